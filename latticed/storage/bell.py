"""A wake-up of the event loop that the storage thread rings without handing the loop the GIL.

Why it exists: the storage thread tells the loop a batch's jobs right before the batch's ``COMMIT``, so
that the loop builds their replies while the fsync runs (``Job.prepare``, singles22). Through trio's
``run_sync_soon`` that wake-up is a ``socket.send``, which releases the GIL for the syscall: the woken
loop thread could take the GIL first and run the replies *before* the ``COMMIT`` starts, while the
storage thread waited for the GIL back (wake26's trace: 4-89 % of batches by run, ~55-90 µs each). The
bell's write is a libc ``write`` called through ``ctypes.PyDLL``, which keeps the GIL: the woken loop
waits for it until the storage thread enters the ``COMMIT`` (``sqlite3`` releases the GIL around the
statement), and runs the replies during the fsync. An eventfd where there is one (Linux; one fd, a
write as cheap as a pipe's, ~4-5 µs against a socket's ~5-7 in a micro-benchmark), else a pipe. Where the
kernel puts the woken loop thread on the storage thread's core, it runs once the ``COMMIT`` sleeps in its
fsync (~130 µs into it), still well before the ``COMMIT`` returns (wake26's trace, with a pipe and with
an eventfd alike).

Where ``ctypes`` cannot reach libc's ``write`` it falls back to ``os.write`` (the GIL is then released
around the write, as trio's wake-up does): the order of things is the same, only the hand-off may come
earlier.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable

import trio

_Write = Callable[[int, bytes, int], object]


def _held_write() -> _Write | None:
    """libc's ``write`` called with the GIL held, or None where it cannot be found."""
    try:
        write = ctypes.PyDLL(None).write
    except (AttributeError, OSError):
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t
    return write


def _released_write(fd: int, data: bytes, size: int) -> object:
    with contextlib.suppress(OSError):  # a full pipe: a wake-up is pending already
        os.write(fd, data[:size])
    return None


_WRITE: _Write = _held_write() or _released_write


_ONE = (1).to_bytes(8, sys.byteorder)  # an eventfd's counter is written as a native 8-byte integer


class Bell:
    """An eventfd (or a pipe) the event loop waits on (:meth:`wait`) and any thread rings (:meth:`ring`)
    without giving up the GIL. Close it only once no thread can ring it any more: a closed fd's number
    may be reused by another file."""

    def __init__(self) -> None:
        eventfd = getattr(os, "eventfd", None)
        if eventfd is not None:
            self._read = self._write = eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._byte = _ONE
        else:
            self._read, self._write = os.pipe()
            os.set_blocking(self._read, False)
            os.set_blocking(self._write, False)
            self._byte = b"\x00"
        self._closed = False

    def ring(self) -> None:
        """Wake :meth:`wait` (any thread; never blocks: a full pipe already holds a wake-up)."""
        if not self._closed:
            _WRITE(self._write, self._byte, len(self._byte))  # -1 on a full pipe: ignored, as above

    async def wait(self) -> None:
        """Until rung since the last wait returned (on the event loop); trio.ClosedResourceError once
        :meth:`close` was called."""
        await trio.lowlevel.wait_readable(self._read)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        """Close it (once no thread rings any more): a waiting :meth:`wait` raises
        trio.ClosedResourceError."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):  # outside a trio run nothing can be waiting
            trio.lowlevel.notify_closing(self._read)
        os.close(self._read)
        if self._write != self._read:
            os.close(self._write)


__all__ = ["Bell"]
