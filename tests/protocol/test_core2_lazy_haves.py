"""HAVE2s on a pruned core-2 link say only what the peer may lack: none goes out of a summary the peer's
own word (HAVE2, ACK2, DELTA2) covers, and of the two ends of a link one waits a linger more for that
word, so the two do not announce the same records to each other; a peer that lacks a record still gets
its HAVE2 and grafts."""

from __future__ import annotations

from support.core2_sim import Core2Network
from support.queue2_histories import OWNER, empty, extend

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.protocol.core2_session import Core2Link
from latticed.protocol.core2_wire import HAVE2, WANT2, Have2, Prune2, decode2, encode2, link_summary
from latticed.protocol.replication import ReplicationSession
from latticed.protocol.replication_messages import unpack_message
from latticed.protocol.versions import HEADS_V2

LINE = extend(empty(), [("offer", 1)] * 4, b"s")
KEY = (LINE[0].owner, LINE[0].name, LINE[0].kind)
SUMMARIES = [link_summary(state) for state in LINE]


def _pruned_pair(ours: bytes = b"\x01" * 16, theirs: bytes = b"\x02" * 16) -> tuple[ReplicationSession, ...]:
    """``a`` and ``b`` hold the first summary, HAVE2s linger 0.5 s, grafts go at once; ``b`` pruned ``a``
    (a's news goes out as HAVE2s). Incarnations ``ours`` (a's) and ``theirs`` decide which end waits."""
    a = ReplicationSession(notices=False, have_linger=0.5, incarnation=ours)
    b = ReplicationSession(notices=False, have_linger=0.5, incarnation=theirs)
    for session in (a, b):
        session.attach_core2(Core2Link())
        session.start({})
        assert session.core2 is not None
        session.core2.start({KEY: SUMMARIES[0]})
        session.agree_features(frozenset({HEADS_V2}))
    for _ in range(2):
        for x, y in ((a, b), (b, a)):
            for message in x.messages_to_send():
                y.receive_message(message)
    a.receive_message(encode2(Prune2(KEY)))
    return a, b


def _typed(session: ReplicationSession, code: int) -> list[list[object]]:
    return [raw for raw in map(unpack_message, session.messages_to_send()) if raw[0] == code]


def test_a_peer_that_lacks_a_record_gets_a_have2_and_grafts_one_that_said_it_holds_it_gets_none() -> None:
    for peer_said in (False, True):
        a, b = _pruned_pair()
        assert a.core2 is not None and b.core2 is not None
        a.core2.local_update(KEY, SUMMARIES[1])
        a.tick(10.0)
        if peer_said:  # b's eager link brought the record too, and b announced it first
            b.core2.local_update(KEY, SUMMARIES[1])
            a.receive_message(encode2(Have2(KEY, SUMMARIES[1])), now=10.2)
        a.tick(10.5)
        haves = _typed(a, HAVE2)
        if peer_said:
            assert haves == [] and not a.has_work() and a.next_deadline() is None
            continue
        assert [decode2(raw) for raw in haves] == [Have2(KEY, SUMMARIES[1])]
        b.receive_message(encode2(Have2(KEY, SUMMARIES[1])), now=10.5)
        assert len(_typed(b, WANT2)) == 1  # b lacks it: it grafts the link


def test_a_peer_ahead_on_our_line_is_not_told_what_it_holds() -> None:
    a, _ = _pruned_pair()
    assert a.core2 is not None
    a.receive_message(encode2(Have2(KEY, SUMMARIES[3])), now=10.0)
    a.core2.local_update(KEY, SUMMARIES[2])
    a.tick(10.0)
    a.tick(10.5)
    assert _typed(a, HAVE2) == [] and a.next_deadline() is None


def test_the_end_with_the_higher_incarnation_waits_for_the_peers_word() -> None:
    a, b = _pruned_pair(ours=b"\x02" * 16, theirs=b"\x01" * 16)
    assert a.core2 is not None and b.core2 is not None
    assert a.core2.waits() and not b.core2.waits()
    unknown = ReplicationSession(notices=False)
    unknown.attach_core2(Core2Link())
    assert unknown.core2 is not None and not unknown.core2.waits()  # no HELLO yet: it announces at once


def test_the_waiting_end_keeps_quiet_while_the_peer_announces_and_speaks_once_it_falls_silent() -> None:
    """A stream: the waiting end's HAVE2 is due two lingers after its first record; the peer's word
    covered that one (not the newest): nothing goes, the rest waits for the next turn. Then the peer
    stops announcing (its eager link is lost, say): the next turn sends, and the peer grafts."""
    a, b = _pruned_pair(ours=b"\x02" * 16, theirs=b"\x01" * 16)
    assert a.core2 is not None and b.core2 is not None
    a.core2.local_update(KEY, SUMMARIES[1])
    a.tick(10.0)
    assert a.next_deadline() == 11.0
    a.tick(10.5)
    assert _typed(a, HAVE2) == []
    a.receive_message(encode2(Have2(KEY, SUMMARIES[1])), now=10.6)
    a.core2.local_update(KEY, SUMMARIES[2])
    a.tick(11.0)
    assert _typed(a, HAVE2) == []  # the peer announces: it holds what we had to say first
    a.tick(11.0)
    assert a.next_deadline() == 12.0  # the newer record waits for the next turn
    a.tick(12.0)
    haves = _typed(a, HAVE2)
    assert [decode2(raw) for raw in haves] == [Have2(KEY, SUMMARIES[2])]
    b.core2.local_update(KEY, SUMMARIES[1])
    b.receive_message(encode2(Have2(KEY, SUMMARIES[2])), now=12.0)
    assert len(_typed(b, WANT2)) == 1


def _stream(
    net: Core2Network, state: QueueState2, records: int, sent: dict[tuple[int, int], int]
) -> QueueState2:
    """The owner (node 0) commits ``records`` records 0.2 s apart; HAVE2s counted per link as they go."""
    for _ in range(records):
        state = queue2.commit(state, OWNER, now_ms=state.held[1] + 1, records=[Record(value=b"x" * 10)])
        net.node2(0).put2(state)
        for _ in range(3):  # a record's hops, the lingers' ticks, the grafts they start
            net.settle()
            while any(net.wires.values()):
                for link, wire in net.wires.items():
                    sent[link] = sent.get(link, 0) + sum(1 for m in wire if unpack_message(m)[0] == HAVE2)
                net.round()
            net.tick_all(0.2 / 3)
    return state


def test_in_a_mesh_one_end_of_a_lazy_link_announces_and_the_other_repairs_a_lost_eager_link() -> None:
    """A triangle under a live stream: the link between the two replicas is pruned both ways, and only
    the end with the lower incarnation (node 1) announces on it. Then node 1's eager link drops: it
    announces nothing more, so node 2's HAVE2s go, and node 1 grafts and catches up."""
    net = Core2Network(features=frozenset({HEADS_V2}), graft_timeout=0.3, have_linger=0.5, remember=True)
    for n in range(3):
        net.add(n)
    for a, b in ((0, 1), (0, 2), (1, 2)):
        net.connect(a, b)
    state = _stream(net, empty(), 5, {})  # the replicas' link is pruned after the first duplicates
    sent: dict[tuple[int, int], int] = {}
    state = _stream(net, state, 20, sent)
    assert net.node2(1).states2[KEY] == net.node2(2).states2[KEY] == state
    assert sent.get((1, 2), 0) >= 4 and sent.get((2, 1), 0) == 0, sent
    net.disconnect(0, 1)
    state = _stream(net, state, 10, sent)
    while net.tick_all(0.5):
        net.run_until_quiet()
    assert sent[(2, 1)] >= 1
    assert net.node2(1).states2[KEY] == state
