"""One daemon per data directory: an exclusive ``flock`` on ``data_dir/latticed.lock``.

SQLite alone would let two daemons open the same file, and each would then sign heads from its own
in-memory state: the owner would equivocate. The kernel drops the lock when the process dies, so a
crashed daemon never blocks a restart.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from latticed.errors import AlreadyExistsError, StorageError

LOCK_NAME = "latticed.lock"


class DataDirLock:
    """Context manager holding the data directory's lock."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StorageError(f"cannot open the lock file {self.path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyExistsError(
                f"another latticed is using the data directory {self.path.parent}; stop it first"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StorageError(f"cannot lock {self.path}: {exc.strerror or exc}") from exc
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


__all__ = ["LOCK_NAME", "DataDirLock"]
