"""Each node stays on a queue's eager tree: a first copy that comes on a link we pruned (its push crossed
our PRUNE2, as the warm-up's empty delta and the record after it do) grafts that link back, so no node
is left with every in-link pruned; and what operators read of it (``tree``, ``Gossip.trees``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core2_sim import Core2Network
from support.queue2_histories import OWNER, empty

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.net.gossip import Gossip, PeerLink
from latticed.protocol.core2_session import Core2Link
from latticed.protocol.replication import LinkTree, QueueKey
from latticed.protocol.versions import HEADS_V2

KEY: QueueKey = (OWNER.public_key, "q", 0)
#: A small mesh: the writer 0 and three relays, every pair of relays linked, 3 to the writer only by 1
#: and 2 (two hops), so copies cross on every relay's in-links.
EDGES = ((0, 1), (0, 2), (1, 2), (1, 3), (2, 3))


def _mesh() -> Core2Network:
    # A graft timer that never runs out (no tick here): a node cut off stays cut off, as the daemons'
    # would for a graft timer's wait.
    net = Core2Network(features=frozenset({HEADS_V2}), graft_timeout=1.0)
    for n in range(4):
        net.add(n)
    for a, b in EDGES:
        net.connect(a, b)
    net.run_until_quiet()
    return net


def _created() -> queue2.QueueState2:
    """The queue as the daemon creates it: a signed version of no records (pushed as a delta [0, 0))."""
    return queue2.commit(empty(), OWNER, now_ms=1, records=[])


def _eager_from_writer(net: Core2Network) -> set[int]:
    """The nodes the writer reaches by links that push ``KEY`` (the sender's link eager, the receiver's
    not pruned): what ``tree`` reports at each end."""
    reached, todo = {0}, [0]
    while todo:
        x = todo.pop()
        for y, session in net.nodes[x].sessions.items():
            ours = session.core2
            theirs = net.nodes[y].sessions[x].core2
            assert ours is not None and theirs is not None
            lazy_out = ours.tree()[2]  # one queue: 1 if the peer pruned us
            pruned_in = theirs.tree()[1] == 1  # one queue: 1 if we pruned the peer
            if y not in reached and not lazy_out and not pruned_in:
                reached.add(y)
                todo.append(y)
    return reached


def _step(net: Core2Network, x: int, y: int | None = None) -> None:
    """Deliver the next message from ``x`` to ``y``, or (``y`` None) node ``x`` acts on what its links
    asked of it (a relay pushes what it merged on to its other links)."""
    acting = x
    if y is not None:
        net.deliver(x, y)
        acting = y
    for peer in net.nodes[acting].sessions:
        net.handle(acting, peer)


#: Steps :func:`_deliver_in_order` takes before it calls the run a loop (a few records over 5 links take
#: well under 1,000; a graft/prune loop never ends).
MAX_STEPS = 5_000


def _deliver_in_order(net: Core2Network, picks: st.DataObject, max_steps: int = MAX_STEPS) -> None:
    """One message delivered, or one node acting, at a time, as the test draws, until nothing is left;
    an AssertionError after ``max_steps`` (a graft loop fails fast, not at a timeout)."""
    for _ in range(max_steps):
        busy: list[tuple[int, int | None]] = sorted(link for link, wire in net.wires.items() if wire)
        busy += [
            (n, None) for n, node in net.nodes.items() if any(s.has_work() for s in node.sessions.values())
        ]
        if not busy:
            return
        _step(net, *picks.draw(st.sampled_from(busy)))
    raise AssertionError(f"still busy after {max_steps} steps: a graft/prune loop?")


def _stream(net: Core2Network, records: int, picks: st.DataObject | None = None) -> queue2.QueueState2:
    """The warm-up as the daemons run it: the writer creates the queue (an empty delta, [0, 0)), then
    commits ``records`` records, each pushed as it commits; with ``picks``, each push's copies are
    delivered in an order hypothesis draws before the next commit. Returns the writer's last state."""
    state = _created()
    net.node2(0).put2(state)
    net.settle()
    for i in range(records):
        state = queue2.commit(state, OWNER, now_ms=2 + i, records=[Record(value=b"r%d" % i)])
        net.node2(0).put2(state)
        net.settle()
        if picks is not None:
            _deliver_in_order(net, picks)
    return state


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(min_value=1, max_value=3))
def test_every_node_keeps_an_eager_path_from_the_writer_whatever_the_order_of_deliveries(
    picks: st.DataObject, records: int
) -> None:
    """The warm-up as the daemons run it: the queue created (an empty delta, [0, 0)), then records, each
    pushed as it commits; whatever order the copies arrive in, once nothing is in flight every node
    holds them all and the writer reaches it over eager links (no HAVE2 or graft timer needed)."""
    net = _mesh()
    state = _stream(net, records)
    _deliver_in_order(net, picks)
    assert all(net.node2(n).states2[KEY] == state for n in range(4))
    assert _eager_from_writer(net) == {0, 1, 2, 3}


#: An order of deliveries (sender, receiver) that left node 2 with every in-link pruned before the rule:
#: 2 took [0, 0) from 1 first and pruned 0's copy; 0's record then came first on the link just pruned,
#: and 1's copy second pruned 1 too. Found by the test above.
CUT_OFF_ORDER = (
    (0, 1), (1, 2), (0, 2), (1, 0), (0, 1), (1, 0), (1, 3), (2, 0), (0, 2), (0, 2),
    (2, 0), (0, 2), (2, 0), (2, 0), (2, 1), (1, 2), (2, 1), (1, 2), (1, 2), (2, 1),
    (2, 1), (3, 1), (1, 3), (2, 3), (3, 1), (3, 2), (2, 3), (2, 3), (3, 2), (3, 2),
)  # fmt: skip


def test_a_first_copy_on_a_pruned_link_grafts_it_back() -> None:
    """That order again: node 2's first copy of the record comes on the link it pruned for the empty
    delta's duplicate, and grafts it back (WANT2); both ends report where the link stands."""
    net = _mesh()
    state = _created()
    net.node2(0).put2(state)
    net.settle()
    state = queue2.commit(state, OWNER, now_ms=2, records=[Record(value=b"r")])
    net.node2(0).put2(state)
    net.settle()
    for x, y in CUT_OFF_ORDER:
        if net.wires[(x, y)]:
            _step(net, x, y)
    net.run_until_quiet()
    assert net.quiet() and net.node2(2).states2[KEY] == state
    assert _eager_from_writer(net) == {0, 1, 2, 3}
    trees = {peer: session.tree() for peer, session in net.nodes[2].sessions.items()}
    assert sum(tree.eager_in for tree in trees.values()) >= 1
    assert all(tree.carried == 1 for tree in trees.values())
    for peer, tree in trees.items():  # what 2 pruned, the peer announces to it
        peer_tree = net.nodes[peer].sessions[2].tree()
        assert (tree.pruned_in == 1) == (peer_tree.lazy_out == 1)


@dataclass
class _Session:
    """What ``Gossip.trees`` reads of a link's session."""

    held: frozenset[QueueKey]
    pruned: frozenset[QueueKey]

    def tree(self) -> LinkTree:
        return LinkTree(len(self.held), len(self.pruned), 0)

    def pruned_in1(self) -> list[QueueKey]:
        return list(self.pruned)

    def carries(self, key: QueueKey) -> bool:
        return key in self.held


def test_gossip_names_the_queues_every_carrying_link_pruned_and_never_our_own() -> None:
    ours: QueueKey = (b"m" * 32, "mine", 0)
    other: QueueKey = (b"o" * 32, "other", 0)
    both = frozenset({KEY, other, ours})
    gossip = Gossip(host=None, local_public_key=b"m" * 32)  # type: ignore[arg-type]
    sessions = {
        b"a" * 32: _Session(both, frozenset({KEY, other, ours})),
        b"b" * 32: _Session(frozenset({KEY, ours}), frozenset({KEY, ours})),  # does not carry ``other``
        b"c" * 32: _Session(both, frozenset({KEY})),
    }
    for peer, session in sessions.items():
        gossip.links[peer] = PeerLink(peer, "peer", "static", session)  # type: ignore[arg-type]
    trees, cut = gossip.trees()
    assert cut == [KEY]  # ``other`` still comes from c; our own queue needs no in-link
    assert trees[b"c" * 32].eager_in == 2
    del gossip.links[b"a" * 32]
    assert gossip.trees()[1] == [KEY]
    gossip.links[b"d" * 32] = PeerLink(b"d" * 32, "peer", "static", _Session(both, frozenset()))  # type: ignore[arg-type]
    assert gossip.trees()[1] == []


def _received(net: Core2Network, n: int) -> int:
    """Core-2 deltas node ``n`` received on all its links."""
    return sum(s.core2.stats["deltas_received"] for s in net.nodes[n].sessions.values() if s.core2)


@settings(max_examples=100, deadline=None)
@given(st.data(), st.integers(min_value=2, max_value=6))
def test_the_graft_rule_makes_no_loop_and_the_tree_settles_to_one_copy_a_record(
    picks: st.DataObject, stream: int
) -> None:
    """review26, attack (1): a stream of records, each delivered in an order hypothesis draws (copies
    crossing PRUNE2s and WANT2s anywhere), then records delivered as they come. No graft/prune loop: a
    node's WANT2s are at most one per record that reached it (a graft needs a first copy, and each record
    has one), and once the stream ends every node takes exactly one copy of each later record."""
    wants: dict[int, int] = {}
    graft = Core2Link._graft

    def counted(self: Core2Link, key: QueueKey) -> None:
        node = next(n for n, node in net.nodes.items() for s in node.sessions.values() if s.core2 is self)
        wants[node] = wants.get(node, 0) + 1
        graft(self, key)

    net = _mesh()
    Core2Link._graft = counted  # type: ignore[method-assign]
    try:
        state = _stream(net, stream, picks)
    finally:
        Core2Link._graft = graft  # type: ignore[method-assign]
    assert all(count <= stream + 1 for count in wants.values()), wants  # [0, 0) and each record
    assert _eager_from_writer(net) == {0, 1, 2, 3}
    for i in range(3):  # settled: one copy a record at every node
        before = {n: _received(net, n) for n in (1, 2, 3)}
        state = queue2.commit(state, OWNER, now_ms=100 + i, records=[Record(value=b"s%d" % i)])
        net.node2(0).put2(state)
        net.settle()
        net.run_until_quiet()
        assert all(net.node2(n).states2[KEY] == state for n in range(4))
        assert {n: _received(net, n) - before[n] for n in (1, 2, 3)} == {1: 1, 2: 1, 3: 1}


def test_tree_counts_follow_new_queues_prunes_and_grafts() -> None:
    """review26: ``tree`` keeps its counts as queues come and links are pruned and grafted (it no longer
    reads every queue each call), and agrees with the links' flags."""
    net = _mesh()
    state = _created()
    net.node2(0).put2(state)
    net.settle()
    net.run_until_quiet()
    session = net.nodes[3].sessions[1]
    core2 = session.core2
    assert core2 is not None
    assert session.tree().carried == 1
    other = queue2.commit(queue2.empty_state(OWNER.public_key, "other"), OWNER, now_ms=1, records=[])
    net.node2(0).put2(other)
    net.settle()
    net.run_until_quiet()
    for node in net.nodes.values():
        for link in node.sessions.values():
            c2 = link.core2
            assert c2 is not None
            carried, pruned, lazy = c2.tree()
            assert carried == 2
            assert pruned == sum(1 for lk in c2._links.values() if lk.pruned)
            assert lazy == sum(1 for lk in c2._links.values() if not lk.eager)
    pruned_keys = sorted(core2._pruned)
    if pruned_keys:
        core2._graft(pruned_keys[0])
        assert core2.tree()[1] == len(pruned_keys) - 1


def test_deliver_in_order_fails_fast_on_a_loop() -> None:
    """The step limit: a run still busy after ``max_steps`` (as a graft/prune loop always is) fails with
    that said, not at the test's timeout."""

    @given(st.data())
    @settings(max_examples=1, deadline=None, database=None)
    def run(picks: st.DataObject) -> None:
        net = _mesh()
        net.node2(0).put2(_created())
        net.settle()
        _deliver_in_order(net, picks, max_steps=1)

    with pytest.raises(AssertionError, match="still busy after 1 steps"):
        run()
