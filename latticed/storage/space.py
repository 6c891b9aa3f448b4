"""Giving disk space back: the reserve for full disks, WAL checkpoints after deletions, and compaction.

Deleted records free pages inside ``latticed.db``; with ``auto_vacuum=INCREMENTAL`` (every store made
since it was introduced) the storage thread moves them to the end of the file and cuts it off, but in WAL
mode the cut reaches the file only at a checkpoint, and the WAL itself keeps the size it grew to. So after
pages were given back the storage thread checkpoints, and cuts a WAL that outgrew its working size back.
``latticectl store compact`` does all of it at once, and converts a store made without incremental
auto-vacuum with one ``VACUUM`` (which needs free space about the size of the store, once).

On a full disk every step here is itself a write: :class:`SpaceKeeper` then works in small steps, each
followed by a checkpoint that truncates the WAL, inside the room the reserve (:mod:`.reserve`) gave.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Any, Final

from latticed.errors import StorageError
from latticed.process.logs import get_logger, log_event
from latticed.storage.batch import Batch
from latticed.storage.checkpointer import Checkpointer
from latticed.storage.jobs import Job, WriterView
from latticed.storage.reserve import RESERVE_BYTES, Reserve, reserve_path
from latticed.storage.sqlite import (
    BUSY_TIMEOUT_MS,
    WAL_AUTOCHECKPOINT_PAGES,
    is_full,
    preallocate_wal,
    wal_path,
    wal_working_bytes,
)
from latticed.storage.store import Store

log = get_logger(__name__)

#: How long a checkpoint made to give space back waits for readers still on an older snapshot (ms): it runs
#: on the storage thread, and a checkpoint that could not finish is simply tried again later.
CHECKPOINT_BUSY_MS: Final = 200
#: Free pages given back per ``incremental_vacuum``. It must stay well under what the writer's page cache
#: holds (8 MiB: 2048 pages): a step that dirties more spills every freed page into the WAL, so giving 1 GiB
#: back wrote ~1 GiB of WAL (on a full disk: failed). Under it, a freed page beyond the new end of the file
#: is never written, and the WAL grows by the pages moved and the pointer-map pages only.
VACUUM_STEP_PAGES: Final = 512
#: SQLite's auto_vacuum modes.
_INCREMENTAL: Final = 2


def store_bytes(path: Path) -> int:
    """The store's files on disk: the database, its WAL and the WAL index."""
    total = 0
    for name in (path, wal_path(path), Path(f"{path}-shm")):
        with contextlib.suppress(OSError):
            total += os.stat(name).st_size
    return total


def checkpoint(store: Store, *, truncate: bool) -> bool:
    """Copy the WAL into the database (which cuts the file to the pages in use) and, with ``truncate``,
    cut the WAL to zero; True if every frame was copied. Waits at most :data:`CHECKPOINT_BUSY_MS` for
    readers."""
    conn = store.connection
    conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_MS}")
    try:
        mode = "TRUNCATE" if truncate else "PASSIVE"
        busy, frames, copied = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return not busy and frames == copied


class SpaceKeeper:
    """The reserve of one store and the steps that give space back; storage thread only."""

    def __init__(self, db: Path, reserve_bytes: int = RESERVE_BYTES) -> None:
        self.db = db
        self.reserve = Reserve(reserve_path(db.parent), reserve_bytes)
        #: The reserve is to be written (again) once there is room: it was used, or could not be written.
        self.wanted = False
        #: It was used to commit a batch that makes room and is not back yet: until it is, only such
        #: batches run (a reserve that could not be written at start only costs that guarantee).
        self.used = False
        #: The store's checkpoint thread, if it has one: paused while this owns checkpoints.
        self.checkpointer: Checkpointer | None = None

    def owning_checkpoints(self) -> contextlib.AbstractContextManager[None]:
        """Around this module's own checkpoints: no pass of the checkpoint thread runs meanwhile (a
        TRUNCATE checkpoint needs the WAL to itself)."""
        if self.checkpointer is None:
            return contextlib.nullcontext()
        return self.checkpointer.paused()

    def open(self) -> None:
        """Before the store opens (and preallocates its WAL): the reserve comes first."""
        self.wanted = not self.reserve.ensure()

    def restore(self, store: Store) -> bool:
        """Write the reserve again if it is wanted and the disk has room for it; True if it is held."""
        if not self.wanted:
            return True
        try:
            st = os.statvfs(self.db.parent)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize < self.reserve.size:
            return False
        self.wanted = not self.reserve.ensure()
        if not self.wanted:
            if self.used and self.checkpointer is not None:
                self.checkpointer.resume()
            elif self.used:
                store.connection.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            self.used = False
            log_event(log, "storage.reserve_restored", path=str(self.reserve.path))
        return not self.wanted

    def release(self, store: Store) -> int:
        """Free the reserve for a batch that makes room; it is written again after (:meth:`restore`).

        Until then SQLite's automatic checkpoints (or the checkpoint thread) are off: one copies the WAL
        into a database file that must grow for it, and on a full disk that growth would take the room
        just freed (the checkpoints that give space back run only after a deletion, when the file shrank)."""
        freed = self.reserve.release()
        if freed:
            if self.checkpointer is not None and not self.used:
                self.checkpointer.pause()
            self.wanted = self.used = True
            store.connection.execute("PRAGMA wal_autocheckpoint = 0")
        return freed

    def give_back(self, store: Store) -> int:
        """Every free page back to the file system, then a checkpoint that cuts the database file and the
        WAL; returns the free pages left (a store without incremental auto-vacuum keeps them all until
        ``store compact``). In steps of :data:`VACUUM_STEP_PAGES`, which keeps the WAL it writes small."""
        conn = store.connection
        left = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        while left > 0:
            now = store.reclaim(VACUUM_STEP_PAGES)
            if now >= left:
                break
            left = now
        with self.owning_checkpoints():
            checkpoint(store, truncate=True)
        return left

    def settle(self, store: Store) -> None:
        """After pages were given back: checkpoint so the database file shrinks, and cut a WAL that grew
        past its working size (readers held checkpoints off) back to that size."""
        try:
            with self.owning_checkpoints():
                done = checkpoint(store, truncate=False)
                wal = wal_path(self.db)
                size = wal.stat().st_size if wal.exists() else 0
                if done and size > wal_working_bytes(store.connection):
                    self.reset_wal(store)
        except (OSError, sqlite3.Error) as exc:
            log_event(log, "storage.checkpoint_failed", level=30, error=str(exc))

    def reset_wal(self, store: Store) -> None:
        """Cut the WAL to zero and, if the disk has ample room, write it out to its working size again
        (:func:`~latticed.storage.sqlite.preallocate_wal`); a nearly full disk keeps the room instead."""
        with self.owning_checkpoints():
            self._reset_wal(store)

    def _reset_wal(self, store: Store) -> None:
        if not checkpoint(store, truncate=True):
            return
        target = wal_working_bytes(store.connection)
        try:
            st = os.statvfs(self.db.parent)
            if st.f_bavail * st.f_frsize >= 4 * target + self.reserve.size:
                preallocate_wal(store.connection, self.db)
        except OSError as exc:
            log_event(log, "store.wal_preallocation_failed", level=30, error=str(exc))

    def compact(self, store: Store) -> dict[str, Any]:
        """Give back every free page (a store without incremental auto-vacuum: ``VACUUM`` once, which
        also converts it), cut the WAL, write the reserve again; returns the sizes before and after."""
        before = store_bytes(self.db)
        conn = store.connection
        vacuumed = False
        try:
            if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) == _INCREMENTAL:
                self._give_back_or_release(store)
            else:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("VACUUM")
                vacuumed = True
            self.reset_wal(store)
        finally:
            self.restore(store)
        after = store_bytes(self.db)
        free_pages = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        log_event(log, "store.compacted", before_bytes=before, after_bytes=after, vacuumed=vacuumed)
        return {
            "before_bytes": before,
            "after_bytes": after,
            "freed_bytes": max(before - after, 0),
            "free_pages": free_pages,
            "vacuumed": vacuumed,
        }

    def _give_back_or_release(self, store: Store) -> None:
        try:
            self.give_back(store)
        except sqlite3.Error as exc:
            if not is_full(exc) or self.release(store) == 0:
                raise
            self.give_back(store)


class CompactStore(Job):
    """``store compact`` on the storage thread, between batches (no transaction is open when a job
    applies); ``result`` is :meth:`SpaceKeeper.compact`'s answer. It may use the reserve."""

    __slots__ = ("keeper",)
    frees_space = True

    def __init__(self, keeper: SpaceKeeper) -> None:
        super().__init__()
        self.keeper = keeper

    def apply(self, batch: Batch, writer: WriterView) -> None:
        try:
            self.result = self.keeper.compact(writer.store)
        except sqlite3.Error as exc:
            error = writer.store.error(exc, "compact")
            if "VACUUM" in str(exc) or is_full(exc):
                error = StorageError(f"{error} (compacting needs free space about the size of the store)")
            raise error from exc


__all__ = [
    "CHECKPOINT_BUSY_MS",
    "VACUUM_STEP_PAGES",
    "CompactStore",
    "SpaceKeeper",
    "checkpoint",
    "store_bytes",
]
