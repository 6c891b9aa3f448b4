"""A loopback TCP relay in front of a daemon whose answers a test lets through by the byte: what the target
sends back passes only within an allowance the test sets, so a catch-up can be held at a point the test
chooses (after the peer said what it holds, before its records) instead of raced by polling."""

from __future__ import annotations

import contextlib
import socket
import threading

from loopback_relay import LoopbackRelay, copy


class HeldRelay(LoopbackRelay):
    """Accepts on ``127.0.0.1:port`` and relays each connection to ``127.0.0.1:target_port``. The dialler's
    bytes pass freely; the target's pass while :attr:`allowance` (bytes in all, over every connection) is
    None or not yet reached. Bytes not let through stay in the kernel's buffers (the sender sees a slow
    reader), so nothing is dropped and nothing is reordered."""

    def __init__(self, target_port: int) -> None:
        self._cond = threading.Condition()
        self.allowance: int | None = None
        #: Bytes passed back from the target, over every connection.
        self.passed = 0
        self._closed = False
        super().__init__(target_port)

    def hold(self) -> None:
        """Let nothing more through from the target until :meth:`allow` or :meth:`release`."""
        with self._cond:
            self.allowance = self.passed

    def allow(self, more: int) -> None:
        """Let ``more`` bytes through from the target, then hold again."""
        with self._cond:
            self.allowance = (self.passed if self.allowance is None else self.allowance) + more
            self._cond.notify_all()

    def release(self) -> None:
        """Let everything through from now on."""
        with self._cond:
            self.allowance = None
            self._cond.notify_all()

    def spent(self) -> bool:
        """What was allowed has passed (never, while everything may)."""
        with self._cond:
            return self.allowance is not None and self.passed >= self.allowance

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._listener.close()

    def _relay(self, dialler: socket.socket, target: socket.socket) -> None:
        done = threading.Event()
        threading.Thread(target=self._forward, args=(dialler, target, done), daemon=True).start()
        threading.Thread(target=self._back, args=(target, dialler, done), daemon=True).start()

    def _forward(self, source: socket.socket, sink: socket.socket, done: threading.Event) -> None:
        copy(source, sink)
        self._end(source, sink, done)

    def _back(self, source: socket.socket, sink: socket.socket, done: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._room() > 0 or done.is_set() or self._closed)
                    room = self._room()
                    if done.is_set() or self._closed:
                        break
                chunk = source.recv(min(room, 65536))
                if not chunk:
                    break
                if not self._pass(chunk, sink, done):
                    break
        self._end(source, sink, done)

    def _pass(self, chunk: bytes, sink: socket.socket, done: threading.Event) -> bool:
        """Send ``chunk`` as the allowance lets it: a :meth:`hold` while the read waited holds what it
        read (else a hold would let up to 64 KiB through after it). False: the relay or link ended."""
        while chunk:
            with self._cond:
                self._cond.wait_for(lambda: self._room() > 0 or done.is_set() or self._closed)
                if done.is_set() or self._closed:
                    return False
                part, chunk = chunk[: self._room()], chunk[self._room() :]
            sink.sendall(part)
            with self._cond:
                self.passed += len(part)
                self._cond.notify_all()
        return True

    def _room(self) -> int:
        return 65536 if self.allowance is None else self.allowance - self.passed

    def _end(self, one: socket.socket, other: socket.socket, done: threading.Event) -> None:
        with self._cond:
            done.set()
            self._cond.notify_all()
        for sock in (one, other):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
