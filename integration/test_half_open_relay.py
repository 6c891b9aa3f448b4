"""The relay the half-open link test cuts: before the cut it relays both ways; after it the target reads
its end closed while the dialler's end stays open and silent, its bytes swallowed."""

from __future__ import annotations

import socket

import pytest
from half_open_relay import HalfOpenRelay


def test_a_cut_closes_the_targets_end_only() -> None:
    target = socket.create_server(("127.0.0.1", 0))
    relay = HalfOpenRelay(target.getsockname()[1])
    try:
        with socket.create_connection(("127.0.0.1", relay.port)) as dialler:
            far, _ = target.accept()
            with far:
                dialler.sendall(b"ping")
                assert far.recv(4) == b"ping"
                far.sendall(b"pong")
                assert dialler.recv(4) == b"pong"
                relay.cut()
                far.settimeout(10)
                assert far.recv(1) == b""  # the target's end: closed
                dialler.sendall(b"into the void")  # the dialler's: still open, nothing comes back
                with pytest.raises(BlockingIOError):
                    dialler.recv(1, socket.MSG_DONTWAIT)
    finally:
        relay.close()
        target.close()
