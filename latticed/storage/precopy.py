"""The copy of the store kept before it is migrated: ``latticed.db.pre-N`` (N: the schema it had).

Why a copy as well as transactional steps: each step commits on its own, so a crash mid-way is safe, but
once a step has committed no older release can open the file again. The copy is what an operator rolls
back to (docs/operations.md, "Rolling back"). It is written under a temporary name, flushed, then renamed:
a crash while copying leaves the store untouched and no half copy under the real name.

The copy is SQLite's online backup of the open writer connection, so it is consistent even with a WAL
that has not been folded back into the file yet.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Final

from latticed.errors import StorageError
from latticed.process.logs import get_logger, log_event
from latticed.storage.sqlite import storage_error

log = get_logger(__name__)

#: For tests only: the name of a point (``copy``, or the schema version a migration step goes to) where the
#: upgrade stops, logs ``store.migration_paused`` and waits to be killed. How the integration tests land a
#: ``kill -9`` inside an upgrade without timing guesses. Never set it otherwise: the daemon hangs there.
PAUSE_ENV: Final = "LATTICED_TEST_PAUSE_MIGRATION"


def pause_point(where: str, path: Path) -> None:
    """Stop here for good when :data:`PAUSE_ENV` names ``where`` (tests kill the process meanwhile)."""
    if os.environ.get(PAUSE_ENV) != where:
        return
    log_event(log, "store.migration_paused", path=str(path), at=where)
    threading.Event().wait()


def copy_path(path: Path, schema: int) -> Path:
    """Where the copy of the store at ``path`` is kept before it is migrated from schema ``schema``."""
    return path.with_name(f"{path.name}.pre-{schema}")


def keep_copy(conn: sqlite3.Connection, path: Path, schema: int) -> Path:
    """Copy the store open on ``conn`` (the writer, outside a transaction) to :func:`copy_path`,
    replacing an older copy of the same schema; returns the copy's path. Fails (and the caller does not
    migrate) when the copy cannot be written in full: a full disk leaves no partial file behind."""
    target = copy_path(path, schema)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        dest = sqlite3.connect(str(partial), isolation_level=None)
        try:
            conn.backup(dest)
        finally:
            dest.close()
        _flush(partial)
        pause_point("copy", path)
        os.replace(partial, target)
        _flush_dir(target.parent)
    except (OSError, sqlite3.Error) as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        error = storage_error(exc, f"keep a copy ({target.name}) before migrating", path)
        raise StorageError(f"{error}; nothing was migrated") from exc
    return target


def _flush(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush_dir(directory: Path) -> None:
    """Make the rename durable (a directory's entry is data of the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["PAUSE_ENV", "copy_path", "keep_copy", "pause_point"]
