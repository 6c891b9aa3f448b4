"""What the daemon knows about each peer beyond the peer book: why dialling it fails, who we refused, how far
its clock is from ours, and the operator's standing decisions (peers added, identities blocked).

Sans-IO like the peer book: the replication service reports events with the time (Unix seconds) as an
argument, and :func:`peer_status` turns one book entry and these facts into what ``latticectl peers`` shows:

=============  ====================================================================================
connected      a handshake completed and the link is up
dialling       being dialled, or waiting for the next try (``next_attempt``), after ``failures`` failed
               tries that never reached the handshake (nothing listens there, no route, a timeout)
refused        TCP connected but the handshake failed (with the reason): no answer to our opening (the
               peer has another network key, its clock is more than 2 minutes off, or it runs an older
               latticed: a responder answers none of these, by design), it refused our identity (its
               allow-list or block list), or the identity is not in our ``allowed_peers``
blocked        the identity is on our block list: never dialled, refused at the handshake
self           our own address (a multi-homed host announces several)
=============  ====================================================================================

A dialler cannot tell a wrong network key from the other causes of silence, since the responder must not
say; the accepting side can, and records what it refused in :class:`IncomingRefusals`.

Clock skew is measured by the accepting side, from the time the initiator seals into the handshake's first
message (``docs/protocol.md``), which is authentic because it is MAC'd under the network key.
:class:`ClockSkew` reports transitions only, with hysteresis, so a log line is written once when a peer's
clock drifts past the threshold and once when it is back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from latticed.errors import MalformedError
from latticed.protocol.addresses import HostPort, parse_host_port

__all__ = [
    "INCOMING_REFUSALS_SHOWN_S",
    "MAX_ADDED",
    "MAX_BLOCKED",
    "NO_ANSWER_REASON",
    "OTHER_NETWORKS_FIX",
    "REFUSED_US_REASON",
    "SKEW_FORGET_S",
    "SKEW_RECOVER_MS",
    "SKEW_WARN_MS",
    "ClockSkew",
    "DialFailure",
    "FailureKind",
    "IncomingRefusal",
    "IncomingRefusals",
    "PeerRules",
    "SkewReading",
    "classify_dial_failure",
    "format_host_port",
    "other_networks_text",
    "peer_status",
]

#: At most this many addresses added with ``peers add`` and identities blocked (the rules file stays small).
MAX_ADDED: Final = 1024
MAX_BLOCKED: Final = 4096
_RULES_VERSION: Final = 1
_KEY_SIZE: Final = 32

#: A peer whose clock is further than this from ours (ms) is reported (the handshake refuses beyond 120 s;
#: KV entries are ordered by hybrid logical clocks, so a clock ahead wins conflicts it should not).
SKEW_WARN_MS: Final = 10_000
#: ... and reported recovered once it is back within this (hysteresis: no flapping near the threshold).
SKEW_RECOVER_MS: Final = 5_000
#: A reading not renewed for this long (s) is dropped: that peer has not connected to us since.
SKEW_FORGET_S: Final = 3600.0
_MAX_SKEW_PEERS: Final = 256
#: Handshakes we refused are shown this long (s) after the last one.
INCOMING_REFUSALS_SHOWN_S: Final = 600.0
_MAX_INCOMING: Final = 64

NO_ANSWER_REASON: Final = (
    "no answer to the handshake: wrong network key? (or its clock is more than 2 minutes off ours, or it "
    "runs an older latticed)"
)
REFUSED_US_REASON: Final = "it refused our identity (its allowed_peers leaves us out, or it blocked us)"

#: Why a dial failed: ``unreachable`` before the handshake (TCP), the rest during it.
FailureKind = Literal["unreachable", "no_answer", "refused_us", "not_allowed", "blocked", "handshake"]


def format_host_port(address: HostPort) -> str:
    """``HOST:PORT``, IPv6 literals in brackets (what :func:`parse_host_port` reads)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def other_networks_text(count: int) -> str:
    """What ``peers`` and ``doctor`` say of the daemons mDNS hears under another network key."""
    return f"{count} daemon{'s' if count != 1 else ''} of another network on this LAN"


#: What to do about them (their announcements do not open under our key: who they are is unknown).
OTHER_NETWORKS_FIX: Final = (
    "if they are yours, give them one network key: `latticectl invite` on a member, `latticectl join TOKEN` "
    "on the other"
)


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, bytes) or len(key) != _KEY_SIZE:
        raise MalformedError(f"a peer identity is {_KEY_SIZE} bytes (64 hex digits)")
    return key


# --- the operator's decisions -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerRules:
    """Addresses added with ``latticectl peers add`` and identities blocked, kept across restarts."""

    added: tuple[HostPort, ...] = ()
    blocked: frozenset[bytes] = frozenset()

    def with_added(self, address: HostPort) -> PeerRules:
        if address in self.added:
            return self
        if len(self.added) >= MAX_ADDED:
            raise MalformedError(f"at most {MAX_ADDED} peers can be added; remove some first")
        return PeerRules((*self.added, address), self.blocked)

    def without_added(self, addresses: Iterable[HostPort]) -> PeerRules:
        gone = set(addresses)
        return PeerRules(tuple(a for a in self.added if a not in gone), self.blocked)

    def with_blocked(self, key: bytes) -> PeerRules:
        _check_key(key)
        if key in self.blocked:
            return self
        if len(self.blocked) >= MAX_BLOCKED:
            raise MalformedError(f"at most {MAX_BLOCKED} identities can be blocked; unblock some first")
        return PeerRules(self.added, self.blocked | {key})

    def without_blocked(self, key: bytes) -> PeerRules:
        return PeerRules(self.added, self.blocked - {key})

    def admits(self, key: bytes, allowed: frozenset[bytes] | None) -> bool:
        """Whether the handshake may accept ``key``: not blocked, and in ``allowed`` if there is a list."""
        return key not in self.blocked and (allowed is None or key in allowed)

    def to_json(self) -> str:
        doc = {
            "version": _RULES_VERSION,
            "added": [format_host_port(a) for a in self.added],
            "blocked": sorted(k.hex() for k in self.blocked),
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> PeerRules:
        """Exactly what :meth:`to_json` writes, else :class:`MalformedError` (the file is the operator's)."""
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as error:
            raise MalformedError(f"peer rules are not JSON: {error}") from None
        if (
            not isinstance(doc, dict)
            or doc.get("version") != _RULES_VERSION
            or set(doc) != {"version", "added", "blocked"}
            or not isinstance(doc["added"], list)
            or not isinstance(doc["blocked"], list)
        ):
            raise MalformedError(
                f"peer rules must be {{'version': {_RULES_VERSION}, 'added': [...], 'blocked': [...]}}"
            )
        rules = cls()
        for i, text_address in enumerate(doc["added"]):
            if not isinstance(text_address, str):
                raise MalformedError(f"peer rules: added[{i}] is not 'HOST:PORT'")
            rules = rules.with_added(parse_host_port(text_address))
        for i, hexkey in enumerate(doc["blocked"]):
            try:
                key = bytes.fromhex(hexkey) if isinstance(hexkey, str) else b""
            except ValueError:
                key = b""
            if len(key) != _KEY_SIZE:
                raise MalformedError(f"peer rules: blocked[{i}] is not 64 hex digits")
            rules = rules.with_blocked(key)
        return rules


# --- dial failures ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DialFailure:
    """Why the last dial of an address failed, and when (Unix seconds)."""

    kind: FailureKind
    reason: str
    at: float

    @property
    def refused(self) -> bool:
        """Whether the peer was reached and the handshake failed (shown as ``refused``)."""
        return self.kind != "unreachable"


def classify_dial_failure(
    *,
    reached: bool,
    message: str,
    at: float,
    handshake_error: bool = False,
    waiting_for: str | None = None,
    we_refused: bytes | None = None,
    blocked: frozenset[bytes] = frozenset(),
) -> DialFailure:
    """A dial's failure as the dialler can tell it.

    ``reached``: TCP connected (the failure came during the handshake). ``handshake_error``: the handshake
    itself failed (else the connection closed or timed out during it). ``waiting_for``: which of the
    peer's messages we waited for when it hung up. ``we_refused``: the identity our own check refused.
    """
    if not reached:
        return DialFailure("unreachable", message, at)
    if we_refused is not None:
        if we_refused in blocked:
            return DialFailure("blocked", f"{we_refused.hex()} is on our block list", at)
        return DialFailure("not_allowed", f"{we_refused.hex()} is not in our allowed_peers", at)
    if not handshake_error or waiting_for == "msg2":
        return DialFailure("no_answer", NO_ANSWER_REASON, at)
    if waiting_for == "msg4":
        return DialFailure("refused_us", REFUSED_US_REASON, at)
    return DialFailure("handshake", f"the handshake failed: {message}", at)


# --- handshakes we refused ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IncomingRefusal:
    """Handshakes opened to us from ``host`` that we refused: the last reason, when, how many."""

    host: str
    reason: str
    at: float
    count: int
    public_key: bytes | None = None


@dataclass(slots=True)
class IncomingRefusals:
    """Recent refused incoming handshakes by remote host (the source port is ephemeral), bounded."""

    shown_for: float = INCOMING_REFUSALS_SHOWN_S
    capacity: int = _MAX_INCOMING
    _by_host: dict[str, IncomingRefusal] = field(default_factory=dict)

    def refused(self, host: str, reason: str, now: float, public_key: bytes | None = None) -> None:
        old = self._by_host.pop(host, None)
        count = 1 if old is None or now - old.at > self.shown_for else old.count + 1
        self._by_host[host] = IncomingRefusal(host, reason, now, count, public_key)
        while len(self._by_host) > self.capacity:
            del self._by_host[next(iter(self._by_host))]  # the least recently refused

    def accepted(self, host: str) -> None:
        """A handshake from ``host`` succeeded: what we refused before is no longer news."""
        self._by_host.pop(host, None)

    def forget(self, public_key: bytes) -> None:
        """Drop what we refused of ``public_key`` (unblocked, or removed by the operator)."""
        for host in [h for h, r in self._by_host.items() if r.public_key == public_key]:
            del self._by_host[host]

    def recent(self, now: float) -> list[IncomingRefusal]:
        return sorted(
            (r for r in self._by_host.values() if now - r.at <= self.shown_for), key=lambda r: r.host
        )


# --- clock skew ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkewReading:
    """The last measured offset of a peer's clock from ours (positive: it is ahead), in ms."""

    peer: str
    offset_ms: int
    at: float
    address: str
    skewed: bool
    #: Hex identity, when the handshake got far enough to tell it.
    public_key: str | None = None


@dataclass(slots=True)
class ClockSkew:
    """Per peer (identity hex, or host when a stale opening was refused before we learnt it), the last
    clock offset; :meth:`observe` says when a peer crosses the threshold, each way."""

    warn_ms: int = SKEW_WARN_MS
    recover_ms: int = SKEW_RECOVER_MS
    forget_after: float = SKEW_FORGET_S
    capacity: int = _MAX_SKEW_PEERS
    _readings: dict[str, SkewReading] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.recover_ms <= self.warn_ms:
            raise MalformedError("clock skew thresholds need 0 <= recover_ms <= warn_ms")

    def observe(
        self, peer: str, offset_ms: int, now: float, address: str = "", public_key: str | None = None
    ) -> Literal["skewed", "recovered"] | None:
        """Record a measurement; "skewed" when the peer just went over the threshold, "recovered" when it
        came back within ``recover_ms``, None when nothing changed."""
        old = self._readings.pop(peer, None)
        if old is not None and now - old.at > self.forget_after:
            old = None
        was = old is not None and old.skewed
        size = abs(offset_ms)
        skewed = size > self.warn_ms if not was else size > self.recover_ms
        self._readings[peer] = SkewReading(peer, offset_ms, now, address, skewed, public_key)
        while len(self._readings) > self.capacity:
            del self._readings[next(iter(self._readings))]
        if skewed and not was:
            return "skewed"
        if was and not skewed:
            return "recovered"
        return None

    def reading(self, peer: str, now: float) -> SkewReading | None:
        """The last recent reading of ``peer``, if any."""
        found = self._readings.get(peer)
        return found if found is not None and now - found.at <= self.forget_after else None

    def skewed(self, now: float) -> list[SkewReading]:
        """Peers whose last reading is over the threshold and recent, sorted by peer."""
        return sorted(
            (r for r in self._readings.values() if r.skewed and now - r.at <= self.forget_after),
            key=lambda r: r.peer,
        )


# --- what latticectl peers shows ------------------------------------------------------------------------


def peer_status(
    *,
    book_state: str,
    public_key: bytes | None,
    blocked: frozenset[bytes],
    failure: DialFailure | None,
) -> tuple[str, str | None]:
    """The shown state of one peer book entry, and the reason for it (None when there is nothing to say).

    ``book_state`` is :class:`~latticed.protocol.peerbook.PeerState`'s value. A blocked identity is blocked
    whatever its entry says (a link that was up when it was blocked is being closed)."""
    if public_key is not None and public_key in blocked:
        return "blocked", "on our block list: never dialled, refused at the handshake"
    if book_state == "connected":
        return "connected", None
    if book_state == "self":
        return "self", "this daemon's own address"
    if failure is not None and failure.kind == "blocked":
        return "blocked", failure.reason
    if failure is not None and failure.refused:
        return "refused", failure.reason
    return "dialling", failure.reason if failure is not None else None
