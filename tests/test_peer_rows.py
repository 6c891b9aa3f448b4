"""What ``latticectl peers`` and ``doctor`` show of each peer: one row per peer although it dialled us from
an ephemeral port too, no "on our block list" once it is unblocked, and a dial error said once."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest
import trio
from support.inprocess import start_in_process

from latticed.errors import ConnectionClosedError
from latticed.host.config import DaemonConfig
from latticed.net.peerstate import PeerFaults
from latticed.net.replication import PEERS_FILE
from latticed.net.transport import connect_failure, open_peer
from latticed.process.logs import EVENT_ATTR, FIELDS_ATTR
from latticed.protocol.peerbook import PeerBook
from latticed.protocol.peerstate import PeerRules

PK_B = bytes(range(32))
PK_C = bytes(range(1, 33))
LISTEN_B = ("192.0.2.7", 7464)


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
    caplog.set_level(logging.INFO, logger="latticed.net.replication")
    config = DaemonConfig(data_dir=data, socket_path=tmp_path / "d.sock", listen=("127.0.0.1", 0), mdns=False)
    daemon = start_in_process(config)
    daemon.stop()
    [ready] = [r for r in caplog.records if getattr(r, EVENT_ATTR, None) == "replication.ready"]
    assert getattr(ready, FIELDS_ATTR)["peers"] == 1
