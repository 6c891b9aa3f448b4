"""The word a redial carries: "the link you had with me, this one, is gone on my side" (``link-gone``).

Why: when a peer's end of a link died while ours still looks alive (half-open), and the peer dials again,
the key order that settles simultaneous dials may keep our old link; the redial was then refused until the
old link had been silent for two ping intervals (20 s), the peer in the dark meanwhile. A simultaneous dial
and a redial look alike to us: in both the peer may have no other live link to us when it dials. What
tells them apart is *which* link is gone, so the word names it.

``GONE [9, tag]``, sent right after the HELLO on a new link, where ``tag`` is keyed BLAKE2b of the new
link's ``session_id`` under the old link's ``session_id`` (:func:`gone_tag`). Only the two ends of the old
link know its session id (it needs that handshake's ephemeral secret, not only the network key), and the
tag is bound to the new link, so:

* the only one who can name a link is its other end, and it names only a link it lost: at worst a peer
  ends a link it is an end of, which it could do by closing it;
* a word copied to another link (recorded, or replayed by whoever holds the identity key: a copied data
  directory) names nothing there, and a word naming a link already gone names none we hold: both are
  refused by the key order as before, and evict nothing live;
* a simultaneous dial is decided by the key order on both ends as ever: neither link there was lost by
  anyone, so no word names either.

A peer names only a link it *lost* (it died without the other end's final frame: EOF, reset, silence),
never one either end closed on purpose (the other end knows that one ended), and only when the link it
lost had agreed on the feature (a 0.2.0 peer, or one without it, is never sent it, and never sends one);
a receiver reads it only where it would refuse the new link, and ignores it on a link it took anyway
(:func:`is_gone`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from typing import Any, Final

from latticed.crdt.wire import pack, unpack

__all__ = ["GONE", "LINK_GONE_FEATURE", "LostLinks", "gone_message", "gone_tag", "is_gone", "names"]

#: The protocol feature: a daemon that speaks it reads GONE and may send it.
LINK_GONE_FEATURE: Final = "link-gone"
#: The message's type code (the replication protocol's 0-8 are taken; 16-18, 32-44 and 64-79 too).
GONE: Final = 9
_TAG_SIZE: Final = 32
_PERSON: Final = b"latticed/v2/gone"  # 16 bytes, as the handshake's personalizations
#: Peers whose last lost link we remember (oldest forgotten first): one entry each, 32 bytes.
MAX_LOST_LINKS: Final = 256
#: How long a lost link is named (s): twice the silence after which the peer's end of it is stale anyway
#: (net/gossip.py's ``STALE_AFTER_S``, 20 s) and any redial replaces it. Later the word would do nothing
#: but reach a peer that may no longer speak the feature (restarted on an older build, or another run of
#: the identity), which refuses an unknown message by dropping the link.
LOST_LINK_TTL_S: Final = 40.0


def gone_tag(old_session_id: bytes, new_session_id: bytes) -> bytes:
    """The tag naming the old link (by its session id), bound to the new one."""
    return hashlib.blake2b(new_session_id, digest_size=_TAG_SIZE, key=old_session_id, person=_PERSON).digest()


def gone_message(old_session_id: bytes, new_session_id: bytes) -> bytes:
    """``GONE [9, tag]`` as sent on the new link."""
    return pack([GONE, gone_tag(old_session_id, new_session_id)])


def is_gone(raw: list[Any]) -> bool:
    """Whether a decoded message is a well-formed GONE (a malformed one is not: the caller's strict
    decoding then refuses it)."""
    return len(raw) == 2 and raw[0] == GONE and type(raw[1]) is bytes and len(raw[1]) == _TAG_SIZE


def names(message: bytes, old_session_id: bytes, new_session_id: bytes) -> bool:
    """Whether ``message``, received on the new link, is the GONE naming the old link."""
    if len(message) != 36 or message[1] != GONE:  # fixarray(2), fixint 9, bin8 32, the tag
        return False
    try:
        raw = unpack(message)
    except Exception:  # not msgpack: not the word
        return False
    return (
        type(raw) is list
        and is_gone(raw)
        and hmac.compare_digest(raw[1], gone_tag(old_session_id, new_session_id))
    )


class LostLinks:
    """Per peer, the session id of the last link to it that was lost on our side (it died: end of stream
    or reset without the peer's final frame, silence, a peer that stopped reading) after the peer said
    hello on it, if that link agreed on the feature (the peer then reads the word). A link either end
    closed on purpose (a daemon stopping, a duplicate replaced, an error answered) is not lost: its other
    end knows it ended, so there is nothing to name, and naming it would only cost a link if the peer
    came back on a build without the feature (a rollback)."""

    def __init__(self, capacity: int = MAX_LOST_LINKS, ttl: float = LOST_LINK_TTL_S) -> None:
        self.capacity = capacity
        self.ttl = ttl
        #: Per peer, the lost link's session id and when it ended (the caller's clock).
        self._lost: OrderedDict[bytes, tuple[bytes, float]] = OrderedDict()

    def ended(
        self, peer: bytes, session_id: bytes, *, said_hello: bool, agreed: bool, closed: bool, now: float
    ) -> None:
        """A link to ``peer`` ended here at ``now`` (``closed``: on purpose, by either end). One the peer
        never said hello on was never its link (it refused it): the link named before stays named. One
        closed on purpose, or that did not agree on the feature, forgets it and names nothing."""
        if not said_hello:
            return
        self._lost.pop(peer, None)
        if agreed and not closed:
            self._lost[peer] = (session_id, now)
            while len(self._lost) > self.capacity:
                self._lost.popitem(last=False)

    def word_for(self, peer: bytes, new_session_id: bytes, *, now: float) -> bytes | None:
        """The GONE to send right after the HELLO on a new link to ``peer`` at ``now`` (None: none to
        name, or the lost link ended so long ago that the peer's end of it is stale by now)."""
        lost = self._lost.get(peer)
        if lost is None:
            return None
        old, ended_at = lost
        if now - ended_at > self.ttl:
            del self._lost[peer]
            return None
        return gone_message(old, new_session_id)
