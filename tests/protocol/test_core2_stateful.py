"""Core-2 queues (``crdt/queue2``) over the real sans-IO replication sessions, driven by hypothesis: any
order of delivery and of the hosts' work, links that break and come back (agreeing on ``heads-v2`` at
once or later), daemons that restart, an owner whose store is copied so two or three copies write their
own histories (records, truncations, metadata), and the owner's recovery on a node that saw the fork.

Whenever the network goes quiet with every link up and agreed, every host holds the same value of each
queue, which is the join of everything any copy signed: the same records, frozen at the same fork point,
the same epoch, the same branches; all flag the fork. No exceptions. ``CORE2_STATEFUL_EXAMPLES`` and
``CORE2_STATEFUL_STEPS`` set the number of examples and steps (100 and 50 by default).

A message is never dropped on its own: sessions run over TCP, where a loss breaks the connection, which
is what ``link_breaks`` does.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.core2_sim import Core2Network
from support.queue2_histories import OWNER, Step, extend, step

from latticed.crdt import queue2
from latticed.crdt.core_errors import EquivocationError, GapError
from latticed.crdt.queue2 import QueueState2
from latticed.protocol.replication import QueueKey
from latticed.protocol.versions import HEADS_V2

NODES = 4
TOPOLOGY = ((0, 1), (1, 2), (2, 3), (3, 0), (0, 2))
LINKS = st.sampled_from(TOPOLOGY)
DIRECTED = st.sampled_from([*TOPOLOGY, *((b, a) for a, b in TOPOLOGY)])
NODE = st.integers(0, NODES - 1)
#: "q" is written by copies of the owner's store (it forks); "r" only by the owner's first copy.
QUEUES = ("q", "r")
FEATURES = frozenset({HEADS_V2})


class Copy:
    """One copy of the owner's store: where it runs, what it signed last of each queue, its records' tag."""

    def __init__(self, node: int, states: dict[str, QueueState2], tag: bytes) -> None:
        self.node, self.states, self.tag = node, states, tag


class Core2Replication(RuleBasedStateMachine):
    #: The sessions' graft timer (see Core2ReplicationWithGraftTimer).
    GRAFT_TIMEOUT = 0.0
    #: What every link agrees on (see Core2ReplicationCompact).
    FEATURES = FEATURES

    def __init__(self) -> None:
        super().__init__()
        self.net = Core2Network(
            window=3,
            depth=2,
            max_records=2,
            features=self.FEATURES,
            agree_at_start=False,
            graft_timeout=self.GRAFT_TIMEOUT,
        )
        for name in range(NODES):
            self.net.add(name)
        for a, b in TOPOLOGY:
            self.net.connect(a, b)
            self.net.agree(a, b)
        first = {queue: queue2.empty_state(OWNER.public_key, queue) for queue in QUEUES}
        self.copies = [Copy(0, first, b"a")]
        #: The join of everything any copy signed, per queue: what every host must hold in the end.
        self.everything: dict[QueueKey, QueueState2] = {}
        for queue in QUEUES:  # a history to start from, so short runs fork and catch up too
            first[queue] = extend(first[queue], [("offer", 3)], b"s")[-1]
            self._publish(self.copies[0], queue)

    def _publish(self, copy: Copy, name: str) -> None:
        state = copy.states[name]
        key = (state.owner, state.name, state.kind)
        self.net.node2(copy.node).put2(state)
        seen = self.everything.get(key)
        self.everything[key] = state if seen is None else queue2.join(seen, state)

    # ------------------------------------------------------------------ the owner and its copies
    @initialize(others=st.lists(NODE, max_size=2), steps=st.lists(step, min_size=3, max_size=3))
    def stores_copied_at_start(self, others: list[int], steps: list[Step]) -> None:
        """Copies of the owner's store already run on ``others`` and each wrote a step (most runs then
        fork)."""
        for node in others:
            self.store_is_copied(0, node)
        for which, s in enumerate(steps[: len(self.copies)]):
            self.copy_writes(which, "q", s)

    @rule(which=st.integers(0, 2), queue=st.sampled_from(QUEUES), s=step)
    def copy_writes(self, which: int, queue: str, s: Step) -> None:
        copy = self.copies[which % len(self.copies)] if queue == "q" else self.copies[0]
        copy.states[queue] = extend(copy.states[queue], [s], copy.tag)[-1]
        self._publish(copy, queue)

    @precondition(lambda self: len(self.copies) < 3)
    @rule(which=st.integers(0, 2), node=NODE)
    def store_is_copied(self, which: int, node: int) -> None:
        """A copy of a copy's data directory starts on ``node`` and writes from there on."""
        source = self.copies[which % len(self.copies)]
        tag = b"bc"[len(self.copies) - 1 : len(self.copies)]
        self.copies.append(Copy(node, {"q": source.states["q"]}, tag))

    @rule(which=st.integers(0, 2), keep_mine=st.booleans())
    def owner_recovers(self, which: int, keep_mine: bool) -> None:
        """A copy's daemon recovers the frozen queue its node holds (refused until it is caught up to
        the fork point), keeping its own records from past it or not."""
        copy = self.copies[which % len(self.copies)]
        frozen = self.net.node2(copy.node).states2.get((OWNER.public_key, "q", 0))
        if frozen is None or not frozen.forked:
            return
        try:
            queue2.commit(frozen, OWNER, now_ms=0)
            raise AssertionError("a frozen queue signed a head")
        except EquivocationError:
            pass
        mine = copy.states["q"]
        lost = mine.records()[max(0, frozen.held[1] - mine.held[0]) :] if keep_mine else []
        try:
            copy.states["q"] = queue2.recover(
                frozen, OWNER, now_ms=10_000 + frozen.chains.epoch, keep_mine=lost
            )
        except GapError:
            return
        self._publish(copy, "q")

    @rule(which=st.integers(0, 2), keep_mine=st.booleans())
    def quiet_then_owner_recovers(self, which: int, keep_mine: bool) -> None:
        """The network settles (so the copy's node holds the frozen records), then the copy recovers."""
        self._converge()
        self.owner_recovers(which, keep_mine)

    # ------------------------------------------------------------------ the network
    @rule(link=DIRECTED, count=st.integers(1, 4))
    def deliver(self, link: tuple[int, int], count: int) -> None:
        if self.net.connected(*link):
            self.net.deliver(*link, count, handle=False)

    @rule(link=DIRECTED)
    def host_handles(self, link: tuple[int, int]) -> None:
        self.net.handle(*link)

    @rule(link=LINKS)
    def link_breaks(self, link: tuple[int, int]) -> None:
        self.net.disconnect(*link)

    @rule(link=LINKS, agree_now=st.booleans())
    def link_comes_back(self, link: tuple[int, int], agree_now: bool) -> None:
        """Redialled; its features are agreed at once or, later, by ``link_agrees``."""
        if not self.net.connected(*link):
            self.net.connect(*link)
            if agree_now:
                self.net.agree(*link)

    @rule(link=LINKS)
    def link_agrees(self, link: tuple[int, int]) -> None:
        if self.net.connected(*link):
            self.net.agree(*link)

    @rule(node=NODE)
    def daemon_restarts(self, node: int) -> None:
        for peer in self.net.restart(node):
            self.net.connect(node, peer)
            self.net.agree(node, peer)

    @rule()
    def clocks_move(self) -> None:
        self.net.tick_all()

    @rule()
    def network_goes_quiet(self) -> None:
        self._converge()

    # ------------------------------------------------------------------ what must hold
    @invariant()
    def windows_hold(self) -> None:
        for node in self.net.nodes.values():
            for session in node.sessions.values():
                assert session.core2 is not None and session.core2.inflight <= session.window

    def teardown(self) -> None:
        self._converge()
        q = self.everything.get((OWNER.public_key, "q", 0))
        if q is not None:  # what the run reached (--hypothesis-show-statistics)
            event(f"q: forked {q.forked}, epoch {q.chains.epoch}, {len(self.copies)} copies")

    def _converge(self) -> None:
        for a, b in TOPOLOGY:
            if not self.net.connected(a, b):
                self.net.connect(a, b)
            self.net.agree(a, b)
        for _ in range(50):  # grafts waiting for their timer fall due, until none waits
            self.net.run_until_quiet(max_rounds=500)
            if not self.net.tick_all() and self.net.quiet():
                break
        assert self.net.quiet(), "the network did not go quiet"
        for name in self.net.nodes:
            node = self.net.node2(name)
            assert set(node.states2) == set(self.everything)
            for key, expected in self.everything.items():
                held = node.states2[key]
                assert held == expected, f"node {name} holds another value of {key[1]}"
                assert held.records() == expected.records() and held.meta == expected.meta
                assert held.forked == expected.forked and held.chains.epoch == expected.chains.epoch
                assert held.chains.fork_point == expected.chains.fork_point
            for key in self.everything:
                if key[1] == "r":
                    assert node.states2[key] == self.copies[0].states["r"]  # never forked: the owner's


#: Without the explain phase: on Python 3.11 it traces every line of every step (the run took 5x as long
#: and past the 300 s test timeout on CI), and a failure here is already shrunk to its steps.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]

Core2Replication.TestCase.settings = settings(
    phases=PHASES,
    max_examples=int(os.environ.get("CORE2_STATEFUL_EXAMPLES", "100")),
    stateful_step_count=int(os.environ.get("CORE2_STATEFUL_STEPS", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_core2_replication_converges = Core2Replication.TestCase


class Core2ReplicationWithGraftTimer(Core2Replication):
    """The same with a graft timer: a HAVE2 with news waits for the eager copy until the clock moves,
    and grafts only if it has not come."""

    GRAFT_TIMEOUT = 1.0


Core2ReplicationWithGraftTimer.TestCase.settings = settings(
    phases=PHASES,
    max_examples=int(os.environ.get("CORE2_STATEFUL_EXAMPLES", "100")) // 2,
    stateful_step_count=int(os.environ.get("CORE2_STATEFUL_STEPS", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_core2_replication_converges_with_a_graft_timer = Core2ReplicationWithGraftTimer.TestCase


class Core2ReplicationCompact(Core2Replication):
    """The same on links that agreed on ``compact`` too: every core-2 message in its compact form, each
    head rebuilt from whatever the link carried last (another copy's head, a lagging one, a recovery)."""

    FEATURES = frozenset({HEADS_V2, "compact"})


Core2ReplicationCompact.TestCase.settings = settings(
    phases=PHASES,
    max_examples=int(os.environ.get("CORE2_STATEFUL_EXAMPLES", "100")) // 2,
    stateful_step_count=int(os.environ.get("CORE2_STATEFUL_STEPS", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_core2_replication_converges_on_compact_links = Core2ReplicationCompact.TestCase
