"""A loopback TCP relay that can leave every link through it half-open: :meth:`HalfOpenRelay.cut` ends
each relayed connection on the target's side only. The target sees its end closed at once; the dialler
sees nothing (no FIN, no RST, its bytes swallowed), as when the far host vanished, so the dialler's end
lives on until its own staleness rule ends it. On loopback a real half-open link needs such a middle:
the kernel answers for a stopped process."""

from __future__ import annotations

import contextlib
import socket
import threading

from loopback_relay import LoopbackRelay, copy


class HalfOpenRelay(LoopbackRelay):
    """Accepts on ``127.0.0.1:port`` and relays each connection to ``127.0.0.1:target_port``, both ways,
    until :meth:`cut` (see the module docstring) or :meth:`close`."""

    def __init__(self, target_port: int) -> None:
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self.cut_done = False
        super().__init__(target_port)

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

    def _admit(self) -> bool:
        return not self.cut_done

    def _relay(self, dialler: socket.socket, target: socket.socket) -> None:
        with self._lock:
            self._pairs.append((dialler, target))
        threading.Thread(target=self._pump, args=(dialler, target), daemon=True).start()
        threading.Thread(target=self._pump, args=(target, dialler), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        copy(source, sink, drop=lambda: self.cut_done)  # after the cut the dialler's bytes are dropped
        if not self.cut_done:  # an end closed before any cut: close the other as a plain relay does
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
