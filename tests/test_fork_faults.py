"""A forked queue as its operator meets it, in-process (a network reaches this state only by accident): a
second history signed with the daemon's own key, merged straight into the engine. It is logged once, at
WARNING, with the proof's hash; ``status``, ``queue list`` and ``queue info`` show it; the queue stops where
the daemon stands (its records stay stored, none is read past the visible end) and every kind of write by
the owner is refused with exit code 6, naming ``latticectl queue recover``."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from cli.boundary import ExitCode
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig
from latticed.process.logs import FIELDS_ATTR

runner = CliRunner()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    d = start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))
    yield d
    d.stop()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def fork_events(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        dict(getattr(r, FIELDS_ATTR))
        for r in caplog.records
        if r.getMessage() == "queue.forked" and r.levelno == logging.WARNING
    ]


def _fork_own(daemon: InProcessDaemon, other: LatticeQueue, first_delta: core.QueueDelta) -> core.QueueState:
    """Merge the second history's first record under its newest head: a fork, found by the join, that
    stops the queue where this daemon stands (its own head and records)."""
    first_only = dataclasses.replace(first_delta, head=other.delta().head)
    before = daemon.handle.engine.state(
        daemon.handle.engine.find(first_delta.owner, first_delta.name, first_delta.kind)
    )
    state: core.QueueState = daemon.call(daemon.handle.engine.merge_delta, first_only)
    assert state.forked and (state.head, state.held_end) == (before.head, before.held_end)
    return state


def test_a_fork_is_logged_once_with_its_proof_and_shown_everywhere(
    daemon: InProcessDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="latticed.services.health")
    name = f"q{secrets.token_hex(4)}"
    with daemon.client() as c:
        address = c.queue_create(name, core=1)  # the second history is v1 deltas: core 1's fork
        c.offer(name, b"this daemon's record")
    other = LatticeQueue.create(daemon.handle.identity, name)
    deltas = []
    for value in (b"a", b"b", b"c"):
        other.offer(value)
        other.commit()
        deltas.append(other.delta())
    state = _fork_own(daemon, other, deltas[0])
    assert state.fork is not None
    proof = state.fork.digest().hex()
    # More evidence of the same fork arrives: still one warning for this queue.
    daemon.call(daemon.handle.engine.merge_delta, other.delta())
    [event] = fork_events(caplog)
    assert event["queue"] == address and event["proof"] == proof and event["owned"] is True

    status = json.loads(ctl(daemon, "status", "--json").stdout)
    assert status["forked_queues"] == [{"queue": address, "kind": "queue", "proof": proof, "owned": True}]
    text = ctl(daemon, "status").stdout
    assert re.search(rf"^forked queues: +{re.escape(address)} \(proof {proof[:16]}\)$", text, re.M)
    info = json.loads(ctl(daemon, "queue", "info", name, "--json").stdout)
    assert info["forked"] is True and info["fork_proof"] == proof
    assert re.search(rf"^fork_proof: +{proof}$", ctl(daemon, "queue", "info", name).stdout, re.M)
    [line] = [ln for ln in ctl(daemon, "queue", "list").stdout.splitlines() if ln.startswith(address)]
    assert line.split()[-1] == "yes"  # the FORKED column


def test_every_write_to_a_forked_own_queue_is_exit_6(daemon: InProcessDaemon) -> None:
    name = f"q{secrets.token_hex(4)}"
    with daemon.client() as c:
        c.queue_create(name, core=1)  # the second history is v1 deltas: core 1's fork
        c.offer(name, b"ours")
    other = LatticeQueue.create(daemon.handle.identity, name)
    other.offer(b"theirs")
    other.commit()
    first = other.delta()
    for _ in range(2):
        other.offer(b"more")
        other.commit()
    forked = _fork_own(daemon, other, first)
    for args in (("offer", name, "x"), ("meta", "set", name, "k", "v"), ("truncate", name, "1")):
        result = ctl(daemon, *args)
        assert result.exit_code == ExitCode.INTEGRITY, (args, result.output)
        assert "forked" in result.stderr, (args, result.stderr)
        assert f"latticectl queue recover {name}" in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    # Our record stays stored, but the proof shows the two histories share nothing: none is read.
    assert forked.held_end == 1 and forked.visible_end == 0
    info = json.loads(ctl(daemon, "queue", "info", name, "--json").stdout)
    assert (info["start_offset"], info["end_offset"]) == (0, 0)
    assert "ours" not in ctl(daemon, "peek", name, "0").stdout


def test_a_write_to_a_forked_own_kv_namespace_is_exit_6(daemon: InProcessDaemon) -> None:
    assert ctl(daemon, "kv", "put", "a", "1").exit_code == 0
    identity = daemon.handle.identity
    other = LatticeQueue(core.empty_state(identity.public_key, "kv", KIND_KV), identity)
    other.offer(b"an op of a second history")
    other.commit()
    first = other.delta()
    for _ in range(2):
        other.offer(b"another")
        other.commit()
    _fork_own(daemon, other, first)
    result = ctl(daemon, "kv", "put", "b", "2")
    assert result.exit_code == ExitCode.INTEGRITY and "forked" in result.stderr, result.output
    status = json.loads(ctl(daemon, "status", "--json").stdout)
    assert [f["kind"] for f in status["forked_queues"]] == ["kv"]
