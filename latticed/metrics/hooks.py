"""What the storage and replication layers report to metrics, as interfaces (implemented by
:class:`~latticed.metrics.live.DaemonMetrics`); a layer given None reports nothing and pays nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from latticed.errors import LatticedError

if TYPE_CHECKING:
    from latticed.storage.jobs import Job
    from latticed.storage.writer import Change

Direction = Literal["incoming", "outgoing"]


class StorageMetrics(Protocol):
    """Reports of the storage thread and the engine."""

    def observe_commit(self, commit_s: float, fsync_s: float) -> None:
        """On the storage thread, once per group commit that wrote something: the whole commit (apply,
        sign, write, fsync) and SQLite's ``COMMIT`` alone (where the WAL is written and fsynced)."""
        ...

    def committed(self, jobs: Sequence[Job], changes: Sequence[Change]) -> None:
        """On the event loop, once per group commit, after its waiters were woken."""
        ...

    def verification_failed(self, error: LatticedError) -> None:
        """On the event loop: a peer's delta (or a stored queue) failed verification."""
        ...


class PeerMetrics(Protocol):
    """Reports of the replication service."""

    def connected(self, direction: Direction) -> None:
        """A peer completed the handshake."""
        ...

    def handshake_failed(self, direction: Direction, error: LatticedError) -> None:
        """A connection (accepted, or dialled) ended before the handshake completed."""
        ...


__all__ = ["Direction", "PeerMetrics", "StorageMetrics"]
