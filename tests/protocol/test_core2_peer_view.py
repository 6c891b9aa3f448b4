"""A core-2 link's view of what its peer holds only moves forward along one history: a word of the peer
older than one it gave since (a HAVE2 that lingered past the bulk's last ACK2, an ACK2 of what is durable
there after a DELTA2 of what it verified ahead) does not move it back, so the next live record goes alone
instead of with records the peer holds. A word on another branch, or "nothing", still replaces it; an
ACK2 below the view counts as changing nothing; and a delta says it holds what it brings, so a replica
does not send back what the writer committed past what its link was told."""

from __future__ import annotations

from support.core2_sim import Core2Network
from support.queue2_histories import OWNER, empty, extend

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.protocol.core2_session import Core2Link, Delta2Received, NeedDelta2, heard
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import Ack2, Delta2, Have2, encode2, link_summary
from latticed.protocol.replication import ReplicationSession
from latticed.protocol.versions import HEADS_V2

KEY = (OWNER.public_key, "q", 0)
CHUNK, VERSIONS = 4, 8
LINE = extend(empty(), [("offer", 2)] * 5, b"v")
SUMMARIES = [link_summary(state) for state in LINE]
OTHER = extend(LINE[2], [("offer", 2)], b"w")[0]  #: as many leaves as LINE[3], on another branch
FORKED = link_summary(queue2.join(LINE[3], OTHER))


def _bulk() -> QueueState2:
    state = empty()
    for i in range(VERSIONS):
        state = queue2.commit(state, OWNER, now_ms=1 + i, records=[Record(value=b"x" * 10)] * CHUNK)
    return state


def test_a_have2_older_than_the_bulks_last_ack2_does_not_make_live_records_resend_held_ones() -> None:
    net = Core2Network(max_records=CHUNK, window=8, features=frozenset({HEADS_V2}))
    for n in range(2):
        net.add(n)
    net.connect(0, 1)
    state = _bulk()
    net.node2(0).put2(state)
    net.round()
    net.round()
    early = link_summary(net.node2(1).states2[KEY])  # what the replica held part way into the bulk
    assert early.core.held_end < state.held[1]
    net.run_until_quiet()
    assert net.node2(1).states2[KEY] == state
    net.wires[(1, 0)].append(encode2(Have2(KEY, early)))  # said then, arriving after the last ACK2
    net.run_until_quiet()
    for i in range(3):  # the live stream: one record at a time
        state = queue2.commit(state, OWNER, now_ms=100 + i, records=[Record(value=b"live")])
        net.node2(0).put2(state)
        net.run_until_quiet()
    assert net.node2(1).states2[KEY] == state
    core2 = net.nodes[1].sessions[0].core2
    assert core2 is not None
    assert core2.stats["records_held"] == 0, core2.stats


def _sender() -> ReplicationSession:
    """A link holding ``LINE[3]`` whose peer's digest said ``LINE[0]``; its first delta is out."""
    session, peer = ReplicationSession(notices=False), ReplicationSession(notices=False)
    for s, held in ((session, SUMMARIES[3]), (peer, SUMMARIES[0])):
        s.attach_core2(Core2Link())
        s.start({})
        assert s.core2 is not None
        s.core2.start({KEY: held})
        s.agree_features(frozenset({HEADS_V2}))
    for message in peer.messages_to_send():
        session.receive_message(message)
    session.messages_to_send()
    assert session.core2 is not None
    event = session.next_event()
    assert isinstance(event, NeedDelta2)
    session.core2.provide_delta(KEY, outgoing(LINE[3], event.since, event.max_records))
    session.messages_to_send()
    return session


def _next_since(session: ReplicationSession) -> queue2.Summary | None:
    """Where the delta of our next record starts."""
    assert session.core2 is not None
    session.core2.local_update(KEY, SUMMARIES[4])
    event = session.next_event()
    assert isinstance(event, NeedDelta2)
    return event.since


def test_an_ack2_of_what_is_durable_after_a_newer_word_does_not_move_the_view_back() -> None:
    """The peer's DELTA2 told us it holds ``LINE[3]`` (it relayed what it verified ahead of its commit);
    the ACK2 of our delta then says what it holds durably, ``LINE[2]``: the next delta starts at 3."""
    session = _sender()
    peer_delta = queue2.delta(LINE[3], SUMMARIES[2].core, 10)
    session.receive_message(encode2(Delta2(1, SUMMARIES[3], peer_delta)))
    applied = session.next_event()
    assert isinstance(applied, Delta2Received) and session.core2 is not None
    session.core2.delta_applied(applied.seq, SUMMARIES[3], False)  # we held it: it changed nothing
    session.receive_message(encode2(Ack2(1, KEY, SUMMARIES[2])))
    assert _next_since(session) == SUMMARIES[3].core


def test_a_word_on_another_branch_or_of_nothing_still_replaces_the_view() -> None:
    assert heard(SUMMARIES[3], SUMMARIES[1]) == SUMMARIES[3]
    assert heard(SUMMARIES[1], SUMMARIES[3]) == SUMMARIES[3]
    assert heard(None, SUMMARIES[1]) == SUMMARIES[1]
    assert heard(SUMMARIES[3], link_summary(OTHER)) == link_summary(OTHER)
    assert FORKED.heads and heard(SUMMARIES[4], FORKED) == FORKED
    assert heard(SUMMARIES[3], None) is None


def test_a_peer_that_acks_below_what_it_said_before_gets_the_whole_value_once_then_nothing() -> None:
    """Its word is not taken (the view stays where it said it was), so the delta from there would go
    again at every ACK2: instead it counts as changing nothing, as an ACK2 of what the peer held."""
    session = _sender()
    session.receive_message(encode2(Ack2(1, KEY, SUMMARIES[3])))
    assert session.core2 is not None
    session.core2.local_update(KEY, SUMMARIES[4])
    sinces = []
    for seq in range(2, 12):
        event = session.next_event()
        if event is None:
            break
        assert isinstance(event, NeedDelta2)
        sinces.append(event.since)
        session.core2.provide_delta(KEY, outgoing(LINE[4], event.since, event.max_records))
        session.messages_to_send()
        session.receive_message(encode2(Ack2(seq, KEY, SUMMARIES[2])))  # the delta did not fit
    assert sinces == [SUMMARIES[3].core, None]


def test_a_delta_built_past_what_its_link_was_told_is_not_sent_back() -> None:
    """The host builds a delta from what it holds as it answers, past a commit whose change has not
    reached the link yet: the delta says it holds what it brings, so the replica, which hears of its
    merge on every link (the daemon's store hook), finds nothing for the writer and sends nothing back."""
    net = Core2Network(max_records=64, window=8, features=frozenset({HEADS_V2}))
    for n in range(2):
        net.add(n)
    net.connect(0, 1)
    net.run_until_quiet()  # the digests
    writer, replica = net.node2(0), net.node2(1)
    state = empty()
    for i in range(6):
        state = queue2.commit(state, OWNER, now_ms=1 + 2 * i, records=[Record(value=b"a")])
        writer.states2[KEY] = state
        writer._changed2(KEY, state)  # its link asks for a delta
        state = queue2.commit(state, OWNER, now_ms=2 + 2 * i, records=[Record(value=b"b")])
        writer.states2[KEY] = state  # committed; its change reaches the link after the delta left
        net.round()  # the delta is built
        net.round()  # and merged
        back = replica.sessions[0].core2
        assert back is not None
        back.local_update(KEY, link_summary(replica.states2[KEY]))
        writer._changed2(KEY, state)
        net.run_until_quiet()
    assert replica.states2[KEY] == state
    core2 = writer.sessions[1].core2
    assert core2 is not None
    assert core2.stats["deltas_received"] == 0, core2.stats
