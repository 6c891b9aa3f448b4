"""What the retention service and the metrics collector need from the store, as narrow Protocols (the
daemon passes its :class:`~latticed.storage.engine.Engine`); a name appears here only if a service uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.queue import QueueState
from latticed.services.health import ForkedCore2
from latticed.services.retention_core2 import Core2Retention
from latticed.storage.catalog import QueueCatalog
from latticed.storage.reader import StoreReader

T = TypeVar("T")


class RetentionCore2(Core2Retention, Protocol):
    """The core-2 queues retention walks and cuts."""

    def queues(self, kind: int = KIND_QUEUE) -> list[int]: ...

    def holds(self, q: int) -> bool: ...


class RetentionStore(QueueCatalog, Protocol):
    """Queues and KV namespaces, read and cut: signed truncations of ours (on both cores), local drops of
    replicas, and purge and compaction steps of KV namespaces (run on the storage thread, errors as
    StorageError)."""

    @property
    def core2(self) -> RetentionCore2: ...

    async def truncate(self, q: int, new_start: int) -> None: ...

    async def drop_local(self, q: int, floor: int) -> int: ...

    async def inspect(self, fn: Callable[[StoreReader], T]) -> T: ...

    async def purge_expired_kv(self, ns: int, now_ms: int) -> int:
        """Delete KV namespace ``ns``'s keys expired by ``now_ms`` on the storage thread; returns how many."""
        ...

    async def compact_kv_step(self, ns: int) -> int:
        """One compaction step of our KV namespace ``ns``'s op log; returns the ops dropped."""
        ...


class MetricsStore(Protocol):
    """What a scrape reads of the store: the queues' in-memory heads and the file's size."""

    @property
    def public_key(self) -> bytes: ...

    def state(self, q: int) -> QueueState: ...

    def queues(self, kind: int = KIND_QUEUE) -> list[int]: ...

    def storage_bytes(self) -> int: ...

    @property
    def core2(self) -> ForkedCore2: ...


__all__ = ["MetricsStore", "RetentionStore"]
