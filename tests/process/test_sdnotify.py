"""sd_notify against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from latticed.process.sdnotify import Notifier, watchdog_interval


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket playing systemd's notify socket; returns (NOTIFY_SOCKET value, socket)."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)  # only a safety net: datagrams are already queued when recv is called
    yield str(path), sock
    sock.close()


def recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_messages(manager: tuple[str, socket.socket]) -> None:
    address, sock = manager
    n = Notifier.from_env({"NOTIFY_SOCKET": address})
    assert n.enabled
    assert n.ready()
    assert recv(sock) == "READY=1"
    assert n.ready(status="serving 3 peers")
    assert recv(sock) == "READY=1\nSTATUS=serving 3 peers"
    assert n.status("syncing\nqueue a")
    assert recv(sock) == "STATUS=syncing queue a"  # a newline would start a bogus assignment
    assert n.watchdog()
    assert recv(sock) == "WATCHDOG=1"
    assert n.stopping()
    assert recv(sock) == "STOPPING=1"
    n.close()


def test_abstract_socket() -> None:
    name = f"latticed-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert recv(sock) == "READY=1"
        n.close()
    finally:
        sock.close()


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "vsock:2:1234"}])
def test_disabled_is_a_noop(env: dict[str, str]) -> None:
    n = Notifier.from_env(env)
    assert not n.enabled
    assert not n.ready()
    assert not n.watchdog()


def test_send_failure_is_logged_not_raised(
    manager: tuple[str, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    address, sock = manager
    n = Notifier.from_env({"NOTIFY_SOCKET": address})
    sock.close()
    os.unlink(address)  # systemd went away
    assert not n.ready()
    assert "sd_notify" in caplog.text
    assert not n.watchdog()  # and it keeps not raising


def test_reconnects_after_failure(tmp_path: Path) -> None:
    address = str(tmp_path / "later")
    n = Notifier.from_env({"NOTIFY_SOCKET": address})
    assert not n.status("nobody listening yet")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    try:
        assert n.status("now")
        assert recv(sock) == "STATUS=now"
    finally:
        sock.close()
        n.close()


def test_watchdog_interval() -> None:
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, pid=1) == 15.0
    # Inherited by a child: not for us.
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}) is None
