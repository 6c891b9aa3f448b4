"""WAL checkpoints on their own thread, beside the commits instead of inside one.

SQLite's automatic checkpoint runs inside the ``COMMIT`` that takes the WAL past its limit: that commit
copies the WAL (~16 MiB) into the database file and fsyncs it, several times the cost of the others, and
the storage thread waits for it. Here the writer's automatic checkpoints are off; after a commit that
leaves the WAL at its working size or more, the storage thread wakes this thread, which runs a PASSIVE
checkpoint on its own connection (it never blocks the writer or the readers). Durability is unchanged: a
commit is durable at its WAL fsync, and a checkpoint only copies durable frames into the database file.

Fewer, larger checkpoints: each pass copies and fsyncs the database file beside the commits, on the same
disk and the other core, so a commit past the working size only schedules one, run once commits pause
for :data:`QUIET_S` (a burst's WAL is copied after it, not during), or at once when the WAL reaches
:data:`BUSY_FACTOR` times the working size (64 MiB, SQLite's ``journal_size_limit`` here) under a steady
stream. SQLite starts the WAL over from its beginning only at a write transaction that finds every frame
copied, so while the WAL is that long each commit wakes the thread again (a pass then copies the few
frames written during the last one) until a pass ends between two commits. If it falls behind anyway
(the WAL reaches :data:`FALLBACK_FACTOR` times the working size) the storage thread checkpoints itself,
as SQLite would. The disk-full reserve (:mod:`.space`) takes precedence: while it owns checkpoints the
thread is paused.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from latticed.process.logs import get_logger, log_event
from latticed.process.threadname import name_os_thread
from latticed.storage.sqlite import WAL_AUTOCHECKPOINT_PAGES

log = get_logger(__name__)

#: The WAL at this many times the working size: a pass runs at once, commits or not.
BUSY_FACTOR: Final = 4
#: The WAL at this many times the working size: the storage thread checkpoints itself after its commit.
FALLBACK_FACTOR: Final = 8
#: A pass past the working size waits until no commit came for this long (seconds).
QUIET_S: Final = 0.1
#: The wal-index (``-shm``) header: ``mxFrame`` (frames in the WAL) at byte 16 and, after the header's
#: two copies, ``nBackfill`` (frames copied into the database) at byte 96, in native byte order.
_MX_FRAME: Final = struct.Struct("=I")
_MX_FRAME_AT: Final = 16
_BACKFILL_AT: Final = 96


def wal_frames(db: Path) -> tuple[int, int] | None:
    """(frames in the WAL, frames of them already copied into the database), read from the wal-index;
    None if it cannot be read. A cheap read of a page the kernel holds: no SQL, no lock."""
    index = WalIndex.open(db)
    if index is None:
        return None
    try:
        return index.frames()
    finally:
        index.close()


class WalIndex:
    """The wal-index (``-shm``) of one store held open, so that reading its header after each commit is
    one ``pread``, not an open, a read and a close.

    Why held: besides two syscalls a commit, closing a descriptor of a file drops every POSIX lock the
    process holds on it (fcntl(2)), SQLite's own locks on the ``-shm`` among them; this one is closed
    once, at shutdown. The file stays while the store is open (the writer's connection keeps it)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def open(cls, db: Path) -> WalIndex | None:
        """``db``'s wal-index, or None if it cannot be opened."""
        try:
            return cls(os.open(f"{db}-shm", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            return None

    def frames(self) -> tuple[int, int] | None:
        """(frames in the WAL, frames copied into the database), or None if unreadable (or closed)."""
        fd = self._fd
        if fd is None:
            return None
        try:
            header = os.pread(fd, _BACKFILL_AT + 4, 0)
        except OSError:
            return None
        if len(header) < _BACKFILL_AT + 4:
            return None
        (frames,) = _MX_FRAME.unpack_from(header, _MX_FRAME_AT)
        (copied,) = _MX_FRAME.unpack_from(header, _BACKFILL_AT)
        return frames, copied

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Checkpointer:
    """The checkpoint thread of one store: :meth:`start` and :meth:`after_commit` on the storage thread,
    :meth:`close` before the store closes."""

    def __init__(self, db: Path, pages: int = WAL_AUTOCHECKPOINT_PAGES, quiet_s: float = QUIET_S) -> None:
        self.db = db
        #: Frames of WAL past which a commit schedules a pass (the working size).
        self.pages = pages
        self.quiet_s = quiet_s
        #: ``time.monotonic()`` of the last commit: a scheduled pass waits for a pause after it.
        self._last_commit = 0.0
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._requested = 0
        self._served = 0
        self._stopping = False
        #: Held during each pass; :meth:`paused` takes it so no pass runs while the caller checkpoints.
        self._run = threading.Lock()
        self._paused = 0
        #: Statistics: passes run, passes that failed, checkpoints the storage thread ran itself.
        self.passes = 0
        self.failures = 0
        self.fallbacks = 0
        #: Times a commit woke the thread (once per pass it asks for, not once per commit).
        self.wakeups = 0
        self._index: WalIndex | None = None

    def start(self, writer: sqlite3.Connection) -> bool:
        """Open the thread's connection, turn the writer's automatic checkpoints off and start; False
        (automatic checkpoints stay on) if the WAL index cannot be read or the connection not opened."""
        index = WalIndex.open(self.db)
        if index is None or index.frames() is None:
            if index is not None:
                index.close()
            return False
        try:
            conn = sqlite3.connect(str(self.db), isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous = FULL")  # a checkpoint fsyncs the WAL, then the database
        except sqlite3.Error as exc:
            index.close()
            log_event(log, "storage.checkpointer_failed", level=30, error=str(exc))
            return False
        self._conn, self._index = conn, index
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        self._thread = threading.Thread(target=self._main, name="latticed-checkpoint", daemon=True)
        self._thread.start()
        return True

    def after_commit(self, writer: sqlite3.Connection) -> None:
        """On the storage thread after a commit: wake the thread if the WAL is long and not all copied;
        checkpoint here if it has fallen far behind. Never raises."""
        self._last_commit = time.monotonic()
        frames = None if self._index is None else self._index.frames()
        if frames is None or self._paused:
            return
        total, copied = frames
        if total < self.pages or copied >= total:
            return
        if total >= FALLBACK_FACTOR * self.pages:
            # The thread cannot catch up (each pass ends after the next commit began): wait for the pass
            # under way, then copy here, as SQLite would; the next commit then starts the WAL over.
            self._run.acquire()
            try:
                self.fallbacks += 1
                writer.execute("PRAGMA wal_checkpoint(PASSIVE)")
                log_event(log, "storage.checkpoint_fallback", frames=total)
            except sqlite3.Error as exc:
                log_event(log, "storage.checkpoint_failed", level=30, error=str(exc))
            finally:
                self._run.release()
            return
        with self._cond:
            # A pass already asked for and not served: the thread re-reads the WAL and the last commit's
            # time on its own (its wait ends at the pause it waits for), so it is woken again only if
            # the WAL reached the busy size, not at every commit of a steady stream (a thread wake-up
            # and a turn of the GIL each).
            idle = self._served >= self._requested
            self._requested += 1
            if idle or total >= BUSY_FACTOR * self.pages:
                self.wakeups += 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No pass runs inside (one under way is waited for): the caller owns checkpoints."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pause(self) -> None:
        with self._run:
            self._paused += 1

    def resume(self) -> None:
        self._paused = max(self._paused - 1, 0)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until every wake-up so far was served (tests, shutdown); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._served >= self._requested or self._stopping, timeout)

    def close(self) -> None:
        """End the thread (a pass under way finishes) and close its connection; before the store."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error as exc:  # pragma: no cover - close of a healthy connection
                log_event(log, "storage.checkpointer_close_failed", error=str(exc))
            self._conn = None
        if self._index is not None:
            self._index.close()
            self._index = None

    def _main(self) -> None:
        name_os_thread("ld-checkpoint")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._served < self._requested or self._stopping)
                if self._stopping:
                    return
            self._await_pause()
            with self._cond:
                if self._stopping:
                    return
                target = self._requested  # this pass serves every wake-up so far
            with self._run:
                if not self._paused:
                    try:
                        self._pass()
                        self.passes += 1
                    except Exception as exc:  # logged; the next commit past the threshold tries again
                        self.failures += 1
                        log_event(log, "storage.checkpoint_failed", level=30, error=str(exc))
            with self._cond:
                self._served = target
                self._cond.notify_all()

    def _await_pause(self) -> None:
        """Until commits pause for ``quiet_s``, the WAL reaches the busy size, or the store closes."""
        with self._cond:
            while not self._stopping:
                wait = self._last_commit + self.quiet_s - time.monotonic()
                if wait <= 0:
                    return
                frames = None if self._index is None else self._index.frames()
                if frames is None or frames[0] >= BUSY_FACTOR * self.pages:
                    return
                self._cond.wait(wait)

    def _pass(self) -> None:
        assert self._conn is not None
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()


__all__ = ["BUSY_FACTOR", "FALLBACK_FACTOR", "QUIET_S", "Checkpointer", "WalIndex", "wal_frames"]
