"""The async face of the store: what the local API (and later replication) calls from trio.

It lives with the store because it is the bridge to the storage thread: writes become jobs for the
:class:`~latticed.storage.writer.Writer` and the calling task waits on a ``trio.Event`` that the thread
sets (one ``run_sync_soon`` per group commit, not per job); reads run on a small pool of read connections
through ``trio.to_thread``, so neither kind ever blocks the event loop. After each commit the engine wakes
the tails of the queues that changed (one ``trio.Event`` per waited-on queue, no polling) and keeps that
batch's records in memory so live tails are served without reading them back.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import trio

from latticed.clock import wall_ms
from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_GROUP, KIND_KV, KIND_QUEUE, SignedHead, check_name, queue_id
from latticed.crdt.kvplan import KvRequest
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.crdt.records import Record, RecordRun
from latticed.crdt.signing import Identity, parse_public_key
from latticed.errors import (
    BehindPeersError,
    GapError,
    IntegrityError,
    LatticedError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
    StorageError,
)
from latticed.logs import get_logger, log_event
from latticed.storage import segments
from latticed.storage.ahead import AHEAD_DELTA_RECORDS, AHEAD_MAX_RECORDS, VerifiedAhead, summary_after
from latticed.storage.batch import Batch
from latticed.storage.entries import StoredEntries
from latticed.storage.jobs import (
    KV_NAMESPACE,
    Append,
    AppendMany,
    Call,
    CreateQueue,
    DropLocal,
    Job,
    KvWrite,
    Merge,
    SetMeta,
    Truncate,
    WriterView,
)
from latticed.storage.reader import Columns, RawRow, ReadPool, StoreReader, columns_of
from latticed.storage.schema import SCHEMA_VERSION
from latticed.storage.sqlite import wal_path
from latticed.storage.store import db_path
from latticed.storage.verify import verify_queue
from latticed.storage.writer import Change, StorageMetrics, Writer

log = get_logger(__name__)

AnyJob = TypeVar("AnyJob", bound=Job)
T = TypeVar("T")

#: A committed batch larger than this is not kept in memory for tails (they read it back instead).
RECENT_MAX_RECORDS: Final = 8192
ADDRESS_CACHE_SIZE: Final = 4096
#: A peer's delta this small is verified on the event loop (see :meth:`Engine.verify_delta`).
INLINE_VERIFY_RECORDS: Final = 64
INLINE_VERIFY_BYTES: Final = 64 * 1024
#: Chain values remembered per queue for serving live pushes from memory.
KNOWN_CHAINS: Final = 8


class Engine:
    """Queues and KV namespaces of one node, backed by the store. Use :meth:`open`."""

    def __init__(
        self,
        writer: Writer,
        pool: ReadPool,
        identity: Identity,
        clock: Callable[[], int],
        metrics: StorageMetrics | None = None,
    ) -> None:
        self._writer = writer
        self._pool = pool
        self.identity = identity
        self.clock = clock
        self._token = trio.lowlevel.current_trio_token()
        self._limiter = trio.CapacityLimiter(pool.size)
        self._waiters: dict[int, trio.Event] = {}
        self._recent: dict[int, tuple[int, Sequence[Record]]] = {}
        #: Per replicated queue, verified records on their way to the store (for live tails and relaying).
        self._ahead: dict[int, VerifiedAhead] = {}
        #: Per queue, our chain values at a few recent ends (``delta_for`` checks a peer's ``since``
        #: against them to serve a live push from ``_recent`` without reading the store).
        self._known_chains: dict[int, dict[int, bytes]] = {}
        self._closed = False
        #: Resolved addresses (a queue's number never changes once it exists), so hot requests skip the
        #: parsing and hashing of ``resolve``.
        self._addresses: dict[tuple[str, int], int] = {}
        #: Called on the trio thread with each committed queue value (replication pushes from here).
        self._listeners: list[Callable[[QueueState], None]] = []
        #: Set by replication: why our own queue must not be written right now (a peer holds records of
        #: it that we lack), or None. Checked before every write to a queue or KV namespace we own.
        self.owner_fence: Callable[[QueueState], str | None] | None = None
        self._metrics = metrics
        writer.on_done = self._on_done

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
        metrics: StorageMetrics | None = None,
    ) -> AsyncIterator[Engine]:
        """Open the store (migrating it), start the storage thread; stop it cleanly on exit. ``metrics``
        (off when None) hears of every group commit and verification failure."""
        path = db_path(data_dir)
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
        engine = cls(writer, pool, identity, clock, metrics)
        if 0 < writer.store.migrated_from < SCHEMA_VERSION:  # an older store was upgraded (0: a new one)
            log_event(
                log,
                "store.migrated",
                path=str(path),
                from_version=writer.store.migrated_from,
                to_version=SCHEMA_VERSION,
            )
        kinds = collections.Counter(state.kind for state in writer.states.values())
        log_event(
            log,
            "store.opened",
            path=str(path),
            queues=kinds[KIND_QUEUE],  # what status and daemon.ready count
            kv_namespaces=kinds[KIND_KV],
            groups=kinds[KIND_GROUP],
            schema_version=SCHEMA_VERSION,
        )
        try:
            yield engine
        finally:
            engine._closed = True
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(writer.stop)
                pool.close()
            log_event(log, "store.closed", path=str(path), transactions=writer.transactions)

    # ------------------------------------------------------------------ storage thread bridge
    def _on_done(self, jobs: list[Job], changes: list[Change]) -> None:
        """Runs on the storage thread after each batch: hand completion to trio in one callback."""
        self._token.run_sync_soon(self._complete, jobs, changes)

    def _complete(self, jobs: list[Job], changes: list[Change]) -> None:
        for change in changes:
            ahead = self._ahead.get(change.q)
            if ahead is not None and (change.state.held_end >= ahead.end or change.state.forked):
                del self._ahead[change.q]
            if change.appended and len(change.appended) <= RECENT_MAX_RECORDS:
                self._recent[change.q] = (change.first, change.appended)
            else:
                self._recent.pop(change.q, None)
            self._wake(change.q)
            for listener in self._listeners:
                listener(change.state)
        for job in jobs:
            if job.error is not None and isinstance(job, Merge) and self._ahead:
                d = job.verified.delta
                failed = self.find(d.owner, d.name, d.kind)
                if failed is not None and self._ahead.pop(failed, None) is not None:
                    self._wake(failed)  # a tail waiting on the dropped records looks again
            if job.done is not None:
                job.done.set()
                if job.notify is not None:
                    job.notify()
        if self._metrics is not None:
            self._metrics.committed(jobs, changes)

    def _start(self, job: AnyJob) -> AnyJob:
        """Hand ``job`` to the storage thread now; :meth:`outcome` waits for it. Jobs commit in the order
        they are started, so a connection that pipelines its offers keeps their order."""
        if self._closed:
            raise LatticedError("latticed is shutting down")
        job.done = trio.Event()
        self._writer.submit(job)
        return job

    async def outcome(self, job: Job) -> Any:
        """The result of a started job once its transaction committed (its error, raised, if it failed)."""
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    async def _run(self, job: Job) -> Any:
        return await self.outcome(self._start(job))

    async def _read(self, fn: Callable[[StoreReader], Any]) -> Any:
        def work() -> Any:
            with self._pool.reader() as reader:
                return fn(reader)

        return await trio.to_thread.run_sync(work, limiter=self._limiter)

    def add_change_listener(self, listener: Callable[[QueueState], None]) -> None:
        self._listeners.append(listener)

    def remove_change_listener(self, listener: Callable[[QueueState], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    # ------------------------------------------------------------------ addressing and state
    @property
    def public_key(self) -> bytes:
        return self.identity.public_key

    def resolve(self, address: str, kind: int = KIND_QUEUE) -> int:
        """``NAME`` (ours) or ``OWNER_HEX/NAME`` to the queue's number; NotFoundError if we hold none."""
        if not isinstance(address, str):
            raise MalformedError("a queue is addressed as NAME or OWNER_HEX/NAME")
        q = self._addresses.get((address, kind))
        if q is not None:
            return q
        owner, name = self.parse_address(address)
        q = self._writer.lookup(queue_id(owner, name, kind))
        if q is None:
            raise NotFoundError(f"no queue {owner.hex()}/{name}")
        if len(self._addresses) >= ADDRESS_CACHE_SIZE:
            self._addresses.clear()
        self._addresses[(address, kind)] = q
        return q

    def parse_address(self, address: str) -> tuple[bytes, str]:
        if not isinstance(address, str):
            raise MalformedError("a queue is addressed as NAME or OWNER_HEX/NAME")
        owner_hex, sep, name = address.rpartition("/")
        owner = parse_public_key(owner_hex) if sep else self.public_key
        check_name(name)
        return owner, name

    def find(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> int | None:
        return self._writer.lookup(queue_id(owner, name, kind))

    def state(self, q: int) -> QueueState:
        """The newest committed value (never includes uncommitted writes).

        Its heads, metadata, bounds and ``summary()`` are in memory; its records are not, and its entries
        read rows through the storage thread's connection, so do not read records from it here: use
        :meth:`read`, :meth:`row` or :meth:`delta_for`."""
        return self._writer.states[q]

    def owned(self, q: int) -> bool:
        return self._writer.states[q].owner == self.public_key

    def address(self, q: int) -> str:
        state = self._writer.states[q]
        return f"{state.owner.hex()}/{state.name}"

    def created_ms(self, q: int) -> int:
        return self._writer.created_ms.get(q, 0)

    def queues(self, kind: int = KIND_QUEUE) -> list[int]:
        return [q for q, state in list(self._writer.states.items()) if state.kind == kind]

    def summary(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> Summary | None:
        q = self.find(owner, name, kind)
        return None if q is None else self.state(q).summary()

    @property
    def transactions(self) -> int:
        return self._writer.transactions

    @property
    def jobs_committed(self) -> int:
        return self._writer.jobs_committed

    def storage_bytes(self) -> int:
        path = self._writer.path
        total = 0
        for name in (path, wal_path(path), Path(f"{path}-shm")):
            with contextlib.suppress(OSError):
                total += os.stat(name).st_size
        return total

    def _require_owner(self, q: int, what: str) -> None:
        if not self.owned(q):
            raise NotOwnerError(f"cannot {what}: not the owner of {self.address(q)}")
        self._check_fence(q, what)

    def _check_new(self, name: str, kind: int, what: str) -> None:
        """The fence for one of our queues that does not exist here (yet)."""
        fence = self.owner_fence
        if fence is not None and (reason := fence(core.empty_state(self.public_key, name, kind))) is not None:
            raise BehindPeersError(f"cannot {what} {self.public_key.hex()}/{name} yet: {reason}")

    def _check_fence(self, q: int, what: str) -> None:
        fence = self.owner_fence
        if fence is not None and (reason := fence(self._writer.states[q])) is not None:
            raise BehindPeersError(f"cannot {what} {self.address(q)} yet: {reason}")

    # ------------------------------------------------------------------ writes
    async def create_queue(
        self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE
    ) -> int:
        check_name(name)
        self._check_new(name, kind, "create")
        result: int = await self._run(CreateQueue(name, meta, kind))
        return result

    async def append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> int:
        """Offer records (one group commit); returns the first offset assigned. ``checked``: the caller
        already ran :func:`~latticed.crdt.records.check_record` on each."""
        first: int = await self.outcome(self.start_append(q, records, checked=checked))
        return first

    def start_append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> Job:
        """:meth:`append` without waiting: the job is queued for the next group commit and its first
        offset is ``await outcome(job)``. Lets a connection read its next request meanwhile."""
        self._require_owner(q, "offer")
        return self._start(Append(q, records, checked=checked))

    async def append_many(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> list[int]:
        """Records for several owned queues in ONE transaction; returns each part's first offset."""
        for q, _ in parts:
            self._require_owner(q, "offer")
        firsts: list[int] = await self._run(AppendMany(parts))
        return firsts

    async def truncate(self, q: int, new_start: int) -> None:
        self._require_owner(q, "truncate")
        await self._run(Truncate(q, new_start))

    async def drop_local(self, q: int, floor: int) -> int:
        """Drop a replicated queue's records below ``floor`` on this daemon only (they stay wherever
        else they are held); returns the first offset held now. Nothing is signed."""
        if self.owned(q):
            raise NotOwnerError(f"cannot drop records of {self.address(q)} locally: truncate it instead")
        start: int = await self._run(DropLocal(q, floor))
        return start

    async def set_meta(self, q: int, updates: Mapping[str, str | None]) -> None:
        self._require_owner(q, "set metadata")
        await self._run(SetMeta(q, updates))

    async def kv_write(self, request: KvRequest) -> Any:
        ns = self.kv_namespace(None)
        if ns is not None:
            self._check_fence(ns, "write")
        else:  # the first write creates the namespace: a peer may hold one we lost
            self._check_new(KV_NAMESPACE, KIND_KV, "write")
        return await self._run(KvWrite(request))

    async def call_in_writer(self, fn: Callable[[Batch, WriterView], Any]) -> Any:
        """Run ``fn`` on the storage thread (maintenance, tests)."""
        return await self._run(Call(fn))

    async def merge_delta(self, delta: QueueDelta) -> QueueState:
        """Verify a peer's delta (off the event loop), then join and persist it; wakes tails.

        Raises IntegrityError for anything forged (nothing is stored), GapError when it does not
        connect to what we hold."""
        job = await self.merged(self.submit_merge(await self.verify_delta(delta)))
        q: int = job.result
        return self.state(q)

    async def verify_delta(self, delta: QueueDelta) -> core.VerifiedDelta:
        """Check a peer's delta against its owner's signatures and hash chain, before anything of it is
        stored. A small one (a live push) is checked right here: a thread hop costs more than its one
        signature; anything bigger on a worker thread, off the event loop."""
        try:
            base = core.empty_state(delta.owner, delta.name, delta.kind)
            if (
                len(delta.records) <= INLINE_VERIFY_RECORDS
                and len(delta.checkpoints) <= 1
                and delta.fork is None
                and core.payload_bytes(delta.records) <= INLINE_VERIFY_BYTES
            ):
                return core.verify_delta(base, delta)
            verified: core.VerifiedDelta = await trio.to_thread.run_sync(core.verify_delta, base, delta)
        except (IntegrityError, MalformedError) as exc:
            if self._metrics is not None:
                self._metrics.verification_failed(exc)
            raise
        return verified

    def submit_merge(self, verified: core.VerifiedDelta, origin: object = None) -> Merge:
        """Queue the join and write of a verified delta right now; :meth:`merged` waits for it.

        The storage thread takes jobs in the order they were submitted, several per transaction, so a
        caller that submits deltas in order without waiting between them gets them joined in that order
        while it verifies the next ones (a catch-up pipeline)."""
        job = Merge(verified)
        job.origin = origin
        self._start(job)
        self._note_ahead(job)
        return job

    def _note_ahead(self, job: Merge) -> None:
        """Serve the records of a verified live push that extends exactly what we hold (or what is
        already ahead) to live tails and to peers, before its commit (see ahead.py); sets ``job.ahead``."""
        verified = job.verified
        d = verified.delta
        if d.kind != KIND_QUEUE or not 0 < len(d.records) <= AHEAD_DELTA_RECORDS or d.fork is not None:
            return
        if len(verified.chains) != len(d.records):
            return
        q = self.find(d.owner, d.name, d.kind)
        if q is None:
            return
        state = self.state(q)
        if state.forked or state.head is None:
            return
        ahead = self._ahead.get(q)
        if ahead is not None and ahead.end > state.held_end:
            base = ahead.summary
            if len(ahead.records) + len(d.records) > AHEAD_MAX_RECORDS:
                return
        else:
            ahead = None
            base = state.summary()  # in memory (the chain value at the end is cached)
        if d.from_offset != base.held_end or d.from_hash != base.held_hash:
            return
        summary = summary_after(base, d, verified.chains[-1])
        if summary is None:
            return
        self._ahead[q] = VerifiedAhead.of(d, summary) if ahead is None else ahead.extended(d, summary)
        job.ahead = summary
        self._wake(q)

    def ahead_for(self, owner: bytes, name: str, kind: int, since: Summary | None) -> VerifiedAhead | None:
        """The records ahead of our commit (ahead.py), if a peer summarised by ``since`` is to be served
        from them: it holds at least what we have committed, and we have more on its way to the store."""
        q = self.find(owner, name, kind)
        if q is None or since is None:
            return None
        ahead = self._ahead.get(q)
        if ahead is None or ahead.end <= self.state(q).held_end or since.held_end < self.state(q).held_end:
            return None
        return ahead

    def _wake(self, q: int) -> None:
        event = self._waiters.pop(q, None)
        if event is not None:
            event.set()

    async def merged(self, job: Merge) -> Merge:
        """Wait until ``job``'s transaction committed (so its records are durable); raises its error."""
        await self.outcome(job)
        return job

    # ------------------------------------------------------------------ reads
    async def delta_for(
        self,
        owner: bytes,
        name: str,
        since: Summary | None,
        max_records: int | None = None,
        kind: int = KIND_QUEUE,
        *,
        max_bytes: int | None = None,
    ) -> QueueDelta:
        """What a replica summarised by ``since`` lacks (records read from disk, on a reader thread)."""
        q = self.find(owner, name, kind)
        if q is None:
            raise NotFoundError(f"no queue {owner.hex()}/{name}")
        state = self.state(q)
        pushed = self._delta_from_recent(q, state, since, max_records, max_bytes)
        if pushed is not None:
            return pushed

        def compute(reader: StoreReader) -> QueueDelta:
            entries = state.entries
            assert isinstance(entries, StoredEntries)
            return core.delta(
                dataclasses.replace(state, entries=entries.rebind(reader.rows)),
                since,
                max_records,
                max_bytes,
                read=lambda lo, hi: _read_run(reader, q, lo, hi),
            )

        result: QueueDelta = await self._read(compute)
        if result.tip is not None:
            self._remember_chain(q, result.tip.end, result.tip.head_hash)
        return result

    def _remember_chain(self, q: int, end: int, chain: bytes) -> None:
        known = self._known_chains.get(q)
        if known is None:
            known = self._known_chains[q] = {}
        elif end not in known and len(known) >= KNOWN_CHAINS:
            del known[next(iter(known))]  # the oldest
        known[end] = chain

    def _delta_from_recent(
        self, q: int, state: QueueState, since: Summary | None, max_records: int | None, max_bytes: int | None
    ) -> QueueDelta | None:
        """``core.delta(state, since, ...)`` computed on the event loop when it needs no read: the peer
        lacks only the head, or only records of the last commit (kept in ``_recent``), and ``since`` names
        a chain value we know is ours. None: compute it from the store (anything else, or any doubt)."""
        head, tip = state.head, state.tip
        if head is None or since is None or state.fork is not None:
            return None
        held = state.summary()  # in memory: the chain value at the end is cached with the entries
        self._remember_chain(q, held.held_end, held.held_hash)
        from_offset = since.held_end
        records: Sequence[Record] = ()
        checkpoints: tuple[SignedHead, ...] = ()
        if from_offset == held.held_end:
            if since.held_hash != held.held_hash:
                return None
            tip = None
        else:
            found = self._recent.get(q)
            if found is None or tip is None:
                return None
            first, appended = found
            end = held.held_end
            if first + len(appended) != end or not max(first, state.start) <= from_offset < end:
                return None
            if self._known_chains[q].get(from_offset) != since.held_hash:
                return None
            records = appended[from_offset - first :]
            if (max_records is not None and len(records) > max_records) or (
                max_bytes is not None and core.payload_bytes(records) > max_bytes
            ):
                return None
            checkpoints = tuple(c for c in state.checkpoints if from_offset < c.end <= end and c != tip)
        return QueueDelta(
            owner=state.owner,
            name=state.name,
            kind=state.kind,
            head=head,
            meta=state.meta if since.meta_version != head.meta_version else None,
            tip=tip,
            from_offset=from_offset,
            from_hash=since.held_hash,
            records=records,
            checkpoints=checkpoints,
            fork=None,
        )

    async def inspect(self, fn: Callable[[StoreReader], T]) -> T:
        """Run a read-only ``fn`` on a reader connection, off the event loop and the storage thread
        (maintenance that measures the store, such as retention)."""
        result: T = await self._read(fn)
        return result

    async def verify(self, q: int) -> int:
        """Re-check a stored queue against its owner's signatures, on a reader (writes go on)."""
        state = self.state(q)
        try:
            checked: int = await self._read(lambda r: verify_queue(r.conn, q, state))
        except (IntegrityError, StorageError) as exc:
            if self._metrics is not None:
                self._metrics.verification_failed(exc)
            raise
        return checked

    async def read(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Committed records in ``[lo, hi)`` clamped to what the queue holds, bounded in count and size."""
        state = self.state(q)
        lo, hi = max(lo, state.start), min(hi, state.held_end)
        if hi <= lo or max_records <= 0:
            return Columns()
        recent = self._from_recent(q, lo, hi, max_records, max_bytes)
        if recent is not None:
            return recent
        columns: Columns = await self._read(lambda r: r.columns(q, lo, hi, max_records, max_bytes))
        return columns

    def _from_recent(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns | None:
        found = self._recent.get(q)
        if found is None:
            return None
        first, records = found
        if not first <= lo < first + len(records):
            return None
        return columns_of(first, records, lo, hi, max_records=max_records, max_bytes=max_bytes)

    async def row(self, q: int, offset: int) -> RawRow | None:
        state = self.state(q)
        if not state.start <= offset < state.held_end:
            return None
        found = self._recent.get(q)
        if found is not None and found[0] <= offset < found[0] + len(found[1]):
            r = found[1][offset - found[0]]
            return r.key, r.value, r.timestamp, [[k, v] for k, v in r.headers] if r.headers else None
        result: RawRow | None = await self._read(lambda reader: reader.row(q, offset))
        return result

    def visible_end(self, q: int) -> int:
        """Where a live tail may read up to: the committed end, or past it the verified records of a
        replicated queue still being committed (ahead.py)."""
        held_end = self.state(q).held_end
        ahead = self._ahead.get(q)
        return ahead.end if ahead is not None and ahead.end > held_end else held_end

    async def read_visible(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """:meth:`read` for a live tail: past the committed end, the verified records ahead of it."""
        state = self.state(q)
        if lo < state.held_end:
            return await self.read(q, lo, min(hi, state.held_end), max_records, max_bytes)
        ahead = self._ahead.get(q)
        if ahead is None or not ahead.first <= lo < ahead.end or max_records <= 0:
            return Columns()
        return ahead.columns(lo, hi, max_records, max_bytes)

    async def wait_past(self, q: int, end: int, *, ahead: bool = False) -> None:
        """Return once the queue holds records at or past ``end`` (or was truncated past it); with
        ``ahead`` (a live tail), also once verified records on their way to the store do (ahead.py)."""
        while True:
            state = self.state(q)
            if (self.visible_end(q) if ahead else state.held_end) > end or state.start > end:
                return
            event = self._waiters.get(q)
            if event is None:
                event = self._waiters[q] = trio.Event()
            await event.wait()

    # ------------------------------------------------------------------ KV reads
    def kv_namespace(self, owner: bytes | None) -> int | None:
        return self.find(owner or self.public_key, KV_NAMESPACE, KIND_KV)

    async def kv_entry(self, owner: bytes | None, key: str) -> kv.Entry | None:
        ns = self.kv_namespace(owner)
        if ns is None:
            return None
        entry: kv.Entry | None = await self._read(lambda r: r.kv_entry(ns, key))
        return entry

    async def kv_scan(self, owner: bytes | None, prefix: str) -> list[tuple[str, kv.Entry]]:
        ns = self.kv_namespace(owner)
        if ns is None:
            return []
        items: list[tuple[str, kv.Entry]] = await self._read(lambda r: list(r.kv_scan(ns, prefix)))
        return items


def _read_run(reader: StoreReader, q: int, lo: int, hi: int) -> RecordRun:
    """Committed records ``[lo, hi)`` of queue ``q`` as a run: the segments' columns, concatenated (what
    a delta sends; no Record object is built)."""
    keys: list[bytes | None] = []
    values: list[bytes] = []
    timestamps: list[int] = []
    headers: list[Any] = []
    for segment in segments.scan(reader.conn, q, lo, hi):
        part = segment if lo <= segment.first and segment.end <= hi else segment.slice(lo, hi)
        keys += part.keys
        values += part.values
        timestamps += part.timestamps
        headers += part.headers
    if len(values) != hi - lo:
        # Only a reader racing a truncation can see this: the rows it was promised are gone.
        raise GapError(f"records [{lo}, {hi}) of queue #{q} are no longer all stored (truncated); retry")
    header_column = None
    if headers.count(None) != len(headers):
        header_column = [tuple((k, v) for k, v in h) if h else () for h in headers]
    return RecordRun(values, keys, timestamps, header_column)


__all__ = ["RECENT_MAX_RECORDS", "Engine"]
