"""A daemon that starts signs nothing until the peers it dials first said what they hold, or could not be
reached: a store restored from a copy catches up before it signs (docs/operations.md, "Restoring"). Real
in-process daemon on loopback; the peer is a TCP listener that never answers the handshake until the test
hangs up on it."""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.api_polling import wait_for
from support.inprocess import start_in_process

from latticed.api.client.blocking_client import Client
from latticed.host.config import DaemonConfig
from latticed.process.logs import EVENT_ATTR, FIELDS_ATTR


class _Logged(logging.Handler):
    """Sets ``event`` when ``name`` is logged (and keeps its fields)."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.name_wanted = name
        self.event = threading.Event()
        self.fields: dict[str, object] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, EVENT_ATTR, None) == self.name_wanted:
            self.fields = dict(getattr(record, FIELDS_ATTR, {}))
            self.event.set()


def waiting_writer(*writes: tuple[str, Callable[[], object]]) -> tuple[threading.Thread, dict[str, object]]:
    """A started thread making ``writes`` in order, as a client would right after the start (each waits
    for the gate in the daemon), and what they returned by name; an exception stops it and is kept as
    ``"error"`` for the test's asserts (a thread's own would go unseen)."""
    written: dict[str, object] = {}

    def write() -> None:
        try:
            for name, call in writes:
                written[name] = call()
        except Exception as exc:
            written["error"] = exc

    thread = threading.Thread(target=write)
    thread.start()
    return thread, written


def test_a_write_waits_until_the_first_peers_said_what_they_hold(tmp_path: Path) -> None:
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(10)
    port = silent.getsockname()[1]
    caught_up = _Logged("replication.caught_up")
    logger = logging.getLogger("latticed.net.replication_service")
    logger.addHandler(caught_up)
    level = logger.level
    logger.setLevel(logging.INFO)
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    config = DaemonConfig(
        data_dir=data, socket_path=tmp_path / "d.sock", peers=(("127.0.0.1", port),), mdns=False
    )
    daemon = start_in_process(config)
    try:
        conn, _ = silent.accept()  # the daemon dialled: its handshake waits for an answer
        client = daemon.client()
        writer = daemon.client()
        waiting, written = waiting_writer(
            ("queue", lambda: writer.queue_create("q")),  # waits for the catch-up, then goes ahead
            ("offset", lambda: writer.offer("q", b"signed after the catch-up")),
        )
        try:
            facts = client.identity_runs()
            assert facts is not None and "1 to reach" in str(facts["catching_up"])
            assert not caught_up.event.is_set()
            assert [q for q in client.queue_list() if q.get("name") == "q"] == []  # nothing signed yet
            conn.close()  # the peer hangs up: it cannot be reached, so nothing is awaited any more
            assert caught_up.event.wait(10)
            assert caught_up.fields["timed_out"] is False
            waiting.join(20)
            assert not waiting.is_alive()
            assert "error" not in written, written
            assert written["offset"] == 0
            facts = client.identity_runs()
            assert facts is not None and facts["catching_up"] is None
        finally:
            waiting.join(20)
            client.close()
            writer.close()
    finally:
        daemon.stop()
        silent.close()
        logger.removeHandler(caught_up)
        logger.setLevel(level)


def test_pipelined_offers_to_a_queue_held_before_the_start_wait_for_the_catch_up_too(tmp_path: Path) -> None:
    """``offer`` and ``offer_batch`` run pipelined on the client's connection, not through the router
    that waits for the gate: refused whole at once until they waited too (CI: a batch right after a
    restart failed with "retry in a moment")."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    alone = DaemonConfig(data_dir=data, socket_path=tmp_path / "d.sock", mdns=False)
    first = start_in_process(alone)
    try:
        with first.client() as c:
            c.queue_create("q")
            c.offer("q", b"before the restart")
    finally:
        first.stop()
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(10)
    daemon = start_in_process(dataclasses.replace(alone, peers=(("127.0.0.1", silent.getsockname()[1]),)))
    try:
        conn, _ = silent.accept()  # the first dial waits for the handshake's answer: the gate is closed
        with daemon.client() as client, daemon.client() as writer:
            waiting, written = waiting_writer(
                ("batch", lambda: writer.offer_batch("q", [(b"a", None, ()), (b"b", None, ())])),
                ("offset", lambda: writer.offer("q", b"c")),
            )
            try:
                wait_for(lambda: _facts(client)["writes_waiting"] == 1, "the batch waiting for the gate")
                assert "1 to reach" in str(_facts(client)["catching_up"])
                assert client.queue_info("q")["end_offset"] == 1  # nothing signed yet
                conn.close()  # the peer hangs up: nothing is awaited any more
                waiting.join(20)
                assert not waiting.is_alive()
                assert "error" not in written, written
                assert written == {"batch": [1, 2], "offset": 3}
            finally:
                waiting.join(20)
    finally:
        daemon.stop()
        silent.close()


def _facts(client: Client) -> dict[str, Any]:
    facts = client.identity_runs()
    assert facts is not None
    return facts
