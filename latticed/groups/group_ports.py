"""What the work-queue service needs from the store, as a narrow Protocol (the daemon passes its
:class:`~latticed.storage.engine.Engine`); a name appears here only if the service uses it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.records import Record
from latticed.groups.group_sources import SourceStore
from latticed.storage.reader import Columns
from latticed.storage.sealer import SealableStore


class GroupStore(SealableStore, SourceStore, Protocol):
    """Sources and group logs, addressed and read; group logs and DLQs, created and written."""

    def resolve(self, address: str, kind: int = KIND_QUEUE) -> int: ...

    def parse_address(self, address: str) -> tuple[bytes, str]: ...

    async def read(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns: ...

    async def create_queue(
        self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE
    ) -> int: ...

    async def append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> int: ...

    async def append_many(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> list[int]: ...

    async def truncate(self, q: int, new_start: int) -> None: ...

    async def wait_past(self, q: int, end: int, *, ahead: bool = False) -> None: ...


__all__ = ["GroupStore"]
