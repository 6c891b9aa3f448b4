"""A loopback TCP relay that can leave every link through it half-open: :meth:`HalfOpenRelay.cut` ends
each relayed connection on the target's side only. The target sees its end closed at once; the dialler
sees nothing (no FIN, no RST, its bytes swallowed), as when the far host vanished, so the dialler's end
lives on until its own staleness rule ends it. On loopback a real half-open link needs such a middle:
the kernel answers for a stopped process."""

from __future__ import annotations

import contextlib
import socket
import threading


class HalfOpenRelay:
    """Accepts on ``127.0.0.1:port`` and relays each connection to ``127.0.0.1:target_port``, both ways,
    until :meth:`cut` (see the module docstring) or :meth:`close`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self.cut_done = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Close every relayed connection's target side; the diallers' sides stay open and silent."""
        with self._lock:
            self.cut_done = True
            targets = [target for _, target in self._pairs]
        for target in targets:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_RDWR)  # wakes the pump reading it; the target reads EOF

    def close(self) -> None:
        """Stop accepting and close every socket (the diallers' ends too)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        self._listener.close()
        for dialler, target in pairs:
            for sock in (dialler, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                dialler, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self.cut_done:
                dialler.close()
                continue
            try:
                target = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                dialler.close()
                continue
            with self._lock:
                self._pairs.append((dialler, target))
            threading.Thread(target=self._pump, args=(dialler, target), daemon=True).start()
            threading.Thread(target=self._pump, args=(target, dialler), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if not self.cut_done:
                    sink.sendall(chunk)  # after the cut the dialler's bytes are read and dropped
        if not self.cut_done:  # an end closed before any cut: close the other as a plain relay does
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
