"""Write jobs of core-2 queues (:mod:`latticed.crdt.queue2`), run by the storage thread's group commit.

Each job checks everything before it stages anything (so a bad job fails alone and its group commit goes
ahead), and stages through the writer's :class:`~latticed.storage.core2_queues.Core2Queues`; its
``result`` holds once the batch's transaction committed, fsynced. The owner's appends to one queue in
one group commit are signed as one head, as core 1's are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from latticed.crdt import queue2
from latticed.crdt.head import KIND_QUEUE, queue_id
from latticed.crdt.queue.state import EntryView
from latticed.crdt.queue2 import Delta, QueueState2, Verified
from latticed.crdt.records import MAX_OFFSET, Record, check_records
from latticed.errors import (
    AlreadyExistsError,
    BehindPeersError,
    ForkedQueueError,
    MalformedError,
    NotOwnerError,
)
from latticed.host.retention_policy import KEYS as RETENTION_KEYS
from latticed.storage import core2_fresh
from latticed.storage.batch import Batch
from latticed.storage.core2_queues import Core2Queues, core2_of
from latticed.storage.core2_store import evidence
from latticed.storage.entries import StoredEntries
from latticed.storage.jobs import Job, WriterView

__all__ = [
    "Commit2",
    "CreateQueue2",
    "DropQueue2",
    "Merge2",
    "Merged2",
    "Recover2",
    "Truncate2",
]


def _owned(core2: Core2Queues, q: int, what: str) -> QueueState2:
    """``q``'s staged value (pending appends not signed yet), if this daemon may sign its next head."""
    state = core2.vouched(q)
    if state is not None:
        return state
    state = core2.peek(q)
    address = f"{state.owner.hex()}/{state.name}"
    if state.owner != core2.identity.public_key:
        raise NotOwnerError(f"cannot {what}: not the owner of {address}")
    if state.forked:
        raise ForkedQueueError(
            f"cannot {what} {address}: it is forked at offset {state.chains.fork_point} (this identity "
            "signed two histories of it) and frozen there; recover it to write again"
        )
    tips = state.chains.tips
    if tips and state.held[1] != tips[0].head.end:
        raise BehindPeersError(
            f"cannot {what} {address} yet: the records of its newest head from offset {state.held[1]} to "
            f"{tips[0].head.end} are not here; retry once the catch-up has landed"
        )
    core2.vouch(q, state)
    return state


def _check_meta(meta: Mapping[str, str | None]) -> None:
    for key, value in meta.items():
        if not isinstance(key, str) or not key or not (value is None or isinstance(value, str)):
            raise MalformedError("metadata is a map of non-empty text keys to text values (or None)")


class CreateQueue2(Job):
    """A new core-2 queue we own, with its first signed head (version 1) carrying the metadata."""

    __slots__ = ("kind", "meta", "name")

    def __init__(self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE) -> None:
        super().__init__()
        self.name, self.meta, self.kind = name, dict(meta or {}), kind

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        state = queue2.empty_state(batch.identity.public_key, self.name, self.kind)
        _check_meta(self.meta)
        qid = state.queue_id
        if writer.lookup(qid) is not None or qid in batch.created_qids or core2.find(qid) is not None:
            raise AlreadyExistsError(f"queue {state.owner.hex()}/{self.name} already exists")
        batch.mutations += 1
        q = core2.create(state)
        core2.set(
            q, queue2.commit(core2.state(q), batch.identity, now_ms=core2.now_ms, meta_updates=self.meta)
        )
        self.result = q


class Commit2(Job):
    """The owner's records (and metadata changes) for one core-2 queue; ``result``: the first offset."""

    __slots__ = ("checked", "frees_space", "meta", "q", "records")

    def __init__(
        self,
        q: int,
        records: Sequence[Record],
        meta: Mapping[str, str | None] | None = None,
        *,
        checked: bool = False,
    ) -> None:
        super().__init__()
        self.q, self.records, self.meta, self.checked = q, records, dict(meta or {}), checked
        #: A retention change is how a full disk is meant to be fixed, so it may use the reserve.
        self.frees_space = not records and bool(self.meta) and all(k in RETENTION_KEYS for k in self.meta)

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        state = _owned(core2, self.q, "offer")
        if not self.checked:
            check_records(self.records)
        _check_meta(self.meta)
        first = core2.end(self.q)
        if first + len(self.records) > MAX_OFFSET:
            raise MalformedError(
                f"queue {state.owner.hex()}/{state.name} is full: offsets stop at {MAX_OFFSET}"
            )
        batch.mutations += 1
        self.result = core2.append(self.q, self.records, self.meta)


class Truncate2(Job):
    """The owner's signed truncation of a core-2 queue to ``new_start``."""

    __slots__ = ("new_start", "q")
    frees_space = True

    def __init__(self, q: int, new_start: int) -> None:
        super().__init__()
        self.q, self.new_start = q, new_start

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        _owned(core2, self.q, "truncate")
        state = core2.state(self.q)
        if type(self.new_start) is not int or not 0 <= self.new_start <= MAX_OFFSET:
            raise MalformedError(f"a new start is an offset from 0 to {MAX_OFFSET}")
        if self.new_start > state.held[0]:
            truncated = queue2.truncate(state, core2.identity, self.new_start, now_ms=core2.now_ms)
            batch.mutations += 1
            core2.set(self.q, truncated)
        self.result = core2.state(self.q).held[0]


class Recover2(Job):
    """The owner's next epoch of a forked core-2 queue, from its fork point; with ``keep_mine`` the
    records kept as evidence of the forked epoch are offered again in the new one. ``result``: the epoch."""

    __slots__ = ("keep_mine", "q")

    def __init__(self, q: int, *, keep_mine: bool = False) -> None:
        super().__init__()
        self.q, self.keep_mine = q, keep_mine

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        state = core2.state(self.q)
        if state.owner != core2.identity.public_key:
            raise NotOwnerError(f"cannot recover: not the owner of {state.owner.hex()}/{state.name}")
        mine = evidence(writer.store.connection, self.q).records(state.chains.epoch) if self.keep_mine else []
        recovered = queue2.recover(state, core2.identity, now_ms=core2.now_ms, keep_mine=mine)
        batch.mutations += 1
        core2.set(self.q, recovered)
        self.result = recovered.chains.epoch


@dataclass(frozen=True, slots=True)
class Merged2:
    """What a merge did: the queue, whether its value changed, and how many records it set aside as
    evidence (before the store's bound)."""

    q: int
    changed: bool
    evidence: int


class Merge2(Job):
    """A peer's delta of a core-2 queue joined durably (the queue is created as a replica if we hold none).
    ``verified`` (checked against ``against``) is used when the queue is still at that value, or at one
    that verifies it alike (:func:`_verified_for`); otherwise the delta is verified again here. ``joined``,
    the event loop's join of ``verified`` into ``against``, is taken too when the queue here is that very
    value (:func:`_joined_for`), so a live push is joined once; otherwise it is joined again here. A
    fresh replica's first delta of a queue, verified, is placed as the new queue's value without a join
    where it can be (:meth:`_merge_fresh`). Whatever fails verification changes nothing."""

    __slots__ = ("added", "against", "delta", "joined", "verified")

    def __init__(
        self,
        delta: Delta,
        verified: Verified | None = None,
        against: QueueState2 | None = None,
        joined: QueueState2 | None = None,
    ) -> None:
        super().__init__()
        self.delta, self.verified, self.against, self.joined = delta, verified, against, joined
        #: The records the merge appended past what the queue held (the replication metrics count them).
        self.added: Sequence[Record] = ()

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        d = self.delta
        if not isinstance(d, Delta) or not isinstance(d.owner, bytes) or not isinstance(d.name, str):
            raise MalformedError("not a v2 queue delta")
        qid = queue_id(d.owner, d.name, d.kind)
        q = core2.find(qid)  # a core-1 queue converted earlier in this group commit is one already
        if q is None and (writer.lookup(qid) is not None or qid in batch.created_qids):
            raise MalformedError(
                f"queue {d.owner.hex()}/{d.name} is on fork core 1 here: a v2 delta is refused"
            )
        state = _unborn(core2, d) if q is None else core2.state(q)
        verified = self.verified
        joined = None
        if verified is None or not _verified_for(state, self.against, verified):
            verified = queue2.verify_delta(state, d)
        elif q is not None:
            joined = _joined_for(state, self.against, verified, self.joined)
        if q is None and self._merge_fresh(batch, core2, state, verified):
            return
        # pure: raises before anything is staged
        merged = queue2.join_verified(state, verified) if joined is None else queue2.Merged(joined)
        superseded = _superseded(state, merged.state)
        new = merged.state
        changed = q is None or new.chains != state.chains or new.meta != state.meta
        if changed or merged.evidence:
            batch.mutations += 1
            if q is None:
                q = core2.create(state)
                state = core2.state(q)
                merged = queue2.join_verified(state, verified)
            core2.set(q, merged.state)
            count = new.held[1] - max(state.held[1], new.held[0])
            self.added = verified.records[len(verified.records) - count :] if count > 0 else ()
            first = state.held[1] - len(merged.evidence)
            core2.keep_evidence(q, state.chains.epoch, first, merged.evidence)
            core2.keep_evidence(q, state.chains.epoch, *superseded)
        self.result = Merged2(q if q is not None else -1, changed, len(merged.evidence) + len(superseded[1]))

    def _merge_fresh(self, batch: Batch, core2: Core2Queues, state: QueueState2, verified: Verified) -> bool:
        """A queue we hold none of (``state``: its empty value), ``verified`` against it, placed as the new
        queue's value at once when it is :func:`core2_fresh.placeable` (no join, nor a second one against
        the created value; the group commit writes it with the batch's other new queues). False: the
        generic path joins it."""
        if not core2.fresh_batched or not core2_fresh.placeable(state, verified):
            return False
        batch.mutations += 1
        rows = core2.store.rows
        q = core2.create(state, lambda q: core2_fresh.as_queue(rows, q, state, verified))
        self.added = verified.records
        self.result = Merged2(q, True, 0)
        return True


def _unborn(core2: Core2Queues, d: Delta) -> QueueState2:
    """The empty value of a queue this replica does not hold yet, its records an empty stored run as
    :meth:`Core2Queues.create` stages them: a delta's run joined to it stays a run, where an in-memory
    view builds a Record per row (a fresh replica's first chunk, joined twice here)."""
    empty = queue2.empty_state(d.owner, d.name, d.kind)
    stored = StoredEntries(core2.store.rows, -1, empty.held[0], 0)
    return replace(empty, entries=cast(EntryView, stored))


def _verified_for(state: QueueState2, against: QueueState2 | None, verified: Verified) -> bool:
    """Whether ``verify_delta(state, d)`` is ``verified``, checked against ``against``: it reads nothing
    of a value but its chains (which fix the queue, what is held and the base), its metadata and the
    chain value where the records start, so two values alike in those verify a delta alike (a push
    verified on the event loop against the value its pending predecessors join into)."""
    if state is against:
        return True
    if against is None or state.chains != against.chains or state.meta != against.meta:
        return False
    if not verified.records:
        return True
    try:
        mine = against.chain_at(verified.from_offset)
    except Exception:  # a value that cannot tell without a read (the event loop's): verify again
        return False
    return mine is not None and mine == state.chain_at(verified.from_offset)


def _joined_for(
    state: QueueState2, against: QueueState2 | None, v: Verified, joined: QueueState2 | None
) -> QueueState2 | None:
    """``join_verified(state, v).state`` without the join, from ``joined`` (the event loop's join of ``v``
    into ``against``), when ``state`` is the very value ``against`` read without the store (the same
    chains, metadata and bodies objects: the queue has not moved since) and ``joined`` is that join of
    ``v``, a plain append of its records: its chains are ``v``'s, its start is ``state``'s, its end
    ``v``'s. The records and chain values come from ``v`` (what was verified) onto ``state``'s own rows;
    ``joined`` gives the merged log and bodies. None: join here (anything else, e.g. a merge in between)."""
    if joined is None or against is None or not v.records:
        return None
    if (
        state.chains is not against.chains
        or state.meta is not against.meta
        or state.bodies is not against.bodies
    ):
        return None
    lo, hi = state.held
    end = v.from_offset + len(v.records)
    skip = hi - v.from_offset
    chains, mine = joined.chains, v.chains
    if not 0 <= skip < len(v.records) or joined.held != (lo, end) or joined.meta is not v.meta:
        return None
    if (chains.shared, chains.tips, chains.start_head) != (mine.shared, mine.tips, mine.start_head):
        return None
    if chains.epoch != state.chains.epoch or chains.forked:
        return None
    bodies = joined.bodies
    if len(bodies) < len(state.bodies) or (bodies and bodies[-1].end != end):
        return None
    entries = state.entries.extend(v.records[skip:], v.chain[skip:])
    return replace(joined, entries=entries)


def _superseded(state: QueueState2, joined: QueueState2) -> tuple[int, tuple[Record, ...]]:
    """Records ``state`` held past the fork point of its epoch when ``joined`` is a later epoch (a replica
    that learns of the owner's recovery before it saw the fork): evidence too, from which offset."""
    chains = joined.chains
    if chains.epoch <= state.chains.epoch or not chains.tips:
        return 0, ()
    point = min(tip.leaves()[0][1] for tip in chains.tips) if not chains.shared else chains.shared[0][1]
    lo, hi = state.held
    first = max(lo, point)
    return first, tuple(state.entries.records(first - lo)) if hi > first else ()


class DropQueue2(Job):
    """Delete a core-2 queue here with its records, leaves, bodies and evidence."""

    __slots__ = ("q",)
    frees_space = True

    def __init__(self, q: int) -> None:
        super().__init__()
        self.q = q

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        core2.drop(self.q)  # NotFoundError before anything is staged
        batch.mutations += 1
        self.result = self.q
