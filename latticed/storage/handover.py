"""Calls from the storage thread to the event loop, in order, each woken without the thread giving up
the interpreter.

``TrioToken.run_sync_soon`` wakes the loop with a ``send`` on trio's wake-up socket, and CPython releases
the GIL around it: the woken loop takes the interpreter during the ``send``, and the storage thread then
waits for it back mid-cycle, before its ``COMMIT`` (the pre-COMMIT hand-over) or before it goes back to
waiting for jobs (py-spy, issue 28, singles24: two thirds of that call's ~80 µs a cycle was this wait).
Here the storage thread queues the call and writes one byte to a socket of our own through a libc
``write`` called with the GIL held (``ctypes.PyDLL``), so it runs on until it blocks (in SQLite's
``COMMIT``, or waiting for jobs), and the woken loop gets the interpreter then, once.

A wake-up is never lost: every call is queued before its byte is written, and the loop's pump reads the
bytes before it takes the calls, so a call queued after that read has a byte of its own still unread. A
write that finds the socket's buffer full (``EAGAIN``) has bytes unread ahead of it: the loop will run.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import socket
import threading
from collections.abc import Callable
from typing import Final

import trio

from latticed.errors import LatticedError
from latticed.process.logs import get_logger, log_event

log = get_logger(__name__)

#: One wake-up byte.
_BYTE: Final = b"\0"


def _held_write() -> Callable[[int], int]:
    """``write(fd, b"\\0", 1)`` for a non-blocking fd, keeping the GIL (``ctypes.PyDLL``); an
    ``os.write`` (which releases it) where libc's ``write`` cannot be had. Returns the bytes written
    (0: the buffer is full); raises OSError otherwise."""
    try:
        write = ctypes.PyDLL(None, use_errno=True).write
    except (OSError, AttributeError):  # pragma: no cover - every POSIX libc has write
        write = None
    if write is None:  # pragma: no cover

        def released(fd: int) -> int:
            try:
                return os.write(fd, _BYTE)
            except BlockingIOError:
                return 0

        return released
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t

    def held(fd: int) -> int:
        while True:
            written = int(write(fd, _BYTE, 1))
            if written >= 0:
                return written
            code = ctypes.get_errno()
            if code in (errno.EAGAIN, errno.EWOULDBLOCK):
                return 0  # bytes unread ahead of ours: the loop wakes for them
            if code != errno.EINTR:
                raise OSError(code, os.strerror(code))

    return held


#: Writes one wake-up byte to a non-blocking fd without releasing the GIL.
write_byte: Final = _held_write()


class HandoverClosed(LatticedError):
    """The hand-over was closed (the storage stopped, or the event loop ended): nothing runs any more."""


class LoopHandover:
    """A FIFO of calls posted from any thread and run on the trio loop by :meth:`pump`.

    Create it on the trio thread inside a run: it starts its pump as a system task (it runs the calls
    left when the run ends, as trio's own entry queue does). Calls must not raise: one that does is
    logged and the others still run."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._fd = self._write.fileno()
        self._calls: collections.deque[tuple[Callable[..., object], tuple[object, ...]]] = collections.deque()
        #: Held around each wake-up write and the close: a byte never goes to a closed (reused) fd.
        self._lock = threading.Lock()
        self._closed = False
        #: Wake-up bytes written, and pump turns that ran calls (statistics, tests).
        self.wakeups = 0
        self.turns = 0
        trio.lowlevel.spawn_system_task(self.pump, name="latticed-storage-handover")

    @property
    def closed(self) -> bool:
        return self._closed

    def post(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the loop after every call posted before it (any thread; never blocks).
        :class:`HandoverClosed` once closed."""
        with self._lock:
            if self._closed:
                raise HandoverClosed("the event loop no longer takes the storage thread's calls")
            self._calls.append((fn, args))
            write_byte(self._fd)
            self.wakeups += 1

    def wait_run(self, timeout: float) -> bool:
        """Block (on a thread other than the loop's) until every call posted before this one has run;
        False if that took longer than ``timeout`` seconds. A test seam: a fake fsync's time."""
        ran = threading.Event()
        self.post(ran.set)
        return ran.wait(timeout)

    async def pump(self) -> None:
        """Run the posted calls as their bytes arrive; on leaving (cancelled at the run's end, or
        :meth:`close`), close and run what is left."""
        try:
            while True:
                try:
                    await trio.lowlevel.wait_readable(self._read)
                except trio.ClosedResourceError:
                    return
                # The bytes first, then the calls: a call posted after this read has its byte unread.
                self._drain()
                self._run()
        finally:
            self.close()

    def _drain(self) -> None:
        try:
            while self._read.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _run(self) -> None:
        calls = self._calls
        if calls:
            self.turns += 1
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception as exc:  # a call's bug must not end the pump: later calls wake waiters
                log_event(log, "storage.handover_failed", level=50, exc_info=exc, call=repr(fn))

    def close(self) -> None:
        """Refuse further calls, run those posted, release the sockets (on the trio thread, or after the
        run). The pump, if it waits, ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._run()
        try:
            trio.lowlevel.notify_closing(self._read)
        except RuntimeError:  # outside the run: nobody waits on it
            pass
        self._read.close()
        self._write.close()


__all__ = ["HandoverClosed", "LoopHandover", "write_byte"]
