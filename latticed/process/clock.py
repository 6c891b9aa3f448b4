"""The one wall clock: Unix time in whole milliseconds.

Everything that stamps records, KV ops, announcements or commits reads time through a ``Clock`` passed in
(this function by default), never ``time.time()`` directly, so tests can drive time and the pure core
(`latticed/crdt/`) stays free of clock reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: A source of Unix time in milliseconds.
Clock = Callable[[], int]


def wall_ms() -> int:
    """Unix time in whole milliseconds (compared across hosts, so a wall clock, not a monotonic one)."""
    return time.time_ns() // 1_000_000


__all__ = ["Clock", "wall_ms"]
