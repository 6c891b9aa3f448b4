"""What a replica knows of one queue's chain of v2 heads, and where a forked queue is frozen.

An honest owner's heads form one chain; a replica knows a prefix of it (the leaves of every version up to
its newest head, :mod:`latticed.crdt.head2`). What replicas saw together forms a tree of such chains, kept
cut at its first branching: the ``shared`` leaves and one :class:`Tip` per branch past them (its newest
signed head, the leaves from the branch on). Two or more tips: the owner signed two histories, a proof
anyone can check with its key (:func:`verify`), and the queue is frozen at the end of the last shared head
(:attr:`Chains.fork_point`): its records are ``[start, fork point)``, ``start`` the highest signed start.

The cut of a union of trees is the cut of the union of their cuts, so :func:`join` (cut of the union, the
highest ``(start, version, bytes)`` head, the furthest held end below the bound) is commutative,
associative and idempotent; a higher epoch (the owner's recovery) supersedes every lower one whole.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from operator import itemgetter

from latticed.crdt.core_errors import EquivocationError, MalformedError, WrongOwnerError
from latticed.crdt.fold_compiled import all_leaves
from latticed.crdt.fold_index import prefix_fold
from latticed.crdt.head2 import HeadV2, Leaf, fold, genesis, is_leaf

__all__ = ["Chains", "Tip", "empty", "join", "replica", "start_rank", "verify"]


@dataclass(frozen=True, slots=True)
class Tip:
    """A branch past the shared leaves: its newest signed head and the unsigned leaves between (the
    head's ``log`` folds over them, so its signature covers them)."""

    head: HeadV2
    tail: tuple[Leaf, ...] = ()

    def leaves(self) -> tuple[Leaf, ...]:
        return (*self.tail, self.head.leaf())


@dataclass(frozen=True, slots=True)
class Chains:
    """One replica's knowledge of a queue's heads in its newest epoch, and how far it holds records."""

    owner: bytes
    queue_id: bytes
    epoch: int = 0
    shared: Sequence[Leaf] = ()  #: a tuple, or a Grown that later values extend (shared_prefix.py)
    tips: tuple[Tip, ...] = ()
    start_head: HeadV2 | None = None  #: the head with the highest signed start seen
    held_end: int = 0  #: records held: ``[start, held_end)`` (a replica's progress)

    @property
    def forked(self) -> bool:
        return len(self.tips) > 1

    @property
    def fork_point(self) -> int | None:
        """The end of the last head every branch shares (0 if they part at an epoch's first head)."""
        return (self.shared[-1][1] if self.shared else 0) if self.forked else None

    @property
    def start(self) -> int:
        return 0 if self.start_head is None else self.start_head.start

    @property
    def upper(self) -> int:
        """The end of what may be held: the fork point if frozen, else the newest head's end."""
        point = self.fork_point
        return point if point is not None else (self.tips[0].head.end if self.tips else 0)

    @property
    def held(self) -> tuple[int, int]:
        """The records this value consists of: nothing past the fork point, nothing below the start.
        (``start`` and ``upper`` inlined: a relay asks a push's values for it a few times each.)"""
        head, tips = self.start_head, self.tips
        start = 0 if head is None else head.start
        if len(tips) > 1:
            upper = self.shared[-1][1] if self.shared else 0
        else:
            upper = tips[0].head.end if tips else 0
        return start, max(start, min(self.held_end, upper))


_END = itemgetter(1)


def empty(owner: bytes, queue_id: bytes) -> Chains:
    return Chains(owner, queue_id)


def replica(owner: bytes, head: HeadV2, log: tuple[Leaf, ...], held_end: int) -> Chains:
    """The value of a replica holding ``head``, the leaves of the versions before it and records up to
    ``held_end``."""
    return Chains(owner, head.queue_id, head.epoch, log, (Tip(head),), head, min(held_end, head.end))


def _rank(head: HeadV2) -> tuple[int, bytes]:
    return head.version, head.to_bytes()


def start_rank(head: HeadV2 | None) -> tuple[int, int, bytes]:
    """How the value picks its start head: the highest signed start, then the newest."""
    return (-1, 0, b"") if head is None else (head.start, head.version, head.to_bytes())


def _split(branches: list[tuple[tuple[Leaf, ...], HeadV2]]) -> int | None:
    """The first index at which two branches hold different leaves (None: all lie on one chain)."""
    pairs = itertools.combinations((leaves for leaves, _ in branches), 2)
    firsts = (next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None) for x, y in pairs)
    return min((i for i in firsts if i is not None), default=None)


def join(a: Chains, b: Chains) -> Chains:
    """The least value above both (both verified, of one queue)."""
    if (a.owner, a.queue_id) != (b.owner, b.queue_id):
        raise WrongOwnerError("joining values of two queues")
    if not a.tips or not b.tips or a.epoch != b.epoch:
        return max(a, b, key=lambda c: (bool(c.tips), c.epoch))
    branches = [((*x.shared, *t.leaves()), t.head) for x in (a, b) for t in x.tips]
    split = _split(branches)
    tips: tuple[Tip, ...]
    if split is None:
        leaves, head = max(branches, key=lambda branch: (len(branch[0]), _rank(branch[1])))
        shared, tips = leaves[:-1], (Tip(head),)
    else:
        best: dict[Leaf, tuple[tuple[Leaf, ...], HeadV2]] = {}
        for leaves, head in branches:
            if len(leaves) > split:
                kept = best.get(leaves[split])
                if kept is None or _rank(head) > _rank(kept[1]):
                    best[leaves[split]] = (leaves, head)
        shared = next(iter(best.values()))[0][:split]
        tips = tuple(Tip(head, leaves[split:-1]) for _, (leaves, head) in sorted(best.items()))
    start_head = max(a.start_head, b.start_head, key=start_rank)
    value = Chains(a.owner, a.queue_id, a.epoch, shared, tips, start_head)
    return replace(value, held_end=min(max(a.held_end, b.held_end), value.upper))


def verify(value: Chains) -> None:
    """Raise unless every head is the owner's and every leaf is covered by a signature: then a forked
    value proves the fork to anyone (:class:`EquivocationError` for a value in no normal form).
    ``held_end`` is a replica's progress, not checked here: the records it claims verify on their own."""
    for head in [t.head for t in value.tips] + ([] if value.start_head is None else [value.start_head]):
        head.verify(value.owner, value.queue_id)
        if head.epoch != value.epoch:
            raise MalformedError("a head of another epoch")
    if not are_leaves(value.shared) or not are_leaves([leaf for tip in value.tips for leaf in tip.tail]):
        raise MalformedError("a leaf is a 32-byte digest and an offset")
    base = prefix_fold(genesis(value.queue_id, value.epoch), value.shared, len(value.shared))
    for tip in value.tips:
        if fold(base, tip.tail) != tip.head.log or len(value.shared) + len(tip.leaves()) != tip.head.version:
            raise EquivocationError("leaves that the head's log does not cover")
        ends = list(map(_END, itertools.chain(value.shared, tip.leaves())))  # checked leaves: (digest, end)
        if ends != sorted(ends):
            raise EquivocationError("a chain of heads whose end goes back")
    firsts = [tip.leaves()[0] for tip in value.tips]
    if (value.tips and value.start_head is None) or firsts != sorted(set(firsts)):
        raise EquivocationError("tips that do not branch at the shared leaves")
    if not value.forked and value.tips and value.tips[0].tail:
        raise EquivocationError("an unforked value keeps its leaves shared")


def are_leaves(items: Sequence[Leaf]) -> bool:
    """Whether every item is a leaf (:func:`~latticed.crdt.head2.is_leaf`; one C pass where built)."""
    found = all_leaves(items if type(items) in (tuple, list) else tuple(items))
    return found if found is not None else all(map(is_leaf, items))
