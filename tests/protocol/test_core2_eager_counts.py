"""trees26: the eager/pruned counts a node's core-2 links keep as they go (:class:`EagerCounts`, the
``tree`` counts) equal a recount from scratch of every link's flags, after any sequence of deliveries,
prunes, grafts, WANT2s, new records and queues, link drops and redials."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support.core2_sim import Core2Network
from support.queue2_histories import OWNER

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.protocol.core2_session import Core2Link, EagerCounts
from latticed.protocol.replication import QueueKey
from latticed.protocol.versions import HEADS_V2

EDGES = ((0, 1), (0, 2), (1, 2), (1, 3), (2, 3))
NAMES = ("a", "b", "c")


def _recount(links: list[Core2Link]) -> tuple[dict[QueueKey, int], dict[QueueKey, int], set[QueueKey]]:
    """The reference: per queue, the links carrying it unpruned and those that pruned it, read from every
    link's flags; cut off = pruned on some link and carried unpruned by none (review26's ``trees``)."""
    eager: dict[QueueKey, int] = {}
    pruned: dict[QueueKey, int] = {}
    for link in links:
        if not link.agreed:
            continue
        for key, state in link._links.items():
            if state.pruned and key in link._local:
                pruned[key] = pruned.get(key, 0) + 1
        for key in link._local:
            if link.carries(key) and not (key in link._links and link._links[key].pruned):
                eager[key] = eager.get(key, 0) + 1
    return eager, pruned, {key for key in pruned if key not in eager}


class EagerCountsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.net = Core2Network(features=frozenset({HEADS_V2}), graft_timeout=1.0)
        self.ledgers = {n: EagerCounts() for n in range(4)}
        self.states: dict[str, queue2.QueueState2] = {}
        self.clock = 1
        for n in range(4):
            self.net.add(n)
        for a, b in EDGES:
            self._dial(a, b)

    def _dial(self, a: int, b: int) -> None:
        self.net.connect(a, b)
        for x, y in ((a, b), (b, a)):
            core2 = self.net.nodes[x].sessions[y].core2
            assert core2 is not None
            core2.share(self.ledgers[x])  # as Gossip does once the link is listed

    @rule(name=st.sampled_from(NAMES), writer=st.integers(0, 3))
    def write(self, name: str, writer: int) -> None:
        """A record of queue ``name`` (new: its creation first) put at node ``writer``."""
        self.clock += 1
        state = self.states.get(name)
        if state is None:
            state = queue2.commit(queue2.empty_state(OWNER.public_key, name), OWNER, now_ms=1, records=[])
        else:
            state = queue2.commit(state, OWNER, now_ms=self.clock, records=[Record(value=b"r")])
        node = self.net.node2(writer)
        held = node.states2.get((OWNER.public_key, name, 0))
        if held is not None and held != self.states.get(name):
            return  # that node is behind: one writer's history, put where it is current
        self.states[name] = state
        node.put2(state)
        self.net.settle()

    @rule(data=st.data(), count=st.integers(1, 40))
    def deliver(self, data: st.DataObject, count: int) -> None:
        """Up to ``count`` messages, each on a wire drawn (copies crossing PRUNE2s and WANT2s)."""
        for _ in range(count):
            busy = sorted(link for link, wire in self.net.wires.items() if wire)
            if not busy:
                return
            x, y = data.draw(st.sampled_from(busy))
            self.net.deliver(x, y)
            for peer in list(self.net.nodes[y].sessions):
                self.net.handle(y, peer)

    @rule(edge=st.sampled_from(EDGES))
    def drop_or_redial(self, edge: tuple[int, int]) -> None:
        a, b = edge
        if self.net.connected(a, b):
            for x, y in ((a, b), (b, a)):
                core2 = self.net.nodes[x].sessions[y].core2
                assert core2 is not None
                core2.unshare()  # as Gossip does when the link ends
            self.net.disconnect(a, b)
        else:
            self._dial(a, b)

    @rule()
    def graft_timers(self) -> None:
        self.net.tick_all(2.0)  # waiting grafts fall due: WANT2s

    @invariant()
    def counts_equal_a_recount(self) -> None:
        for n, node in self.net.nodes.items():
            links = [s.core2 for s in node.sessions.values() if s.core2 is not None]
            eager, pruned, cut = _recount(links)
            ledger = self.ledgers[n]
            assert (ledger.eager, ledger.pruned, ledger.cut) == (eager, pruned, cut)
            for link in links:
                carried, pruned_in, lazy_out = link.tree()
                assert pruned_in == sum(1 for k, s in link._links.items() if s.pruned and k in link._local)
                assert lazy_out == sum(1 for k, s in link._links.items() if not s.eager and k in link._local)
                assert carried == sum(1 for k in link._local if link.carries(k))


EagerCountsMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_eager_counts_equal_a_recount = EagerCountsMachine.TestCase
