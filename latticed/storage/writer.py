"""The storage thread: it owns the writer connection and turns waiting jobs into one transaction each.

Group commit: the thread takes every job queued at that moment, applies them to a
:class:`~latticed.storage.batch.Batch` (one signature per queue), writes the result in ONE transaction
(one WAL fsync with ``synchronous=FULL``), and only then reports every job done. Jobs that arrive while
a batch is being written wait for the next one, so concurrent writers share fsyncs without any timer.
``linger_ms`` (the ``group_commit_ms`` setting) adds a bounded wait only when the batches of the last
few milliseconds show several writers at once and fewer than that have arrived yet: concurrent writers
then share one fsync more often (each costs ~0.3 ms of CPU here), and a lone client never waits.

The thread also holds the authoritative :class:`QueueState` of every queue. It publishes a new value into
``states`` after its transaction commits; readers on other threads only ever see committed values.

Why one module: the :class:`Writer` is the storage thread: taking jobs, applying them to a batch, the one
transaction and its failure handling run on one thread over one connection, and the group-commit rule (all
of a moment's jobs, one fsync) is only visible with all of it together.
"""

from __future__ import annotations

import collections
import functools
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from latticed.crdt import kv
from latticed.crdt.head import KIND_KV, queue_id
from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import LatticedError, MalformedError, StorageError
from latticed.process.clock import wall_ms
from latticed.process.logs import EveryInterval, get_logger, log_event
from latticed.process.threadname import name_os_thread
from latticed.storage.batch import Batch, Staged, appended_since
from latticed.storage.checkpointer import QUIET_S, Checkpointer
from latticed.storage.core2_queues import Change2, Core2Queues
from latticed.storage.jobs import KV_NAMESPACE, Job, KvSealing
from latticed.storage.kvcompact import MIN_OPS, RATIO, CompactKv, worth_compacting
from latticed.storage.reserve import RESERVE_BYTES
from latticed.storage.space import VACUUM_STEP_PAGES, SpaceKeeper
from latticed.storage.sqlite import WAL_AUTOCHECKPOINT_PAGES, is_full
from latticed.storage.store import Store

log = get_logger(__name__)

_STOP: Final = object()
#: Free pages given back per maintenance step, so reclaiming the space of a big truncation never stalls
#: writes for long; steps run after each batch and while the thread is idle. Small enough that a step
#: does not write the freed pages into the WAL (see :data:`latticed.storage.space.VACUUM_STEP_PAGES`).
RECLAIM_PAGES: Final = VACUUM_STEP_PAGES
#: The fewest free pages left (4 KiB pages: 8 MiB) while writes keep coming; see :data:`RECLAIM_SLACK`.
RECLAIM_KEEP_PAGES: Final = 2048
#: The share of the file's pages left free (for the next writes) while writes keep coming.
RECLAIM_SLACK: Final = 0.125
_IDLE_S: Final = 0.05
#: While memory is stale (see ``Writer._repair``): seconds between read-backs tried while idle.
_REPAIR_RETRY_S: Final = 1.0
#: An upkeep error repeating (after every batch, at every idle tick) is logged at most this often.
MAINTAIN_LOG_INTERVAL_S: Final = 60.0
#: How far back (seconds) the estimate of concurrent writers looks: after a burst ends, a lone writer
#: stops waiting for company this soon.
_RECENT_S: Final = 0.02
#: A batch of nothing but live pushes already served ahead of their commit (``Job.may_linger``) waits up
#: to this long for more before it commits: a replica relaying a live stream then shares one transaction
#: (and one fsync, ~0.5 ms of CPU here) between several records. Only the sender's ACK waits for it.
MERGE_LINGER_S: Final = 0.02
#: ... and commits as soon as it holds this many: a sender may have only 8 deltas unacknowledged (32
#: small ones on a link that agreed on ``window2-32``), and must never be held back by our linger.
MERGE_LINGER_JOBS: Final = 4


@dataclass(frozen=True, slots=True)
class Change:
    """A queue changed by a committed batch: its new value and the records appended (for tails)."""

    q: int
    state: QueueState
    first: int
    #: Immutable: a tuple of records or a :class:`~latticed.crdt.records.RecordRun`.
    appended: Sequence[Record]


#: After each batch: its jobs, the core-1 queues it changed and the core-2 queues it changed.
DoneCallback = Callable[[list[Job], list[Change], list[Change2]], None]


class StorageMetrics(Protocol):
    """What the storage thread and the engine report (the daemon's metrics implement it; given None, storage
    reports nothing and pays nothing). Declared here, by the reporting layer, so storage imports nothing
    above it."""

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


class Writer:
    """Owns the store's writer connection; use :meth:`start` (thread) or :meth:`open` + :meth:`process`
    from one thread (tests)."""

    def __init__(
        self,
        path: Path,
        identity: Identity,
        *,
        clock: Callable[[], int] = wall_ms,
        linger_ms: float = 0.0,
        merge_linger_s: float = MERGE_LINGER_S,
        max_page_count: int | None = None,
        on_done: DoneCallback | None = None,
        metrics: StorageMetrics | None = None,
        reserve_bytes: int = RESERVE_BYTES,
    ) -> None:
        self.path = path
        #: The disk reserve and the steps that give space back (latticed/storage/space.py).
        self.space = SpaceKeeper(path, reserve_bytes)
        #: The last batch failed because the disk (or the page quota) is full.
        self._full = False
        self.identity = identity
        self._clock = clock
        self._linger = linger_ms / 1000.0
        self._merge_linger = merge_linger_s
        self._max_page_count = max_page_count
        self.on_done = on_done
        #: Told (on this thread) a batch's jobs right before its ``COMMIT``: see ``Job.prepare``.
        self.on_committing: Callable[[list[Job]], None] | None = None
        #: Told (on this thread) that a read-back ended a stale spell: values read meanwhile were old.
        self.on_reloaded: Callable[[], None] | None = None
        self._metrics = metrics
        self.states: dict[int, QueueState] = {}
        #: Core-2 queues (latticed/storage/core2_queues.py): staged and written with each group commit.
        self.core2 = Core2Queues()
        #: The core-2 queues the last batch changed (handed to ``on_done`` with the core-1 changes).
        self.changes2: list[Change2] = []
        self.created_ms: dict[int, int] = {}
        self._by_qid: dict[bytes, int] = {}
        self.kv_hlc = 0
        #: Opens the ops of sealed KV namespaces for folding and compaction (latticed/storage/sealer.py).
        self.kv_sealing: KvSealing | None = None
        self._next_q = 1
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._store: Store | None = None
        #: WAL checkpoints beside the commits (latticed/storage/checkpointer.py); None: SQLite's own.
        self.checkpointer: Checkpointer | None = None
        #: (time, size) of recent batches: how many writers have been committing together lately.
        self._recent_sizes: collections.deque[tuple[float, int]] = collections.deque()
        #: While a batch lingers for company: how many more jobs it waits for (0: not lingering), and the
        #: event :meth:`submit` sets once that many are queued.
        self._awaiting = 0
        self._enough = threading.Event()
        #: ... and whether it holds only pushes served ahead (then any other job wakes it at once).
        self._merges_only = False
        self._reclaim = False
        #: Free pages left after the last step of giving space back (-1: none taken yet).
        self._free_left = -1
        #: KV log compaction: the log size at which keys are counted next, and whether a pass is running.
        self._kv_qid = queue_id(identity.public_key, KV_NAMESPACE, KIND_KV)
        self._kv_next_check = 0
        self._kv_compacting = False
        #: The jobs (and changes) of this batch's COMMIT once it returned: whatever fails after it, they
        #: are reported done with their results.
        self._committed: list[Job] = []
        self._committed_changes: list[Change] = []
        #: Publishing a commit failed and reading the store back did too: batches are refused until it
        #: works (see :meth:`_repair`).
        self._stale = False
        #: While stale: when (``time.monotonic``) the idle thread may try the read-back again.
        self._repair_at = 0.0
        #: Lets ``storage.maintain_failed`` into the log at most once an interval (its clock: tests').
        self.maintain_log = EveryInterval(MAINTAIN_LOG_INTERVAL_S)
        #: Statistics: transactions committed and jobs they carried.
        self.transactions = 0
        self.jobs_committed = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def store(self) -> Store:
        assert self._store is not None, "writer is not open"
        return self._store

    def open(self) -> None:
        """Open the store and load every queue's small state, on the calling thread."""
        self.space.open()  # before the store preallocates its WAL: the reserve matters more
        store = Store(self.path, max_page_count=self._max_page_count)
        try:
            for loaded in store.load():
                self.states[loaded.q] = loaded.state
                self.created_ms[loaded.q] = loaded.created_ms
                self._by_qid[loaded.state.queue_id] = loaded.q
            self.core2.open(store)
            self._next_q = store.next_queue_number()
            self.kv_hlc = self._last_kv_hlc(store)
        except BaseException:
            store.close()
            raise
        self._store = store

    def _last_kv_hlc(self, store: Store) -> int:
        ns = self._by_qid.get(queue_id(self.identity.public_key, KV_NAMESPACE, KIND_KV))
        if ns is None:
            return 0
        state = self.states[ns]
        if state.held_end == state.start:
            return 0
        record = store.rows.record(ns, state.held_end - 1)
        try:
            return kv.decode_op(record.value).hlc if record is not None else 0
        except MalformedError:
            return 0

    def start_checkpointer(self, pages: int = WAL_AUTOCHECKPOINT_PAGES, quiet_s: float = QUIET_S) -> None:
        """Move WAL checkpoints out of the commits onto their own thread (else SQLite's automatic ones
        stay); the storage thread does it after :meth:`open`, tests may."""
        checkpointer = Checkpointer(self.path, pages, quiet_s)
        if checkpointer.start(self.store.connection):
            self.checkpointer = self.space.checkpointer = checkpointer

    def _close(self) -> None:
        """The checkpointer first (it reads the store), then the store."""
        if self.checkpointer is not None:
            self.checkpointer.close()
            self.checkpointer = self.space.checkpointer = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def start(self) -> None:
        """Open the store on a new thread and serve jobs there; raises if opening fails."""
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._main, args=(ready, failure), name="latticed-storage", daemon=True
        )
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]

    def stop(self) -> None:
        """Finish queued jobs, close the store and end the thread (blocking)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        else:
            self._close()

    def submit(self, job: Job) -> None:
        """Queue a job (thread-safe, never blocks); wakes a lingering batch once it has what it waits for."""
        self._queue.put(job)
        awaiting = self._awaiting
        if awaiting and (self._queue.qsize() >= awaiting or (self._merges_only and not job.may_linger)):
            self._awaiting = 0
            self._enough.set()

    def lookup(self, qid: bytes) -> int | None:
        return self._by_qid.get(qid)

    def _main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        name_os_thread("ld-storage")  # else it shows under the name of the trio worker that started it
        try:
            self.open()
            self.start_checkpointer()
        except BaseException as exc:
            self._close()
            failure.append(exc)
            ready.set()
            return
        ready.set()
        try:
            while True:
                items = self._collect()
                stop = any(item is _STOP for item in items)
                jobs = [item for item in items if isinstance(item, Job)]
                if jobs:
                    self._process_guarded(jobs)
                if stop:
                    break
                try:
                    self.maintain(idle=not jobs)
                except Exception as exc:  # a bug in upkeep must not end the thread that takes the writes
                    self._reclaim = self._kv_compacting = False  # not retried at each idle wake-up
                    # ... but it runs after every batch too: logged at most once a minute
                    if (held := self.maintain_log.allow()) is not None:
                        log_event(log, "storage.maintain_failed", level=50, exc_info=exc, suppressed=held)
        finally:
            self._close()

    def maintain(self, idle: bool = True) -> bool:
        """One bounded step of upkeep: compacting our KV op log, else giving back disk space freed by
        deletions. True if more remains (the thread then comes back while idle).

        While writes keep coming (``idle`` False) up to :data:`RECLAIM_SLACK` of the file stays free: under
        retention's steady state, space freed by one truncation is soon written again, and handing it to
        the file system only to grow the file back would cost writes I/O for nothing."""
        if self._stale:
            # The read-back is retried while idle too (at most once a second): readers on other threads
            # see memory as the failed publish left it (an acked create not found by its name), and a
            # quiet daemon may get no batch to retry it at.
            now = time.monotonic()
            if now >= self._repair_at and not self._repair():
                self._repair_at = now + _REPAIR_RETRY_S
            return self._stale
        ns = self._kv_compaction_due()
        if ns is not None:
            job = CompactKv(ns)
            self._process_guarded([job])
            if job.error is not None:
                # Try again only after as many new writes again: a full disk must not become a busy loop.
                self._kv_next_check = self._kv_ops(ns) + MIN_OPS
                log_event(log, "kv.compaction_failed", level=30, error=str(job.error))
            else:
                log_event(log, "kv.compacted", dropped=job.result, ops=self._kv_ops(ns))
            self._kv_compacting = job.error is None
            return True
        if not self._reclaim:
            return False
        try:
            keep = 0 if idle else max(RECLAIM_KEEP_PAGES, int(self.store.page_count() * RECLAIM_SLACK))
            before = self._free_left
            self._free_left = self.store.reclaim(RECLAIM_PAGES, keep=keep)
            # Idle and no page given back: a store without incremental auto-vacuum (store compact fixes it).
            self._reclaim = self._free_left > 0 and not (idle and self._free_left == before)
            if not self._reclaim:
                self.space.settle(self.store)  # the file shrinks at a checkpoint, not before
        except sqlite3.Error as exc:
            self._reclaim = False
            log_event(log, "storage.reclaim_failed", level=30, error=str(exc))
        return self._reclaim

    def _kv_ops(self, ns: int) -> int:
        state = self.states[ns]
        return state.held_end - state.start

    def _kv_compaction_due(self) -> int | None:
        """Our KV namespace, if its log is worth a compaction step now. Counting keys costs a query, so
        it is done only once the log has grown past the last count's threshold."""
        ns = self._by_qid.get(self._kv_qid)
        if ns is None:
            return None
        ops = self._kv_ops(ns)
        if ops < max(MIN_OPS, self._kv_next_check) and not self._kv_compacting:
            return None
        keys = self.store.kv_count(ns)
        if worth_compacting(ops, keys):
            return ns
        self._kv_compacting = False
        self._kv_next_check = RATIO * keys
        return None

    def _collect(self) -> list[object]:
        items: list[object] = []
        target = self._recent_writers()
        if self._linger > 0 and target > 1:
            # Several writers lately (a lock-step cohort of clients, each waiting for its ack): wait for
            # that many jobs at once, at most the linger from now, so the thread wakes once a commit
            # and not also at the cohort's first job (a wake-up and a turn of the GIL in the middle of
            # the event loop reading the cohort's requests). A job queued meanwhile waits at most the
            # linger, as it would have from its own arrival; none queued: wait as below.
            deadline = time.monotonic() + self._linger
            self._wait_for_more(items, target, self._linger)
            if items:
                if self._merge_linger > 0 and _all_may_linger(items):
                    return self._linger_merges(items)
                return self._linger_for(items, target, deadline)
        if self._reclaim or self._kv_compacting or self._stale:
            try:
                first = self._queue.get(timeout=_IDLE_S)
            except queue.Empty:
                return []
        else:
            first = self._queue.get()
        items.append(first)
        self._drain(items)
        if self._merge_linger > 0 and _all_may_linger(items):
            return self._linger_merges(items)
        # Writers seen together recently: a batch may wait (at most the linger) for that many.
        target = self._recent_writers() if self._linger > 0 else 1
        return self._linger_for(items, target, time.monotonic() + self._linger)

    def _linger_for(self, items: list[object], target: int, deadline: float) -> list[object]:
        """Wait until ``items`` hold ``target`` writers or ``deadline`` (``time.monotonic``) passes, and
        note how many writers the batch has."""
        writers = _writers(items)
        while writers < target:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wait_for_more(items, target - writers, remaining)
            writers = _writers(items)
        self._recent_sizes.append((time.monotonic(), writers))
        return items

    def _recent_writers(self) -> int:
        """The most writers a batch of the last :data:`_RECENT_S` held (1 if none)."""
        now = time.monotonic()
        recent = self._recent_sizes
        while recent and recent[0][0] < now - _RECENT_S:
            recent.popleft()
        return max((size for _, size in recent), default=1)

    def _linger_merges(self, items: list[object]) -> list[object]:
        """Wait for more pushes to join ``items`` (all of them lingering merges), up to the linger; any
        other job ends the wait at once, so it never waits on our account."""
        deadline = time.monotonic() + self._merge_linger
        while len(items) < MERGE_LINGER_JOBS:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wait_for_more(items, MERGE_LINGER_JOBS - len(items), remaining, merges_only=True)
            if not _all_may_linger(items):
                break
        return items

    def _wait_for_more(
        self, items: list[object], wanted: int, timeout: float, *, merges_only: bool = False
    ) -> None:
        """Sleep until ``wanted`` more jobs are queued (with ``merges_only``: or any job that is not a
        lingering merge), at most ``timeout`` seconds, then add what is queued to ``items``. :meth:`submit`
        wakes the thread once, when that is so, not at each job: every wake-up is a context switch, and
        with 16 writers there were ~15 per commit."""
        self._enough.clear()
        self._merges_only = merges_only
        self._awaiting = wanted
        if self._queue.qsize() < wanted:
            self._enough.wait(timeout)
        self._awaiting = 0
        self._merges_only = False
        self._drain(items)

    def _drain(self, items: list[object]) -> None:
        """Add every job queued right now to ``items``."""
        get = self._queue.get_nowait
        try:
            while True:
                items.append(get())
        except queue.Empty:
            pass

    # ------------------------------------------------------------------ one group commit
    def _process_guarded(self, jobs: list[Job]) -> None:
        """``process``, but a bug in it must not kill the thread: every waiting task would hang."""
        try:
            self.process(jobs)
        except Exception as exc:
            log_event(log, "storage.batch_crashed", level=50, exc_info=exc, jobs=len(jobs))
            committed = {id(job) for job in self._committed}  # durable: they keep their results
            for job in jobs:
                if job.error is None and id(job) not in committed:
                    job.error = StorageError(f"internal error in the storage thread: {exc!r}")
            if not committed:
                self.changes2 = []
            self._done(jobs, self._committed_changes if committed else [])

    def process(self, jobs: list[Job]) -> list[Change]:
        """Apply ``jobs`` in one transaction; every job ends with ``result`` or ``error`` set."""
        self._committed = []
        if self._stale and not self._repair():
            for job in jobs:
                job.error = StorageError(
                    f"cannot write to {self.path}: its queues could not be read back after an internal "
                    "error (see the log); retry, or restart latticed"
                )
            self.changes2 = []
            self._done(jobs, [])
            return []
        remaining = self._keep_reserve(jobs)
        changes: list[Change] = []
        rescued = False
        while remaining:
            poisoned, changes = self._attempt(remaining)
            if poisoned is None:
                if self._full and not rescued and (rescue := self._rescue(remaining)):
                    remaining, rescued = rescue, True
                    continue
                break
            # That job failed after changing the batch: drop it and redo the others in a fresh batch.
            remaining = [job for job in remaining if job is not poisoned]
            for job in remaining:
                job.error = None
                job.result = None
        if rescued or (self.space.used and self._reclaim):  # room made while the reserve is used up
            try:
                self._recover()
            except Exception as exc:  # after the COMMIT: its jobs stay committed
                log_event(log, "storage.after_commit_failed", level=50, exc_info=exc, step="recover")
        self._done(jobs, changes)
        return changes

    def _done(self, jobs: list[Job], changes: list[Change]) -> None:
        """``on_done``, which must not fail the batch (e.g. the event loop is gone at shutdown)."""
        if self.on_done is not None:
            try:
                self.on_done(jobs, changes, self.changes2)
            except Exception as exc:
                log_event(log, "storage.notify_failed", error=repr(exc))

    # ------------------------------------------------------------------ a full disk
    def _keep_reserve(self, jobs: list[Job]) -> list[Job]:
        """While the reserve is used up and cannot be written again, only jobs that make room run: the
        others fail at once as on a full disk, so they cannot take the room a truncation needs."""
        if not self.space.used or all(job.frees_space for job in jobs) or self.space.restore(self.store):
            return list(jobs)
        error = StorageError(
            f"cannot write to {self.path}: the disk is full (latticed keeps its last "
            f"{self.space.reserve.size >> 20} MiB for truncations and retention changes); free space, "
            "or drop records with truncate or queue retention set, then retry"
        )
        for job in jobs:
            if not job.frees_space:
                job.error = StorageError(str(error))
        return [job for job in jobs if job.frees_space]

    def _rescue(self, jobs: list[Job]) -> list[Job]:
        """After a batch failed on a full disk: the jobs in it that make room, to be tried again alone
        with the reserve released (the others keep their error); empty if there is nothing to try."""
        freeing = [job for job in jobs if job.frees_space]
        if not freeing:
            return []
        released = self.space.release(self.store)
        if not released and len(freeing) == len(jobs):
            return []  # nothing new to try: the same batch, no more room
        log_event(log, "storage.reserve_used", level=30, jobs=len(freeing), released_bytes=released)
        for job in freeing:
            job.error = None
            job.result = None
        return freeing

    def _recover(self) -> None:
        """After a batch committed with the reserve's room: if it deleted records, give the freed pages
        back now (the disk is still full), then write the reserve again if that made room for it.

        Nothing else: a checkpoint without a deletion before it would copy the WAL into a database file
        that must grow for it, and take the very room the reserve just gave."""
        if self._reclaim:
            try:
                self.space.give_back(self.store)
            except sqlite3.Error as exc:
                log_event(log, "storage.reclaim_failed", level=30, error=str(exc))
            self._reclaim = False
        if not self.space.restore(self.store):
            log_event(log, "storage.reserve_missing", level=30, path=str(self.space.reserve.path))

    def _attempt(self, jobs: list[Job]) -> tuple[Job | None, list[Change]]:
        """One try at a batch: (a job that failed after changing the batch, or None; what changed)."""
        changes: list[Change] = []
        next_q = self._next_q
        started = time.perf_counter()
        batch = Batch(self.states, self.identity, self._clock(), self._allocate_q, self.store.kv_entry)
        self.core2.begin(self.identity, batch.now_ms, self._allocate_q)
        self.changes2 = []
        for job in jobs:
            before = batch.mutations
            try:
                job.apply(batch, self)
            except LatticedError as exc:
                job.error = exc
            except Exception as exc:
                log_event(log, "storage.job_failed", level=40, exc_info=exc, job=type(job).__name__)
                job.error = LatticedError(f"internal error in {type(job).__name__}: {exc!r}")
            if job.error is not None and batch.mutations != before:
                self._next_q = next_q
                self.core2.abort()
                return job, []
        failure: LatticedError | None = None
        self._full = False
        try:
            if batch.staged or self.core2.pending:
                batch.commit_pending()
                self.core2.sign_pending()
                changes = self._write(batch, started, jobs)
                self._committed, self._committed_changes = jobs, changes
                self.transactions += 1
                self.jobs_committed += len(jobs)
        except LatticedError as exc:
            failure = exc
        except sqlite3.Error as exc:
            self._full = is_full(exc)
            failure = self.store.error(exc, "write to")
            log_event(log, "storage.write_failed", level=40, error=str(failure), jobs=len(jobs))
        except Exception as exc:
            log_event(log, "storage.write_failed", level=40, exc_info=exc, jobs=len(jobs))
            failure = StorageError(f"cannot write to {self.path}: internal error {exc!r}")
        if failure is not None:
            self._next_q = next_q
            self.core2.abort()  # nothing it staged was committed
            for job in jobs:
                if job.error is None:
                    job.error = type(failure)(str(failure))
        return None, changes

    def _committing(self, jobs: list[Job]) -> None:
        """``on_committing``, which must not fail the batch (e.g. the event loop is gone at shutdown)."""
        assert self.on_committing is not None
        try:
            self.on_committing(jobs)
        except Exception as exc:
            log_event(log, "storage.notify_failed", error=repr(exc))

    def _allocate_q(self) -> int:
        q = self._next_q
        self._next_q += 1
        return q

    def _write(self, batch: Batch, started: float, jobs: list[Job]) -> list[Change]:
        """Write ``batch`` (of ``jobs``) in one transaction; ``started`` (``perf_counter``) is when the
        batch began, for the commit latency metric."""
        store = self.store
        results: list[Change] = []
        reclaim = False
        store.begin()
        try:
            for new in batch.new_queues.values():
                store.insert_queue(new.q, batch.staged[new.q].before, new.created_ms)
            for q, staged in batch.staged.items():
                if staged.state is staged.before:
                    continue
                first, appended = appended_since(staged.before, staged.state)
                refold = staged.joined and staged.state.kind == KIND_KV and _view_stale(staged)
                refold = refold or _frozen_now(staged)
                persisted, deleted = store.persist(q, staged.before, staged.state)
                reclaim = reclaim or deleted
                if persisted.kind == KIND_KV and staged.joined:
                    ops = appended
                    if refold:
                        # The view holds ops the kept log no longer does (the log jumped past ops we never
                        # saw, or a fork's join replaced our records): fold it again from the log, which
                        # holds every op that still decides a key.
                        store.clear_kv(q)
                        batch.kv.pop(q, None)
                        ops = persisted.entries.records(0, persisted.visible_end - persisted.start)
                    if self.kv_sealing is not None:
                        ops = self.kv_sealing.fold_ops(
                            q, persisted, ops, functools.partial(store.rows.records, q)
                        )
                    _fold_ops(batch, q, ops)
                results.append(Change(q, persisted, first, appended))
            self.core2.write()
            reclaim = reclaim or self.core2.deleted
            for ns, entries in batch.kv.items():
                store.put_kv(ns, entries.items())
            if batch.settings:  # rows a release does not know are ignored by it: no schema change
                store.connection.executemany(
                    "INSERT OR REPLACE INTO settings (name, value) VALUES (?, ?)", batch.settings.items()
                )
            syncing = time.perf_counter()
            if self.on_committing is not None:
                self._committing(jobs)
            store.commit()  # WAL mode, synchronous=FULL: the WAL frames are written and fsynced here
            done = time.perf_counter()
        except BaseException:
            store.rollback()
            raise
        # The COMMIT returned: the batch is durable and its jobs get their results whatever happens now.
        # Nothing below may raise out of here (the caller would report durable writes as failed).
        self._reclaim = self._reclaim or reclaim
        try:
            self._publish(batch, results)
        except Exception as exc:
            log_event(
                log, "storage.after_commit_failed", level=50, exc_info=exc, step="publish", jobs=len(jobs)
            )
            self._repair()
        try:
            if self._metrics is not None:  # last, once everything is published
                self._metrics.observe_commit(done - started, done - syncing)
            if self.checkpointer is not None:
                self.checkpointer.after_commit(store.connection)
        except Exception as exc:  # nothing in memory depends on these: logging is all
            log_event(
                log, "storage.after_commit_failed", level=50, exc_info=exc, step="report", jobs=len(jobs)
            )
        return results

    def _publish(self, batch: Batch, results: list[Change]) -> None:
        """After the COMMIT: the batch's values become the committed ones in memory. The core-2 changes
        are taken first: if publishing fails, the read-back repairs memory, and the listeners (replication,
        tails) must still hear of what was committed."""
        self.changes2 = self.core2.changes()
        self.core2.publish()
        for change in results:
            self.states[change.q] = change.state
        for new in batch.new_queues.values():
            state = self.states.setdefault(new.q, batch.staged[new.q].before)
            self.created_ms[new.q] = new.created_ms
            self._by_qid[state.queue_id] = new.q
        for q in self.core2.converted:  # now core-2 queues (latticed/storage/core1_convert.py)
            self._by_qid.pop(self.states.pop(q).queue_id, None)

    def _repair(self) -> bool:
        """Read every queue's committed value back from the store, after publishing a commit failed
        halfway (memory may then hold some of its values and not others). Until this succeeds the writer
        is stale and refuses batches: signing from a stale state would fork our own queues."""
        try:
            self._reload()
        except Exception as exc:
            self._stale = True
            log_event(log, "storage.reload_failed", level=50, exc_info=exc)
            return False
        was_stale, self._stale = self._stale, False
        log_event(log, "storage.reloaded", level=30, queues=len(self.states))
        if was_stale and self.on_reloaded is not None:
            # Waiters woken by the stale spell's commits read the old values and wait again: wake them.
            try:
                self.on_reloaded()
            except Exception as exc:
                log_event(log, "storage.notify_failed", error=repr(exc))
        return True

    def _reload(self) -> None:
        """What :meth:`open` reads, again, into the same dicts (readers on other threads hold them):
        keys are replaced or dropped, never missing in between."""
        store = self.store
        loaded = list(store.load())
        states = {item.q: item.state for item in loaded}
        self.core2.reload(store)
        self.states.update(states)
        for q in [q for q in self.states if q not in states]:
            del self.states[q]
        self.created_ms = {item.q: item.created_ms for item in loaded}
        self._by_qid = {state.queue_id: q for q, state in states.items()}
        # Never back: the store's max(q) + 1 forgets a dropped last queue, and the event loop keys caches
        # by number (an address's, live tails'), so a number handed out again would alias the dropped one.
        self._next_q = max(self._next_q, store.next_queue_number())


def _all_may_linger(items: list[object]) -> bool:
    return all(isinstance(item, Job) and item.may_linger for item in items)


def _writers(items: list[object]) -> int:
    """How many writers submitted these jobs: jobs of one origin (a pipelining connection, a peer's
    catch-up) count once, so that one busy writer does not make later lone commits wait for company."""
    jobs = [item for item in items if isinstance(item, Job)]
    return len({id(job) if job.origin is None else id(job.origin) for job in jobs})


def _view_stale(staged: Staged) -> bool:
    """Whether the join left a log that no longer extends the one the view was folded from: its chain
    value where our records ended changed (a fork's join kept the other history's records there) or is
    not held (the log jumped past our end). Both lookups are cached or in memory, so the check is O(1)."""
    before, after = staged.before, staged.state
    if before.head is None:
        return False  # nothing folded yet
    end = before.held_end
    return after.chain_at(end) != before.chain_at(end)


def _frozen_now(staged: Staged) -> bool:
    """Whether a join froze a KV namespace (or moved its visible end): its view is folded again from
    its ops up to the visible end only, as every read of a forked queue stops there."""
    before, after = staged.before, staged.state
    if after.kind != KIND_KV or not after.forked:
        return False
    return not before.forked or after.visible_end != before.visible_end


def _fold_ops(batch: Batch, ns: int, records: Sequence[Record]) -> None:
    """Fold KV ops that arrived by a merge into the namespace's view (the join makes re-folding harmless)."""
    for record in records:
        try:
            op = kv.decode_op(record.value)
        except MalformedError:
            # Signed by the owner yet not an op: keep the log as signed, leave the view alone.
            log_event(log, "kv.bad_op", ns=ns)
            continue
        entry = kv.op_entry(op)
        current = batch.kv_entry(ns, op.key)
        batch.put_kv(ns, op.key, entry if current is None else kv.join_entry(current, entry))


__all__ = ["MAINTAIN_LOG_INTERVAL_S", "Change", "DoneCallback", "Writer"]
