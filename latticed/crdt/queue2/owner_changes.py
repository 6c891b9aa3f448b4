"""The owner's changes to its queue under v2 heads: :func:`commit` (append, truncate, set metadata: one
signed head per batch, or per slice of ``checkpoint_bytes``), and :func:`recover`, which starts the next
epoch of a forked queue from its fork point.

A forked queue is frozen: the owner cannot know which history its own key meant, so it signs nothing in
that epoch (:class:`~latticed.crdt.core_errors.EquivocationError`) until it recovers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from latticed.crdt import epochs
from latticed.crdt.core_errors import EquivocationError, GapError, MalformedError, NotOwnerError
from latticed.crdt.epochs import Chains, Tip
from latticed.crdt.head import meta_hash
from latticed.crdt.head2 import HeadV2, genesis, next_log
from latticed.crdt.queue.commit import CHECKPOINT_BYTES, checkpoint_cuts
from latticed.crdt.queue.state import Meta, empty_entries
from latticed.crdt.queue2.chain_state import QueueState2, bodies_between
from latticed.crdt.records import MAX_OFFSET, Record, blake2b_skip, chain_extend, check_records
from latticed.crdt.shared_prefix import grown
from latticed.crdt.signing import Identity

__all__ = ["commit", "recover", "truncate"]


def commit(
    state: QueueState2,
    identity: Identity,
    *,
    now_ms: int,
    records: Sequence[Record] = (),
    new_start: int | None = None,
    meta_updates: Mapping[str, str | None] | None = None,
    checkpoint_bytes: int = CHECKPOINT_BYTES,
) -> QueueState2:
    """The owner's changes signed as the next v2 head (a slice of ``checkpoint_bytes`` of payload gets a
    head of its own, so chunks of a catch-up stay bounded). Refused on a frozen queue, by anyone but the
    owner, and by an owner that does not hold its queue's records up to its newest head."""
    if identity.public_key != state.owner:
        raise NotOwnerError(f"not the owner of {state.owner.hex()}/{state.name}")
    if state.forked:
        raise EquivocationError("the queue is frozen at its fork point: recover it first")
    tips = state.chains.tips
    if tips and state.held[1] != tips[0].head.end:
        raise GapError("the owner's state is missing records; it cannot sign a new head")
    check_records(records)
    if state.held[1] + len(records) > MAX_OFFSET or (new_start is not None and new_start > MAX_OFFSET):
        raise MalformedError(f"offsets stop at {MAX_OFFSET}")
    meta = _meta_after(state.meta, meta_updates)
    first = 0
    for end in checkpoint_cuts(records, checkpoint_bytes):
        state = _sign(state, identity, now_ms, records[first:end], new_start=None, meta=state.meta)
        first = end
    return _sign(state, identity, now_ms, records[first:], new_start=new_start, meta=meta)


def truncate(state: QueueState2, identity: Identity, new_start: int, *, now_ms: int) -> QueueState2:
    return commit(state, identity, now_ms=now_ms, new_start=new_start)


def _meta_after(meta: Meta, updates: Mapping[str, str | None] | None) -> Meta:
    merged = dict(meta)
    for key, value in (updates or {}).items():
        if not isinstance(key, str) or not key:
            raise MalformedError("metadata keys are non-empty strings")
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, str):
            merged[key] = value
        else:
            raise MalformedError(
                f"metadata values are strings (or None to delete), not {type(value).__name__}"
            )
    return tuple(sorted(merged.items()))


def _sign(
    state: QueueState2,
    identity: Identity,
    now_ms: int,
    records: Sequence[Record],
    *,
    new_start: int | None,
    meta: Meta,
) -> QueueState2:
    """One head over ``records`` and the other changes, and the owner's state under it."""
    chains, prev = state.chains, (state.chains.tips[0].head if state.chains.tips else None)
    start, end = state.held
    base, top = state.base_hash, state.chain_at(end) or state.base_hash
    entries = state.entries
    if records:
        chain = chain_extend(top, end, records)
        entries, end, top = entries.extend(records, chain), end + len(records), chain[-1]
    if new_start is not None and new_start > start:
        if new_start >= end:
            if new_start > end:  # offsets in [end, new_start) are never assigned
                top, end = blake2b_skip(top, new_start), new_start
            entries, base = empty_entries(), top
        else:
            base, entries = entries.chain(new_start - start - 1), entries.drop(new_start - start)
        start = new_start
    meta_version = prev.meta_version if prev else 0
    version = prev.version + 1 if prev else 1
    if meta != state.meta:
        meta_version = version
    body = HeadV2(
        state.queue_id,
        chains.epoch,
        version,
        next_log(prev) if prev else genesis(state.queue_id, chains.epoch),
        start,
        end,
        base,
        top,
        meta_version,
        meta_hash(dict(meta)),
        max(now_ms, prev.timestamp if prev else 0),
    )
    head = body.signed(identity)
    # The leaves and bodies are the previous value's lists appended to (shared_prefix.grown): a commit
    # costs what it adds, not the queue's versions; a truncation that drops bodies builds a new list.
    shared = grown(chains.shared, (prev.leaf(),)) if prev else ()
    value = Chains(state.owner, state.queue_id, chains.epoch, shared, (Tip(head),), head, end)
    bodies: Sequence[HeadV2] = ()
    if end > start:
        kept = state.bodies
        if kept and (kept[0].end <= start or kept[-1].end > end):  # sorted by end: a truncation cut some
            kept = bodies_between(kept, start, end)
        bodies = grown(kept, (head,))
    # The constructor, not dataclasses.replace (~0.8 µs more, a head a batch); ``memo`` starts afresh.
    return QueueState2(state.owner, state.name, state.kind, value, meta, entries, bodies)


def recover(
    state: QueueState2, identity: Identity, *, now_ms: int, keep_mine: Sequence[Record] = ()
) -> QueueState2:
    """The owner's next epoch of a frozen queue: version 1 signs the frozen records ``[start, fork point)``
    and supersedes every head of the forked epoch everywhere; ``keep_mine`` (records this daemon wrote
    past the fork point, kept aside as evidence) are offered again as new records of the new epoch."""
    point = state.chains.fork_point
    if point is None:
        raise MalformedError("only a forked queue is recovered")
    start, end = state.held
    if end != max(start, point):
        raise GapError(f"catch up to the fork point first: holds [{start}, {end}), frozen at {point}")
    epoch = state.chains.epoch + 1
    top = state.chain_at(end)
    assert top is not None
    body = HeadV2(
        state.queue_id,
        epoch,
        1,
        genesis(state.queue_id, epoch),
        start,
        end,
        state.base_hash,
        top,
        1,
        meta_hash(dict(state.meta)),
        now_ms,
    )
    head = body.signed(identity)
    value = epochs.replica(state.owner, head, (), end)
    recovered = replace(state, chains=value, bodies=(head,) if end > start else ())
    if keep_mine:
        recovered = commit(recovered, identity, now_ms=now_ms, records=keep_mine)
    return recovered
