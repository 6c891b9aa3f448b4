"""The bridge between trio and the storage thread: jobs go out, completions come back, reads run on a pool.

Writes become jobs for the :class:`~latticed.storage.writer.Writer`; the calling task waits on a
``trio.Event`` that the event loop sets when the job's transaction committed (one ``run_sync_soon`` per
group commit, not per job). Before it does, the owner of the bridge hears of the batch's changes
(``on_commit``), so whatever a woken waiter looks at already shows them. Reads run on a small pool of read
connections through ``trio.to_thread``, so neither kind ever blocks the event loop.

This module knows nothing of queues, caches or replication; it changes only if the way trio talks to the
storage thread does.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import trio

from latticed.errors import LatticedError, StorageError
from latticed.process.logs import get_logger, log_event
from latticed.storage.batch import Batch
from latticed.storage.bell import Bell
from latticed.storage.core2_queues import Change2
from latticed.storage.jobs import SUBMITTER, Call, Job, WriterView
from latticed.storage.reader import ReadPool, StoreReader
from latticed.storage.sqlite import wal_path
from latticed.storage.writer import Change, Writer

log = get_logger(__name__)

AnyJob = TypeVar("AnyJob", bound=Job)
T = TypeVar("T")

#: What the bridge's owner does with each committed batch, on the event loop, before any waiter wakes.
CommitHandler = Callable[[list[Job], list[Change], list[Change2]], None]

#: How long a :class:`StorageHold` keeps the storage thread at most (a test that forgets to release it
#: must not wedge the thread for ever).
HOLD_TIMEOUT_S: Final = 30.0


def tell(listener: Callable[..., object], *args: object) -> bool:
    """Hand a commit to one listener: one that raises is logged, and the others (and the commit's
    waiters, woken after) still hear of it: the commit is durable whatever a listener does. False if it
    raised (the caller may have to undo what it left halfway)."""
    try:
        listener(*args)
    except Exception as exc:
        log_event(log, "storage.listener_failed", level=40, exc_info=exc, listener=repr(listener))
        return False
    return True


class StorageBridge:
    """Job submission to the storage thread and its completion on the event loop; reads on the pool.

    Built on the trio thread (it captures that loop's token)."""

    def __init__(self, writer: Writer, pool: ReadPool, on_commit: CommitHandler) -> None:
        self._writer = writer
        self._pool = pool
        self._on_commit = on_commit
        self._token = trio.lowlevel.current_trio_token()
        self._limiter = trio.CapacityLimiter(pool.size)
        self._closed = False
        #: Called on the event loop once the storage thread read the store back after a failed read-back
        #: (memory was stale until then): the owner wakes whatever waited and looked at stale values.
        self.on_reload: Callable[[], None] | None = None
        #: Batches told by ``on_committing`` whose replies the loop has not built yet (appended on the
        #: storage thread, taken on the loop), and the bell it rings for them (see latticed/storage/bell.py).
        self._preparing: collections.deque[list[Job]] = collections.deque()
        self._bell = Bell()
        trio.lowlevel.spawn_system_task(self._preparer, name="latticed-storage-prepare")
        writer.on_done = self._on_done
        writer.on_committing = self._on_committing
        writer.on_reloaded = self._on_reloaded

    # ------------------------------------------------------------------ writes
    def _on_done(self, jobs: list[Job], changes: list[Change], changes2: list[Change2]) -> None:
        """Runs on the storage thread after each batch: hand completion to trio in one callback."""
        self._token.run_sync_soon(self._complete, jobs, changes, changes2)

    def _on_reloaded(self) -> None:
        """Runs on the storage thread after a read-back that ended a stale spell: tell the event loop."""
        self._token.run_sync_soon(self._reloaded)

    def _reloaded(self) -> None:
        if self.on_reload is not None:
            tell(self.on_reload)

    def _on_committing(self, jobs: list[Job]) -> None:
        """Runs on the storage thread right before a batch's ``COMMIT``: while the fsync runs the event
        loop is idle, so the jobs' waiters build their replies then (``Job.prepare``), and what is left
        for the loop once the commit returns is to send them. The bell keeps the GIL on this thread until
        the ``COMMIT`` releases it: the loop builds the replies during the fsync, not before it while
        this thread waits (trio's ``run_sync_soon`` handed the GIL over in its ``send``; wake26)."""
        if any(job.prepare is not None for job in jobs):
            self._preparing.append(jobs)
            self._bell.ring()

    async def _preparer(self) -> None:
        """The loop's side of the bell: each ring builds the replies of the batches told since."""
        try:
            while True:
                await self._bell.wait()
                self._prepare_told()
        except trio.ClosedResourceError:  # stop() closed the bell
            return

    def _prepare_told(self) -> None:
        """Build the replies of every batch told and not yet prepared, in the order told."""
        preparing = self._preparing
        while preparing:
            self._prepare(preparing.popleft())

    @staticmethod
    def _prepare(jobs: list[Job]) -> None:
        # Taken by _complete first if the bell's task has not run yet: it always runs before the batch's
        # jobs are done. Once per distinct callback: a connection's prepares all its jobs in one pass, and
        # calling it for each of its 63 jobs in the batch walked them 63 times (O(n^2): ~0.4 ms of the
        # loop per batch).
        called: set[Callable[[], None]] = set()
        for job in jobs:
            prepare = job.prepare
            if prepare is not None and prepare not in called:
                called.add(prepare)
                try:
                    prepare()
                except Exception as exc:  # the reply is then built once the job is done, as without it
                    log_event(log, "storage.prepare_failed", level=40, exc_info=exc, job=type(job).__name__)

    def _complete(self, jobs: list[Job], changes: list[Change], changes2: list[Change2]) -> None:
        # A callback of run_sync_soon that raises ends the whole trio run, and the waiters below would
        # never wake: whatever the owner's handler or a job's callback does, each job is completed with
        # what its commit did (its result or error was settled on the storage thread).
        self._prepare_told()  # the replies of this batch (and any later one told) before anything is done
        try:
            self._on_commit(jobs, changes, changes2)
        except Exception as exc:
            log_event(log, "storage.on_commit_failed", level=50, exc_info=exc, jobs=len(jobs))
        for job in jobs:
            if job.done is not None:
                job.done.set()
        # Every job of the batch is done before any callback runs: one that acknowledges its caller's
        # jobs in order sees all of this commit's (one message for them all, not one per job).
        # Each callback is dropped as it is called: it is one-shot, and one that holds what holds the job
        # (a link's partial over its pending merge) would else leave a reference cycle per merge behind,
        # garbage only the cyclic collector frees (~25 objects a relayed push; issue 28, gc23).
        for job in jobs:
            notify = job.notify
            if job.done is not None and notify is not None:
                job.notify = None
                try:
                    notify()
                except Exception as exc:
                    log_event(log, "storage.notify_failed", level=40, exc_info=exc, job=type(job).__name__)

    def start(self, job: AnyJob) -> AnyJob:
        """Hand ``job`` to the storage thread now; :meth:`outcome` waits for it. Jobs commit in the order
        they are started, so a connection that pipelines its offers keeps their order."""
        if self._closed:
            raise LatticedError("latticed is shutting down")
        job.done = trio.Event()
        submitter = SUBMITTER.get()
        if submitter is not None:  # a pipelining connection's job (see latticed.storage.jobs.submitting)
            job.notify, job.prepare, job.origin = submitter.notify, submitter.prepare, submitter.origin
        self._writer.submit(job)
        return job

    async def outcome(self, job: Job) -> Any:
        """The result of a started job once its transaction committed (its error, raised, if it failed)."""
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    async def run(self, job: Job) -> Any:
        """:meth:`start` and :meth:`outcome` in one."""
        return await self.outcome(self.start(job))

    async def call(self, fn: Callable[[Batch, WriterView], Any]) -> Any:
        """Run ``fn`` on the storage thread inside a batch (maintenance, tests)."""
        return await self.run(Call(fn))

    def hold(self) -> StorageHold:
        """Test seam: keep the storage thread inside a batch, so nothing commits, until the hold is
        released. Submitted now (call it on the event loop); see :class:`StorageHold`."""
        hold = StorageHold()
        self.start(Call(hold.job))
        return hold

    # ------------------------------------------------------------------ reads
    async def read(self, fn: Callable[[StoreReader], T]) -> T:
        """``fn`` with a reader inside one read transaction, on a worker thread (at most one per reader)."""

        def work() -> T:
            with self._pool.reader() as reader:
                return fn(reader)

        return await trio.to_thread.run_sync(work, limiter=self._limiter)

    # ------------------------------------------------------------------ facts and lifecycle
    @property
    def transactions(self) -> int:
        return self._writer.transactions

    @property
    def jobs_committed(self) -> int:
        return self._writer.jobs_committed

    def storage_bytes(self) -> int:
        """The database, its WAL and its shared-memory index, on disk."""
        path = self._writer.path
        total = 0
        for name in (path, wal_path(path), Path(f"{path}-shm")):
            with contextlib.suppress(OSError):
                total += os.stat(name).st_size
        return total

    async def stop(self) -> None:
        """Refuse new jobs, let the storage thread finish the ones it has, close the readers."""
        self._closed = True
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._writer.stop)
            self._pool.close()
        self._bell.close()  # the storage thread has ended: nothing rings it any more


class StorageHold:
    """The storage thread held inside one batch until :meth:`release` (at most :data:`HOLD_TIMEOUT_S`).

    A test seam for what happens between a job's submission and its commit: records verified but not
    yet stored, requests pipelined behind a commit. As a context manager it waits (blocking the calling
    thread) until the storage thread is inside the batch, and releases it on leaving."""

    def __init__(self) -> None:
        self._entered = threading.Event()
        self._released = threading.Event()

    def job(self, batch: Batch, writer: WriterView) -> None:
        """The batch's body, on the storage thread."""
        self._entered.set()
        self._released.wait(HOLD_TIMEOUT_S)

    def wait_entered(self, timeout: float = HOLD_TIMEOUT_S) -> None:
        """Block until the storage thread is inside the batch; StorageError if it is not in time."""
        if not self._entered.wait(timeout):
            raise StorageError(f"the storage thread did not reach the hold within {timeout} s")

    def release(self) -> None:
        self._released.set()

    def __enter__(self) -> StorageHold:
        try:
            self.wait_entered()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


__all__ = ["HOLD_TIMEOUT_S", "CommitHandler", "StorageBridge", "StorageHold", "tell"]
