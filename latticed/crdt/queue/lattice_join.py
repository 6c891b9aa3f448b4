"""The join: :func:`join_verified` takes the newest head (by version, signature as tie-break), the
longest verified prefix and the union of checkpoints. When it finds, or is handed, a proof that the owner
signed two histories, the queue stops where this replica stands (:func:`freeze`): it keeps its own head
and records, flags the queue forked and keeps the proof, and merges nothing but proofs from then on.
:func:`merge` is verify-then-join for a delta or a whole state.

It is commutative, associative and idempotent for every honest history (property tested in
tests/crdt/test_lattice_laws.py); forked values are not a lattice on core 1 (core 2 is one).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from latticed.crdt.core_errors import GapError, MalformedError
from latticed.crdt.forks import Bridge, ForkProof, better_proof, heads_conflict, two_head_proof
from latticed.crdt.head import SignedHead
from latticed.crdt.queue.deltas import VerifiedDelta, delta, verify_delta
from latticed.crdt.queue.state import DeltaEntries, Entries, QueueDelta, QueueState, empty_entries
from latticed.crdt.records import (
    record_digest,
)


def merge(state: QueueState, incoming: QueueDelta | QueueState) -> QueueState:
    """Verify, then join. Anything forged raises an :class:`IntegrityError` and leaves ``state`` as it was;
    an older but valid state joins as a no-op."""
    if isinstance(incoming, QueueState):
        for h in (incoming.head, incoming.tip, *incoming.checkpoints):
            if h is None:
                continue
            if not isinstance(h, SignedHead):
                raise MalformedError("a queue state's heads are signed heads")
            h.check()
        d = delta(incoming)
        return join_verified(state, verify_delta(state, d))
    return join_verified(state, verify_delta(state, incoming))


#: A checkpoint's place: by end, then by :attr:`SignedHead.sort_key` (version, signature), in C.
_BY_END_THEN_ORDER = attrgetter("end", "version", "signature")


@dataclass(slots=True)
class _Run:
    """A contiguous verified run of records ``[start, end)``: chain value ``base`` at ``start``, and ``tip``
    (when there are records) the signed head that vouches for the chain value at ``end``."""

    start: int
    base: bytes
    entries: Entries
    tip: SignedHead | None
    checkpoints: tuple[SignedHead, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.entries)

    def chain_at(self, offset: int) -> bytes | None:
        if offset == self.start:
            return self.base
        if self.start < offset <= self.end:
            return self.entries.chain(offset - self.start - 1)
        return None

    def witness(self, offset: int, fallback: SignedHead) -> tuple[SignedHead, Bridge | None]:
        """A signed head and, if needed, a bridge proving this run's chain value at ``offset``."""
        if self.tip is None:
            return fallback, None
        if offset == self.end:
            return self.tip, None
        records = self.entries.records(offset - self.start)
        digests = tuple(record_digest(r, offset + i) for i, r in enumerate(records))
        start_hash = self.chain_at(offset)
        assert start_hash is not None
        return self.tip, Bridge(start_hash, digests)


def join_verified(state: QueueState, verified: VerifiedDelta) -> QueueState:
    """The lattice join of a state and a verified delta (see the module docstring for a fork)."""
    proof = verified.delta.fork
    if state.forked or proof is not None:
        return freeze(state, better_proof(state.fork, proof))
    extended = _extended(state, verified)
    if extended is not None:
        return extended
    return _join_general(state, verified)


def _extended(state: QueueState, verified: VerifiedDelta) -> QueueState | None:
    """:func:`_join_general`'s result for the common case of a live push, or None for any other case:
    an unforked replica without a floor, holding records, gets a newer head and records that start at its
    held end from its chain value there, under the same start and base, and no head of either side
    contradicts another. Then the general join keeps exactly our run extended by the delta's records,
    its tip, our metadata unless the delta brings its own, and no proof; this builds that state without
    the general join's runs (tests/crdt/test_join_extend.py checks the two agree on every field)."""
    d = verified.delta
    ours, head, tip = state.head, d.head, d.tip
    if (
        ours is None
        or head is None
        or tip is None
        or not d.records
        or d.fork is not None
        or state.fork is not None
        or state.forked
        or state.floor
    ):
        return None
    start = ours.start
    end = state.held_end
    if (
        d.from_offset != end
        or end <= start
        or head.start != start
        or head.base_hash != ours.base_hash
        or head.sort_key <= ours.sort_key
        or (d.meta is None and head.meta_version != ours.meta_version)
        or d.from_hash != state.entries.chain(end - start - 1)
    ):
        return None
    # Each pair once (a head is often its side's tip too): the verdicts the general join looks at.
    theirs = (head, *d.checkpoints) if tip is head else (head, tip, *d.checkpoints)
    for x in (ours,) if state.tip is ours or state.tip is None else (ours, state.tip):
        for y in theirs:
            if heads_conflict(x, y):
                return None
    joined = state.entries.extend(d.records, list(verified.chains))
    run = _Run(start, ours.base_hash, joined, tip, state.checkpoints + d.checkpoints)
    entries = joined.drop(0)
    return QueueState(
        state.owner,
        state.name,
        state.kind,
        head,
        tip,
        entries,
        d.meta if d.meta is not None else state.meta,
        _checkpoints(run, start, start + len(entries)),
        False,
        None,
        0,
        b"",
    )


def _join_general(state: QueueState, verified: VerifiedDelta) -> QueueState:
    """The join for every case (:func:`_extended` only shortcuts one); a fork it finds freezes ``state``."""
    d = verified.delta
    if d.head is None:
        return state
    owner, name, kind = state.owner, state.name, state.kind

    # 1. Heads: the newest wins; any contradiction between two heads is a fork.
    ours = [h for h in (state.head, state.tip) if h is not None]
    theirs = [h for h in (d.head, d.tip, *d.checkpoints) if h is not None]
    proof: ForkProof | None = None
    for x in ours:
        for y in theirs:
            if heads_conflict(x, y):
                proof = better_proof(proof, two_head_proof(owner, name, kind, x, y))
    if proof is not None:
        return freeze(state, proof)
    ours_head = state.head
    if ours_head is not None and d.head.sort_key <= ours_head.sort_key:
        head, meta = ours_head, state.meta
    else:
        if d.meta is None and (ours_head is None or d.head.meta_version != ours_head.meta_version):
            raise GapError("delta lacks metadata this replica does not have")
        head = d.head
        meta = d.meta if d.meta is not None else state.meta

    # 2. Runs of records: ours, theirs, and both joined where they meet and agree; where they meet and
    #    differ, or the delta's records pass below our floor with another value there, the owner forked.
    runs: list[_Run] = []
    local = None
    if state.head is not None:
        local = _Run(state.start, state.base_hash, state.entries, state.tip, state.checkpoints)
        runs.append(local)
    if d.records:
        chains = list(verified.chains)
        incoming = _Run(d.from_offset, d.from_hash, DeltaEntries(d.records, chains), d.tip, d.checkpoints)
        runs.append(incoming)
        meets = local is not None and (
            local.start <= d.from_offset <= local.end
            or (state.floor and d.from_offset < local.start <= incoming.end)
        )
        if local is not None and state.head is not None and meets:
            meet = min(local.end, incoming.end)
            if local.chain_at(meet) != incoming.chain_at(meet):
                a, bridge_a = local.witness(meet, state.head)
                b, bridge_b = incoming.witness(meet, d.head)
                return freeze(state, ForkProof(owner, name, kind, a, b, meet, bridge_a, bridge_b))
            if d.from_offset >= local.start:
                both = state.checkpoints + d.checkpoints
                if incoming.end > local.end:
                    skip = local.end - d.from_offset
                    # The delta's records as they came (a run stays columnar into the store).
                    joined = local.entries.extend(d.records[skip:] if skip else d.records, chains[skip:])
                    runs.append(_Run(local.start, local.base, joined, d.tip, both))
                else:
                    local.checkpoints = both

    # 3. Keep the longest run through the newest head's start, with the chain value that head signs
    #    there, or through our own floor above it: a join never brings back what this replica dropped. A
    #    run past that start with another value there is another history: a fork. Two runs of one length
    #    through one start hold the same records (else step 2 found a fork); the tip breaks the tie.
    start = head.start
    floor = state.floor if state.floor > start else 0
    through: list[_Run] = []
    if floor:
        start = floor
        through = [r for r in runs if r.start <= floor < r.end and r.chain_at(floor) == state.floor_hash]
    else:
        for run in runs:
            if run.start <= start < run.end:
                if run.chain_at(start) != head.base_hash:
                    b, bridge_b = run.witness(start, head)
                    return freeze(state, ForkProof(owner, name, kind, head, b, start, None, bridge_b))
                through.append(run)
    entries: Entries = empty_entries()
    tip: SignedHead | None = None
    checkpoints: tuple[SignedHead, ...] = ()
    if through:
        longest = max(r.end for r in through)
        tied = [r for r in through if r.end == longest]
        best = (
            tied[0]
            if len(tied) == 1
            else max(tied, key=lambda r: (r.chain_at(r.end) or b"", r.tip.sort_key if r.tip else (-1, b"")))
        )
        entries, tip = best.entries.drop(start - best.start), best.tip
        checkpoints = _checkpoints(best, start, start + len(entries))
    return QueueState(
        owner,
        name,
        kind,
        head,
        tip,
        entries,
        meta,
        checkpoints,
        False,
        None,
        floor,
        state.floor_hash if floor else b"",
    )


def _checkpoints(run: _Run, start: int, held_end: int) -> tuple[SignedHead, ...]:
    """Checkpoints inside the held range. Each run's checkpoints agree with its records by construction
    (ours were checked when they arrived, the delta's against its recomputed chain), so only the range
    needs filtering: no chain lookups, which matters when entries live on disk."""
    seen: dict[bytes, SignedHead] = {}
    for checkpoint in (*run.checkpoints, *((run.tip,) if run.tip else ())):
        if start < checkpoint.end <= held_end:
            seen[checkpoint.signature] = checkpoint
    return tuple(sorted(seen.values(), key=_BY_END_THEN_ORDER))


def freeze(state: QueueState, proof: ForkProof | None) -> QueueState:
    """``state`` as it stands, flagged forked with ``proof`` (the better of what it held and the new one):
    its head and records stay (nothing is deleted), and reads stop at :attr:`QueueState.visible_end`."""
    if state.forked and proof is state.fork:
        return state
    return QueueState(
        state.owner,
        state.name,
        state.kind,
        state.head,
        state.tip,
        state.entries,
        state.meta,
        state.checkpoints,
        True,
        proof,
        state.floor,
        state.floor_hash,
    )
