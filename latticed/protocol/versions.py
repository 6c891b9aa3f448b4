"""How two daemons settle on a replication protocol version and the optional features they both speak.

The exchange rides inside the authenticated, encrypted link, after the handshake (which stays v2): both
sides send the HELLO of the lowest version they speak, which every release read so far (0.2.0 accepts
exactly ``[0, 1, subscription, incarnation]`` and refuses anything longer or of another version, so no
field can be added to it). Then each asks the other, as a request of the link's request/answer
sub-protocol (:mod:`latticed.protocol.lease_forwarding`, op :data:`VERSIONS_OP`), which versions and
features it speaks. 0.2.0 answers any op it does not know with a refusal and keeps the link: a refusal (or no
answer) means the peer speaks protocol 1 without features (:data:`UNSTATED`). Both then use the highest
version they share and the features both name (:func:`agree`).

What a feature gates: a queue of a kind that needs a feature (:data:`FEATURE_OF_KIND`), or on a core that
needs one (:data:`FEATURE_OF_CORE`: ``heads-v2`` for queues on the v2 fork core), is not offered to a peer
that lacks it (the session counts what it held back). Until the peer has answered, only what every
version expresses is sent. :func:`queue_expressible` is the one test for a queue.

A HELLO of a version we do not speak means the two have none in common (a daemon sends its lowest):
:func:`incompatible` says so with both sides' versions, never as a key or clock problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from latticed.errors import IncompatiblePeerError, RemoteProtocolError
from latticed.version import PROTOCOL_FEATURES, PROTOCOL_VERSIONS, RELEASE, span

__all__ = [
    "FEATURE_OF_CORE",
    "FEATURE_OF_KIND",
    "HEADS_V2",
    "SMALL_DELTA2_BYTES",
    "WIDE_WINDOW2",
    "WINDOW2",
    "UNSTATED",
    "VERSIONS_OP",
    "Agreement",
    "LinkVersions",
    "agree",
    "expressible",
    "incompatible",
    "ours",
    "queue_expressible",
    "stated",
]

#: The request of the link's request/answer sub-protocol that asks a peer what it speaks.
VERSIONS_OP: Final = "link.versions"
#: Queue kinds that only a peer speaking the named feature may be sent (none yet).
FEATURE_OF_KIND: Final[Mapping[int, str]] = {}
#: The feature of queues on the v2 fork core (a forked queue frozen, its owner's recovery in a new epoch).
HEADS_V2: Final = "heads-v2"
#: The feature of the wider core-2 delta window: with ``heads-v2`` agreed too, each end of the link keeps
#: up to :data:`WIDE_WINDOW2` core-2 deltas unacknowledged (the session's ``window``, 8, without it), at
#: most ``window`` of them over :data:`SMALL_DELTA2_BYTES` as sent: many small queues catch up with more
#: merges per group commit, while a link's memory of large deltas stays what it was.
WINDOW2: Final = "window2-32"
WIDE_WINDOW2: Final = 32
SMALL_DELTA2_BYTES: Final = 64 * 1024
#: Queue cores that only a peer speaking the named feature may be sent anything of (1: none needed).
FEATURE_OF_CORE: Final[Mapping[int, str]] = {2: HEADS_V2}

_MAX_VERSIONS: Final = 64
_MAX_FEATURES: Final = 64
_MAX_NAME: Final = 64


@dataclass(frozen=True, slots=True)
class LinkVersions:
    """What one daemon speaks on the peer link (``release`` None: it did not say)."""

    release: str | None
    protocols: tuple[int, ...]
    features: frozenset[str] = frozenset()

    def to_body(self) -> dict[str, Any]:
        """The body of a :data:`VERSIONS_OP` request or answer."""
        return {
            "release": self.release or "",
            "protocols": list(self.protocols),
            "features": sorted(self.features),
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> LinkVersions:
        """Parse a peer's statement; anything malformed is the peer's protocol error."""
        release = body.get("release", "")
        protocols = body.get("protocols")
        features = body.get("features", [])
        if type(release) is not str or len(release) > _MAX_NAME:
            raise RemoteProtocolError("link.versions: release must be short text")
        if (
            type(protocols) is not list
            or not 0 < len(protocols) <= _MAX_VERSIONS
            or not all(type(v) is int and v > 0 for v in protocols)
        ):
            raise RemoteProtocolError("link.versions: protocols must be a list of positive integers")
        if (
            type(features) is not list
            or len(features) > _MAX_FEATURES
            or not all(type(f) is str and 0 < len(f) <= _MAX_NAME for f in features)
        ):
            raise RemoteProtocolError("link.versions: features must be a list of short names")
        return cls(release or None, tuple(sorted(set(protocols))), frozenset(features))

    def describe(self) -> str:
        """``protocol 1-2 (features: a, b)``, as the log and ``latticectl peers`` write it."""
        named = f"latticed {self.release}, " if self.release else ""
        features = f" (features: {', '.join(sorted(self.features))})" if self.features else ""
        return f"{named}protocol {span(self.protocols)}{features}"


def ours() -> LinkVersions:
    """What this build speaks."""
    return LinkVersions(RELEASE, PROTOCOL_VERSIONS, PROTOCOL_FEATURES)


#: A peer that does not state its versions (0.2.0 refuses the request): protocol 1, no features.
UNSTATED: Final = LinkVersions(None, (1,), frozenset())


@dataclass(frozen=True, slots=True)
class Agreement:
    """What a link uses: the highest protocol version both speak, and the features both name."""

    protocol: int
    features: frozenset[str]
    peer: LinkVersions


def agree(local: LinkVersions, peer: LinkVersions) -> Agreement:
    """The highest common version and the shared features; no common version: IncompatiblePeerError."""
    common = set(local.protocols) & set(peer.protocols)
    if not common:
        raise incompatible(local, peer)
    return Agreement(max(common), local.features & peer.features, peer)


def stated(body: Mapping[str, Any]) -> frozenset[str]:
    """The features this build and a peer whose :data:`VERSIONS_OP` request carries ``body`` both name
    (malformed: none). The peer may use them on what it sends once it has our answer, which can come
    before it answers our own request; so the limits we enforce on it follow its request."""
    try:
        return PROTOCOL_FEATURES & LinkVersions.from_body(body).features
    except RemoteProtocolError:
        return frozenset()


def incompatible(local: LinkVersions, peer: LinkVersions) -> IncompatiblePeerError:
    """The error (and log reason) for a peer with no version in common, naming both sides."""
    newer = "this daemon" if min(local.protocols) > max(peer.protocols) else "the peer"
    older = "the peer" if newer == "this daemon" else "this daemon"
    return IncompatiblePeerError(
        f"no replication protocol in common: the peer speaks {peer.describe()}, this daemon speaks "
        f"{local.describe()}; {newer} is too new for {older}: upgrade {older} (docs/operations.md, Upgrades)"
    )


def expressible(
    kind: int, features: frozenset[str] | None, kinds: Mapping[int, str] = FEATURE_OF_KIND
) -> bool:
    """Whether a queue of ``kind`` may be sent to a peer speaking ``features`` (None: not known yet, so
    only what needs no feature)."""
    needed = kinds.get(kind)
    return needed is None or (features is not None and needed in features)


def queue_expressible(
    kind: int,
    core: int,
    features: frozenset[str] | None,
    kinds: Mapping[int, str] = FEATURE_OF_KIND,
    cores: Mapping[int, str] = FEATURE_OF_CORE,
) -> bool:
    """Whether anything of a queue of ``kind`` on ``core`` may be sent to a peer speaking ``features``
    (None: not known yet): its kind and its core must both be expressible."""
    needed = cores.get(core)
    return expressible(kind, features, kinds) and (
        needed is None or (features is not None and needed in features)
    )
