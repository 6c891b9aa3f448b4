"""A few megabytes of disk held back in the data directory, so that freeing space works on a full disk.

Deleting records is itself a write: SQLite logs the changed pages to the WAL before the file shrinks, so on
a disk with no byte left a truncation fails like any other write, and the operator has no way to follow
the advice "keep fewer records" from inside latticed. Databases keep a reserve for this; so do we: the
file ``latticed.reserve`` is written out (real blocks, not a sparse file) when the store opens. When a
batch that frees space (a truncation, a retention change, a replica's local drop) fails because the disk
is full, the storage thread deletes the file, commits that batch alone, gives the freed pages back to the
file system, and writes the reserve again once there is room. Ordinary writes never use it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from latticed.process.logs import get_logger, log_event

log = get_logger(__name__)

RESERVE_NAME: Final = "latticed.reserve"
#: Enough for the WAL frames of a truncation of any size (the freed pages themselves are not logged, only
#: the b-tree and free-list pages that change) and for steps of giving pages back in between.
RESERVE_BYTES: Final = 4 << 20
_CHUNK: Final = 1 << 20


def reserve_path(data_dir: Path) -> Path:
    return data_dir / RESERVE_NAME


class Reserve:
    """The reserve file of one store; used only from the storage thread."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size

    @property
    def held(self) -> int:
        """Bytes the reserve holds now (0: released, or never written)."""
        try:
            return min(self.path.stat().st_size, self.size)
        except OSError:
            return 0

    def ensure(self) -> bool:
        """Write the reserve out to its full size if it is not; True if it holds it. A disk too full to
        hold it leaves no partial file behind (that space is better used by the store meanwhile)."""
        if self.size <= 0 or self.held >= self.size:
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log_event(log, "storage.reserve_failed", level=30, path=str(self.path), error=str(exc))
            return False
        try:
            chunk = memoryview(bytes(_CHUNK))
            written = 0
            while written < self.size:
                written += os.pwrite(fd, chunk[: self.size - written], written)
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)
            with contextlib.suppress(OSError):
                self.path.unlink()
            log_event(log, "storage.reserve_failed", level=30, path=str(self.path), error=str(exc))
            return False
        os.close(fd)
        return True

    def release(self) -> int:
        """Delete the reserve (its blocks go back to the file system at once); returns the bytes freed."""
        held = self.held
        try:
            self.path.unlink()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log_event(log, "storage.reserve_release_failed", level=40, path=str(self.path), error=str(exc))
            return 0
        log_event(log, "storage.reserve_released", level=30, path=str(self.path), bytes=held)
        return held


__all__ = ["RESERVE_BYTES", "RESERVE_NAME", "Reserve", "reserve_path"]
