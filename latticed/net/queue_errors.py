"""The last error each peer caused about each queue (a delta that failed verification), bounded: what
``latticectl queue why`` shows beside the peer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Final

from latticed.protocol.replication import QueueKey

#: Entries kept at most; the oldest goes first (a peer naming made-up queues cannot grow it).
MAX_QUEUE_ERRORS: Final = 1024


@dataclass(slots=True)
class QueueErrors:
    """(peer, queue) -> (wall time, reason), oldest first."""

    limit: int = MAX_QUEUE_ERRORS
    entries: dict[tuple[bytes, QueueKey], tuple[float, str]] = field(default_factory=dict)

    def note(self, peer: bytes, key: QueueKey, reason: str) -> None:
        self.entries.pop((peer, key), None)
        self.entries[(peer, key)] = (time.time(), reason)
        while len(self.entries) > self.limit:
            del self.entries[next(iter(self.entries))]

    def last(self, peer: bytes, key: QueueKey) -> tuple[float, str] | None:
        return self.entries.get((peer, key))


__all__ = ["MAX_QUEUE_ERRORS", "QueueErrors"]
