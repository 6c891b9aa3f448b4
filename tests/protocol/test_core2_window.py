"""The core-2 delta window a link agrees on (feature ``window2-32``): 32 small deltas in flight each way
where both ends speak it, 8 otherwise, never more than 8 large ones; the receiver holds a peer to what
it agreed to (more is the peer's protocol error)."""

from __future__ import annotations

import pytest
from support.core2_sim import Core2Network
from support.queue2_histories import OWNER

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.errors import RemoteProtocolError
from latticed.protocol.core2_session import Core2Link
from latticed.protocol.core2_wire import Delta2, encode2, link_summary
from latticed.protocol.replication import ReplicationSession
from latticed.protocol.versions import HEADS_V2, SMALL_DELTA2_BYTES, WIDE_WINDOW2, WINDOW2

WIDE = frozenset({HEADS_V2, "compact", WINDOW2})
NARROW = frozenset({HEADS_V2, "compact"})


def _queues(count: int, value: bytes) -> list[queue2.QueueState2]:
    return [
        queue2.commit(
            queue2.empty_state(OWNER.public_key, f"q{i:03d}"), OWNER, now_ms=1, records=[Record(value)]
        )
        for i in range(count)
    ]


def _peak_in_flight(features: frozenset[str], states: list[queue2.QueueState2]) -> int:
    net = Core2Network(max_records=64, depth=4, window=8, features=features)
    for n in range(2):
        net.add(n)
    net.connect(0, 1)
    for state in states:
        net.node2(0).put2(state)
    core2 = net.nodes[0].sessions[1].core2
    assert core2 is not None
    peak = net.peak_until_quiet(lambda: core2.inflight)
    assert net.node2(1).states2 == net.node2(0).states2  # all of them arrived, whatever the window
    return peak


def test_many_small_queues_go_32_at_a_time_where_both_agreed_and_8_where_not() -> None:
    states = _queues(100, b"x" * 100)
    assert _peak_in_flight(WIDE, states) == WIDE_WINDOW2
    assert _peak_in_flight(NARROW, states) == 8


def test_large_deltas_stay_8_in_flight_on_a_wide_link() -> None:
    states = _queues(20, b"x" * (SMALL_DELTA2_BYTES + 1))
    assert _peak_in_flight(WIDE, states) == 8


def _receiver(features: frozenset[str] | None, stated: frozenset[str] | None = None) -> ReplicationSession:
    """A session past the peer's HELLO that agreed on ``features`` (None: not yet) and heard the peer's
    request state ``stated`` (None: not yet)."""
    session = ReplicationSession(notices=False)
    session.attach_core2(Core2Link())
    session.start({})
    assert session.core2 is not None
    session.core2.start({})
    peer = ReplicationSession()
    peer.start({})
    for message in peer.messages_to_send():
        session.receive_message(message)
    if stated is not None:
        session.peer_stated(stated)
    if features is not None:
        session.agree_features(features)
    return session


def _deltas(count: int, value: bytes) -> list[bytes]:
    out = []
    for seq, state in enumerate(_queues(count, value), start=1):
        out.append(encode2(Delta2(seq, link_summary(state), queue2.delta(state, None))))
    return out


@pytest.mark.parametrize(
    ("features", "stated", "admitted"),
    [
        (WIDE, None, WIDE_WINDOW2),  # both agreed
        (None, WIDE, WIDE_WINDOW2),  # its request said so; ours is not answered yet
        (NARROW, NARROW, 8),  # the peer does not speak it
        (None, None, 8),  # nothing agreed yet (or a 0.2.0 peer)
    ],
)
def test_a_peer_is_held_to_the_window_it_agreed_to(
    features: frozenset[str] | None, stated: frozenset[str] | None, admitted: int
) -> None:
    session = _receiver(features, stated)
    messages = _deltas(admitted + 1, b"x" * 100)
    for message in messages[:admitted]:
        session.receive_message(message)
    with pytest.raises(RemoteProtocolError, match=f"more than {admitted} core-2 deltas unacknowledged"):
        session.receive_message(messages[admitted])


def test_a_wide_link_admits_no_more_than_8_large_deltas() -> None:
    session = _receiver(WIDE)
    large = _deltas(9, b"x" * (SMALL_DELTA2_BYTES + 1))
    for message in large[:8]:
        assert len(message) > SMALL_DELTA2_BYTES
        session.receive_message(message)
    with pytest.raises(RemoteProtocolError, match=f"more than 8 core-2 deltas over {SMALL_DELTA2_BYTES}"):
        session.receive_message(large[8])


def test_a_wide_link_without_the_peer_on_heads_v2_stays_narrow() -> None:
    core2 = Core2Link()
    core2.agree(frozenset({WINDOW2}))
    core2.peer_speaks(frozenset({WINDOW2}))
    assert (core2.window_out or core2.window, core2.window_in or core2.window) == (8, 8)
