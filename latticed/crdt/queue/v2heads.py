"""A queue state's heads in the v2 layout, signed beside its v1 heads: the bridge from today's queue to
the fork core of :mod:`latticed.crdt.epochs` (docs/lattice.md, "Forks under v2 heads").

Nothing on the daemon's paths calls this yet: a queue state that keeps v2 heads comes behind the
``heads-v2`` protocol feature. It lets the core be checked against real queue histories now.
"""

from __future__ import annotations

from collections.abc import Sequence

from latticed.crdt import epochs
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head import meta_hash
from latticed.crdt.head2 import HeadV2, genesis, next_log
from latticed.crdt.queue.state import QueueState
from latticed.crdt.signing import Identity

__all__ = ["chains_of", "recover", "sign_v2"]


def sign_v2(state: QueueState, identity: Identity, prev: HeadV2 | None, *, epoch: int = 0) -> HeadV2:
    """The v2 head of ``state``'s newest head, next after ``prev`` (None: ``epoch``'s first head)."""
    head = state.head
    if head is None:
        raise MalformedError("an empty queue has no head to sign")
    if prev is not None and prev.epoch != epoch:
        raise MalformedError("a head follows one of its own epoch")
    version, log = (1, genesis(head.queue_id, epoch)) if prev is None else (prev.version + 1, next_log(prev))
    body = HeadV2(
        head.queue_id,
        epoch,
        version,
        log,
        head.start,
        head.end,
        head.base_hash,
        head.head_hash,
        head.meta_version,
        head.meta_hash,
        head.timestamp,
    )
    return body.signed(identity)


def chains_of(state: QueueState, heads: Sequence[HeadV2]) -> epochs.Chains:
    """The fork core's value of a replica holding ``state`` and ``heads``, its epoch's v2 heads in order."""
    newest = heads[-1]
    log = tuple(h.leaf() for h in heads[:-1] if h.epoch == newest.epoch)
    return epochs.replica(state.owner, newest, log, state.held_end)


def recover(state: QueueState, frozen: epochs.Chains, identity: Identity, now_ms: int) -> HeadV2:
    """The owner's first head of the next epoch: the queue goes on from ``frozen``'s start and fork point
    with the metadata ``state`` (the owner's own history) holds. ``state`` must hold the chain values
    there (its records up to the fork point, or the start itself)."""
    point = frozen.fork_point
    if point is None:
        raise MalformedError("only a forked queue is recovered")
    start = frozen.start
    end = max(start, point)
    base, top = state.chain_at(start), state.chain_at(end)
    if base is None or top is None:
        raise MalformedError(f"this replica does not hold the records [{start}, {end}) it would vouch for")
    body = HeadV2(
        state.queue_id,
        frozen.epoch + 1,
        1,
        genesis(state.queue_id, frozen.epoch + 1),
        start,
        end,
        base,
        top,
        1,
        meta_hash(state.meta_dict),
        now_ms,
    )
    return body.signed(identity)
