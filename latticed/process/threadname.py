"""Names the OS sees for the daemon's threads.

Python (before 3.14) names threads for itself only: ``top -H``, ``/proc/PID/task/TID/comm`` and
``bench/bench_idle.py`` would show every thread under the process's name, or under whatever the thread
that started it was called when it did (a new thread inherits it). Naming the long-lived ones says which
thread wakes up or spends CPU.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Final

#: The kernel keeps at most this many bytes of a thread's name.
MAX_NAME_BYTES: Final = 15


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (cut to 15 bytes) where the OS shows it; nothing where that is not
    possible (not Linux, /proc not mounted): a name is for people, never worth an error."""
    data = name.encode("ascii", "replace")[:MAX_NAME_BYTES]
    with (
        contextlib.suppress(OSError),
        open(f"/proc/self/task/{threading.get_native_id()}/comm", "wb") as comm,
    ):
        comm.write(data)


__all__ = ["MAX_NAME_BYTES", "name_os_thread"]
