"""The changes a holder makes to its own copy of a queue: the owner's :func:`commit` (append, truncate,
set metadata, signing a new head, with a checkpoint head every :data:`CHECKPOINT_BYTES` of payload so
catch-up chunks stay bounded) and a replica's :func:`drop_local` (a floor of its own, which no head says
and no delta carries).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from operator import add

from latticed.crdt import columns_compiled
from latticed.crdt.core_errors import GapError, MalformedError, NotOwnerError
from latticed.crdt.head import SignedHead, meta_hash
from latticed.crdt.queue.state import Entries, QueueState, empty_entries
from latticed.crdt.records import (
    MAX_OFFSET,
    Record,
    RecordRun,
    blake2b_skip,
    chain_extend,
    check_records,
)
from latticed.crdt.signing import Identity

# ---------------------------------------------------------------------------------------------- owner ops


#: The owner signs a head at least every this many payload bytes, so catch-up chunks (which end at signed
#: heads) stay small enough for bounded frames even when one batch is huge.
CHECKPOINT_BYTES = 1 << 20


def commit(
    state: QueueState,
    identity: Identity,
    *,
    now_ms: int,
    records: Sequence[Record] = (),
    new_start: int | None = None,
    meta_updates: Mapping[str, str | None] | None = None,
    checkpoint_bytes: int = CHECKPOINT_BYTES,
) -> QueueState:
    """Apply the owner's changes and sign one head over them (one signature per batch; a batch larger
    than ``checkpoint_bytes`` gets a signed head per slice of that size).

    Everything is checked before anything is computed from the records (their sizes cut the slices),
    so bad input is a :class:`MalformedError`, never some other exception."""
    check_records(records)
    if state.held_end + len(records) > MAX_OFFSET or (new_start is not None and new_start > MAX_OFFSET):
        raise MalformedError(f"offsets stop at {MAX_OFFSET}")
    cuts = checkpoint_cuts(records, checkpoint_bytes)
    extended: tuple[Entries, Sequence[bytes]] | None = None
    if cuts:
        # The chain over the whole batch in one pass and the entries extended once: a slice's state
        # holds a prefix of them (extending the entries slice by slice copied the unwritten ones again
        # for each slice). Refused first, as the first slice would be, before anything is computed.
        _check_signable(state, identity)
        end = state.held_end
        chains = chain_extend(state.chain_at(end) or state.base_hash, end, records)
        extended = (state.entries.extend(records, chains), chains)
    first = 0
    for cut in cuts:
        assert extended is not None
        prefix = (extended[0].take(len(state.entries) + cut - first), extended[1][first:cut])
        state = _commit_once(state, identity, now_ms=now_ms, records=records[first:cut], extended=prefix)
        first = cut
    return _commit_once(
        state,
        identity,
        now_ms=now_ms,
        records=records[first:],
        new_start=new_start,
        meta_updates=meta_updates,
        extended=None if extended is None else (extended[0], extended[1][first:]),
    )


def checkpoint_cuts(records: Sequence[Record], checkpoint_bytes: int) -> list[int]:
    """Where to end a signed slice of ``records``: after each ``checkpoint_bytes`` of payload (the first
    record that brings a slice to ``checkpoint_bytes`` ends it, unless it is the last record).

    Found in one C pass where the column passes were built (:mod:`latticed.crdt.columns_compiled`),
    else by bisecting the running sums of the records' sizes, a column at a time: a Python step per
    record cost the owner's bulk append more than any other stage of it."""
    columns = columns_compiled.load()
    if type(records) is RecordRun and columns is not None:
        found = columns.cuts(records.values, records.keys, checkpoint_bytes)
        if found is not None:  # the same cuts, one C pass
            return found  # type: ignore[no-any-return]
    if type(records) is RecordRun:
        if records.payload_bytes() < checkpoint_bytes:
            return []
        sizes: Iterable[int] = map(len, records.values)
        keys = records.keys
        nils = keys.count(None)
        if nils != len(keys):
            sizes = map(add, sizes, map(len, keys) if not nils else [len(k) if k else 0 for k in keys])  # type: ignore[arg-type]
    else:
        sizes = [len(r.value) + (len(r.key) if r.key else 0) for r in records]
    running = list(accumulate(sizes))
    if not running or running[-1] < checkpoint_bytes:
        return []
    cuts: list[int] = []
    last = len(running) - 1
    index, before = 0, 0
    while True:
        # The first record at or after ``index`` whose running sum reaches ``before + checkpoint_bytes``.
        index = bisect_left(running, before + checkpoint_bytes, lo=index)
        if index >= last:
            return cuts
        cuts.append(index + 1)
        before = running[index]
        index += 1


def _check_signable(state: QueueState, identity: Identity) -> None:
    if identity.public_key != state.owner:
        raise NotOwnerError(f"not the owner of {state.owner.hex()}/{state.name}")
    if not state.complete:
        raise GapError("owner state is missing records; it cannot sign a new head")


def _commit_once(
    state: QueueState,
    identity: Identity,
    *,
    now_ms: int,
    records: Sequence[Record] = (),
    new_start: int | None = None,
    meta_updates: Mapping[str, str | None] | None = None,
    extended: tuple[Entries, Sequence[bytes]] | None = None,
) -> QueueState:
    """One signed head over ``records`` (checked by :func:`commit`) and the other changes. ``extended``:
    the state's entries with ``records`` appended and their chain values, if the caller computed them."""
    _check_signable(state, identity)
    qid = state.queue_id
    version = state.version + 1
    start, end = state.start, state.held_end
    entries = state.entries
    base_hash = state.base_hash
    head_hash = state.chain_at(end) or base_hash
    if records:
        chains: Sequence[bytes]
        if extended is None:
            chains = chain_extend(head_hash, end, records)
            entries = entries.extend(records, chains)
        else:
            entries, chains = extended
        end += len(records)
        head_hash = chains[-1]
    if new_start is not None and new_start > start:
        if new_start >= end:
            if new_start > end:
                # Offsets in [end, new_start) are never assigned; the chain records the jump explicitly.
                head_hash = blake2b_skip(head_hash, new_start)
                end = new_start
            entries = empty_entries()
            base_hash = head_hash
        else:
            base_hash = entries.chain(new_start - start - 1)
            entries = entries.drop(new_start - start)
        start = new_start
    meta = state.meta
    meta_version = state.head.meta_version if state.head else 0
    if meta_updates:
        merged = dict(meta)
        for key, value in meta_updates.items():
            if not isinstance(key, str) or not key:
                raise MalformedError("metadata keys are non-empty strings")
            if value is None:
                merged.pop(key, None)
            elif isinstance(value, str):
                merged[key] = value
            else:  # never converted: a 5 stored as "5" would come back as another type
                raise MalformedError(
                    f"metadata values are strings (or None to delete), not {type(value).__name__}"
                )
        new_meta = tuple(sorted(merged.items()))
        if new_meta != meta:
            meta, meta_version = new_meta, version
    head = SignedHead.sign(
        identity,
        queue_id=qid,
        version=version,
        start=start,
        end=end,
        base_hash=base_hash,
        head_hash=head_hash,
        meta_version=meta_version,
        meta_hash=meta_hash(dict(meta)),
        timestamp=max(now_ms, state.head.timestamp if state.head else 0),
    )
    checkpoints = state.checkpoints
    if checkpoints and checkpoints[0].end <= start:
        # Checkpoints are sorted by end, so only a truncation (past the first one) drops any.
        checkpoints = tuple(c for c in checkpoints if c.end > start)
    if records:
        checkpoints += (head,)
    return QueueState(
        owner=state.owner,
        name=state.name,
        kind=state.kind,
        head=head,
        tip=head if len(entries) else None,
        entries=entries,
        meta=meta,
        checkpoints=checkpoints,
        forked=state.forked,
        fork=state.fork,
    )


# ------------------------------------------------------------------------------------------- local drops


def drop_local(state: QueueState, floor: int) -> QueueState:
    """This replica's records below ``floor`` dropped (it keeps less than the owner), leaving a suffix that
    still verifies on its own; the newest record is always kept, so a signed head (``tip``) vouches for
    the kept run and ``floor_hash`` stays provable.

    Nothing is signed and nothing travels: the owner's head and ``start`` are unchanged, and later joins
    never bring the dropped records back (see :func:`join_verified`). A floor at or below what is held
    already changes nothing (the same value is returned)."""
    if state.head is None or state.tip is None:
        return state
    floor = min(floor, state.held_end - 1)
    if floor <= state.start:
        return state
    floor_hash = state.chain_at(floor)
    assert floor_hash is not None
    checkpoints = state.checkpoints
    if checkpoints and checkpoints[0].end <= floor:
        checkpoints = tuple(c for c in checkpoints if c.end > floor)
    return QueueState(
        state.owner,
        state.name,
        state.kind,
        state.head,
        state.tip,
        state.entries.drop(floor - state.start),
        state.meta,
        checkpoints,
        state.forked,
        state.fork,
        floor,
        floor_hash,
    )
