"""How much room the data directory's file system has left, and when that is too little.

Low means less than :data:`LOW_DISK_FRACTION` of the file system, or less than :data:`LOW_DISK_BYTES`, is
free for the daemon's user (``statvfs``'s ``f_bavail``: root's reserve does not count). It is back once
free space is :data:`RECOVER_FACTOR` times over both thresholds, so a disk hovering at the threshold does
not flap. No trio here: ``latticectl doctor`` uses it without a daemon.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["LOW_DISK_BYTES", "LOW_DISK_FRACTION", "RECOVER_FACTOR", "DiskUsage", "disk_is_low", "disk_usage"]

LOW_DISK_FRACTION: Final = 0.05
LOW_DISK_BYTES: Final = 1 << 30
RECOVER_FACTOR: Final = 1.1


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """Free and total bytes of the file system holding ``path``."""

    path: str
    free: int
    total: int

    @property
    def free_fraction(self) -> float:
        return self.free / self.total if self.total > 0 else 0.0


def disk_usage(path: Path) -> DiskUsage:
    """What ``statvfs`` says of ``path``'s file system (free: what an unprivileged user may still use)."""
    st = os.statvfs(path)
    return DiskUsage(str(path), st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def disk_is_low(free: int, total: int, *, was_low: bool = False) -> bool:
    """Under 5 % or under 1 GiB free; once low, low until both are exceeded by :data:`RECOVER_FACTOR`."""
    factor = RECOVER_FACTOR if was_low else 1.0
    return free < LOW_DISK_BYTES * factor or free < total * LOW_DISK_FRACTION * factor
