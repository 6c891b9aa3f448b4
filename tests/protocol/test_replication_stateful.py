"""The sans-IO replication sessions driven through the in-process network by hypothesis: any order of
delivery and of the hosts' work, links that break and come back, daemons that restart, owners that
truncate and an owner that forks. Whenever the network goes quiet with every link up, all replicas hold
the same records of every queue the owner never forked, exactly the owner's latest state.

A forked queue stops where each replica stands (docs/lattice.md, "Forks"): once the network is quiet every
replica flags it and keeps the same valid proof, serves no record of it, still holds exactly what it held
when it first flagged it, and two replicas show the same record at every offset both show (up to their
visible ends); the owner's writes to it are refused, as the daemon refuses them. A queue whose second
history no head or record contradicts yet is one history: it is held alike everywhere.
``REPLICATION_EXAMPLES`` and ``REPLICATION_STEPS`` set the size of a run (150 examples of 50 steps).

A message is never dropped on its own: sessions run over TCP, where a loss breaks the connection (both
directions' messages in flight are lost, and the daemon redials), which is what ``link_breaks`` does.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support.sim import SimNetwork

from latticed.crdt import queue as core
from latticed.crdt.head import meta_hash
from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import GapError
from latticed.protocol.replication import QueueKey

ALICE = Identity.from_seed(b"a" * 32)  # writes on node 0, and also from an old copy of her store
BOB = Identity.from_seed(b"b" * 32)  # writes on node 2
HOMES = {ALICE.public_key: 0, BOB.public_key: 2}
OWNERS = st.sampled_from([ALICE, BOB])
QUEUES = st.sampled_from(["q", "r"])
NODES = 4
#: A ring with a chord: redundant paths, so links get pruned to lazy and must graft when one breaks.
TOPOLOGY = ((0, 1), (1, 2), (2, 3), (3, 0), (0, 2))
LINKS = st.sampled_from(TOPOLOGY)
DIRECTED = st.sampled_from([*TOPOLOGY, *((b, a) for a, b in TOPOLOGY)])
NODE = st.integers(0, NODES - 1)


class Replication(RuleBasedStateMachine):
    #: Protocol features every link agrees on (see CompactReplication).
    FEATURES: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        # Small windows and chunks, so backlogs stream in several pipelined chunks.
        self.net = SimNetwork(window=3, depth=2, max_records=3, remember=True, features=self.FEATURES)
        for name in range(NODES):
            self.net.add(name)
        for a, b in TOPOLOGY:
            self.net.connect(a, b)
        #: Every state an owner signed, per queue: the replicas must end up holding their join.
        self.signed: dict[QueueKey, list[QueueState]] = {}
        #: Queues Alice signed a second history of.
        self.forked: set[QueueKey] = set()
        #: What each node held of a queue when it first flagged it forked: it holds exactly that for good.
        self.stopped: dict[tuple[int, QueueKey], QueueState] = {}
        self.clock = 0

    def _sign(self, key: QueueKey, state: QueueState) -> None:
        self.signed.setdefault(key, []).append(state)

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    # ------------------------------------------------------------------ owners
    @rule(owner=OWNERS, queue=QUEUES, count=st.integers(1, 5))
    def owner_writes(self, owner: Identity, queue: str, count: int) -> None:
        now = self._tick()
        records = [Record(value=b"%d.%d" % (now, i), timestamp=now) for i in range(count)]
        self._commit(owner, queue, now, records=records)

    @rule(owner=OWNERS, queue=QUEUES, drop=st.integers(1, 4))
    def owner_truncates(self, owner: Identity, queue: str, drop: int) -> None:
        home = self.net.nodes[HOMES[owner.public_key]]
        state = home.states.get((owner.public_key, queue, 0))
        if state is not None:
            self._commit(owner, queue, self._tick(), new_start=state.start + drop)

    def _commit(self, owner: Identity, queue: str, now: int, **change: object) -> None:
        held = self.net.nodes[HOMES[owner.public_key]].states.get((owner.public_key, queue, 0))
        if held is not None and held.forked:
            return  # the daemon refuses its owner's writes to a forked queue (exit 6)
        try:
            state = self.net.nodes[HOMES[owner.public_key]].commit(owner, queue, now, **change)
        except GapError:
            return  # the home lacks records (a fork's longer history won): the daemon refuses the write too
        self._sign((owner.public_key, queue, 0), state)

    @rule(data=st.data(), queue=QUEUES, node=NODE, count=st.integers(1, 3))
    def owner_forks(self, data: st.DataObject, queue: str, node: int, count: int) -> None:
        """Alice's old copy of her store (any state she signed before, or none) signs new records and hands
        them to some node: two histories under one key."""
        key = (ALICE.public_key, queue, 0)
        earlier = [core.empty_state(ALICE.public_key, queue), *self.signed.get(key, [])]
        base = earlier[data.draw(st.integers(0, len(earlier) - 1), label="restored from signed state")]
        if not base.complete:
            return
        now = self._tick()
        records = [Record(value=b"fork %d.%d" % (now, i), timestamp=now) for i in range(count)]
        forked = core.commit(base, ALICE, now_ms=now, records=records)
        self._sign(key, forked)
        self.forked.add(key)
        self.net.nodes[node].inject(forked)

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

    @rule(link=LINKS)
    def link_comes_back(self, link: tuple[int, int]) -> None:
        if not self.net.connected(*link):
            self.net.connect(*link)

    @rule(node=NODE)
    def daemon_restarts(self, node: int) -> None:
        for peer in self.net.restart(node):
            self.net.connect(node, peer)

    @rule()
    def network_goes_quiet(self) -> None:
        self._converge()

    # ------------------------------------------------------------------ what must hold
    @invariant()
    def windows_hold(self) -> None:
        for node in self.net.nodes.values():
            for session in node.sessions.values():
                assert session.inflight <= session.window

    def teardown(self) -> None:
        self._converge()

    def _converge(self) -> None:
        for a, b in TOPOLOGY:
            if not self.net.connected(a, b):
                self.net.connect(a, b)
        self.net.run_until_quiet(max_rounds=200)
        assert self.net.quiet(), "the network did not go quiet"
        for node in self.net.nodes.values():
            assert set(node.states) == set(self.signed)
            assert node.key_budget.used == 0  # every queue is held everywhere: nothing foreign is tracked
        for key, states in self.signed.items():
            held = [node.states[key] for node in self.net.nodes.values()]
            if any(state.forked for state in held):
                self._check_stopped(key, held)
            else:
                for name, state in enumerate(held):
                    assert (state.summary(), state.entries, state.meta) == (
                        held[0].summary(),
                        held[0].entries,
                        held[0].meta,
                    ), f"node {name} holds other records of {key[1]} than node 0"
            if key not in self.forked:
                expected = core.empty_state(*key)
                for state in states:
                    expected = core.merge(expected, state)
                assert not expected.forked
                assert all(state == expected for state in held)

    def _check_stopped(self, key: QueueKey, held: list[QueueState]) -> None:
        assert key in self.forked
        for name, state in enumerate(held):
            assert state.forked, f"node {name} does not flag the fork of {key[1]}"
            assert state.fork is not None and state.fork == held[0].fork, f"node {name} keeps another proof"
            state.fork.verify()
            assert not core.delta(state).records
            first = self.stopped.setdefault((name, key), state)
            assert (state.head, state.entries) == (first.head, first.entries), f"node {name} moved on"
        shown = [{o: state.record_at(o) for o in range(state.start, state.visible_end)} for state in held]
        for x in shown:
            for y in shown:
                assert all(x[o] == y[o] for o in x.keys() & y.keys()), "two replicas show other records"


Replication.TestCase.settings = settings(
    max_examples=int(os.environ.get("REPLICATION_EXAMPLES", "150")),
    stateful_step_count=int(os.environ.get("REPLICATION_STEPS", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_replication_converges = Replication.TestCase


class CompactReplication(Replication):
    """The same with every link speaking ``compact``: what a link leaves out of a DELTA is rebuilt to the
    signed bytes through forks, truncations, broken links and restarts (a wrong rebuild fails the merge's
    verification, and the test)."""

    FEATURES = frozenset({"compact"})


CompactReplication.TestCase.settings = settings(
    max_examples=int(os.environ.get("REPLICATION_EXAMPLES", "150")) // 2,
    stateful_step_count=int(os.environ.get("REPLICATION_STEPS", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_replication_converges_over_compact_links = CompactReplication.TestCase


def shared_records(count: int) -> list[Record]:
    return [Record(b"s%d" % i) for i in range(count)]


def _network(*states: QueueState) -> tuple[SimNetwork, QueueKey]:
    """A line of nodes 0 - 1 - 2 with small windows and chunks; node ``i`` starts from ``states[i]``."""
    net = SimNetwork(window=3, depth=2, max_records=3, remember=True)
    for name in range(3):
        net.add(name)
    for name, state in enumerate(states):
        net.nodes[name].inject(state)
    net.connect(0, 1)
    net.connect(1, 2)
    net.run_until_quiet(max_rounds=200)
    assert net.quiet()
    return net, (states[0].owner, states[0].name, states[0].kind)


def test_a_copied_store_stops_where_each_replica_stands() -> None:
    """Alice's data directory copied after 10 records; the original writes 5 more on node 0, the copy 3 on
    node 2, and node 1 relays: every node flags the fork with the same proof, keeps exactly what it held,
    serves no record of it, and none shows a record the other history does not hold at that offset."""
    shared = core.commit(core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=1, records=shared_records(10))
    owner = core.commit(shared, ALICE, now_ms=2, records=[Record(b"owner %d" % i) for i in range(5)])
    copy = core.commit(shared, ALICE, now_ms=2, records=[Record(b"copy %d" % i) for i in range(3)])
    net, key = _network(owner, shared, copy)
    held = [node.states[key] for node in net.nodes.values()]
    assert all(s.forked for s in held)
    # Node 1 holds what came first.
    assert (held[0].held_end, held[2].held_end) == (15, 13) and held[1].held_end in (13, 15)
    assert held[0].entries == owner.entries and held[2].entries == copy.entries
    assert len({s.fork for s in held}) == 1
    for state in held:
        assert state.visible_end <= 10 and not core.delta(state).records
        for offset in range(state.start, state.visible_end):
            assert state.record_at(offset) == shared.record_at(offset)


def test_two_histories_that_set_metadata_at_one_version_stop_with_their_own_metadata() -> None:
    """Alice's two copies set metadata at one version: every replica flags the fork and keeps a head with
    its own metadata (a delta leaves out metadata of the version the peer's summary names, so a replica
    that took the other head with its own metadata would serve deltas no peer could verify)."""
    base = core.commit(core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=1, records=[Record(value=b"x")])
    for n in range(4):
        one = core.commit(base, ALICE, now_ms=2, meta_updates={"k": f"one {n}"})
        two = core.commit(base, ALICE, now_ms=2, meta_updates={"k": f"two {n}"})
        net, key = _network(one, base, two)
        held = [node.states[key] for node in net.nodes.values()]
        assert (held[0].meta, held[2].meta) == (one.meta, two.meta)
        for state in held:
            assert state.forked and state.head is not None
            assert meta_hash(dict(state.meta)) == state.head.meta_hash
            for other in held:
                core.merge(other, core.delta(state, other.summary()))  # verifies, or raises


class _Drawn:
    """Stands in for hypothesis' data object in a replayed run."""

    def __init__(self, value: int) -> None:
        self.value = value

    def draw(self, strategy: object, label: str = "") -> int:
        return self.value


def test_a_replica_that_finds_a_fork_sends_its_proof_to_a_sender_that_flags_it_by_then() -> None:
    """A run hypothesis found: node 1 found the fork in a delta from node 0, which meanwhile flagged it on
    another proof. Node 1 told only its other peers (the sender was no longer "behind"), so nodes kept
    two proofs for good; a replica now sends its proof on every link it has not gone over yet."""
    machine = Replication()
    a, b = ALICE, BOB
    for step in [
        lambda: machine.owner_writes(count=4, owner=a, queue="q"),
        lambda: machine.owner_writes(count=2, owner=b, queue="q"),
        lambda: machine.owner_truncates(drop=3, owner=a, queue="q"),
        lambda: machine.owner_forks(count=3, data=_Drawn(1), node=1, queue="q"),
        lambda: machine.owner_writes(count=5, owner=a, queue="r"),
        lambda: machine.owner_writes(count=2, owner=a, queue="q"),
        lambda: machine.owner_truncates(drop=3, owner=b, queue="q"),
        lambda: machine.owner_truncates(drop=1, owner=b, queue="r"),
        lambda: machine.owner_truncates(drop=3, owner=a, queue="r"),
        lambda: machine.owner_forks(count=3, data=_Drawn(1), node=2, queue="r"),
        lambda: machine.owner_truncates(drop=4, owner=b, queue="q"),
        lambda: machine.link_breaks(link=(0, 1)),
        lambda: machine.link_breaks(link=(2, 3)),
        lambda: machine.link_breaks(link=(1, 2)),
        lambda: machine.owner_writes(count=1, owner=b, queue="q"),
        lambda: machine.owner_forks(count=2, data=_Drawn(1), node=1, queue="r"),
        lambda: machine.owner_forks(count=1, data=_Drawn(0), node=2, queue="r"),
        lambda: machine.owner_writes(count=4, owner=a, queue="q"),
        lambda: machine.owner_writes(count=3, owner=b, queue="r"),
    ]:
        step()
    machine.teardown()
