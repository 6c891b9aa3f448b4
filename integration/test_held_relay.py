"""The relay the stale-restore test holds a catch-up with: the target's bytes pass only as allowed, none
lost or reordered; the dialler's pass freely."""

from __future__ import annotations

import socket
import threading

import pytest
from held_relay import HeldRelay
from polling import wait_until

SENT = bytes(range(256)) * 40  # 10,240 bytes, each position distinct enough to show an order


def receive(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, "the relay hung up early"
        got += chunk
    return got


def test_the_targets_bytes_pass_as_allowed_and_the_diallers_freely() -> None:
    target = socket.create_server(("127.0.0.1", 0))
    heard = threading.Event()

    def serve() -> None:
        conn, _ = target.accept()
        with conn:
            conn.sendall(SENT)
            assert conn.recv(5) == b"hello"
            heard.set()
            conn.recv(1)  # until the dialler hangs up

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    relay = HeldRelay(target.getsockname()[1])
    relay.hold()
    with socket.create_connection(("127.0.0.1", relay.port)) as dialler:
        dialler.sendall(b"hello")
        assert heard.wait(10), "the dialler's bytes pass while the target's are held"
        relay.allow(1000)
        wait_until(relay.spent, "the allowed kilobyte")
        assert relay.passed == 1000
        assert receive(dialler, 1000) == SENT[:1000]
        with pytest.raises(BlockingIOError):
            dialler.recv(1, socket.MSG_DONTWAIT)  # nothing past the allowance was read from the target
        relay.release()
        assert receive(dialler, len(SENT) - 1000) == SENT[1000:]
        assert not relay.spent()
    server.join(10)
    relay.close()
    target.close()
