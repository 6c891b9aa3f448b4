"""Version negotiation on the peer link (latticed/protocol/versions.py): the highest common version, the
shared features, what a feature gates, and how a peer with no version in common is described."""

from __future__ import annotations

import pytest

from latticed.crdt.queue import Summary
from latticed.errors import IncompatiblePeerError, RemoteProtocolError
from latticed.protocol import replication
from latticed.protocol.core2_session import Core2Link
from latticed.protocol.replication import NeedDelta, ReplicationSession
from latticed.protocol.versions import (
    HEADS_V2,
    UNSTATED,
    LinkVersions,
    agree,
    expressible,
    ours,
    queue_expressible,
)
from latticed.version import PROTOCOL_VERSIONS, RELEASE

OWNER = b"o" * 32
PLAIN = (OWNER, "plain", 0)
NEWER = (OWNER, "newer", 7)  # a kind that needs a feature an older peer lacks
KINDS = {7: "newer-kind"}


def test_both_sides_use_the_highest_version_they_share_and_the_features_both_name() -> None:
    local = LinkVersions("9.0.0", (1, 2, 3), frozenset({"a", "b"}))
    peer = LinkVersions("8.0.0", (2, 3, 4), frozenset({"b", "c"}))
    agreed = agree(local, peer)
    assert (agreed.protocol, agreed.features) == (3, frozenset({"b"}))
    assert agree(peer, local).protocol == 3  # the same from either side


def test_a_peer_that_does_not_state_its_versions_is_spoken_to_in_protocol_1() -> None:
    agreed = agree(ours(), UNSTATED)  # 0.2.0 refuses the request: protocol 1, no features
    assert (agreed.protocol, agreed.features) == (1, frozenset())
    assert 1 in PROTOCOL_VERSIONS


def test_no_common_version_names_both_sides_and_who_to_upgrade() -> None:
    local = LinkVersions("0.3.0", (1,))
    peer = LinkVersions("2.0.0", (3, 4), frozenset({"x"}))
    with pytest.raises(IncompatiblePeerError) as info:
        agree(local, peer)
    message = str(info.value)
    assert "latticed 2.0.0, protocol 3-4 (features: x)" in message
    assert "latticed 0.3.0, protocol 1" in message
    assert "upgrade this daemon" in message and "network key" not in message
    with pytest.raises(IncompatiblePeerError, match="upgrade the peer"):
        agree(peer, local)


def test_a_statement_round_trips_and_a_malformed_one_is_a_protocol_error() -> None:
    assert LinkVersions.from_body(ours().to_body()) == ours()
    assert ours().release == RELEASE
    for body in (
        {"protocols": []},
        {"protocols": [0]},
        {"protocols": ["1"]},
        {"protocols": [1], "features": [1]},
        {"protocols": [1], "release": 5},
        {"protocols": [1], "features": ["x" * 65]},
    ):
        with pytest.raises(RemoteProtocolError):
            LinkVersions.from_body(body)


def test_a_kind_that_needs_a_feature_is_expressible_only_once_both_speak_it() -> None:
    assert expressible(0, None, KINDS)
    assert not expressible(7, None, KINDS)
    assert not expressible(7, frozenset(), KINDS)
    assert expressible(7, frozenset({"newer-kind"}), KINDS)


def _asked(session: ReplicationSession) -> set[tuple[bytes, str, int]]:
    asked = set()
    while (event := session.next_event()) is not None:
        if isinstance(event, NeedDelta):
            asked.add(event.key)
            session.provide_delta(event.key, None)
    return asked


def _open_pair(local: dict[tuple[bytes, str, int], Summary]) -> ReplicationSession:
    sender = ReplicationSession(kind_features=KINDS)
    receiver = ReplicationSession()
    sender.start(local)
    receiver.start({})
    for message in receiver.messages_to_send():
        sender.receive_message(message)
    return sender


def test_what_the_peer_cannot_express_is_held_back_counted_and_sent_once_agreed() -> None:
    held = Summary(version=1, start=0, held_end=3, held_hash=b"h" * 32)
    sender = _open_pair({PLAIN: held, NEWER: held})
    assert _asked(sender) == {PLAIN}  # before the peer stated its features: only what needs none
    assert sender.withheld == 1
    sender.agree_features(frozenset())  # an older peer: still held back
    assert _asked(sender) == set() and sender.withheld == 1
    sender.agree_features(frozenset({"newer-kind"}))
    assert _asked(sender) == {NEWER} and sender.withheld == 0


def test_without_gated_kinds_nothing_is_held_back() -> None:
    held = Summary(version=1, start=0, held_end=3, held_hash=b"h" * 32)
    session = ReplicationSession()
    session.start({NEWER: held})
    peer = ReplicationSession()
    peer.start({})
    for message in peer.messages_to_send():
        session.receive_message(message)
    assert _asked(session) == {NEWER} and session.withheld == 0


def test_a_core2_links_expressibility_follows_the_agreed_features_and_keeps_few_kinds() -> None:
    """The session answers its core-2 link per kind from a small table (a relay asks on every push): the
    answer is ``queue_expressible``'s for the features agreed at the time, and a peer's odd kinds are
    answered without being kept past the bound."""
    session = ReplicationSession(kind_features=KINDS)
    core2 = Core2Link()
    session.attach_core2(core2)
    key0, key7 = (b"o" * 32, "q", 0), (b"o" * 32, "q", 7)
    assert not core2.expressible(key0)  # no features yet: core 2 needs heads-v2
    session.agree_features(frozenset({HEADS_V2}))
    assert core2.expressible(key0) and not core2.expressible(key7)
    session.peer_features = frozenset({HEADS_V2, "newer-kind"})
    assert core2.expressible(key7)
    for kind in range(1000, 1100):  # a peer's many odd kinds: answered, few kept
        key = (b"o" * 32, "q", kind)
        assert core2.expressible(key) == queue_expressible(kind, 2, session.peer_features, KINDS)
    assert len(session._expressible_kinds) <= replication._KINDS_KEPT
