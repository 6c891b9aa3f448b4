"""Replicas of the v2 fork core gossiping deltas (``crdt/epoch_delta.py``) while an owner's store is
copied, both copies write, truncate and set metadata, and an owner recovers: whenever every pair has
synced, every replica holds the join of everything any copy signed, so all flag the same fork, freeze at
the same point and follow the same epoch."""

from __future__ import annotations

import dataclasses
import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from latticed.crdt import epoch_delta, epochs
from latticed.crdt.epochs import Chains, join
from latticed.crdt.head import meta_hash, queue_id
from latticed.crdt.head2 import HeadV2, Leaf, genesis, next_log
from latticed.crdt.signing import Identity, blake2b

OWNER = Identity.from_seed(bytes(range(32)))
QID = queue_id(OWNER.public_key, "q")
NODES = 4
NODE = st.integers(0, NODES - 1)


def _hash(*parts: object) -> bytes:
    return blake2b(repr(parts).encode(), b"test.chain")


class Copy:
    """One running copy of the owner's store: its heads in the current epoch, on one node."""

    def __init__(self, node: int, heads: list[HeadV2], tag: int) -> None:
        self.node, self.heads, self.tag = node, heads, tag

    def value(self) -> Chains:
        head = self.heads[-1]
        log: tuple[Leaf, ...] = tuple(h.leaf() for h in self.heads[:-1])
        return epochs.replica(OWNER.public_key, head, log, head.end)

    def sign(self, kind: str, arg: int, now: int) -> None:
        prev = self.heads[-1]
        start, end, meta = prev.start, prev.end, (prev.meta_version, prev.meta_hash)
        if kind == "offer":
            end += arg
        elif kind == "truncate":
            start = min(end, start + arg)
        elif kind == "meta":
            meta = (prev.version + 1, meta_hash({"k": f"{self.tag}.{arg}"}))
        base, top = _hash(self.tag, prev.epoch, start), _hash(self.tag, prev.epoch, end)
        body = HeadV2(QID, prev.epoch, prev.version + 1, next_log(prev), start, end, base, top, *meta, now)
        self.heads.append(body.signed(OWNER))


class ForkGossip(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        first = HeadV2(QID, 0, 1, genesis(QID, 0), 0, 0, _hash(0), _hash(0), 0, meta_hash({}), 0)
        self.copies = [Copy(0, [first.signed(OWNER)], 0)]
        self.nodes: list[Chains] = [epochs.empty(OWNER.public_key, QID) for _ in range(NODES)]
        self.everything = epochs.empty(OWNER.public_key, QID)
        self.clock = 1
        self._publish(self.copies[0])

    def _publish(self, copy: Copy) -> None:
        value = copy.value()
        self.nodes[copy.node] = join(self.nodes[copy.node], value)
        self.everything = join(self.everything, value)

    @rule(
        which=st.integers(0, 3),
        kind=st.sampled_from(["offer", "truncate", "meta", "touch"]),
        arg=st.integers(0, 3),
    )
    def write(self, which: int, kind: str, arg: int) -> None:  # fmt: skip
        copy = self.copies[which % len(self.copies)]
        self.clock += 1
        copy.sign(kind, arg, self.clock)
        self._publish(copy)

    @precondition(lambda self: len(self.copies) < 3)
    @rule(which=st.integers(0, 3), node=NODE)
    def copy_the_store(self, which: int, node: int) -> None:
        """A restored backup or a copied data directory starts on ``node`` and writes on its own."""
        source = self.copies[which % len(self.copies)]
        self.copies.append(Copy(node, list(source.heads), len(self.copies)))

    @rule(node=NODE)
    def owner_recovers(self, node: int) -> None:
        """A copy on a node that holds a frozen value starts the next epoch from it."""
        frozen = self.nodes[node]
        here = [c for c in self.copies if c.node == node]
        if not frozen.forked or not here:
            return
        point = max(frozen.start, frozen.fork_point or 0)
        epoch = frozen.epoch + 1
        body = HeadV2(QID, epoch, 1, genesis(QID, epoch), frozen.start, point, _hash(0, epoch, frozen.start),
                      _hash(0, epoch, point), 1, meta_hash({}), self.clock)  # fmt: skip
        here[0].heads = [body.signed(OWNER)]
        self._publish(here[0])

    @rule(to=NODE, frm=NODE, stale=st.booleans())
    def sync(self, to: int, frm: int, stale: bool) -> None:
        """``frm`` sends ``to`` what ``to``'s summary lacks (or, stale, what an older summary lacked)."""
        receiver = self.nodes[to]
        since = epoch_delta.summary(epochs.empty(OWNER.public_key, QID) if stale else receiver)
        piece = epoch_delta.delta(self.nodes[frm], since)
        if piece is None:
            return
        try:
            self.nodes[to] = epoch_delta.merge(receiver, piece)
        except ValueError:
            whole = epoch_delta.delta(self.nodes[frm], None)
            assert whole is not None
            self.nodes[to] = epoch_delta.merge(receiver, whole)

    def teardown(self) -> None:
        for _ in range(2):
            for to in range(NODES):
                for frm in range(NODES):
                    self.sync(to, frm, False)
        # Records travel beside these deltas, so how far each replica holds them is left out here.
        expected = dataclasses.replace(self.everything, held_end=0)
        for node in self.nodes:
            assert dataclasses.replace(node, held_end=0) == expected


ForkGossip.TestCase.settings = settings(
    max_examples=int(os.environ.get("FORK_GOSSIP_EXAMPLES", "300")), stateful_step_count=40, deadline=None
)
test_fork_gossip = ForkGossip.TestCase
