"""The changes a holder makes to its own copy of a queue: the owner's :func:`commit` (append, truncate,
set metadata, signing a new head, with a checkpoint head every :data:`CHECKPOINT_BYTES` of payload so
catch-up chunks stay bounded) and a replica's :func:`drop_local` (a floor of its own, which no head says
and no delta carries).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from latticed.crdt.core_errors import GapError, MalformedError, NotOwnerError
from latticed.crdt.head import SignedHead, meta_hash
from latticed.crdt.queue.state import QueueState, empty_entries
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
    first = 0
    for cut in checkpoint_cuts(records, checkpoint_bytes):
        state = _commit_once(state, identity, now_ms=now_ms, records=records[first:cut])
        first = cut
    return _commit_once(
        state,
        identity,
        now_ms=now_ms,
        records=records[first:],
        new_start=new_start,
        meta_updates=meta_updates,
    )


def checkpoint_cuts(records: Sequence[Record], checkpoint_bytes: int) -> list[int]:
    """Where to end a signed slice of ``records``: after each ``checkpoint_bytes`` of payload."""
    if type(records) is RecordRun:
        if records.payload_bytes() < checkpoint_bytes:
            return []
        sizes = list(map(len, records.values))
        if records.keys.count(None) != len(sizes):
            sizes = [size + (len(key) if key else 0) for size, key in zip(sizes, records.keys, strict=True)]
    else:
        sizes = [len(r.value) + (len(r.key) if r.key else 0) for r in records]
    if sum(sizes) < checkpoint_bytes:
        return []
    cuts: list[int] = []
    size = 0
    last = len(sizes) - 1
    for index, record_size in enumerate(sizes):
        size += record_size
        if size >= checkpoint_bytes and index < last:
            cuts.append(index + 1)
            size = 0
    return cuts


def _commit_once(
    state: QueueState,
    identity: Identity,
    *,
    now_ms: int,
    records: Sequence[Record] = (),
    new_start: int | None = None,
    meta_updates: Mapping[str, str | None] | None = None,
) -> QueueState:
    """One signed head over ``records`` (checked by :func:`commit`) and the other changes."""
    if identity.public_key != state.owner:
        raise NotOwnerError(f"not the owner of {state.owner.hex()}/{state.name}")
    if not state.complete:
        raise GapError("owner state is missing records; it cannot sign a new head")
    qid = state.queue_id
    version = state.version + 1
    start, end = state.start, state.held_end
    entries = state.entries
    base_hash = state.base_hash
    head_hash = state.chain_at(end) or base_hash
    if records:
        chains = chain_extend(head_hash, end, records)
        entries = entries.extend(records, chains)
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
