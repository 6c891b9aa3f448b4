"""Keep large freed buffers in the heap for reuse (glibc), instead of handing them back to the kernel.

A bulk read's reply is a few MB, built from a few large buffers (the joined values, msgpack's output, the
framed copy), and replication and batch offers move large frames too. By default glibc serves such
allocations with fresh ``mmap``s or trims the heap top as soon as they are freed, so every request touches
new pages: ~1,650 minor page faults per 20k-record read here, ~82k per million records read, ~20% of the
daemon's CPU on a VM (where each fault costs a few microseconds). Fixed thresholds keep up to
:data:`TRIM_THRESHOLD` of freed memory in the heap and serve buffers up to :data:`MMAP_THRESHOLD` from it:
the same read then faults no pages at all, and the daemon spends ~15-20% less CPU on it. The price is that
much resident memory after a burst.

Freed memory in the *middle* of the heap is kept as well, and a burst of large requests (many connections
each buffering a frame of several MB, say) can leave hundreds of MB behind that way, long after the
requests are gone. :func:`give_back_after_spike` hands it back (``malloc_trim``, which keeps
:data:`TRIM_THRESHOLD` at the top for reuse) when more than :data:`SPIKE_BYTES` beyond that lies free;
the API server calls it shortly after large requests (``latticed/api/server/api_server.py``), so steady bulk
traffic, which stays under that, keeps its warm pages. Many smaller requests (a burst of errors, say) leave
free memory behind too, without any one of them being large: once the API has gone quiet after such a
burst, :func:`give_back_when_idle` hands back whatever lies free beyond :data:`TRIM_THRESHOLD` (nothing
is reusing it then, and the next request still finds that much warm).

Python's own allocator (pymalloc) serves objects up to 512 bytes from 1 MiB arenas and returns an arena
to the system only once every object in it is freed: a burst that decodes requests into millions of tiny
objects can leave arenas held by a few survivors each. That memory is reused by later requests; no call
here can release it, which is why the API refuses what cannot be a request before decoding it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import Final

#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3

#: Buffers up to this size come from the heap (a frame is at most 16 MiB by default).
MMAP_THRESHOLD: Final = 16 << 20
#: Freed memory at the top of the heap is kept up to this size.
TRIM_THRESHOLD: Final = 16 << 20
#: Free heap memory beyond :data:`TRIM_THRESHOLD` that :func:`give_back_after_spike` hands back.
SPIKE_BYTES: Final = 64 << 20


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+): every field a ``size_t``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)  # a CDLL call releases the GIL
    except OSError:
        return None


def keep_large_buffers() -> bool:
    """Apply the thresholds to this process; False where the C library is not glibc (nothing changes)."""
    libc = _libc()
    try:
        mallopt = libc.mallopt if libc is not None else None
    except AttributeError:  # not glibc (musl has no mallopt)
        return False
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def free_heap_bytes() -> int | None:
    """Bytes the C heap holds free (all arenas, fastbins included); None where that is unknown."""
    libc = _libc()
    try:
        mallinfo2 = libc.mallinfo2 if libc is not None else None
    except AttributeError:  # glibc before 2.33, or not glibc
        return None
    if mallinfo2 is None:
        return None
    mallinfo2.argtypes = ()
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.fordblks) + int(info.fsmblks)


def release_free_memory(keep: int = TRIM_THRESHOLD) -> bool:
    """Hand free heap pages back to the kernel, keeping ``keep`` bytes at the top of the heap; False where
    the C library cannot (not glibc) or nothing was released."""
    libc = _libc()
    try:
        malloc_trim = libc.malloc_trim if libc is not None else None
    except AttributeError:
        return False
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(keep))


def give_back_after_spike(
    *,
    keep: int = TRIM_THRESHOLD,
    spike: int = SPIKE_BYTES,
    free_bytes: Callable[[], int | None] = free_heap_bytes,
    release: Callable[[int], bool] = release_free_memory,
) -> bool:
    """Release free heap memory if more than ``keep + spike`` bytes of it lie idle (what a burst of large
    requests leaves behind), else keep it warm for reuse; True if memory was given back."""
    free = free_bytes()
    if free is None or free <= keep + spike:
        return False
    return release(keep)


def give_back_when_idle(
    *,
    keep: int = TRIM_THRESHOLD,
    free_bytes: Callable[[], int | None] = free_heap_bytes,
    release: Callable[[int], bool] = release_free_memory,
) -> bool:
    """Release free heap memory beyond ``keep`` bytes (for when requests have stopped coming: nothing is
    reusing it then); True if memory was given back."""
    free = free_bytes()
    if free is None or free <= keep:
        return False
    return release(keep)
