"""What ``latticectl peers`` and ``doctor`` show of each peer: one row per peer although it dialled us from
an ephemeral port too, no "on our block list" once it is unblocked, a dial error said once, and how many
daemons of another network mDNS hears on the LAN."""

from __future__ import annotations

import functools
import json
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from latticed.api.client.peer_client import PeerOps
from latticed.errors import ConnectionClosedError
from latticed.host.config import DaemonConfig
from latticed.net.discovery import DiscoveredPeer, run_discovery
from latticed.net.peer_faults import PeerFaults
from latticed.net.replication_service import PEERS_FILE
from latticed.net.transport import connect_failure, open_peer
from latticed.process.logs import EVENT_ATTR, FIELDS_ATTR
from latticed.protocol.peerbook import PeerBook
from latticed.protocol.peerstate import PeerRules

PK_B = bytes(range(32))
PK_C = bytes(range(1, 33))
LISTEN_B = ("192.0.2.7", 7464)
runner = CliRunner()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def test_a_peer_that_dialled_us_is_one_row_at_its_listen_address() -> None:
    book = PeerBook(rng=lambda: 0.0)
    book.add(LISTEN_B, "remembered", now=0.0, public_key=PK_B)
    book.connected(("192.0.2.7", 51234), PK_B, 1.0, incoming=True)  # it dialled us from an ephemeral port
    book.connected(("192.0.2.8", 40000), PK_C, 1.0, incoming=True)  # C: no other address known
    assert [(s.host, s.port) for s in book.snapshot() if s.public_key == PK_B.hex()] == [
        ("192.0.2.7", 7464),
        ("192.0.2.7", 51234),
    ]
    rows = book.by_identity()
    assert [(s.public_key, s.port, s.sources) for s in rows] == [
        (PK_B.hex(), 7464, ("incoming", "remembered")),
        (PK_C.hex(), 40000, ("incoming",)),
    ]


def test_unblocking_clears_what_was_refused_for_the_block_at_once(tmp_path: Path) -> None:
    faults = PeerFaults(tmp_path, rules=PeerRules().with_blocked(PK_B))
    failure = faults.dial_failed(LISTEN_B, ConnectionClosedError("closed"), reached=True, we_refused=PK_B)
    assert failure.kind == "blocked"
    faults.dial_failed(("192.0.2.9", 1), ConnectionClosedError("x"), reached=False, we_refused=None)
    faults.incoming_failed("192.0.2.7", ConnectionClosedError("closed"), PK_B)
    faults.incoming_failed("192.0.2.8", ConnectionClosedError("closed"), PK_C)
    faults.update_rules(faults.rules.without_blocked(PK_B))
    faults.unblocked(PK_B)
    assert list(faults.failures) == [("192.0.2.9", 1)]  # an unrelated failure stays
    assert [r.host for r in faults.incoming.recent(time.time())] == ["192.0.2.8"]


def test_a_refused_dial_says_why_once() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused

        async def dial() -> str:
            try:
                await trio.open_tcp_stream("127.0.0.1", port)
            except OSError as exc:
                assert connect_failure(exc) == "Connection refused"
            try:
                await open_peer("127.0.0.1", port, seed=bytes(32), network_key=bytes(32))
            except ConnectionClosedError as exc:
                return str(exc)
            raise AssertionError("connected")

        message = trio.run(dial)
    assert message == f"cannot connect to 127.0.0.1:{port}: Connection refused"


def test_replication_ready_counts_the_remembered_peers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    book = PeerBook()
    book.remember(("127.0.0.1", 9), PK_B, now=time.time())  # the discard port: nothing listens
    (data / PEERS_FILE).write_text(book.to_json())
    caplog.set_level(logging.INFO, logger="latticed.net.replication_service")
    config = DaemonConfig(data_dir=data, socket_path=tmp_path / "d.sock", listen=("127.0.0.1", 0), mdns=False)
    daemon = start_in_process(config)
    daemon.stop()
    [ready] = [r for r in caplog.records if getattr(r, EVENT_ATTR, None) == "replication.ready"]
    assert getattr(ready, FIELDS_ATTR)["peers"] == 1


class _Heard(logging.Handler):
    """Sets ``event`` when discovery logs that it heard a daemon of another network."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, EVENT_ATTR, None) == "mdns.other_network":
            self.event.set()


@contextmanager
def _daemon_of_another_network() -> Iterator[None]:
    """mDNS announcements on loopback under a random network key, from a thread of its own, until exit."""
    ready, done = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    async def announce() -> None:
        send, _receive = trio.open_memory_channel[DiscoveredPeer](16)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(
                    run_discovery,
                    network_key=secrets.token_bytes(32),
                    identity_public_key=secrets.token_bytes(32),
                    port=9,
                    interfaces=["127.0.0.1"],
                    found=send,
                )
            )
            ready.set()
            await trio.to_thread.run_sync(done.wait)
            nursery.cancel_scope.cancel()

    def run() -> None:
        try:
            trio.run(announce)
        except BaseException as exc:
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="other-network")
    thread.start()
    try:
        ready.wait(30)
        assert "error" not in box, box["error"]
        yield
    finally:
        done.set()
        thread.join(30)


def test_peers_and_doctor_count_the_daemons_of_another_network_on_the_lan(tmp_path: Path) -> None:
    """A fresh install next to another network's daemon sees no peers, and says why: a count, no more."""
    heard = _Heard()
    logger = logging.getLogger("latticed.net.discovery")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(heard)
    config = DaemonConfig(
        data_dir=tmp_path / "data",
        socket_path=tmp_path / "d.sock",
        listen=("127.0.0.1", 0),
        mdns=True,
        mdns_interfaces=("127.0.0.1",),
    )
    daemon = start_in_process(config)
    try:
        with _daemon_of_another_network():
            assert heard.event.wait(30), "the daemon never heard the other network's announcement"
            # Other runs on this host may announce on loopback too (and go away): at least ours is counted,
            # once its announcement is resolved, which the log line above may have preceded.
            deadline = time.monotonic() + 30
            while True:
                text = ctl(daemon, "peers")
                assert text.exit_code == 0, text.output
                counted = r"^\d+ daemons? of another network on this LAN: if they are yours"
                if re.search(counted, text.stderr, re.M) or time.monotonic() > deadline:
                    break
                heard.event.clear()
                heard.event.wait(1)  # the next announcement heard, or a second
            assert re.search(counted, text.stderr, re.M), text.stderr
            as_json = ctl(daemon, "peers", "--json")
            assert json.loads(as_json.stdout) == [] and "of another network" in as_json.stderr
            doctor = ctl(daemon, "doctor")
            assert doctor.exit_code == 1
            assert re.search(
                r"^✘ lan: \d+ daemons? of another network on this LAN, and none of this network connected\n"
                r"    fix: if they are yours, give them one network key",
                doctor.stdout,
                re.M,
            ), doctor.stdout
    finally:
        daemon.stop()
        logger.removeHandler(heard)
        logger.setLevel(old_level)


def test_without_mdns_peers_and_doctor_say_nothing_of_other_networks(tmp_path: Path) -> None:
    config = DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "d.sock", mdns=False)
    daemon = start_in_process(config)
    try:
        quiet = ctl(daemon, "peers", "--json")
        assert json.loads(quiet.stdout) == [] and "another network" not in quiet.stderr
        assert ctl(daemon, "peers").stdout == "no peers\n"
        assert "lan:" not in ctl(daemon, "doctor").stdout
    finally:
        daemon.stop()


def test_a_daemon_that_does_not_count_other_networks_still_lists_its_peers() -> None:
    """An older daemon's replies lack ``other_networks``: unknown, not an error."""

    class OlderDaemon(PeerOps):
        def call(self, op: str, **args: Any) -> dict[str, Any]:
            assert op == "peers"
            return {"peers": [{"public_key": PK_B.hex(), "status": "connected"}]}

    report = OlderDaemon().peer_report()
    assert report == {"peers": [{"public_key": PK_B.hex(), "status": "connected"}], "other_networks": None}


def test_each_link_counts_the_deltas_it_sent_and_those_the_peer_answered(tmp_path: Path) -> None:
    """``peers()``' ``deltas_sent`` / ``deltas_acked`` per link (both cores), so a test or an operator can
    wait until a peer answered every push instead of reading the daemon-wide traffic counters."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir(mode=0o700)
    a = start_in_process(
        DaemonConfig(data_dir=dirs[0], socket_path=tmp_path / "a.sock", listen=("127.0.0.1", 0), mdns=False)
    )
    try:
        with a.client() as ca:
            port = int(str(ca.status()["listen"]).rsplit(":", 1)[1])
            ca.queue_create("one", core=1)
            ca.queue_create("two", core=2)
        b_config = DaemonConfig(
            data_dir=dirs[1], socket_path=tmp_path / "b.sock", peers=(("127.0.0.1", port),), mdns=False
        )
        b = start_in_process(b_config)
        try:
            with a.client() as ca, b.client() as cb:
                b_key = cb.identity()

                def row() -> dict[str, Any]:
                    return next((r for r in ca.peers() if r.get("public_key") == b_key), {})

                _until(lambda: row().get("status") == "connected", "the link between a and b", row)
                ca.offer_batch("one", [(b"x%d" % i, None, ()) for i in range(3)])
                ca.offer_batch("two", [(b"y%d" % i, None, ()) for i in range(3)])
                _until(lambda: (row().get("deltas_sent") or 0) >= 2, "a's pushes of both queues", row)
                _until(lambda: row()["deltas_acked"] == row()["deltas_sent"], "b's answers to all", row)
                shown = ctl(a, "peers", "--json")
                [listed] = [r for r in json.loads(shown.stdout) if r["public_key"] == b_key]
                assert listed["deltas_acked"] == listed["deltas_sent"] >= 2
                assert set(listed) >= {"deltas_sent", "deltas_acked"} and "deltas" not in listed  # raw rows

                def cells() -> list[str]:
                    return _sent_acked_cells(ctl(a, "peers"), b_key)

                def settled() -> bool:  # polled: a later push may be unanswered yet
                    shown = cells()
                    return len(shown) == 1 and re.fullmatch(r"(\d+)/\1", shown[0]) is not None

                # The table's column says what the JSON does: all of a's pushes sent, all answered.
                _until(settled, "b's row in the table, its SENT/ACKED equal", cells)
                [cell] = cells()
                assert int(cell.split("/")[1]) >= listed["deltas_acked"], cell
        finally:
            b.stop()
        with a.client() as ca:
            # Not connected: nothing to count (a link's counts start with it).
            _until(lambda: all(r.get("deltas_sent") is None for r in ca.peers()), "b's link gone", ca.peers)
        assert set(_sent_acked_cells(ctl(a, "peers"), b_key)) <= {"-"}
    finally:
        a.stop()


def _sent_acked_cells(table: Result, identity: str) -> list[str]:
    """The SENT/ACKED cells of ``identity``'s rows in ``latticectl peers``' table (cut at the headings)."""
    assert table.exit_code == 0, table.output
    if table.stdout == "no peers\n":
        return []
    heading, *lines = table.stdout.splitlines()
    start, end = heading.index("SENT/ACKED"), heading.index("STATE")
    return [line[start:end].strip() for line in lines if line.startswith(identity)]


def _until(check: Callable[[], bool], what: str, diagnose: Callable[[], object], timeout: float = 20) -> None:
    """Poll an in-process daemon's API (another thread's) for ``check``; fail with ``what`` and the facts."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {diagnose()}"
        time.sleep(0.02)
