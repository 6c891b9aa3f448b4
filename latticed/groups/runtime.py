"""One consumer group run by this daemon: its dispatcher plus what ties it to the store.

The dispatcher is sans-IO; this adds the I/O it needs: which stored queue each source is, how far each
source has been read (``cursors``), the folded progress the group log holds (for snapshots), and the
wakeup that blocked consumers wait on. ``catch_up`` reads a source's new records from the store in bounded
batches and offers them; a lock per source keeps offers in offset order when the feeder and a commit
catch up the same source at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

import trio

from latticed.crdt.attempts import AttemptEntry
from latticed.crdt.group import GroupProgress, ProgressOp, dlq_name, parse_source_id
from latticed.crdt.group_spec import GroupSpec
from latticed.crdt.records import Record
from latticed.errors import LatticedError, NotReaderError
from latticed.groups.group_ports import GroupStore
from latticed.groups.group_sources import find_source, held
from latticed.leases.dispatch import Dispatcher
from latticed.leases.outcomes import Changes
from latticed.process.logs import get_logger, log_event
from latticed.storage.reader import Columns
from latticed.storage.sealer import Sealer

log = get_logger(__name__)

#: Bounds of one read while catching up a source (start-up recovery reads a backlog in such steps).
CATCH_UP_RECORDS: Final = 4096
CATCH_UP_BYTES: Final = 8 << 20


def records_of(columns: Columns) -> list[tuple[int, Record]]:
    """``(offset, Record)`` pairs from a read."""
    return [
        (off, Record(value, key, ts, tuple((k, v) for k, v in hdr) if hdr else ()))
        for off, key, value, ts, hdr in zip(
            columns.offsets, columns.keys, columns.values, columns.timestamps, columns.headers, strict=True
        )
    ]


class GroupRuntime:
    """A group this daemon owns and serves. ``changed`` is set (and replaced) whenever records may have
    become available or leases ended, so waiting consumers re-check instead of polling."""

    def __init__(
        self,
        engine: GroupStore,
        q: int,
        dlq_q: int,
        spec: GroupSpec,
        progress: dict[str, GroupProgress],
        *,
        sealer: Sealer,
        history: Iterable[AttemptEntry] = (),
    ) -> None:
        self.engine = engine
        self.sealer = sealer
        self.q = q
        self.dlq_q = dlq_q
        self.spec = spec
        self.name = spec.name
        self.dispatcher = Dispatcher(spec, engine.public_key, progress=progress, history=history)
        self.dlq = self.dispatcher.dlq
        self.progress = progress
        self.sources = (*spec.sources, self.dlq)
        self.cursors = {sid: progress[sid].ack_floor if sid in progress else 0 for sid in self.sources}
        self._locks = {sid: trio.Lock() for sid in self.sources}
        self._queues: dict[str, int] = {self.dlq: dlq_q}
        #: Consumers whose connection closed while they held leases: unregistered once those end.
        self.detached: set[str] = set()
        #: Sealed sources whose next record this daemon cannot open (not a reader of its key epoch): why.
        self.unreadable: dict[str, NotReaderError] = {}
        self.changed = trio.Event()
        #: Set by ``group delete``: every later call on it fails, waiters wake to find out.
        self.deleted = False

    @property
    def dlq_name(self) -> str:
        return dlq_name(self.name)

    def notify(self) -> None:
        """Wake every consumer waiting on this group."""
        self.changed.set()
        self.changed = trio.Event()

    def source_queue(self, sid: str) -> int | None:
        """The stored queue behind a source id (None until it exists here, e.g. not yet replicated)."""
        q = self._queues.get(sid)
        if q is None:
            owner, name = parse_source_id(sid)
            q = find_source(self.engine, owner, name)
            if q is not None:
                self._queues[sid] = q
        return q

    async def catch_up(self, sid: str, persist: Callable[[GroupRuntime, Changes], None]) -> int:
        """Offer the records ``sid`` holds past our cursor; returns how many were read. Floor ops that
        offering produces go to ``persist`` (no one waits on them)."""
        async with self._locks[sid]:
            q = self.source_queue(sid)
            if q is None:
                return 0
            engine, read = self.engine, 0
            while True:
                start, end = held(engine, q)  # its owner may move it to core 2 meanwhile: same offsets
                lo = max(self.cursors[sid], start)
                if lo >= end:
                    return read
                columns = await engine.read(q, lo, end, CATCH_UP_RECORDS, CATCH_UP_BYTES)
                try:  # a sealed source: what this daemon can open, up to the first record it cannot
                    columns = self.sealer.open_columns(q, columns, partial=True)
                except NotReaderError as exc:
                    if sid not in self.unreadable:
                        log_event(
                            log,
                            "group.source_unreadable",
                            level=30,
                            group=self.name,
                            source=sid,
                            error=str(exc),
                        )
                    self.unreadable[sid] = exc
                    return read
                self.unreadable.pop(sid, None)
                if not columns.offsets:
                    return read
                records = records_of(columns)
                self.cursors[sid] = columns.offsets[-1] + 1
                read += len(records)
                changes = self._offer(sid, records)
                if changes:
                    persist(self, changes)

    def _offer(self, sid: str, records: list[tuple[int, Record]]) -> Changes:
        if sid != self.dlq:
            return self.dispatcher.offer_candidates(sid, records)
        # The DLQ is ours, but a record in it that is not a readable dead letter must not stop the group.
        ops: list[ProgressOp] = []
        for item in records:
            try:
                ops.extend(self.dispatcher.offer_candidates(sid, (item,)).ops)
            except LatticedError as exc:
                log_event(
                    log, "group.bad_dead_letter", level=30, group=self.name, offset=item[0], error=str(exc)
                )
        return Changes(ops=tuple(ops))


__all__ = ["CATCH_UP_BYTES", "CATCH_UP_RECORDS", "GroupRuntime", "records_of"]
