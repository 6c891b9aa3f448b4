"""A queue of fork core 1 (v1 heads, :mod:`latticed.crdt.queue`) continued on core 2: the owner signs
version 1 of epoch :data:`CONVERTED_EPOCH` over the records it holds, and a replica keeps its own records
under that head when they reach the chain values it signs.

Both cores chain records alike, so offsets and chain values do not change: a reader goes on where it was.
Core 1's whole history counts as epoch 0, which any head of epoch 1 supersedes; a forked core-1 queue
(a v1 :class:`~latticed.crdt.forks.ForkProof`) is converted from its fork point, as ``queue recover``
continues a frozen core-2 queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from latticed.crdt import epochs
from latticed.crdt.core_errors import MalformedError, NotOwnerError
from latticed.crdt.epoch_delta import vouches
from latticed.crdt.epochs import Chains
from latticed.crdt.forks import signed_chain_values
from latticed.crdt.head import meta_hash
from latticed.crdt.head2 import HeadV2, genesis
from latticed.crdt.queue.state import Meta, QueueState
from latticed.crdt.queue2.chain_state import QueueState2, keep_bodies
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity

__all__ = ["CONVERTED_EPOCH", "converted", "fork_point", "seeded"]

#: The epoch of a converted queue's first v2 head (core 1's history is epoch 0).
CONVERTED_EPOCH: Final = 1


def fork_point(state: QueueState) -> int | None:
    """Where a forked core-1 queue's two histories part (None if not forked), within what ``state``
    holds: the proof's first differing offset, or for two heads that conflict on their own, the highest
    offset at which both sign the same chain value or the owner's last head before their version ends.
    The owner's records below it are what its new epoch vouches for; the rest are set aside."""
    if not state.forked:
        return None
    lo, hi = state.start, state.held_end
    proof = state.fork
    if proof is None:
        point = lo
    elif proof.offset >= 0:
        point = proof.offset
    else:
        a, b = signed_chain_values(proof.a), signed_chain_values(proof.b)
        point = max((o for o, value in a.items() if b.get(o) == value), default=lo)
        # Two heads of one version: both histories went on from the owner's head before that version
        # (a copy of its store signs the same next version), the newest such head this replica kept.
        below = min(proof.a.version, proof.b.version)
        kept = (h for h in (*state.checkpoints, state.tip, state.head) if h is not None and h.version < below)
        point = max([point, *(h.end for h in kept if state.chain_at(h.end) == h.head_hash)])
    return min(max(point, lo), hi)


def converted(
    state: QueueState, identity: Identity, now_ms: int, *, upto: int | None = None
) -> tuple[QueueState2, tuple[Record, ...]]:
    """The owner's core-1 ``state`` as a core-2 value holding its records ``[start, upto)`` (``upto``
    None: all it holds) under version 1 of epoch 1, and the records past ``upto`` it leaves out."""
    if identity.public_key != state.owner:
        raise NotOwnerError(f"not the owner of {state.owner.hex()}/{state.name}")
    if state.head is None:
        raise MalformedError("a queue without a signed head has nothing to convert")
    start, held = state.start, state.held_end
    end = held if upto is None else upto
    if not start <= end <= held:
        raise MalformedError(f"cannot convert up to {end}: this daemon holds [{start}, {held})")
    base, top = state.chain_at(start), state.chain_at(end)
    assert base is not None and top is not None
    qid = state.queue_id
    body = HeadV2(
        qid,
        CONVERTED_EPOCH,
        1,
        genesis(qid, CONVERTED_EPOCH),
        start,
        end,
        base,
        top,
        1,
        meta_hash(state.meta_dict),
        max(now_ms, state.head.timestamp),
    )
    head = body.signed(identity)
    chains = epochs.replica(state.owner, head, (), end)
    value = QueueState2(
        state.owner,
        state.name,
        state.kind,
        chains,
        state.meta,
        state.entries.take(end - start),  # type: ignore[arg-type]
        (head,) if end > start else (),
    )
    rest = tuple(state.entries.records(end - start)) if held > end else ()
    return value, rest


def seeded(state: QueueState, chains: Chains, meta: Meta, bodies: Sequence[HeadV2] = ()) -> QueueState2:
    """A replica's core-1 ``state`` as a core-2 value under ``chains`` (verified, of a later epoch):
    its records from the signed start up to the furthest head on the log (a tip, the start head, or one
    of ``bodies``) whose chain value they reach; none if they do not pass through the start's."""
    held = replace(chains, held_end=chains.start)
    value = QueueState2(state.owner, state.name, state.kind, held, meta)
    head = chains.start_head
    lo = chains.start
    if head is None or state.chain_at(lo) != head.base_hash:
        return value
    top = min(state.held_end, chains.upper)
    candidates = (*(tip.head for tip in chains.tips), head, *bodies)
    reached = [
        h
        for h in candidates
        if lo < h.end <= top and vouches(chains, h) and state.chain_at(h.end) == h.head_hash
    ]
    if not reached:
        return value
    voucher = max(reached, key=lambda h: (h.end, h.version))
    end = voucher.end
    entries = state.entries.drop(lo - state.start).take(end - lo)
    chains = replace(chains, held_end=end)
    return replace(
        value,
        chains=chains,
        entries=entries,  # type: ignore[arg-type]
        bodies=keep_bodies(chains, (voucher, *bodies)),
    )
