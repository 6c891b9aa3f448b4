"""Opening SQLite connections with our pragmas, and turning SQLite failures into clear StorageErrors.

Why these settings:

* WAL lets readers run beside the single writer, so tails and reads never wait behind a group commit.
* ``synchronous=FULL`` fsyncs the WAL at every commit: a write acknowledged to a client is on disk.
* Connections run in autocommit mode (``isolation_level=None``); the writer opens its own
  ``BEGIN IMMEDIATE`` transactions, one per group commit.
* Page caches are small and ``mmap`` is off: the daemon's memory must not grow with the store.
* ``secure_delete=FAST``: some builds (Debian's) zero every freed page, so a deletion wrote the deleted
  bytes again into the WAL: a truncation needed as much free disk as it was to free, and grew the WAL by
  as much. FAST zeroes deleted cells where that costs no extra I/O; freed pages then leave the file at
  the next incremental vacuum (:mod:`latticed.storage.space`).
* The WAL file is given its working size up front (:func:`preallocate_wal`), so commits overwrite it
  in place instead of growing it.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Final

from latticed.errors import StorageError

DB_NAME: Final = "latticed.db"
#: Pages of WAL before the writer folds it back into the database (4 KiB pages: 16 MiB).
WAL_AUTOCHECKPOINT_PAGES: Final = 4096
#: After a checkpoint the WAL file is cut back to this size, so a burst does not keep its disk space.
JOURNAL_SIZE_LIMIT: Final = 64 << 20
#: A WAL file's own header, and each frame's header before its page (SQLite's file format).
WAL_HEADER_BYTES: Final = 32
WAL_FRAME_HEADER_BYTES: Final = 24
WRITER_CACHE_KIB: Final = 8192
READER_CACHE_KIB: Final = 2048
BUSY_TIMEOUT_MS: Final = 10_000

# Primary result codes (extended codes carry them in the low byte).
_SQLITE_READONLY: Final = 8
_SQLITE_IOERR: Final = 10
_SQLITE_CORRUPT: Final = 11
_SQLITE_FULL: Final = 13
_SQLITE_CANTOPEN: Final = 14
_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_NOTADB: Final = 26
_SQLITE_PERM: Final = 3
_SQLITE_AUTH: Final = 23


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the store's page quota) is full."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
        return True
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def storage_error(exc: BaseException, what: str, path: Path) -> StorageError:
    """A StorageError that says what failed, on which file, and what the operator can do about it."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if is_full(exc):
        why = "the disk (or the store's size limit) is full; free space, then retry"
    elif primary in (_SQLITE_READONLY, _SQLITE_PERM, _SQLITE_AUTH) or (
        isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    ):
        why = "the store is read-only: the data directory or its files cannot be written"
    elif primary == _SQLITE_CANTOPEN:
        why = "the file cannot be opened (missing, unwritable or read-only data directory?)"
    elif primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        why = "the file is corrupt or not a latticed store"
    elif primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        why = "the store is locked by another process"
    elif primary == _SQLITE_IOERR:
        why = f"I/O error ({exc})"
    else:
        why = str(exc)
    return StorageError(f"cannot {what} {path}: {why}")


def connect(path: Path, *, writer: bool, cache_kib: int | None = None) -> sqlite3.Connection:
    """Open one connection; the writer sets the file-wide modes (WAL, auto_vacuum) on a new file."""
    try:
        conn = sqlite3.connect(
            str(path),
            isolation_level=None,
            check_same_thread=writer,
            cached_statements=64,
        )
    except sqlite3.Error as exc:
        raise storage_error(exc, "open the store", path) from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if writer:
            _writer_pragmas(conn, cache_kib or WRITER_CACHE_KIB)
        else:
            conn.execute(f"PRAGMA cache_size = -{cache_kib or READER_CACHE_KIB}")
            conn.execute("PRAGMA query_only = 1")
        conn.execute("PRAGMA mmap_size = 0")
        conn.execute("PRAGMA temp_store = MEMORY")
    except sqlite3.Error as exc:
        conn.close()
        raise storage_error(exc, "open the store", path) from exc
    return conn


def _writer_pragmas(conn: sqlite3.Connection, cache_kib: int) -> None:
    fresh = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0] == 0
    if fresh:
        # Only possible before the first table exists; lets truncation give disk space back.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise sqlite3.OperationalError(f"could not switch to WAL mode (got {mode!r})")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA secure_delete = FAST")
    conn.execute(f"PRAGMA cache_size = -{cache_kib}")
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")


#: ``fdatasync`` where the platform has it (not macOS), else ``fsync``.
_flush_data = getattr(os, "fdatasync", os.fsync)


def wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def preallocate_wal(conn: sqlite3.Connection, path: Path, pages: int = WAL_AUTOCHECKPOINT_PAGES) -> int:
    """Write the empty WAL file of the store at ``path`` out to the size ``pages`` frames take (what it
    reaches between automatic checkpoints); returns the bytes written, 0 when it leaves the file alone.

    Why: a commit that appends to the WAL grows the file, so its ``fdatasync`` must also push the new
    size through the filesystem's journal; a commit that overwrites needs only the data flush. On this
    kind of VM that is ~2-3x the cost per durable commit (bench/RESULTS.md, session 5). SQLite reuses its
    WAL from the start after each checkpoint, so a store that has run a while overwrites anyway, but it
    deletes the WAL at every clean close: without this every start, and every new store, pays the growing
    cost for its first ~16 MiB of commits. The bytes must really be written: ``fallocate`` or a sparse
    ``ftruncate`` leave extents that the first write converts, through the journal again.

    Safe because only an empty WAL is touched: a ``TRUNCATE`` checkpoint first moves every frame into the
    database (durably) and cuts the file to zero, and if it cannot (another connection still reads the
    WAL) nothing is written. Zeros are not a valid WAL header, so until SQLite writes its own, a crash
    leaves a WAL that recovery ignores. Run it on the writer connection, before anything else uses the
    store. A full or read-only disk leaves the file empty and raises ``OSError`` (the caller carries on).
    """
    busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    wal = wal_path(path)
    if busy or not wal.exists() or wal.stat().st_size != 0:
        return 0
    target = wal_working_bytes(conn, pages)
    fd = os.open(wal, os.O_WRONLY | os.O_CLOEXEC)
    try:
        chunk = memoryview(bytes(1 << 20))
        written = 0
        try:
            while written < target:
                written += os.pwrite(fd, chunk[: target - written], written)
            _flush_data(fd)
        except OSError:
            os.ftruncate(fd, 0)  # give the space back: the disk may be full
            raise
        return written
    finally:
        os.close(fd)


def wal_working_bytes(conn: sqlite3.Connection, pages: int = WAL_AUTOCHECKPOINT_PAGES) -> int:
    """The size the WAL reaches between automatic checkpoints (what :func:`preallocate_wal` writes)."""
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return WAL_HEADER_BYTES + pages * (WAL_FRAME_HEADER_BYTES + page_size)


__all__ = [
    "DB_NAME",
    "connect",
    "is_full",
    "preallocate_wal",
    "storage_error",
    "wal_path",
    "wal_working_bytes",
]
