"""Core-2 queues through the daemon's :class:`~latticed.storage.engine.Engine`: the owner's operations
the local API calls, and the reads and merges a replica uses (replication's host,
``latticed/net/core2_engine_host.py``, reads and merges through these jobs and the same reader).

Writes are jobs of the storage thread's group commit (:mod:`latticed.storage.core2_jobs`): each returns
once its transaction committed, fsynced. Reads that touch records (a delta, a verification, evidence) run
on a reader connection, inside one read transaction, off the storage thread, as core 1's reads do; the
committed value they start from is taken on the storage thread (a value loads there on first use).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

from latticed.crdt import queue2
from latticed.crdt.head import KIND_QUEUE, queue_id
from latticed.crdt.queue.state import EntryView
from latticed.crdt.queue2 import Delta, QueueState2, Summary, Verified
from latticed.crdt.records import Record
from latticed.storage.batch import Batch
from latticed.storage.bridge import StorageBridge
from latticed.storage.core2_jobs import (
    Commit2,
    CreateQueue2,
    DropQueue2,
    Merge2,
    Merged2,
    Recover2,
    Truncate2,
)
from latticed.storage.core2_queues import core2_of
from latticed.storage.core2_store import Evidence, evidence
from latticed.storage.entries import RowSource, StoredEntries
from latticed.storage.jobs import Job, WriterView
from latticed.storage.reader import StoreReader


class Core2Host(Protocol):
    """What core-2 operations use of the daemon's :class:`~latticed.storage.engine.Engine` (named here so
    the engine can hold a :class:`~latticed.storage.core2_view.Core2View` without an import cycle)."""

    @property
    def bridge(self) -> StorageBridge: ...

    async def call_in_writer(self, fn: Callable[[Batch, WriterView], Any]) -> Any: ...


__all__ = ["Core2Engine", "Core2Host", "reading_through"]


def reading_through(state: QueueState2, rows: RowSource) -> QueueState2:
    """``state`` with its stored records read through ``rows`` (a reader's connection)."""
    entries = state.entries
    if not isinstance(entries, StoredEntries):
        return state
    return replace(state, entries=cast(EntryView, entries.rebind(rows)))


class Core2Engine:
    """The owner's and a replica's operations on core-2 queues (see the module docstring)."""

    def __init__(self, engine: Core2Host) -> None:
        self._engine = engine

    async def _run(self, job: Job) -> Any:
        return await self._engine.bridge.run(job)

    # ------------------------------------------------------------------ the owner's writes
    async def create(self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE) -> int:
        q: int = await self._run(CreateQueue2(name, meta, kind))
        return q

    async def commit(
        self, q: int, records: Sequence[Record], meta: Mapping[str, str | None] | None = None
    ) -> int:
        """Offer records (and metadata changes); returns the first offset, once on disk."""
        first: int = await self._run(Commit2(q, records, meta))
        return first

    async def truncate(self, q: int, new_start: int) -> int:
        start: int = await self._run(Truncate2(q, new_start))
        return start

    async def recover(self, q: int, *, keep_mine: bool = False) -> int:
        """Start the next epoch of forked queue ``q`` at its fork point; returns the epoch."""
        epoch: int = await self._run(Recover2(q, keep_mine=keep_mine))
        return epoch

    async def drop(self, q: int) -> None:
        await self._run(DropQueue2(q))

    # ------------------------------------------------------------------ values and replication
    async def find(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> int | None:
        qid = queue_id(owner, name, kind)
        found: int | None = await self._engine.call_in_writer(lambda _b, w: core2_of(w).find(qid))
        return found

    async def state(self, q: int) -> QueueState2:
        """``q``'s committed value (its records read on the storage thread's connection: read them
        through :func:`reading_through` on a reader, as the methods below do)."""

        def committed(_batch: Batch, writer: WriterView) -> QueueState2:
            return core2_of(writer).committed(q)

        value: QueueState2 = await self._engine.call_in_writer(committed)
        return value

    async def summary(self, q: int) -> Summary:
        def summarise(_batch: Batch, writer: WriterView) -> Summary:
            return queue2.summary(core2_of(writer).committed(q))

        result: Summary = await self._engine.call_in_writer(summarise)
        return result

    async def delta_for(
        self, q: int, since: Summary | None, max_records: int | None = None, max_bytes: int | None = None
    ) -> Delta:
        """What a replica summarised by ``since`` lacks of ``q``, records bounded as :func:`queue2.delta`."""
        state = await self.state(q)

        def read(reader: StoreReader) -> Delta:
            return queue2.delta(reading_through(state, reader.rows), since, max_records, max_bytes)

        result: Delta = await self._engine.bridge.read(read)
        return result

    async def verify(self, d: Delta) -> tuple[Verified, QueueState2 | None]:
        """Check a peer's delta against the queue's committed value (an empty one if we hold none); raises
        as :func:`queue2.verify_delta`. Returns the verified delta and the value it was checked against,
        for :meth:`merge`."""
        q = await self.find(d.owner, d.name, d.kind) if isinstance(d, Delta) else None
        if q is None:
            return queue2.verify_delta(queue2.empty_state(d.owner, d.name, d.kind), d), None
        state = await self.state(q)

        def check(reader: StoreReader) -> Verified:
            return queue2.verify_delta(reading_through(state, reader.rows), d)

        verified: Verified = await self._engine.bridge.read(check)
        return verified, state

    async def merge(
        self, d: Delta, verified: Verified | None = None, against: QueueState2 | None = None
    ) -> Merged2:
        """Join a peer's delta durably (verified again on the storage thread unless ``verified`` was
        checked against the value still current there); records held past a newly learned fork point
        are kept aside as evidence."""
        merged: Merged2 = await self._run(Merge2(d, verified, against))
        return merged

    async def evidence(self, q: int) -> Evidence:
        """What ``q``'s replica held past fork points it learned of (``queue fork show``)."""
        result: Evidence = await self._engine.bridge.read(lambda reader: evidence(reader.conn, q))
        return result
