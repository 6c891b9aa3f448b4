"""A stopped daemon's store, read only, checked as the daemon checks it at load: which core-2 queues are
not what their owners signed (:mod:`latticed.storage.corruption`). ``latticectl doctor`` runs this when
the daemon does not answer, so a store found corrupt at the last start (``store.queue_corrupt``) is named
before the daemon starts again, by the same code the daemon loads queues with.

The file is opened with SQLite's ``mode=ro`` and ``query_only``: nothing is written, no write lock is
taken, so it is safe beside a daemon too (one that does not answer its socket). It reads in one read
transaction, a single snapshot: read in separate ones, a commit landing between a queue's reads (its head
in one, its records in the next) would make a good queue look corrupt, and doctor would advise dropping
it; in WAL mode the daemon's commits go on meanwhile (only its checkpoints wait for the read).

Nor is a file created beside it (SQLite would create ``-wal`` and ``-shm``, and after ``sudo latticectl
doctor`` they would be root's, which the daemon's user then cannot open): a store closed cleanly has no
``-wal`` and is opened ``immutable``, its time, size and ``-wal`` compared after the read (a daemon that
started on it meanwhile: not checked); with a ``-wal`` the daemon's own ``-shm`` is used, and without
one nothing is read."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latticed.errors import NotFoundError, StorageError
from latticed.storage import core2_store
from latticed.storage.corruption import CorruptQueueError, corrupt_entry
from latticed.storage.entries import SqlRows
from latticed.storage.schema import MIGRATIONS, user_version
from latticed.storage.sqlite import storage_error
from latticed.storage.store import db_path

__all__ = ["StoreFindings", "check_store"]


class _ReadOnlyFile:
    """The store file as :func:`core2_store.load` reads it (a :class:`~latticed.storage.corruption.
    StoreFile`), opened read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        wal, shm = (path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))
        #: Opened without locks: a writer starting meanwhile is found by the file's stamp after the read.
        self.immutable = not wal.exists()
        if self.immutable:  # closed cleanly: nothing beside it to read, and no -wal/-shm to create
            mode = "ro&immutable=1"
        elif shm.exists():  # a daemon's (running, or stopped uncleanly): read through its files, as they are
            mode = "ro"
        else:  # reading would create the -shm file, which a daemon of another user could then not open
            raise NotFoundError(
                f"{path}'s write-ahead log is not checkpointed and has no -shm file (the daemon stopped "
                "uncleanly?): not read here, to create nothing beside it; start the daemon and run doctor"
            )
        try:
            self._conn = sqlite3.connect(
                f"{path.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None
            )
            self._conn.execute("PRAGMA query_only = 1")
            self.has_cores = any(row[1] == "core" for row in self._conn.execute("PRAGMA table_info(queues)"))
        except sqlite3.Error as exc:
            raise storage_error(exc, "open the store", path) from exc
        self.rows = SqlRows(self._conn)

    @property
    def connection(self) -> sqlite3.Connection:
        return self._conn

    def error(self, exc: BaseException, what: str) -> StorageError:
        return storage_error(exc, what, self.path)

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True, slots=True)
class StoreFindings:
    """What :func:`check_store` found: the store's path and schema, how many core-2 queues it read, and
    each one found corrupt (``{"queue", "error", "owned"}``, as the daemon's ``doctor`` lists them)."""

    path: Path
    schema: int
    checked: int = 0
    corrupt: list[dict[str, Any]] = field(default_factory=list)

    @property
    def current(self) -> bool:
        """Whether the store is of this release's schema (an older one is migrated, then checked, at the
        daemon's next start: its queues are not read here)."""
        return self.schema == len(MIGRATIONS)

    @property
    def newer(self) -> bool:
        """Whether a newer release wrote the store (this release's daemon refuses it: not checked here)."""
        return self.schema > len(MIGRATIONS)


def check_store(data_dir: Path, own: bytes | None = None) -> StoreFindings:
    """Read every core-2 queue of the store in ``data_dir`` as the daemon loads it; ``own``: this daemon's
    public key (whose queues are marked ``owned``). NotFoundError if there is no store, StorageError if it
    cannot be read."""
    path = db_path(data_dir)
    if not path.is_file():
        raise NotFoundError(f"no store at {path} (the daemon has not run with this data directory)")
    before = _stamp(path)
    store = _ReadOnlyFile(path)
    try:
        try:  # one read transaction: one snapshot, whatever a daemon beside commits meanwhile
            store.connection.execute("BEGIN")
            schema = user_version(store.connection)
        except sqlite3.Error as exc:
            raise store.error(exc, "read the schema version of") from exc
        if schema != len(MIGRATIONS):
            return StoreFindings(path, schema)
        rows = core2_store.index(store)
        corrupt = []
        for row in rows:
            try:
                core2_store.load(store, row)
            except CorruptQueueError as exc:
                corrupt.append(corrupt_entry(f"{row.owner.hex()}/{row.name}", str(exc), own))
        if store.immutable and _stamp(path) != before:  # a daemon started on it: what was read may be torn
            raise NotFoundError(
                f"{path} changed while it was read (a daemon started on it?): not checked; run doctor again"
            )
        return StoreFindings(path, schema, len(rows), corrupt)
    finally:
        store.close()


def _stamp(path: Path) -> tuple[int, int, bool]:
    """What a writer's start or checkpoint changes: the file's time and size, and whether it has a WAL."""
    found = path.stat()
    return found.st_mtime_ns, found.st_size, path.with_name(path.name + "-wal").exists()
