"""Hostile handshakes against a real daemon's peer listener (in process, on loopback addresses): a key
holder flooding the replay cache with future-dated openings, and a stranger holding half-open
connections. Honest peers must still get in, replays must still draw nothing, the local API must keep
answering, and the log must not grow a line per attempt.

Each source is its own loopback address (127.0.0.x), which Linux routes to the daemon like any host."""

from __future__ import annotations

import errno
import functools
import logging
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from support.inprocess import InProcessDaemon, start_in_process
from support.passthrough_stream import PassThrough

from latticed.crdt.signing import Identity
from latticed.host.config import DaemonConfig
from latticed.host.netkey import new_network_key, write_network_key
from latticed.net.accept import serve_listeners
from latticed.net.admission import FailureLog
from latticed.net.transport import secure_connect
from latticed.process.logs import record_fields
from latticed.protocol.handshake import MSG1_SIZE, MSG2_SIZE, Initiator, ReplayCache

KEY = new_network_key()
HONEST = Identity.from_seed(b"h" * 32)
FLOODER = Identity.from_seed(b"f" * 32)
#: The daemon under test gets a small replay cache, so a flood of a hundred openings fills it as 8,400
#: fill the default one.
CAPACITY = 64


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[InProcessDaemon, int]]:
    monkeypatch.setattr(
        ReplayCache, "__init__", functools.partialmethod(ReplayCache.__init__, capacity=CAPACITY)
    )
    write_network_key(tmp_path / "network.key", KEY)
    config = DaemonConfig(
        data_dir=tmp_path / "data",
        socket_path=tmp_path / "api.sock",
        listen=("127.0.0.1", 0),
        mdns=False,
        network_key_file=tmp_path / "network.key",
    )
    running = start_in_process(config, "flooded")
    try:
        with running.client() as client:
            port = int(client.status()["listen"].rsplit(":", 1)[1])
        yield running, port
    finally:
        running.stop()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _open(port: int, msg1: bytes, source: str) -> bytes:
    """Send an opening from ``source`` and return what the daemon answers before it hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as sock:
        sock.sendall(msg1)
        answer = b""
        while len(answer) < MSG2_SIZE and (chunk := sock.recv(MSG2_SIZE)):
            answer += chunk
        return answer


def _honest_connect(port: int, source: str = "127.0.0.1") -> bytes:
    """A real peer's whole handshake from ``source``; returns the daemon's identity, and the opening it
    sent (recorded, as an eavesdropper would)."""
    recorded: list[bytes] = []

    class Tap(PassThrough):
        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            recorded.append(bytes(data))
            await self.inner.send_all(data)

    async def main() -> bytes:
        sock = trio.socket.socket()
        await sock.bind((source, 0))
        await sock.connect(("127.0.0.1", port))
        stream = await secure_connect(
            Tap(trio.SocketStream(sock)), seed=HONEST.seed, network_key=KEY, timeout=10
        )
        async with stream:
            return stream.remote_public_key

    trio.run(main)
    assert len(recorded[0]) == MSG1_SIZE
    return recorded[0]


def _failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.getMessage() in ("peer.handshake_failed", "peer.connection_refused")
    ]


def test_a_key_holder_flooding_future_openings_locks_out_no_one(
    daemon: tuple[InProcessDaemon, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="latticed.net.replication_service")
    _, port = daemon
    answered = 0
    for _ in range(CAPACITY + 40):
        opening = Initiator(seed=FLOODER.seed, network_key=KEY, now_ms=_now_ms() + 115_000).initiate()
        answered += len(_open(port, opening, "127.0.0.2")) == MSG2_SIZE
    # An honest peer, dialling from elsewhere with a correct clock, gets in at once...
    recorded = _honest_connect(port)
    assert 0 < answered < CAPACITY  # the flooder got its share, not the cache
    # ...and its opening, replayed from any address (its own included), draws nothing.
    for source in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
        assert _open(port, recorded, source) == b""
    # One line per source per interval, saying how many attempts it stands for; not one per attempt.
    lines = _failures(caplog)
    assert 0 < len(lines) <= 3, [record_fields(r) for r in lines]


_HOLDER = """
import resource, socket, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the daemon's lowered limit is not ours
held = []
for _ in range(int(sys.argv[2])):
    held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), source_address=("127.0.0.4", 0)))
print("holding", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def few_descriptors() -> Iterator[None]:
    """This process (the daemon's) gets 160 descriptors more than it has open now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 160, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_half_open_connections_keep_out_no_honest_peer_nor_the_local_api(
    daemon: tuple[InProcessDaemon, int], few_descriptors: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A stranger (another process) holds 300 connections from one address and sends nothing, more
    than the daemon has descriptors: past its per-source share they are closed at once, so an honest
    peer still completes its handshake and the local API answers; nothing is logged per connection."""
    caplog.set_level(logging.INFO, logger="latticed")
    running, port = daemon
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(port), "300"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        _honest_connect(port)
        with running.client() as client:
            assert client.status()["listen"] == f"127.0.0.1:{port}"
    finally:
        holder.kill()
        holder.wait()
    assert len(_failures(caplog)) <= 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_running_out_of_descriptors_is_logged_once_per_episode(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    """trio's accept loop logs an ERROR with a traceback per failed accept; ours one WARNING when it
    starts and one INFO line with the count when accepting works again, per episode."""
    caplog.set_level(logging.INFO, logger="latticed.net.accept")
    served: list[object] = []

    class Exhausted(trio.abc.Listener[trio.abc.Stream]):
        def __init__(self) -> None:
            self.calls = 0

        async def accept(self) -> trio.abc.Stream:
            self.calls += 1
            await trio.sleep(0)
            if self.calls > 200:
                await trio.sleep_forever()
            if self.calls % 100 in range(1, 51):  # 50 failures, then 50 connections, twice
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return trio.testing.memory_stream_pair()[0]

        async def aclose(self) -> None:
            pass

    async def handler(stream: trio.abc.Stream) -> None:
        served.append(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve_listeners, handler, [Exhausted()], name="peer"))
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert len(served) == 100
    events = [(r.getMessage(), r.levelno) for r in caplog.records]
    assert (
        events
        == [
            ("peer.accept_exhausted", logging.WARNING),
            ("peer.accept_recovered", logging.INFO),
        ]
        * 2
    )
    assert [record_fields(r)["failed_accepts"] for r in caplog.records[1::2]] == [50, 50]


def test_failure_lines_are_one_per_source_per_interval() -> None:
    failures = FailureLog(interval=60, max_sources=2)
    assert [failures.note("a", t) for t in (0, 1, 59)] == [1, None, None]
    assert failures.note("b", 5) == 1
    assert failures.note("a", 61) == 3  # the line stands for the two it kept quiet and itself
    assert failures.note("c", 62) == 1 and failures.note("b", 63) == 1  # b was forgotten for c
