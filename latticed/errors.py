"""Public error hierarchy: the pure core's errors plus those of storage, network and API layers."""

from __future__ import annotations

from latticed.crdt.core_errors import (
    BadSignatureError,
    EquivocationError,
    GapError,
    IntegrityError,
    LatticedError,
    MalformedError,
    NotOwnerError,
    NotReaderError,
    TamperedError,
    WrongOwnerError,
    WrongTypeError,
)


class NotFoundError(LatticedError):
    """An unknown queue, namespace, key, group or lease."""

    code = "not_found"


class AlreadyExistsError(LatticedError):
    """Creating something that already exists."""

    code = "exists"


class StorageError(LatticedError):
    """The store cannot do what was asked: disk full, read-only data dir, corrupt file."""

    code = "storage"


class ProtocolError(LatticedError):
    """A peer or client broke the wire protocol (bad frame, bad state transition, oversized message)."""

    code = "protocol"


class LocalProtocolError(ProtocolError):
    """We were about to break the protocol ourselves: a bug on our side."""

    code = "local_protocol"


class RemoteProtocolError(ProtocolError):
    """The other side broke the protocol; close that connection, keep serving the rest."""

    code = "remote_protocol"


class VersionGapError(ProtocolError):
    """The daemon is of another release and does not know an op this client uses (the message names both
    releases and local API versions, and what to upgrade)."""

    code = "version_gap"


class IncompatiblePeerError(RemoteProtocolError):
    """The peer authenticated but speaks no replication protocol version we speak (the message names
    both sides' versions): one of the two daemons must be upgraded; nothing is wrong with keys or clocks."""

    code = "incompatible_peer"


class HandshakeError(RemoteProtocolError):
    """Authentication failed: wrong network key, unexpected identity, or a tampered handshake.

    ``waiting_for`` names the peer's message we waited for when the peer hung up ("msg2": it never
    answered our opening, as a peer with another network key does; "msg4": it refused our identity), and
    ``clock_offset_ms`` how far an authentic opening's clock was from ours when it was refused as stale,
    so the daemon can say which fault it was without parsing the message."""

    code = "handshake"

    def __init__(
        self, *args: object, waiting_for: str | None = None, clock_offset_ms: int | None = None
    ) -> None:
        super().__init__(*args)
        self.waiting_for = waiting_for
        self.clock_offset_ms = clock_offset_ms


class ConnectionClosedError(LatticedError):
    """The daemon or peer went away (or never answered)."""

    code = "connection"


class ForkedQueueError(LatticedError):
    """The queue's owner signed two histories; readers that need one history refuse it."""

    code = "forked"


class OtherCoreError(LatticedError):
    """An operation that does not reach queues on fork core 2 yet (sealing, groups, KV...) was asked of
    one."""

    code = "other_core"


class BehindPeersError(LatticedError):
    """A peer holds records of one of our own queues that we lack (a store restored from an older copy):
    a write now would sign a second history at offsets the peer already holds, a fork that can never be
    undone. Refused until the catch-up from that peer has landed; retry then."""

    code = "behind_peers"


class LeaseError(LatticedError):
    """A stale or unknown lease token (fencing)."""

    code = "lease"


class CapacityError(LatticedError):
    """The group's consumer cap or a consumer's in-flight cap is reached; settle leases, then retry."""

    code = "capacity"


class OwnerUnreachableError(LatticedError):
    """A group run by another daemon, whose daemon could not be reached (no link, none could be dialled,
    or it did not answer) within the time the call allows. Nothing was leased or settled by this call,
    unless the owner says so later: a lease it holds is still good when the link comes back."""

    code = "owner_unreachable"


class NotAllowedError(NotOwnerError):
    """The owner of a group does not let this daemon's identity consume it remotely (its allow-list)."""

    code = "not_allowed"


class EmptyError(NotFoundError):
    """Nothing was available to dequeue before the wait ran out (not a failure: try again later)."""

    code = "empty"


__all__ = [
    "AlreadyExistsError",
    "BadSignatureError",
    "BehindPeersError",
    "CapacityError",
    "ConnectionClosedError",
    "EmptyError",
    "EquivocationError",
    "ForkedQueueError",
    "GapError",
    "HandshakeError",
    "IncompatiblePeerError",
    "VersionGapError",
    "IntegrityError",
    "LatticedError",
    "LeaseError",
    "LocalProtocolError",
    "MalformedError",
    "NotAllowedError",
    "NotFoundError",
    "NotOwnerError",
    "NotReaderError",
    "OtherCoreError",
    "OwnerUnreachableError",
    "ProtocolError",
    "RemoteProtocolError",
    "StorageError",
    "TamperedError",
    "WrongOwnerError",
    "WrongTypeError",
]
