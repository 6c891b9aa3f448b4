"""Replicas of a v2 queue state (``crdt/queue2``) exchanging deltas in chunks, in any order and from stale
summaries, while an owner's store is copied, both copies write, truncate and set metadata, and the owner
recovers on a node that saw the fork: once every pair has synced, every replica holds the same records,
the same fork flag and the same epoch, which is the join of everything any copy signed."""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from support.queue2_histories import OWNER, empty, extend, step

from latticed.crdt import queue2
from latticed.crdt.core_errors import EquivocationError, GapError
from latticed.crdt.queue2 import QueueState2

NODES = 4
NODE = st.integers(0, NODES - 1)


def send(to: QueueState2, frm: QueueState2, since: queue2.Summary | None, size: int) -> QueueState2:
    """One delta from ``frm`` for ``since``, joined into ``to`` (a delta that does not fit is dropped,
    as a link drops a message it cannot use: a later exchange carries it)."""
    d = queue2.delta(frm, since, max_records=size)
    try:
        return queue2.join_verified(to, queue2.verify_delta(to, d)).state
    except GapError:
        return to


def settle(to: QueueState2, frm: QueueState2, size: int) -> QueueState2:
    """Fresh summaries until nothing changes (whole leaves once, if ours part from theirs)."""
    for _ in range(200):
        after = send(to, frm, queue2.summary(to), size)
        if after == to:
            after = send(to, frm, None, size)
        if after == to and after.bodies == to.bodies:
            return to
        to = after
    raise AssertionError("no fixpoint")


class Copy:
    def __init__(self, node: int, state: QueueState2, tag: bytes) -> None:
        self.node, self.state, self.tag = node, state, tag


class QueueGossip(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.copies = [Copy(0, extend(empty(), [("offer", 2)], b"s")[-1], b"a")]
        self.nodes = [empty() for _ in range(NODES)]
        self.seen: list[queue2.Summary | None] = [None] * NODES
        self.everything = empty()
        self._publish(self.copies[0])

    def _publish(self, copy: Copy) -> None:
        self.nodes[copy.node] = settle(self.nodes[copy.node], copy.state, 1000)
        self.everything = queue2.join(self.everything, copy.state)

    @rule(which=st.integers(0, 3), s=step)
    def write(self, which: int, s: tuple[str, int]) -> None:
        copy = self.copies[which % len(self.copies)]
        copy.state = extend(copy.state, [s], copy.tag)[-1]
        self._publish(copy)

    @precondition(lambda self: len(self.copies) < 3)
    @rule(which=st.integers(0, 3), node=NODE)
    def copy_the_store(self, which: int, node: int) -> None:
        source = self.copies[which % len(self.copies)]
        self.copies.append(Copy(node, source.state, b"bcd"[len(self.copies) - 1 : len(self.copies)]))

    @rule(node=NODE, keep_mine=st.booleans())
    def owner_recovers(self, node: int, keep_mine: bool) -> None:
        frozen = self.nodes[node]
        here = [c for c in self.copies if c.node == node]
        if not frozen.forked or not here:
            return
        try:
            queue2.commit(frozen, OWNER, now_ms=0)
            raise AssertionError("a frozen queue signed a head")
        except EquivocationError:
            pass
        mine = here[0].state
        lost = mine.records()[max(0, frozen.held[1] - mine.held[0]) :] if keep_mine else []
        try:
            here[0].state = queue2.recover(frozen, OWNER, now_ms=10_000, keep_mine=lost)
        except GapError:
            return  # not caught up to the fork point yet
        self._publish(here[0])

    @rule(to=NODE, frm=NODE, size=st.integers(1, 4), stale=st.booleans())
    def sync(self, to: int, frm: int, size: int, stale: bool) -> None:
        """One chunk from ``frm`` for ``to``'s summary (or an older one it sent before)."""
        since = self.seen[to] if stale else queue2.summary(self.nodes[to])
        self.seen[to] = queue2.summary(self.nodes[to])
        self.nodes[to] = send(self.nodes[to], self.nodes[frm], since, size)

    def teardown(self) -> None:
        for _ in range(2):
            for to in range(NODES):
                for frm in range(NODES):
                    self.nodes[to] = settle(self.nodes[to], self.nodes[frm], 3)
        for node in self.nodes:
            assert node == self.everything
            assert node.forked == self.everything.forked and node.records() == self.everything.records()


QueueGossip.TestCase.settings = settings(
    max_examples=int(os.environ.get("QUEUE2_GOSSIP_EXAMPLES", "200")), stateful_step_count=30, deadline=None
)
test_queue2_gossip = QueueGossip.TestCase
