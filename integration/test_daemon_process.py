"""The daemon as a real process: restarts, crash safety under ``kill -9``, signals, files and modes."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket as socketlib
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from latticed.api.client.blocking_client import Client
from latticed.errors import ConnectionClosedError, LatticedError

#: The ``latticed_process`` fixture (integration/conftest.py): starts a daemon, returns its handle.
Factory = Callable[..., Any]


def test_restart_keeps_identity_and_data(latticed_process: Factory) -> None:
    first = latticed_process()
    with Client(first.socket) as c:
        identity = c.identity()
        c.queue_create("q", {"a": "b"})
        c.offer_batch("q", [(b"v%d" % i, b"k", [("h", b"x")]) for i in range(100)])
        c.truncate("q", 10)
        c.kv_put("key", b"value")
        c.kv_incr("n", 3)
        before = c.range("q", 0, 1000), c.queue_info("q")
    assert first.stop() == 0
    key = first.data_dir / "identity.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32

    second = latticed_process(data_dir=first.data_dir, socket_path=first.socket)
    with Client(second.socket) as c:
        assert c.identity() == identity
        assert (c.range("q", 0, 1000), c.queue_info("q")) == before
        assert c.kv_get("key") == b"value" and c.kv_incr("n") == 4
        assert c.offer("q", b"more") == 100


def test_socket_is_private_and_sigterm_exits_cleanly(latticed_process: Factory) -> None:
    daemon = latticed_process()
    mode = daemon.socket.stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert daemon.stop(signal.SIGTERM) == 0
    assert not daemon.socket.exists()
    log = daemon.log_text()
    assert '"event": "daemon.signal"' in log and '"event": "daemon.stopped"' in log


def test_tells_systemd_ready_watchdog_and_stopping(latticed_process: Factory) -> None:
    notify_dir = Path(tempfile.mkdtemp(prefix="ld-n-"))
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    listener.bind(str(notify_dir / "notify"))
    listener.settimeout(10)
    try:
        env = {"NOTIFY_SOCKET": str(notify_dir / "notify"), "WATCHDOG_USEC": "100000"}
        daemon = latticed_process(env=env)
        messages = [listener.recv(4096).decode() for _ in range(3)]
        assert any("READY=1" in m for m in messages) and any("WATCHDOG=1" in m for m in messages)
        assert daemon.stop() == 0
        rest = []
        listener.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            while True:
                rest.append(listener.recv(4096).decode())
        assert any("STOPPING=1" in m for m in rest)
    finally:
        listener.close()
        shutil.rmtree(notify_dir, ignore_errors=True)


def test_sigint_exits_cleanly_too(latticed_process: Factory) -> None:
    daemon = latticed_process()
    assert daemon.stop(signal.SIGINT) == 0
    assert not daemon.socket.exists()


def test_kill_9_during_bulk_offers_loses_no_acknowledged_record(latticed_process: Factory) -> None:
    daemon = latticed_process()
    with Client(daemon.socket) as c:
        c.queue_create("bulk")
    acked: dict[int, bytes] = {}
    failure: list[BaseException] = []
    enough = threading.Event()

    def producer() -> None:
        try:
            with Client(daemon.socket) as c:
                batch = 0
                while True:
                    values = [b"b%d-r%d" % (batch, i) for i in range(200)]
                    offsets = c.offer_batch("bulk", [(v, None, ()) for v in values])
                    acked.update(zip(offsets, values, strict=True))
                    batch += 1
                    if batch == 20:
                        enough.set()
        except ConnectionClosedError:
            pass  # the daemon died under us: expected
        except BaseException as exc:
            failure.append(exc)
        finally:
            enough.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert enough.wait(60)
    daemon.kill9()
    thread.join(30)
    assert not failure, failure
    assert daemon.socket.exists()  # a crashed daemon leaves its socket file behind...
    assert len(acked) >= 4000

    again = latticed_process(data_dir=daemon.data_dir, socket_path=daemon.socket)  # ...which is replaced
    with Client(again.socket) as c:
        info = c.queue_info("bulk")
        assert info["end_offset"] >= max(acked) + 1  # a batch may have committed without its ack
        stored: dict[int, bytes] = {}
        offset = 0
        while offset < info["end_offset"]:
            batch = c.read("bulk", offset)
            stored.update(zip(batch.offsets, batch.values, strict=True))
            offset = batch.next_offset
        assert all(stored.get(o) == v for o, v in acked.items())
        assert sorted(stored) == list(range(info["end_offset"]))  # nothing half-written, no holes
        assert c.offer("bulk", b"after the crash") == info["end_offset"]


def test_refuses_a_socket_another_daemon_serves_and_a_locked_data_dir(latticed_process: Factory) -> None:
    live = latticed_process()
    rival = latticed_process(socket_path=live.socket, start=False)
    rival.start(wait=False)
    assert rival.proc is not None and rival.proc.wait(30) != 0
    assert "already serving" in rival.log_text()

    twin = latticed_process(data_dir=live.data_dir, start=False)
    twin.start(wait=False)
    assert twin.proc is not None and twin.proc.wait(30) != 0
    assert "another latticed is using the data directory" in twin.log_text()
    with Client(live.socket) as c:  # the live daemon never noticed
        assert c.identity()


def test_bad_clients_do_not_disturb_others(latticed_process: Factory) -> None:
    daemon = latticed_process()
    with Client(daemon.socket) as good:
        good.queue_create("q")
        for _ in range(20):
            raw = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            raw.connect(str(daemon.socket))
            raw.sendall(b"\x7f\xff\xff\xff" + b"junk" * 10)
            raw.close()
        assert good.offer("q", b"fine") == 0
        try:
            good.call("no_such_op")
        except LatticedError as exc:
            assert exc.code == "protocol"
        start = time.monotonic()
        assert good.peek("q", 0) == b"fine" and time.monotonic() - start < 5
