"""What every service reads of the store to name and look up queues, as one narrow Protocol.

The work-queue service and the retention service each declare what else they use
(:mod:`latticed.groups.group_ports`, :mod:`latticed.services.service_ports`); the lookups they share are
here once, so the daemon's engine answers one contract for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.queue import QueueState

__all__ = ["QueueCatalog"]


class QueueCatalog(Protocol):
    """This daemon's queues by store handle: their state, address, ownership, and the clock ages use."""

    @property
    def public_key(self) -> bytes: ...

    @property
    def clock(self) -> Callable[[], int]:
        """Wall-clock milliseconds (lease deadlines, ages and TTLs are durable, so not monotonic time)."""
        ...

    def state(self, q: int) -> QueueState: ...

    def address(self, q: int) -> str: ...

    def owned(self, q: int) -> bool: ...

    def queues(self, kind: int = KIND_QUEUE) -> list[int]: ...

    def find(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> int | None: ...
