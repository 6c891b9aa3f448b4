"""The redial's word (feature ``link-gone``): it names one link for one new link, nothing else reads as
it, a session that took the link anyway ignores it, and a daemon names only a link its peer took."""

from __future__ import annotations

import pytest

from latticed.crdt.wire import pack
from latticed.errors import RemoteProtocolError
from latticed.net.gossip import STALE_AFTER_S
from latticed.protocol.link_gone import (
    GONE,
    LOST_LINK_TTL_S,
    LostLinks,
    gone_message,
    gone_tag,
    is_gone,
    names,
)
from latticed.protocol.replication import PROTOCOL_VERSION, ReplicationSession
from latticed.protocol.replication_messages import Hello, encode_message
from latticed.version import PROTOCOL_FEATURES

OLD, NEW, OTHER = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def test_the_word_names_one_link_for_one_new_link() -> None:
    word = gone_message(OLD, NEW)
    assert names(word, OLD, NEW)
    assert not names(word, OTHER, NEW)  # another link
    assert not names(word, OLD, OTHER)  # copied to another new link
    assert not names(gone_message(NEW, OLD), OLD, NEW)  # the roles matter
    assert gone_tag(OLD, NEW) != gone_tag(OLD, OTHER) != gone_tag(OTHER, NEW)
    assert "link-gone" in PROTOCOL_FEATURES


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"\x92\x09",
        pack([GONE, b"x" * 31]),
        pack([GONE, "x" * 32]),
        pack([GONE, b"x" * 32, 1]),
        pack([8, gone_tag(OLD, NEW)]),
        b"\x92\x09\xc4\x20" + b"\xff" * 31 + b"\x00",
        encode_message(Hello(PROTOCOL_VERSION, None, b"\x09" * 16)),
    ],
)
def test_nothing_else_reads_as_the_word(message: bytes) -> None:
    assert not names(message, OLD, NEW)


def test_a_session_that_took_the_link_ignores_the_word_and_refuses_a_malformed_one() -> None:
    session = ReplicationSession()
    session.start({})
    session.receive_message(encode_message(Hello(PROTOCOL_VERSION, None, b"\x09" * 16)))
    session.messages_to_send()
    while session.next_event() is not None:  # the peer's HELLO
        pass
    session.receive_message(gone_message(OLD, NEW))
    assert session.messages_to_send() == [] and session.next_event() is None
    assert is_gone([GONE, b"x" * 32]) and not is_gone([GONE, b"x" * 31])
    with pytest.raises(RemoteProtocolError):
        session.receive_message(pack([GONE, b"x" * 31]))


def test_a_daemon_names_the_last_link_its_peer_took_and_spoke_the_feature_on() -> None:
    lost = LostLinks(capacity=2)
    peer = b"p" * 32
    assert lost.word_for(peer, NEW, now=1.0) is None
    lost.ended(peer, OLD, said_hello=True, agreed=True, closed=False, now=0.0)
    assert lost.word_for(peer, NEW, now=1.0) == gone_message(OLD, NEW)
    lost.ended(
        peer, OTHER, said_hello=False, agreed=False, closed=False, now=0.0
    )  # a redial it refused: OLD is still the one
    assert lost.word_for(peer, NEW, now=1.0) == gone_message(OLD, NEW)
    lost.ended(
        peer, OTHER, said_hello=True, agreed=False, closed=False, now=0.0
    )  # a link without the feature: name nothing
    assert lost.word_for(peer, NEW, now=1.0) is None
    lost.ended(peer, OLD, said_hello=True, agreed=True, closed=False, now=0.0)
    lost.ended(peer, OTHER, said_hello=True, agreed=True, closed=True, now=0.0)  # closed on purpose
    assert lost.word_for(peer, NEW, now=1.0) is None  # names nothing, nor the link lost before it
    lost.ended(peer, OLD, said_hello=True, agreed=True, closed=False, now=0.0)
    lost.ended(b"q" * 32, OLD, said_hello=True, agreed=True, closed=False, now=0.0)
    # Over capacity: the oldest forgotten.
    lost.ended(b"r" * 32, OLD, said_hello=True, agreed=True, closed=False, now=0.0)
    assert lost.word_for(peer, NEW, now=1.0) is None and lost.word_for(b"r" * 32, NEW, now=1.0) is not None


def test_a_lost_link_is_named_only_while_the_peers_end_of_it_may_still_look_alive() -> None:
    """Past twice the peer's stale bound its end of the link is stale and any redial replaces it: the
    word would do nothing there, but a peer restarted since on a build without the feature drops a link
    on a message it does not know. So a daemon stops naming the link then (and forgets it)."""
    lost = LostLinks()
    peer = b"p" * 32
    lost.ended(peer, OLD, said_hello=True, agreed=True, closed=False, now=100.0)
    assert lost.word_for(peer, NEW, now=100.0 + LOST_LINK_TTL_S) == gone_message(OLD, NEW)
    assert lost.word_for(peer, NEW, now=100.1 + LOST_LINK_TTL_S) is None
    assert lost.word_for(peer, NEW, now=100.0) is None  # forgotten, not only silent
    assert LOST_LINK_TTL_S >= 2 * STALE_AFTER_S  # the peer's stale bound, with as much again for the way
