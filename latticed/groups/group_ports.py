"""What the work-queue service needs from the store, as a narrow Protocol (the daemon passes its
:class:`~latticed.storage.engine.Engine`); a name appears here only if the service uses it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.records import Record
from latticed.storage.catalog import QueueCatalog
from latticed.storage.core2_view import Core2View
from latticed.storage.reader import Columns
from latticed.storage.sealer import SealableStore


class GroupStore(SealableStore, QueueCatalog, Protocol):
    """Sources and group logs, addressed and read; group logs and DLQs, created and written."""

    #: The sources on fork core 2 (a group hears of their commits there).
    core2: Core2View

    def resolve(self, address: str, kind: int = KIND_QUEUE) -> int: ...

    def parse_address(self, address: str) -> tuple[bytes, str]: ...

    async def read(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns: ...
    async def bounds(self, q: int) -> tuple[int, int]: ...

    async def create_queue(
        self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE
    ) -> int: ...

    async def append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> int: ...

    async def append_many(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> list[int]: ...

    async def truncate(self, q: int, new_start: int) -> None: ...

    async def wait_past(self, q: int, end: int, *, ahead: bool = False) -> None: ...


def find_source(engine: GroupStore, owner: bytes, name: str) -> int | None:
    """A source queue stored here on either fork core (None: not here)."""
    found = engine.find(owner, name, KIND_QUEUE)
    return found if found is not None else engine.core2.lookup(owner, name, KIND_QUEUE)


def held_end_now(engine: GroupStore, q: int) -> int | None:
    """Where source ``q`` ends without waiting, on either fork core (None: a core-2 value not loaded
    yet, which ``bounds`` loads)."""
    if engine.core2.holds(q):
        return engine.core2.held_end_now(q)
    return engine.state(q).held_end


__all__ = ["GroupStore", "find_source", "held_end_now"]
