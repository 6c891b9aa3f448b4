"""The part the integration tests' loopback TCP relays share: a listener on ``127.0.0.1`` whose every
connection is paired with one to the target, and the plain copy of one direction. Each relay adds only
its own rule for the bytes (:mod:`half_open_relay`: a cut that swallows them; :mod:`held_relay`: an
allowance), so the two cannot drift apart in how they accept and connect."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class LoopbackRelay:
    """Accepts on ``127.0.0.1:port`` and connects each dialler to ``127.0.0.1:target_port``; a subclass
    relays the pair (:meth:`_relay`). Its own state must be set before this ``__init__`` runs: the
    accepting thread starts here."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _admit(self) -> bool:
        """Whether a new dialler is relayed (else its connection is closed at once)."""
        return True

    def _relay(self, dialler: socket.socket, target: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                dialler, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._admit():
                dialler.close()
                continue
            try:
                target = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                dialler.close()
                continue
            self._relay(dialler, target)


def copy(source: socket.socket, sink: socket.socket, drop: Callable[[], bool] = lambda: False) -> None:
    """Send what ``source`` sends on to ``sink`` until its end or an error (``drop()``: read and
    swallowed instead)."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            if not drop():
                sink.sendall(chunk)
