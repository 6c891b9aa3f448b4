"""What the replication service reports, as an interface the daemon may implement (metrics:
:class:`~latticed.services.daemon_metrics.DaemonMetrics`). Declared here, by the layer that reports; given
None, replication reports nothing and pays nothing."""

from __future__ import annotations

from typing import Literal, Protocol

from latticed.errors import LatticedError

Direction = Literal["incoming", "outgoing"]


class PeerMetrics(Protocol):
    """Reports of the replication service."""

    def connected(self, direction: Direction) -> None:
        """A peer completed the handshake."""
        ...

    def handshake_failed(self, direction: Direction, error: LatticedError) -> None:
        """A connection (accepted, or dialled) ended before the handshake completed."""
        ...


__all__ = ["Direction", "PeerMetrics"]
