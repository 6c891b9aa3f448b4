"""The join: :func:`join_verified` takes the newest head (by version, signature as tie-break), the
longest verified prefix and the union of checkpoints, and when the owner signed two histories keeps a
:class:`~latticed.crdt.forks.ForkProof` and still ends deterministically (the higher head wins).
:func:`merge` is verify-then-join for a delta or a whole state.

It is commutative, associative and idempotent for every honest history (property tested in
tests/crdt/test_lattice_laws.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from latticed.crdt.core_errors import GapError, MalformedError
from latticed.crdt.forks import Bridge, ForkProof, better_proof, heads_conflict, two_head_proof
from latticed.crdt.head import SignedHead
from latticed.crdt.queue.deltas import VerifiedDelta, delta, verify_delta
from latticed.crdt.queue.state import DeltaEntries, Entries, EntryView, QueueDelta, QueueState, empty_entries
from latticed.crdt.records import (
    chain_extend,
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
        joined = join_verified(state, verify_delta(state, d))
        # A fork's run spliced from two histories: no one head vouches for it from its start, so one
        # delta carries a prefix only, and a merge of the whole state hung on which side came as the
        # state. The rest follows piece by piece, each from as low as its head vouches (where our
        # records may still agree with it), so a whole state joins whole.
        covered = d.end_offset if d.records else incoming.held_end
        while (piece := _piece(incoming, covered)) is not None:
            joined = join_verified(joined, verify_delta(joined, piece))
            covered = piece.end_offset
        return joined
    return join_verified(state, verify_delta(state, incoming))


def _piece(state: QueueState, covered: int) -> QueueDelta | None:
    """The longest piece of ``state``'s run that one head vouches for and that reaches past ``covered``
    from at or below it (None: the run is covered, or no head does)."""
    heads = [h for h in (*state.checkpoints, state.tip) if h is not None and h.start <= covered < h.end]
    if not heads or covered >= state.held_end:
        return None
    tip = max(heads, key=lambda h: (h.end, h.sort_key))
    lo, start = max(tip.start, state.start), state.start
    return QueueDelta(
        owner=state.owner,
        name=state.name,
        kind=state.kind,
        head=state.head,
        meta=state.meta,
        tip=tip,
        from_offset=lo,
        from_hash=state.chain_at(lo) or b"",
        records=tuple(state.entries.records(lo - start, tip.end - start)),
        checkpoints=tuple(c for c in state.checkpoints if lo < c.end <= tip.end and c != tip),
        fork=state.fork,
    )


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
    """The lattice join of a state and a verified delta."""
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
        or _withheld_meta(ours, d)
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
    """The join for every case (:func:`_extended` only shortcuts one)."""
    d = verified.delta
    proof = better_proof(state.fork, d.fork)
    if d.head is None:
        return _replace_fork(state, state.forked or proof is not None, proof)
    owner, name, kind = state.owner, state.name, state.kind

    # 1. Heads: the newest wins; any contradiction between two heads is a fork.
    ours = [h for h in (state.head, state.tip) if h is not None]
    theirs = [h for h in (d.head, d.tip, *d.checkpoints) if h is not None]
    for x in ours:
        for y in theirs:
            if heads_conflict(x, y):
                proof = better_proof(proof, two_head_proof(owner, name, kind, x, y))
    ours_head = state.head
    if ours_head is not None and (d.head.sort_key <= ours_head.sort_key or _withheld_meta(ours_head, d)):
        head, meta = ours_head, state.meta
    else:
        if d.meta is None and (ours_head is None or d.head.meta_version != ours_head.meta_version):
            raise GapError("delta lacks metadata this replica does not have")
        head = d.head
        meta = d.meta if d.meta is not None else state.meta

    # 2. Runs of records: ours, theirs, and both joined where they meet and agree.
    runs: list[_Run] = []
    local = None
    if state.head is not None:
        local = _Run(state.start, state.base_hash, state.entries, state.tip, state.checkpoints)
        runs.append(local)
    if d.records:
        chains = list(verified.chains)
        incoming = _Run(d.from_offset, d.from_hash, DeltaEntries(d.records, chains), d.tip, d.checkpoints)
        runs.append(incoming)
        if local is not None and state.head is not None and local.start <= d.from_offset <= local.end:
            meet = min(local.end, incoming.end)
            if local.chain_at(meet) == incoming.chain_at(meet):
                both = state.checkpoints + d.checkpoints
                if incoming.end > local.end:
                    skip = local.end - d.from_offset
                    # The delta's records as they came (a run stays columnar into the store).
                    joined = local.entries.extend(d.records[skip:] if skip else d.records, chains[skip:])
                    runs.append(_Run(local.start, local.base, joined, d.tip, both))
                else:
                    local.checkpoints = both
            else:
                a, bridge_a = local.witness(meet, state.head)
                b, bridge_b = incoming.witness(meet, d.head)
                proof = better_proof(proof, ForkProof(owner, name, kind, a, b, meet, bridge_a, bridge_b))
                spliced = _spliced(local, d, chains)
                if spliced is not None:
                    runs.append(spliced)
        elif (
            state.head is not None
            and local is not None
            and state.floor
            and d.from_offset < local.start <= incoming.end
        ):
            # Records from below our floor (a peer that holds more than we keep): they may only decide
            # what we hold from the floor on, and only if they pass through our chain value there.
            meet = min(local.end, incoming.end)
            if local.chain_at(meet) != incoming.chain_at(meet):
                a, bridge_a = local.witness(meet, state.head)
                b, bridge_b = incoming.witness(meet, d.head)
                proof = better_proof(proof, ForkProof(owner, name, kind, a, b, meet, bridge_a, bridge_b))
        elif local is not None and d.from_offset < local.start <= incoming.end and head.start < local.start:
            spliced = _spliced_below(local, d, chains)
            if spliced is not None:
                runs.append(spliced)

    # 3. Keep the longest run through the newest head's start, with the chain value that head signs
    #    there, or through our own floor above it: a join never brings back what this replica dropped. A
    #    run past that start with another value there is another history: a proof of the fork, never a
    #    reason to keep fewer records than either side held. Two histories of one length: the higher chain
    #    value at their end, which the records alone decide. Not the higher tip: which head vouches for
    #    the same records differs between replicas (the owner's truncation head, a replica's older one),
    #    so replicas holding one value would keep different histories (the tip only breaks exact ties).
    start = head.start
    floor = state.floor if state.floor > start else 0
    through: list[_Run] = []
    if floor:
        start = floor
        through = [r for r in runs if r.start <= floor < r.end and r.chain_at(floor) == state.floor_hash]
    else:
        for run in runs:
            if run.start <= start < run.end:
                if run.chain_at(start) == head.base_hash:
                    through.append(run)
                else:
                    b, bridge_b = run.witness(start, head)
                    proof = better_proof(proof, ForkProof(owner, name, kind, head, b, start, None, bridge_b))
    entries: Entries = empty_entries()
    tip: SignedHead | None = None
    checkpoints: tuple[SignedHead, ...] = ()
    if through:
        longest = max(r.end for r in through)
        tied = [r for r in through if r.end == longest]
        # The chain value is only looked at when two runs tie on length (it may cost hashing a run).
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
        state.forked or proof is not None,
        proof,
        floor,
        state.floor_hash if floor else b"",
    )


def _spliced(local: _Run, d: QueueDelta, chains: list[bytes]) -> _Run | None:
    """Our records up to where the delta starts, then the delta's: the other history's run, when the delta
    passes through our chain value there and reaches at least our end (else ours is longer). A peer
    relays such a run in chunks (no single head need vouch for it from its start), so a join that only
    compared whole runs kept ours where the peer that assembled that run kept it, for good.

    Only a run this replica can serve again: a head of the delta must vouch from one of our heads at or
    below the junction (or our start) on, since our heads past it vouch for the other history."""
    tip = d.tip
    if tip is None or d.end_offset < local.end or local.chain_at(d.from_offset) != d.from_hash:
        return None
    kept = tuple(c for c in local.checkpoints if c.end <= d.from_offset)
    anchor = max((c.end for c in kept), default=local.start)
    if min(h.start for h in (tip, *d.checkpoints)) > anchor:
        return None
    entries = local.entries.take(d.from_offset - local.start).extend(d.records, chains)
    return _Run(local.start, local.base, entries, tip, kept + d.checkpoints)


def _spliced_below(local: _Run, d: QueueDelta, chains: list[bytes]) -> _Run | None:
    """The delta's records up to where ours start, then ours: the mirror of :func:`_spliced` (a join may
    not hang on which side's records came as the delta), when the delta passes through our chain value
    at our start and we reach at least its end. Only needed when the newest head starts below ours (else
    our own run is this one from there), so only a forked queue gets here; our run is read whole."""
    junction, tip = local.start, local.tip
    cut = junction - d.from_offset
    if tip is None or local.end < d.end_offset or chains[cut - 1] != local.base:
        return None
    if local.end == d.end_offset and local.chain_at(local.end) == chains[-1]:
        return None  # the delta's own run holds the same records
    kept = tuple(c for c in (*d.checkpoints, d.tip) if c is not None and c.end <= junction)
    anchor = max((c.end for c in kept), default=d.from_offset)
    if min(h.start for h in (tip, *local.checkpoints)) > anchor:
        return None  # a peer could not be served our part: no head of ours vouches from the delta's on
    ours = local.entries.records()
    entries = EntryView([*d.records[:cut], *ours], [*chains[:cut], *chain_extend(local.base, junction, ours)])
    return _Run(d.from_offset, d.from_hash, entries, tip, kept + local.checkpoints)


def _withheld_meta(ours: SignedHead, d: QueueDelta) -> bool:
    """A newer head whose metadata the delta left out though ours is not it: the other history's metadata
    of the same version, left out by a sender that took ours for its own (a summary names the version,
    not the hash). A head whose metadata we lack is not ours to keep: the join keeps our head, the two
    heads prove the fork, and the sender then offers its head with its metadata (replication.py: an
    unsettled fork, or its whole run once a delta changed nothing)."""
    assert d.head is not None
    return d.meta is None and d.head.meta_version == ours.meta_version and d.head.meta_hash != ours.meta_hash


def _checkpoints(run: _Run, start: int, held_end: int) -> tuple[SignedHead, ...]:
    """Checkpoints inside the held range. Each run's checkpoints agree with its records by construction
    (ours were checked when they arrived, the delta's against its recomputed chain), so only the range
    needs filtering: no chain lookups, which matters when entries live on disk."""
    seen: dict[bytes, SignedHead] = {}
    for checkpoint in (*run.checkpoints, *((run.tip,) if run.tip else ())):
        if start < checkpoint.end <= held_end:
            seen[checkpoint.signature] = checkpoint
    return tuple(sorted(seen.values(), key=_BY_END_THEN_ORDER))


def _replace_fork(state: QueueState, forked: bool, proof: ForkProof | None) -> QueueState:
    if forked == state.forked and proof is state.fork:
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
        forked,
        proof,
        state.floor,
        state.floor_hash,
    )
