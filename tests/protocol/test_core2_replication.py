"""Core-2 queues over the real sans-IO replication sessions (feature ``heads-v2``): nothing of them
reaches a peer that has not agreed on the feature, core-1 traffic is byte for byte what it was, a mesh
converges on a forked and recovered queue in chunks, and a hostile peer's core-2 messages are its
protocol error."""

from __future__ import annotations

import dataclasses
import random

import pytest
import trio
from support.core2_sim import Core2Network, MemoryCore2Host, core2_host
from support.queue2_histories import OWNER, catch_up, empty, extend

from latticed.crdt import queue as core
from latticed.crdt import queue2
from latticed.crdt.core_errors import IntegrityError
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack
from latticed.errors import LocalProtocolError, RemoteProtocolError
from latticed.protocol.core2_session import Core2Link, Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import outgoing, unpack_steps
from latticed.protocol.core2_wire import (
    CORE2_CODES,
    Ack2,
    AckHeld2,
    Delta2,
    Digest2,
    Have2,
    Prune2,
    Summary2,
    decode2,
    encode2,
    link_summary,
)
from latticed.protocol.replication import DeltaReceived, NeedDelta, ReplicationSession
from latticed.protocol.replication_messages import unpack_message
from latticed.protocol.versions import HEADS_V2, queue_expressible

KEY = (OWNER.public_key, "q", 0)
BOTH = frozenset({HEADS_V2, "compact"})


def _history() -> QueueState2:
    return extend(empty(), [("offer", 3), ("offer", 2), ("truncate", 1), ("meta", 0), ("offer", 3)], b"s")[-1]


def _pair(
    local2: dict[tuple[bytes, str, int], Summary2], features: frozenset[str] | None
) -> tuple[ReplicationSession, ReplicationSession]:
    """A sender holding ``local2`` and an empty receiver, both with a core-2 part, HELLOs exchanged;
    ``features``: what the sender's link agreed on (None: no answer yet)."""
    sender, receiver = ReplicationSession(notices=False), ReplicationSession(notices=False)
    for session, held in ((sender, local2), (receiver, {})):
        session.attach_core2(Core2Link())
        session.start({})
        assert session.core2 is not None
        session.core2.start(held)
    receiver.agree_features(frozenset({HEADS_V2}))
    for message in receiver.messages_to_send():
        sender.receive_message(message)
    for message in sender.messages_to_send():
        receiver.receive_message(message)
    if features is not None:
        sender.agree_features(features)
    return sender, receiver


def _codes(messages: list[bytes]) -> list[int]:
    return [unpack_message(m)[0] for m in messages]


def test_a_core2_queue_needs_the_heads_v2_feature() -> None:
    assert queue_expressible(0, 1, None) and queue_expressible(0, 1, frozenset())
    assert not queue_expressible(0, 2, None) and not queue_expressible(0, 2, frozenset({"compact"}))
    assert queue_expressible(0, 2, frozenset({HEADS_V2}))


@pytest.mark.parametrize("features", [None, frozenset(), frozenset({"compact"})])
def test_a_peer_without_heads_v2_is_sent_nothing_of_a_core2_queue_and_it_is_counted(
    features: frozenset[str] | None,
) -> None:
    """Before the answer (None), a 0.2.0 peer (no features) or one that lacks the feature: no digest,
    no delta, no HAVE of the core-2 queue; it counts as held back."""
    sender, _ = _pair({KEY: link_summary(_history())}, features)
    assert sender.core2 is not None
    sender.core2.local_update(KEY, link_summary(_history()))
    sent = sender.messages_to_send()
    assert not set(_codes(sent)) & CORE2_CODES
    assert sender.next_event() is None
    assert sender.withheld == 1
    sender.agree_features(frozenset({HEADS_V2}))  # the answer came after all
    assert sender.withheld == 0
    assert isinstance(sender.next_event(), NeedDelta2)
    assert 32 in _codes(sender.messages_to_send())


def test_core1_traffic_is_byte_for_byte_unchanged_with_a_core2_part_attached() -> None:
    """The same core-1 conversation with and without a core-2 part: the same bytes, save the core-2
    digest the part sends once the link agreed on ``heads-v2``."""
    alice = Identity.from_seed(b"a" * 32)
    state = core.commit(
        core.empty_state(alice.public_key, "c"), alice, now_ms=1, records=[Record(value=b"x")] * 5
    )
    key = (alice.public_key, "c", 0)
    runs = []
    for attach in (False, True):
        a, b = ReplicationSession(max_records=2), ReplicationSession(max_records=2)
        if attach:
            a.attach_core2(Core2Link())
            b.attach_core2(Core2Link())
        a.start({key: state.summary()})
        b.start({})
        for s in (a, b):
            if s.core2 is not None:
                s.core2.start({})
            s.agree_features(BOTH)
        held = core.empty_state(*key)
        wire: list[bytes] = []
        for _ in range(20):
            for message in a.messages_to_send():
                wire.append(message)
                b.receive_message(message)
            for message in b.messages_to_send():
                wire.append(message)
                a.receive_message(message)
            while (event := a.next_event()) is not None:
                if isinstance(event, NeedDelta):
                    a.provide_delta(event.key, core.delta(state, event.since, event.max_records))
            while (event := b.next_event()) is not None:
                if isinstance(event, DeltaReceived):
                    held = core.merge(held, event.delta)
                    b.delta_applied(event.seq, held.summary(), True)
        runs.append([m for m in wire if unpack_message(m)[0] not in CORE2_CODES])
        assert held == state
    assert runs[0] == runs[1]


def _converged(net: Core2Network) -> list[QueueState2]:
    net.run_until_quiet(max_rounds=500)
    assert net.quiet()
    return [net.node2(n).states2[KEY] for n in net.nodes]


def test_a_mesh_catches_up_in_chunks_and_a_fork_freezes_everywhere_then_recovery_reaches_all() -> None:
    net = Core2Network(window=3, depth=2, max_records=2, features=BOTH)
    for n in range(4):
        net.add(n)
    for a, b in ((0, 1), (1, 2), (2, 3), (3, 0)):
        net.connect(a, b)
    shared = _history()
    net.node2(0).put2(shared)
    held = _converged(net)
    assert all(s == shared for s in held)
    assert net.node2(2).merges2 > 1  # several chunks
    # The owner's store, copied to node 2: both write past what they share.
    mine = extend(shared, [("offer", 5)], b"a")[-1]
    copy = extend(shared, [("offer", 3)], b"b")[-1]
    net.node2(0).put2(mine)
    net.node2(2).put2(copy)
    held = _converged(net)
    frozen = queue2.join(mine, copy)
    assert frozen.forked
    assert all(s == frozen and s.forked and s.records() == frozen.records() for s in held)
    assert net.node2(0).host2.evidence[KEY]  # what it held past the fork point, kept aside
    # The owner recovers on node 0, keeping its own records from past the fork point.
    lost = mine.records()[frozen.held[1] - mine.held[0] :]
    recovered = queue2.recover(held[0], OWNER, now_ms=10_000, keep_mine=lost)
    net.node2(0).put2(recovered)
    held = _converged(net)
    assert all(s == recovered and not s.forked and s.chains.epoch == 1 for s in held)


def test_a_link_that_agrees_late_catches_up_then() -> None:
    net = Core2Network(max_records=2, features=frozenset({HEADS_V2}), agree_at_start=False)
    for n in range(2):
        net.add(n)
    net.node2(0).put2(_history())
    net.connect(0, 1)
    net.run_until_quiet(100)
    assert KEY not in net.node2(1).states2
    assert net.nodes[0].sessions[1].withheld == 1
    net.agree(0, 1)
    assert _converged(net)[1] == _history()


def test_core2_messages_before_hello_or_from_a_hostile_peer_are_its_protocol_error() -> None:
    session = ReplicationSession(window=2)
    session.attach_core2(Core2Link())
    with pytest.raises(LocalProtocolError):
        session.receive_message(encode2(Digest2(())))
    session.start({})
    assert session.core2 is not None
    session.core2.start({})
    with pytest.raises(RemoteProtocolError, match="HELLO"):
        session.receive_message(encode2(Digest2(())))
    peer = ReplicationSession()
    peer.start({})
    for message in peer.messages_to_send():
        session.receive_message(message)
    session.receive_message(encode2(Digest2(())))
    with pytest.raises(RemoteProtocolError, match="twice"):
        session.receive_message(encode2(Digest2(())))
    with pytest.raises(RemoteProtocolError):
        session.receive_message(pack([33, 1, "not a summary", None]))
    d = queue2.delta(_history(), None, 1)
    summary = link_summary(_history())
    for seq in (1, 2):
        session.receive_message(encode2(Delta2(seq, summary, d)))
    with pytest.raises(RemoteProtocolError, match="window"):
        session.receive_message(encode2(Delta2(3, summary, d)))
    with pytest.raises(RemoteProtocolError, match="ACK2"):
        session.receive_message(pack([34, 9, *KEY, [0, 0, b"f" * 32, 0, b"", b""]]))


def test_a_session_without_a_core2_part_refuses_core2_messages_as_unknown() -> None:
    session, peer = ReplicationSession(), ReplicationSession()
    session.start({})
    peer.start({})
    for message in peer.messages_to_send():
        session.receive_message(message)
    with pytest.raises(RemoteProtocolError, match="unknown message type"):
        session.receive_message(encode2(Digest2(())))


def test_a_forged_core2_delta_is_refused_by_the_host_and_changes_nothing() -> None:
    """Records that are not the owner's (a relay changed one) do not hash to the heads on the log."""
    host = MemoryCore2Host()
    honest = _history()
    d = queue2.delta(honest, None)
    records = (Record(value=b"forged"), *d.records[1:])
    with pytest.raises(IntegrityError):
        host.merge2(dataclasses.replace(d, records=records))
    assert host.states2 == {}
    summary, changed = host.merge2(d)
    assert changed and host.states2[KEY] == honest and summary == link_summary(honest)


def test_a_backlog_streams_up_to_depth_chunks_ahead_of_the_acks() -> None:
    state = empty()
    for i in range(100):
        state = queue2.commit(state, OWNER, now_ms=1000 + i, records=[Record(value=b"x" * 10)])
    net = Core2Network(max_records=8, depth=4, window=8, features=frozenset({HEADS_V2}))
    for n in range(2):
        net.add(n)
    net.connect(0, 1)
    net.node2(0).put2(state)
    core2 = net.nodes[0].sessions[1].core2
    assert core2 is not None
    peak = net.peak_until_quiet(lambda: core2.inflight)
    assert peak == 4  # the depth, not one chunk per round trip
    assert net.node2(1).states2[KEY] == state and net.round_number <= 10  # 13 chunks


def test_a_delta_of_a_queue_we_do_not_hold_that_does_not_fit_leaves_nothing_behind() -> None:
    """A chunk from the middle of a queue we never held (a stale or made-up one) is answered with an
    ACK2 that says we hold nothing, and the queue is not remembered: a peer cannot make us keep what
    it names."""
    source = extend(empty(), [("offer", 2)] * 4, b"s")[-1]
    partial = catch_up(empty(), source, 1, 2)
    d = queue2.delta(source, queue2.summary(partial), 2)
    assert d.from_offset == 2 and source.held[0] == 0
    session, _ = _pair({}, frozenset({HEADS_V2}))
    core2 = session.core2
    assert core2 is not None
    host = MemoryCore2Host()
    peer_summary = link_summary(source)
    for seq in (1, 2):
        session.receive_message(encode2(Delta2(seq, peer_summary, d)))
    for _ in range(2):
        event = session.next_event()
        assert isinstance(event, Delta2Received)
        summary, changed = host.merge2(event.delta, event.steps)
        assert (summary, changed) == (None, False)
        core2.delta_applied(event.seq, summary, changed)
    acks = [unpack_message(m) for m in session.messages_to_send() if unpack_message(m)[0] == 34]
    assert [a[-1] for a in acks] == [None, None]
    assert host.states2 == {} and core2.peer_summary(KEY) is None and core2.withheld == 0


def test_a_live_stream_crosses_a_mesh_about_once() -> None:
    """One write per round on a random mesh of 8: pruned links carry HAVE2s, and a HAVE2 of a peer that
    is behind does not make a replica push what the peer's eager link is already bringing."""
    rng = random.Random(3)
    net = Core2Network(features=frozenset({HEADS_V2}))
    for n in range(8):
        net.add(n)
    for n in range(8):
        for p in rng.sample(range(8), 3):
            if p != n and p not in net.nodes[n].sessions:
                net.connect(n, p)
    state = queue2.commit(empty(), OWNER, now_ms=1, records=[Record(value=b"w")])
    net.node2(0).put2(state)
    net.run_until_quiet()
    merges = sum(net.node2(n).merges2 for n in range(8))
    for i in range(50):
        state = queue2.commit(state, OWNER, now_ms=2 + i, records=[Record(value=b"x" * 100)])
        net.node2(0).put2(state)
        net.round()
    assert all(s == state for s in _converged(net))
    per_record = (sum(net.node2(n).merges2 for n in range(8)) - merges) / 50 / 7
    assert per_record <= 1.1, per_record


def test_the_store_interface_is_enough_to_replicate_a_queue() -> None:
    """Two hosts behind the daemon-side interface (``net/core2_host.Core2Host``: summaries, deltas,
    merges that verify against what is held), driven as a link's driver would, end up holding one value."""
    source = _history()
    hosts = [core2_host(MemoryCore2Host({KEY: source})), core2_host(MemoryCore2Host())]
    sessions = [ReplicationSession(max_records=2, notices=False) for _ in hosts]
    for session, host in zip(sessions, hosts, strict=True):
        session.attach_core2(Core2Link())
        session.start({})
        assert session.core2 is not None
        session.core2.start(host.summaries2())
        session.agree_features(frozenset({HEADS_V2}))

    async def drive() -> None:
        for _ in range(50):
            for me, peer in ((0, 1), (1, 0)):
                for message in sessions[me].messages_to_send():
                    sessions[peer].receive_message(message)
            for session, host in zip(sessions, hosts, strict=True):
                core2 = session.core2
                assert core2 is not None
                while (event := session.next_event()) is not None:
                    if isinstance(event, NeedDelta2):
                        core2.provide_delta(
                            event.key,
                            await host.delta2_for(event.key, event.since, event.max_records, 1 << 20),
                        )
                    elif isinstance(event, Delta2Received):
                        summary, changed = await host.submit_merge2(
                            event.delta, event.steps, b"peer"
                        ).result()
                        core2.delta_applied(event.seq, summary, changed)

    trio.run(drive)
    assert hosts[1].summaries2() == hosts[0].summaries2() == {KEY: link_summary(source)}


def test_a_core2_queue_of_a_kind_the_peer_cannot_express_is_held_back_on_a_heads_v2_link() -> None:
    """The gate is per queue: its core needs ``heads-v2`` and its kind what ``FEATURE_OF_KIND`` says."""
    newer = (OWNER.public_key, "n", 7)
    summary = link_summary(_history())
    sender, receiver = (
        ReplicationSession(notices=False, kind_features={7: "newer-kind"}),
        ReplicationSession(),
    )
    sender.attach_core2(Core2Link())
    receiver.attach_core2(Core2Link())
    for session, held in ((sender, {KEY: summary, newer: summary}), (receiver, {})):
        session.start({})
        assert session.core2 is not None
        session.core2.start(held)
        session.agree_features(frozenset({HEADS_V2}))
    for message in receiver.messages_to_send():
        sender.receive_message(message)
    digest = [unpack_message(m) for m in sender.messages_to_send() if unpack_message(m)[0] == 32]
    assert [row[1] for row in digest[0][1]] == ["q"]  # the other queue is not even named
    event = sender.next_event()
    assert isinstance(event, NeedDelta2) and event.key == KEY and sender.next_event() is None
    assert sender.withheld == 1


def test_a_have2_with_news_grafts_only_if_the_eager_copy_has_not_come_within_the_graft_timer() -> None:
    source = _history()
    ahead = link_summary(source)
    for arrives in (False, True):
        session, _ = _pair({}, frozenset({HEADS_V2}))
        session.graft_timeout = 1.0
        core2 = session.core2
        assert core2 is not None
        session.messages_to_send()
        session.receive_message(encode2(Have2(KEY, ahead)), now=10.0)
        assert not session.messages_to_send() and session.next_deadline() == 11.0
        if arrives:  # the eager link delivered it meanwhile
            core2.local_update(KEY, ahead)
        session.tick(11.0)
        wants = [m for m in session.messages_to_send() if unpack_message(m)[0] == 36]
        assert len(wants) == (0 if arrives else 1)
        assert session.next_deadline() is None


def _linked(linger: float, held: Summary2) -> tuple[ReplicationSession, ReplicationSession]:
    """Two sessions with a core-2 part, both holding ``held`` of KEY, ``heads-v2`` agreed, digests
    exchanged; the first's HAVEs linger ``linger``."""
    a, b = ReplicationSession(notices=False, have_linger=linger), ReplicationSession(notices=False)
    for session in (a, b):
        session.attach_core2(Core2Link())
        session.start({})
        assert session.core2 is not None
        session.core2.start({KEY: held})
        session.agree_features(frozenset({HEADS_V2}))
    for _ in range(2):
        for x, y in ((a, b), (b, a)):
            for message in x.messages_to_send():
                y.receive_message(message)
    return a, b


def test_have2s_on_a_pruned_link_linger_and_only_a_queues_newest_summary_goes_out() -> None:
    line = extend(empty(), [("offer", 1)] * 4, b"s")
    a, b = _linked(0.5, link_summary(line[0]))
    assert a.core2 is not None
    a.receive_message(encode2(Prune2(KEY)))  # the peer has this queue from elsewhere: HAVE2s only
    for state in line[1:]:
        a.core2.local_update(KEY, link_summary(state))
    assert not a.has_work() and a.next_deadline() == 0.0  # tick now, to start the linger
    a.tick(10.0)
    assert a.messages_to_send() == [] and a.next_deadline() == 10.5
    a.tick(10.5)
    assert a.has_work()
    (message,) = a.messages_to_send()
    assert decode2(unpack_message(message)) == Have2(KEY, link_summary(line[-1]))
    assert a.next_deadline() is None and not a.has_work()
    b.receive_message(message)
    assert b.core2 is not None and b.core2.peer_summary(KEY) == link_summary(line[-1])


def test_a_delta_that_brings_the_receiver_to_the_senders_summary_is_acked_by_its_seq_alone() -> None:
    """A live stream's ACK2 names neither queue nor summary (both sides know them by seq); an ACK2 of a
    receiver that holds something else (a chunk of a backlog) still says what it holds."""
    line = extend(empty(), [("offer", 1)] * 4, b"s")
    a, b = _linked(0.0, link_summary(line[0]))
    assert a.core2 is not None and b.core2 is not None
    held = line[0]
    for state, chunk, short in ((line[1], 1, True), (line[3], 1, False), (line[3], 4, True)):
        a.core2.local_update(KEY, link_summary(state))
        (need,) = [e for e in iter(a.next_event, None) if isinstance(e, NeedDelta2)]
        a.core2.provide_delta(KEY, outgoing(state, need.since, chunk, 1 << 20))
        for message in a.messages_to_send():
            b.receive_message(message)
        (got,) = [e for e in iter(b.next_event, None) if isinstance(e, Delta2Received)]
        whole = unpack_steps(held, got.delta, got.steps)
        held = queue2.join_verified(held, queue2.verify_delta(held, whole)).state
        b.core2.delta_applied(got.seq, link_summary(held), True)
        acks = [decode2(unpack_message(m)) for m in b.messages_to_send()]
        assert acks == [AckHeld2(got.seq) if short else Ack2(got.seq, KEY, link_summary(held))]
        a.receive_message(encode2(acks[0]))
        assert a.core2.peer_summary(KEY) == link_summary(held)
    assert held == line[3]
    with pytest.raises(RemoteProtocolError, match="did not send"):
        a.receive_message(encode2(AckHeld2(12345)))
