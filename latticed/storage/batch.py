"""One group commit's worth of changes, staged in memory before the single transaction that writes them.

Jobs call into a :class:`Batch`; appends to one queue accumulate and are signed together when the batch
finishes (or when a truncation or merge on that queue needs the appends applied first), so a batch costs
one Ed25519 signature per queue touched, not one per write. Nothing here touches the database except to
read rows and KV entries that the lattice asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import SignedHead
from latticed.crdt.queue import QueueState, VerifiedDelta
from latticed.crdt.records import MAX_OFFSET, Record, RecordRun
from latticed.crdt.signing import Identity
from latticed.errors import (
    BehindPeersError,
    ForkedQueueError,
    LatticedError,
    MalformedError,
    NotOwnerError,
    OtherCoreError,
)
from latticed.storage.entries import StoredEntries

#: Checkpoints closer than this (in records) are thinned out, except the latest.
MIN_CHECKPOINT_SPACING = 1000
#: Keep about this many checkpoints per queue at most: spacing grows with the queue.
MAX_CHECKPOINTS = 1024
#: ...but never thin so far that one chunk between kept checkpoints would exceed this many payload bytes,
#: or catch-up of big records could not fit a frame.
MAX_CHUNK_BYTES = 4 << 20


def _record_bytes(records: Sequence[Record]) -> float:
    if not records:
        return 0.0
    step = max(1, len(records) // 64)
    if type(records) is RecordRun:
        values, keys = records.values[::step], records.keys[::step]
        return (sum(map(len, values)) + sum(len(k) for k in keys if k)) / len(values)
    sample = records[::step]
    return sum(len(r.value) + len(r.key or b"") for r in sample) / len(sample)


def _joined(parts: list[Sequence[Record]]) -> Sequence[Record]:
    """The appends of a batch as one sequence: a run when every part is one (batch offers)."""
    if len(parts) == 1:
        return parts[0]
    if all(type(part) is RecordRun for part in parts):
        return RecordRun.join(parts)  # type: ignore[arg-type]
    return [record for part in parts for record in part]


def thin_checkpoints(
    checkpoints: tuple[SignedHead, ...], held: int, record_bytes: float = 0.0
) -> tuple[SignedHead, ...]:
    """Keep checkpoints at least ``spacing`` records apart, plus the latest; ``record_bytes`` (the typical
    record size seen) caps the spacing so chunks stay under :data:`MAX_CHUNK_BYTES`.

    Checkpoints only let a long backlog be cut into chunks that verify on their own; they are not part of
    the lattice value, so dropping some changes nothing but chunk sizes (and, for a forked queue, whether
    a join can keep a spliced run it could not serve without them: docs/lattice.md, "Known gap"), and
    keeps per-queue memory small.
    A commit adds one checkpoint at the end, so usually only the previous latest needs a look; a full
    pass runs when the list has grown past its bound (the spacing grows with the queue).
    """
    n = len(checkpoints)
    if n <= 2:
        return checkpoints
    spacing = max(MIN_CHECKPOINT_SPACING, held // MAX_CHECKPOINTS)
    if record_bytes > 0:
        spacing = max(1, min(spacing, int(MAX_CHUNK_BYTES // record_bytes)))
    if n <= MAX_CHECKPOINTS + 64:
        if checkpoints[-2].end - checkpoints[-3].end < spacing or checkpoints[-2].end == checkpoints[-1].end:
            return checkpoints[:-2] + checkpoints[-1:]
        return checkpoints
    kept: list[SignedHead] = []
    last_end = -spacing
    for c in checkpoints[:-1]:
        if c.end - last_end >= spacing:
            kept.append(c)
            last_end = c.end
    latest = checkpoints[-1]
    if kept and kept[-1].end == latest.end:
        kept.pop()
    kept.append(latest)
    return checkpoints if len(kept) == n else tuple(kept)


@dataclass(slots=True)
class NewQueue:
    q: int
    created_ms: int


@dataclass(slots=True)
class Staged:
    """Where one queue stands within the batch."""

    before: QueueState
    state: QueueState
    #: Records staged by each append, in order (joined when the batch signs them), and how many in all.
    appends: list[Sequence[Record]] = field(default_factory=list)
    appended: int = 0
    meta: dict[str, str | None] = field(default_factory=dict)
    #: Sign a head even with nothing to apply (a new queue's first head).
    sign: bool = False
    #: Changed through a join (not only our own commits): a KV namespace must fold the new ops.
    joined: bool = False


class Batch:
    """Staged changes of one group commit. Jobs must validate before they change anything, so a job that
    fails leaves the batch as it was (``mutations`` lets the writer check that)."""

    def __init__(
        self,
        states: Mapping[int, QueueState],
        identity: Identity,
        now_ms: int,
        new_queue_number: Callable[[], int],
        kv_reader: Callable[[int, str], kv.Entry | None],
    ) -> None:
        self._states = states
        self.identity = identity
        self.now_ms = now_ms
        self._new_queue_number = new_queue_number
        self._kv_reader = kv_reader
        self.staged: dict[int, Staged] = {}
        self.new_queues: dict[int, NewQueue] = {}
        self.kv: dict[int, dict[str, kv.Entry]] = {}
        #: ``settings`` rows written in the same transaction (a producer's remembered sequences).
        self.settings: dict[str, bytes] = {}
        self.mutations = 0
        self.created_qids: dict[bytes, int] = {}
        #: Core-1 queues a job of this batch converts to core 2: no later job may change them on core 1.
        self.converted: set[int] = set()

    # ------------------------------------------------------------------ reading
    def _staged(self, q: int) -> Staged:
        staged = self.staged.get(q)
        if staged is None:
            if q in self.converted:
                raise OtherCoreError(f"queue #{q} is being converted to fork core 2; retry on that core")
            state = self._states[q]
            staged = self.staged[q] = Staged(state, state)
        return staged

    def state(self, q: int) -> QueueState:
        """The queue's value including everything staged so far (signs pending appends first)."""
        if q not in self.staged:
            return self._states[q]
        return self._flush(q)

    def end(self, q: int) -> int:
        """Next offset to be assigned, without signing anything."""
        staged = self.staged.get(q)
        if staged is None:
            return self._states[q].held_end
        return staged.state.held_end + staged.appended

    def require_owner(self, q: int, what: str) -> QueueState:
        """The state of queue ``q`` if we may sign a new head of it; refused before the batch changes."""
        state = self.staged[q].state if q in self.staged else self._states[q]
        if state.owner != self.identity.public_key:
            raise NotOwnerError(f"cannot {what}: not the owner of {state.owner.hex()}/{state.name}")
        if not state.complete:
            raise _unsignable(state, what)
        return state

    def kv_entry(self, ns: int | None, key: str) -> kv.Entry | None:
        if ns is None:
            return None
        cached = self.kv.get(ns, {}).get(key)
        if cached is not None:
            return cached
        return self._kv_reader(ns, key)

    # ------------------------------------------------------------------ changing
    def create(self, state: QueueState, empty: Callable[[int, QueueState], QueueState]) -> int:
        """Register a new queue; ``empty`` turns the in-memory empty value into a stored one."""
        q = self._new_queue_number()
        stored = empty(q, state)
        self.mutations += 1
        self.staged[q] = Staged(stored, stored)
        self.new_queues[q] = NewQueue(q, self.now_ms)
        self.created_qids[state.queue_id] = q
        return q

    def append(self, q: int, records: Sequence[Record]) -> int:
        """Stage records (already checked); returns the first offset they get.

        Records past the last offset are refused here, so that job fails alone: staged, they would fail
        the signing of the whole group commit, and every other job in it."""
        staged = self._staged(q)
        first = staged.state.held_end + staged.appended
        if first + len(records) > MAX_OFFSET:
            state = staged.state
            raise MalformedError(
                f"queue {state.owner.hex()}/{state.name} is full: offsets stop at {MAX_OFFSET} and it "
                f"ends at {first}; {len(records)} more record(s) do not fit"
            )
        self.mutations += 1
        if records:
            staged.appends.append(records)
            staged.appended += len(records)
        return first

    def set_meta(self, q: int, updates: Mapping[str, str | None], *, sign: bool = False) -> None:
        """Stage metadata changes; ``sign`` forces a new head even if they change nothing."""
        staged = self._staged(q)
        self.mutations += 1
        staged.meta.update(updates)
        staged.sign = staged.sign or sign

    def truncate(self, q: int, new_start: int) -> None:
        state = self._flush(q)
        if new_start > state.start:
            self.mutations += 1
            self._set(q, core.commit(state, self.identity, now_ms=self.now_ms, new_start=new_start))

    def join(self, q: int, verified: VerifiedDelta) -> QueueState:
        """Join a verified delta (may raise GapError, before changing anything)."""
        state = self._flush(q)
        joined = core.join_verified(state, verified)
        if joined is not state:
            self.mutations += 1
            self._set(q, joined, _record_bytes(verified.delta.records))
            self.staged[q].joined = True
        return self.staged[q].state

    def drop_local(self, q: int, floor: int) -> QueueState:
        """Drop a replica's records below ``floor`` here only (:func:`~latticed.crdt.queue.drop_local`);
        refused on our own queues, whose records go only by a signed truncation."""
        current = self.staged[q].state if q in self.staged else self._states[q]
        if current.owner == self.identity.public_key:
            raise NotOwnerError("our own queues are truncated by a signed head, never dropped locally")
        state = self._flush(q)
        dropped = core.drop_local(state, floor)
        if dropped is not state:
            self.mutations += 1
            self._set(q, dropped)
        return dropped

    def put_kv(self, ns: int, key: str, entry: kv.Entry) -> None:
        self.mutations += 1
        self.kv.setdefault(ns, {})[key] = entry

    def commit_pending(self) -> None:
        """Sign every queue's pending appends and metadata (one head per queue)."""
        for q in list(self.staged):
            self._flush(q)

    # ------------------------------------------------------------------ internals
    def _flush(self, q: int) -> QueueState:
        staged = self._staged(q)
        if staged.appends or staged.meta or staged.sign:
            records = _joined(staged.appends) if staged.appends else ()
            try:
                new = core.commit(
                    staged.state,
                    self.identity,
                    now_ms=self.now_ms,
                    records=records,
                    meta_updates=staged.meta or None,
                )
            except BaseException:
                self.mutations += 1  # whatever job triggered this cannot fail alone: redo the batch
                raise
            size = _record_bytes(records)
            staged.appends, staged.appended, staged.meta, staged.sign = [], 0, {}, False
            self._set(q, new, size)
        return staged.state

    def _set(self, q: int, state: QueueState, record_bytes: float = 0.0) -> None:
        thinned = thin_checkpoints(state.checkpoints, len(state.entries), record_bytes)
        if thinned is not state.checkpoints:
            state = QueueState(
                state.owner,
                state.name,
                state.kind,
                state.head,
                state.tip,
                state.entries,
                state.meta,
                thinned,
                state.forked,
                state.fork,
                state.floor,
                state.floor_hash,
            )
        self._staged(q).state = state


def _unsignable(state: QueueState, what: str) -> LatticedError:
    """Why we cannot sign on our own queue: a newer head of ours came from a peer without (all) its records.
    Signing now would reuse offsets that head covers. Raised here, before the batch changes, so only this
    job fails (the signing step would fail the whole batch) and the CLI shows exit 6, not a bare gap."""
    address = f"{state.owner.hex()}/{state.name}"
    missing = f"the records of its newest head from offset {state.held_end} to {state.known_end} are not here"
    if state.forked:
        return ForkedQueueError(
            f"cannot {what} {address}: it is forked (this identity signed two histories of it; see "
            f"docs/operations.md) and {missing}; writes resume once they have arrived"
        )
    return BehindPeersError(f"cannot {what} {address} yet: {missing}; retry once the catch-up has landed")


def appended_since(before: QueueState, after: QueueState) -> tuple[int, Sequence[Record]]:
    """The records ``after`` appended on top of ``before``'s stored rows (for tails and KV folding); an
    immutable sequence (a tuple or a :class:`~latticed.crdt.records.RecordRun`)."""
    entries = after.entries
    if isinstance(entries, StoredEntries):
        records, _ = entries.overlay
        return entries.lo + entries.stored, records
    return after.start, tuple(entries.records())


__all__ = [
    "MAX_CHECKPOINTS",
    "MIN_CHECKPOINT_SPACING",
    "Batch",
    "NewQueue",
    "Staged",
    "appended_since",
    "thin_checkpoints",
]
