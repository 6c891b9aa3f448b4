"""The store as the daemon's services use it: this node's replica view plus what only the owner does.

:class:`Engine` is a :class:`~latticed.storage.replica.ReplicaView` (states, addressing, a peer's deltas)
with the owner's signed writes (each checked first by :class:`~latticed.storage.owner_view.OwnerView`
against the :class:`~latticed.storage.wiring.OwnerFence`) and the reads of the local API and the groups
service. It is built from three parts, each in its own module: the
:class:`~latticed.storage.bridge.StorageBridge` to the storage thread, the
:class:`~latticed.storage.live.LiveCache` (recent commits and records ahead of theirs, for live tails and
replication's pushes), and the replica view. After each group commit it feeds the live cache (which wakes
the tails of the queues that changed) and then hands each changed queue to the ``changes`` listener the
composition root gave it.

Consumers do not depend on this class but on the narrow Protocols naming what they use:
:class:`latticed.api.server.api_ports.ApiStore`, :class:`latticed.groups.group_ports.GroupStore` and
:class:`latticed.net.ports.ReplicaStore`.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from latticed.crdt import kv
from latticed.crdt.head import KIND_GROUP, KIND_KV, KIND_QUEUE, check_name
from latticed.crdt.kvplan import KvRequest
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import (
    AlreadyExistsError,
    MalformedError,
    NotOwnerError,
    StorageError,
)
from latticed.process.clock import wall_ms
from latticed.process.logs import get_logger, log_event
from latticed.storage.batch import Batch
from latticed.storage.bridge import StorageBridge, tell
from latticed.storage.core2_many import AppendManyCores
from latticed.storage.core2_queues import Change2
from latticed.storage.core2_view import Core2View
from latticed.storage.jobs import (
    KV_NAMESPACE,
    Append,
    CreateQueue,
    DropLocal,
    Job,
    KvSealing,
    KvWrite,
    Merge,
    SetMeta,
    Truncate,
    WriterView,
)
from latticed.storage.kv_upkeep import compact_step, purge_expired
from latticed.storage.live import LiveCache
from latticed.storage.owner_view import OwnerView
from latticed.storage.reader import Columns, RawRow, ReadPool, StoreReader
from latticed.storage.schema import SCHEMA_VERSION
from latticed.storage.space import CompactStore
from latticed.storage.store import db_path
from latticed.storage.wiring import ChangeListener, OwnerFence
from latticed.storage.writer import Change, StorageMetrics, Writer

log = get_logger(__name__)

T = TypeVar("T")
AnyJob = TypeVar("AnyJob", bound=Job)


class Engine(OwnerView):
    """Queues and KV namespaces of one node, backed by the store. Use :meth:`open`."""

    def __init__(
        self,
        writer: Writer,
        pool: ReadPool,
        identity: Identity,
        clock: Callable[[], int],
        *,
        changes: ChangeListener | None = None,
        fence: OwnerFence | None = None,
        metrics: StorageMetrics | None = None,
    ) -> None:
        super().__init__(writer, StorageBridge(writer, pool, self._committed), LiveCache(), identity, metrics)
        self.clock = clock
        #: Called on the event loop with each committed queue value (replication pushes from here).
        self._changes = changes
        self._fence = fence if fence is not None else OwnerFence()
        #: This node's queues on fork core 2 (the methods below hand their numbers to it).
        self.core2 = Core2View(self, writer.core2, self._fence)
        self._verify2 = self.core2.verify_stored
        #: Called on the event loop after a group commit in which a job failed with a StorageError (the
        #: daemon has its disk figures sampled again: a full disk must show at once).
        self.on_storage_error: Callable[[], None] | None = None

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        data_dir: Path,
        identity: Identity,
        *,
        group_commit_ms: float = 0.0,
        read_connections: int = 2,
        max_page_count: int | None = None,
        clock: Callable[[], int] = wall_ms,
        changes: ChangeListener | None = None,
        fence: OwnerFence | None = None,
        metrics: StorageMetrics | None = None,
    ) -> AsyncIterator[Engine]:
        """Open the store (migrating it), start the storage thread; stop it cleanly on exit.

        ``changes`` hears of every committed queue value (a :class:`~latticed.storage.wiring.ChangeFanout`
        in the daemon); ``fence`` is asked before every write to our own data (none: never fenced);
        ``metrics`` (off when None) hears of every group commit and verification failure."""
        path = db_path(data_dir)
        fence = fence if fence is not None else OwnerFence()
        fence.load_dropped(data_dir)  # before anything starts: a file not ours stops the open
        writer = Writer(
            path,
            identity,
            clock=clock,
            linger_ms=group_commit_ms,
            max_page_count=max_page_count,
            metrics=metrics,
        )
        await trio.to_thread.run_sync(writer.start)
        try:
            pool = await trio.to_thread.run_sync(ReadPool, path, read_connections)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(writer.stop)
            raise
        engine = cls(writer, pool, identity, clock, changes=changes, fence=fence, metrics=metrics)
        if 0 < writer.store.migrated_from < SCHEMA_VERSION:  # an older store was upgraded (0: a new one)
            log_event(
                log,
                "store.migrated",
                path=str(path),
                from_version=writer.store.migrated_from,
                to_version=SCHEMA_VERSION,
                copy=str(writer.store.kept_copy),  # what a rollback restores
            )
        kinds = collections.Counter(state.kind for state in writer.states.values())
        log_event(
            log,
            "store.opened",
            path=str(path),
            queues=kinds[KIND_QUEUE],  # what status and daemon.ready count
            kv_namespaces=kinds[KIND_KV],
            groups=kinds[KIND_GROUP],
            core2_queues=len(writer.core2.queues()),
            schema_version=SCHEMA_VERSION,
        )
        try:
            yield engine
        finally:
            await engine.bridge.stop()
            log_event(log, "store.closed", path=str(path), transactions=writer.transactions)

    def _committed(self, jobs: list[Job], changes: list[Change], changes2: list[Change2]) -> None:
        """After each group commit, on the event loop, before any of its jobs' waiters wakes."""
        live, listener = self.live, self._changes
        for change in changes:  # guarded: the other changes still reach cache and listeners; this one's
            if not tell(live.committed, change):  # waiters are woken, and nothing stale is kept of it
                live.lost(change.q)
            if listener is not None:
                tell(listener, change.state)
        for change2 in changes2:  # core-2 tails read from the store: waking them is all
            live.wake(change2.q)
            if change2.state is None:  # dropped: a cached number of it must not be handed out
                self.forget(change2.q)
            if self.core2.on_change is not None:
                tell(self.core2.on_change, change2.q, change2.state)
            for listener2 in self.core2.listeners:
                tell(listener2, change2.q, change2.state)
        if live.any_ahead:
            for job in jobs:
                if job.error is not None and isinstance(job, Merge):
                    d = job.verified.delta
                    failed = self.find(d.owner, d.name, d.kind)
                    if failed is not None:
                        live.merge_failed(failed)
        if self._metrics is not None:
            tell(self._metrics.committed, jobs, changes)
        if self.on_storage_error is not None and any(isinstance(job.error, StorageError) for job in jobs):
            tell(self.on_storage_error)

    # ------------------------------------------------------------------ the storage thread
    async def outcome(self, job: Job) -> Any:
        """The result of a started job (``start_append``) once its transaction committed."""
        return await self.bridge.outcome(job)

    async def call_in_writer(self, fn: Callable[[Batch, WriterView], Any]) -> Any:
        """Run ``fn`` on the storage thread (maintenance, tests)."""
        return await self.bridge.call(fn)

    async def purge_expired_kv(self, ns: int, now_ms: int) -> int:
        """Delete KV namespace ``ns``'s keys whose value expired by ``now_ms`` (ours or a replica's; every
        reader sees them absent already); returns how many. StorageError if the disk refuses."""
        purged: int = await self.bridge.call(functools.partial(purge_expired, ns=ns, now_ms=now_ms))
        return purged

    async def compact_kv_step(self, ns: int) -> int:
        """One bounded compaction step of our KV namespace ``ns``'s op log (:mod:`.kvcompact`); returns the
        ops dropped."""
        dropped: int = await self.bridge.call(functools.partial(compact_step, ns=ns))
        return dropped

    @property
    def transactions(self) -> int:
        return self.bridge.transactions

    @property
    def jobs_committed(self) -> int:
        return self.bridge.jobs_committed

    def storage_bytes(self) -> int:
        return self.bridge.storage_bytes()

    async def compact_store(self) -> dict[str, Any]:
        """Give every free page of the store back to the file system, cut the WAL and write the disk
        reserve again (latticed/storage/space.py); returns the store's size before and after. Writes
        wait meanwhile (the storage thread does it)."""
        result: dict[str, Any] = await self.bridge.run(CompactStore(self._writer.space))
        return result

    # ------------------------------------------------------------------ the owner's writes
    def start_job(self, job: AnyJob) -> AnyJob:
        """Start an owner's write job built elsewhere (sealed writes): the caller checked
        :meth:`require_owner` or :meth:`check_fence` first; ``await outcome(job)`` for its result."""
        return self.bridge.start(job)

    def install_kv_sealing(self, sealing: KvSealing) -> None:
        """Let the storage thread open sealed KV ops (the sealer installs itself once, at start-up)."""
        self._writer.kv_sealing = sealing

    async def create_queue(
        self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE, *, core: int = 1
    ) -> int:
        """A new queue of ours on fork core ``core`` (1: stopped where each replica stands at a fork; 2:
        frozen at a fork, then recovered by its owner: docs/lattice.md)."""
        check_name(name)
        if core not in (1, 2):
            raise MalformedError(f"a queue's fork core is 1 or 2, not {core!r}")
        mine = self.public_key
        if self.find(mine, name, kind) is not None or self.core2.lookup(mine, name, kind) is not None:
            # before the fence: it judges new queues
            raise AlreadyExistsError(f"queue {self.public_key.hex()}/{name} already exists")
        if core == 2:
            return await self.core2.create_queue(name, meta, kind)
        self._check_new(name, kind, "create")
        result: int = await self.bridge.run(CreateQueue(name, meta, kind))
        return result

    async def append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> int:
        """Offer records (one group commit); returns the first offset assigned. ``checked``: the caller
        already ran :func:`~latticed.crdt.records.check_record` on each."""
        first: int = await self.bridge.outcome(self.start_append(q, records, checked=checked))
        return first

    def start_append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> Job:
        """:meth:`append` without waiting: the job is queued for the next group commit and its first
        offset is ``await outcome(job)``. Lets a connection read its next request meanwhile."""
        if self.core2.holds(q):
            return self.core2.start_commit(q, records, checked=checked)
        self.require_owner(q, "offer")
        return self.bridge.start(Append(q, records, checked=checked))

    async def append_many(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> list[int]:
        """Records for several owned queues (either core) in ONE transaction; each part's first offset."""
        for q, _ in parts:
            (self.core2.require_owner if self.core2.holds(q) else self.require_owner)(q, "offer")
        firsts: list[int] = await self.bridge.run(AppendManyCores(parts))
        return firsts

    async def truncate(self, q: int, new_start: int) -> None:
        if self.core2.holds(q):
            await self.core2.truncate_queue(q, new_start)
            return
        self.require_owner(q, "truncate")
        await self.bridge.run(Truncate(q, new_start))

    async def drop_local(self, q: int, floor: int) -> int:
        """Drop a replicated queue's records below ``floor`` on this daemon only (they stay wherever
        else they are held); returns the first offset held now. Nothing is signed."""
        if self.owned(q):
            raise NotOwnerError(f"cannot drop records of {self.address(q)} locally: truncate it instead")
        start: int = await self.bridge.run(DropLocal(q, floor))
        return start

    async def set_meta(self, q: int, updates: Mapping[str, str | None]) -> None:
        if self.core2.holds(q):
            await self.bridge.outcome(self.core2.start_commit(q, (), updates))
            return
        self.require_owner(q, "set metadata")
        await self.bridge.run(SetMeta(q, updates))

    async def kv_write(self, request: KvRequest) -> Any:
        ns = self.kv_namespace(None)
        if ns is not None:
            self.check_fence(ns, "write")
        else:  # the first write creates the namespace: a peer may hold one we lost
            self._check_new(KV_NAMESPACE, KIND_KV, "write")
        return await self.bridge.run(KvWrite(request))

    # ------------------------------------------------------------------ reads
    async def inspect(self, fn: Callable[[StoreReader], T]) -> T:
        """Run a read-only ``fn`` on a reader connection, off the event loop and the storage thread
        (maintenance that measures the store, such as retention)."""
        return await self.bridge.read(fn)

    async def read(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Committed records in ``[lo, hi)`` clamped to what the queue shows, bounded in count and size."""
        if self.core2.holds(q):
            return await self.core2.read(q, lo, hi, max_records, max_bytes)
        state = self.state(q)
        lo, hi = max(lo, state.start), min(hi, state.visible_end)
        if hi <= lo or max_records <= 0:
            return Columns()
        recent = self.live.recent_columns(q, lo, hi, max_records, max_bytes)
        if recent is not None:
            return recent
        return await self.bridge.read(lambda r: r.columns(q, lo, hi, max_records, max_bytes))

    async def bounds(self, q: int) -> tuple[int, int]:
        """The offsets ``[start, end)`` of the records queue ``q`` holds (either fork core)."""
        if self.core2.holds(q):
            return (await self.core2.value(q)).held
        state = self.state(q)
        return state.start, state.visible_end

    async def row(self, q: int, offset: int) -> RawRow | None:
        if self.core2.holds(q):
            return await self.core2.read_row(q, offset)
        state = self.state(q)
        if not state.start <= offset < state.visible_end:
            return None
        recent = self.live.recent_row(q, offset)
        if recent is not None:
            return recent
        return await self.bridge.read(lambda reader: reader.row(q, offset))

    def visible_end(self, q: int) -> int:
        """Where a live tail may read up to: the committed end, or past it the verified records of a
        replicated queue still being committed (ahead.py); a forked queue's visible end."""
        return self.live.visible_end(q, self.state(q).visible_end)

    async def read_visible(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """:meth:`read` for a live tail: past the committed end, the verified records ahead of it."""
        state = self.state(q)
        if lo < state.held_end or state.forked:
            return await self.read(q, lo, min(hi, state.held_end), max_records, max_bytes)
        return self.live.ahead_columns(q, lo, hi, max_records, max_bytes)

    async def wait_past(self, q: int, end: int, *, ahead: bool = False) -> None:
        """Return once the queue holds records at or past ``end`` (or was truncated past it); with
        ``ahead`` (a live tail), also once verified records on their way to the store do (ahead.py)."""
        while True:
            state = self.state(q)
            if (self.visible_end(q) if ahead else state.visible_end) > end or state.start > end:
                return
            await self.live.changed(q).wait()

    # ------------------------------------------------------------------ KV reads
    def kv_namespace(self, owner: bytes | None) -> int | None:
        return self.find(owner or self.public_key, KV_NAMESPACE, KIND_KV)

    async def kv_entry(self, owner: bytes | None, key: str) -> kv.Entry | None:
        ns = self.kv_namespace(owner)
        if ns is None:
            return None
        return await self.bridge.read(lambda r: r.kv_entry(ns, key))

    async def kv_scan(self, owner: bytes | None, prefix: str) -> list[tuple[str, kv.Entry]]:
        ns = self.kv_namespace(owner)
        if ns is None:
            return []
        return await self.bridge.read(lambda r: list(r.kv_scan(ns, prefix)))


__all__ = ["Engine"]
