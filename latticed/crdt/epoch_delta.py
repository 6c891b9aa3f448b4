"""Deltas of the fork core's value (:mod:`latticed.crdt.epochs`): only the leaves a peer lacks.

A peer summarises its log by how many leaves it knows and their fold (:class:`LogSummary`, ~50 bytes).
If our log passes through that fold at that length, the peer shares our history up to there and gets only
the leaves after it and our tips; if not, the histories part below it (or the peer is on another epoch),
and it gets our whole value, which proves the fork to it. Records travel beside it (not here): a delta's
``held_end`` is left out. Joining a delta equals joining the value it came from, without its progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from latticed.crdt import append_compiled
from latticed.crdt.core_errors import EquivocationError, MalformedError
from latticed.crdt.epochs import Chains, Tip, are_leaves, join, start_rank, verify
from latticed.crdt.fold_index import prefix_fold
from latticed.crdt.head2 import HeadV2, Leaf, fold, genesis, next_log
from latticed.crdt.shared_prefix import grown

__all__ = ["LogDelta", "LogSummary", "compiled_append", "delta", "merge", "summary", "vouches"]


@dataclass(frozen=True, slots=True)
class LogSummary:
    """The leaves a replica knows in its epoch: the first ``known`` of them fold to ``fold``."""

    epoch: int
    known: int
    fold: bytes


@dataclass(frozen=True, slots=True)
class LogDelta:
    """``value`` without its first ``base`` shared leaves, which fold to ``base_fold`` (the receiver
    checks it holds them)."""

    base: int
    base_fold: bytes
    value: Chains


def _known(value: Chains) -> Sequence[Leaf]:
    """The leaves every branch of ``value`` holds (all of them, when not forked)."""
    if value.forked or not value.tips:
        return value.shared
    return (*value.shared, value.tips[0].head.leaf())


def summary(value: Chains) -> LogSummary:
    if not value.forked and value.tips:  # verified: the newest head's log folds the leaves before it
        return LogSummary(value.epoch, len(value.shared) + 1, next_log(value.tips[0].head))
    known = _known(value)
    return LogSummary(value.epoch, len(known), fold(genesis(value.queue_id, value.epoch), known))


def delta(value: Chains, since: LogSummary | None) -> LogDelta | None:
    """What a replica summarised by ``since`` lacks of ``value`` (None: nothing). A peer that knows
    more leaves than ours share gets our tips from there on: it checks our shared leaves itself."""
    if not value.tips or (since is not None and since.epoch > value.epoch):
        return None
    origin = genesis(value.queue_id, value.epoch)
    if since is None or since.epoch < value.epoch:
        return LogDelta(0, origin, value)
    base = min(since.known, len(value.shared))
    if base == len(value.shared) and not value.forked:
        base_fold = value.tips[0].head.log  # verified: the newest head's log folds every shared leaf
    else:
        base_fold = prefix_fold(origin, value.shared, base)
    if since.known <= len(value.shared) and base_fold != since.fold:
        return LogDelta(0, origin, value)  # the histories part below what the peer knows: all of it
    return LogDelta(base, base_fold, replace(value, shared=value.shared[base:]))


def merge(value: Chains, piece: LogDelta) -> Chains:
    """``value`` joined with ``piece``, verified first: anything forged raises and changes nothing. A
    piece whose left-out leaves this replica does not hold raises :class:`ValueError` (its history parts
    below them, or it changed since its summary): the sender then sends the whole value.

    A piece that extends an unforked value on one chain is appended: only its own leaves are folded and
    checked (our fold is our head's :func:`next_log`), so a catch-up costs O(leaves sent), not O(log)."""
    appended = _append(value, piece)
    if appended is not None:
        return appended
    known = _known(value) if piece.value.epoch == value.epoch else ()
    origin = genesis(piece.value.queue_id, piece.value.epoch)
    if piece.base > len(known) or _fold_known(value, known, origin, piece.base) != piece.base_fold:
        raise ValueError("a delta that leaves out leaves this replica does not hold")
    whole = replace(piece.value, shared=(*known[: piece.base], *piece.value.shared), held_end=0)
    if (whole.shared, whole.tips, whole.start_head) == (value.shared, value.tips, value.start_head):
        return value  # what we hold (verified when it joined): a chunk's log we already have
    verify(whole)
    return join(value, whole)


def _fold_known(value: Chains, known: Sequence[Leaf], origin: bytes, n: int) -> bytes:
    """``fold(origin, known[:n])``: our newest head's log folds all our shared leaves (verified)."""
    if known and n == len(value.shared) and not value.forked:
        return value.tips[0].head.log
    return prefix_fold(origin, known, n)


def _append(value: Chains, piece: LogDelta) -> Chains | None:
    """``merge`` for a piece that goes on from our newest head (None: not such a piece). Checks what
    :func:`verify` would on the new leaves alone; the result is what :func:`join` gives."""
    new = piece.value
    if value.forked or new.forked or not value.tips or not new.tips or new.epoch != value.epoch:
        return None
    ours = value.tips[0].head
    if piece.base != ours.version or new.tips[0].tail or piece.base_fold != next_log(ours):
        return None
    head, leaves = new.tips[0].head, new.shared
    if new.start_head is None:
        raise EquivocationError("tips that do not branch at the shared leaves")
    # A live push's one head, also its start head, is checked in one C pass where built; whatever it
    # does not confirm is checked below (the same checks), which decides.
    if new.start_head is head and compiled_append(value, piece, head, leaves, ours):
        return _appended(value, new, ours, leaves)
    # The newest head is usually the start head too (the newest of the highest start): checked once.
    for signed in (head,) if new.start_head == head else (head, new.start_head):
        if signed == value.start_head:
            continue  # verified when it joined our value
        signed.verify(value.owner, value.queue_id)
        if signed.epoch != value.epoch:
            raise MalformedError("a head of another epoch")
    if not are_leaves(leaves):
        raise MalformedError("a leaf is a 32-byte digest and an offset")
    if fold(piece.base_fold, leaves) != head.log or head.version != piece.base + len(leaves) + 1:
        raise EquivocationError("leaves that the head's log does not cover")
    ends = [ours.end, *(end for _, end in leaves), head.end]
    if ends != sorted(ends):
        raise EquivocationError("a chain of heads whose end goes back")
    return _appended(value, new, ours, leaves)


def compiled_append(
    value: Chains, piece: LogDelta, head: HeadV2, leaves: Sequence[Leaf], ours: HeadV2
) -> bool:
    """Whether the compiled pass confirms ``piece``'s one head ``head`` (also its start head) with
    ``leaves`` going on from ``ours``, our newest head of ``value``: :func:`merge`'s append path and a
    relay's next version (:mod:`.queue2.next_version`) ask it here, so both check the same fields. False:
    not built, or not confirmed (the caller's own checks decide)."""
    return append_compiled.checked(
        head,
        owner=value.owner,
        queue_id=value.queue_id,
        epoch=value.epoch,
        base=piece.base,
        base_fold=piece.base_fold,
        leaves=leaves,
        ours_end=ours.end,
    )


def _appended(value: Chains, new: Chains, ours: HeadV2, leaves: Sequence[Leaf]) -> Chains:
    """``value`` with the checked piece ``new`` (its ``leaves`` after ``ours``) appended: what
    :func:`join` gives."""
    assert new.start_head is not None  # checked by the caller
    start_head = max(value.start_head, new.start_head, key=start_rank)
    shared = grown(value.shared, (ours.leaf(),), leaves)  # our leaves' list, appended to: O(the push)
    head = new.tips[0].head
    return Chains(value.owner, value.queue_id, value.epoch, shared, (Tip(head),), start_head, value.held_end)


def vouches(value: Chains, body: HeadV2) -> bool:
    """Whether ``body`` (unsigned) is the owner's head of its version in ``value``'s verified log: then
    its chain values vouch for a chunk of records as its signature would (a chunk may end at any head, the
    last one every branch shares included, without a signed checkpoint)."""
    if body.queue_id != value.queue_id or body.epoch != value.epoch or body.version < 1:
        return False
    index, leaf = body.version - 1, body.leaf()
    if index < len(value.shared):
        return value.shared[index] == leaf
    return any(tip.leaves()[index - len(value.shared) :][:1] == (leaf,) for tip in value.tips)
