"""latticectl against an in-process daemon, for states a network of daemons reaches only slowly or by
accident (one identity signing two histories of its own queue): built here with the library and merged
straight into the engine, then seen through the CLI as a user meets them."""

from __future__ import annotations

import dataclasses
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
from latticed.crdt.queue import QueueDelta
from latticed.crdt.records import Record
from latticed.errors import BehindPeersError, LatticedError
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig

runner = CliRunner()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    root = tmp_path_factory.mktemp("ctl")
    d = start_in_process(DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"))
    yield d
    d.stop()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def one_error_line(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("latticectl: error: ")
    return line


def _own_queue(daemon: InProcessDaemon) -> tuple[str, LatticeQueue, QueueDelta]:
    """One of the daemon's queues with a record, and a second history of it signed with the daemon's own
    key (as a copied data directory, or a restored one written before it caught up, would sign): three
    more heads, so its newest head is newer than the daemon's. Also the delta of its first record alone."""
    name = f"q{secrets.token_hex(4)}"
    with daemon.client() as c:
        c.queue_create(
            name, core=1
        )  # the second history is v1 deltas: core 1's join (core 2: test_core2_api)
        c.offer(name, b"this daemon's record")
    other = LatticeQueue.create(daemon.handle.identity, name)
    deltas = []
    for value in (b"a", b"b", b"c"):
        other.offer(value)
        other.commit()
        deltas.append(other.delta())
    return name, other, deltas[0]


def test_a_write_to_an_own_queue_whose_newest_head_lacks_its_records_is_exit_6(
    daemon: InProcessDaemon,
) -> None:
    """A peer sent a newer head of our own queue without its records (they are still on the way): a write
    now would sign at offsets that head already covers. Refused as "behind peers" (6), not exit 1."""
    name, other, _ = _own_queue(daemon)
    head_only = dataclasses.replace(other.delta(), records=(), tip=None, checkpoints=())
    state = daemon.call(daemon.handle.engine.merge_delta, head_only)
    assert not state.complete and not state.forked
    line = one_error_line(ctl(daemon, "offer", name, "more"), ExitCode.INTEGRITY)
    assert "yet" in line and "from offset 1" in line, line
    one_error_line(ctl(daemon, "meta", "set", name, "k", "v"), ExitCode.INTEGRITY)
    one_error_line(ctl(daemon, "truncate", name, "1"), ExitCode.INTEGRITY)
    assert ctl(daemon, "peek", name, "0").stdout == "this daemon's record\n"  # nothing changed


def test_a_write_to_an_own_forked_queue_is_exit_6(daemon: InProcessDaemon) -> None:
    """The second history's first record arrives and contradicts ours: the queue is forked and stops
    where this daemon stands (its own head and record). The owner's writes are refused with the
    documented 6, and the one line names the command that recovers it."""
    name, other, first = _own_queue(daemon)
    first_only = dataclasses.replace(first, head=other.delta().head)  # the newest head, one record
    state = daemon.call(daemon.handle.engine.merge_delta, first_only)
    assert state.forked and state.complete and state.held_end == 1
    for args in (("offer", name, "more"), ("meta", "set", name, "k", "v"), ("truncate", name, "1")):
        line = one_error_line(ctl(daemon, *args), ExitCode.INTEGRITY)
        assert "forked" in line and f"latticectl queue recover {name}" in line, line
    assert '"forked": true' in ctl(daemon, "queue", "info", name, "--json").stdout


def test_other_writes_in_the_same_commit_are_not_refused_with_it(daemon: InProcessDaemon) -> None:
    """The refusal comes before the batch changes anything, so an offer to a healthy queue that shares the
    group commit still succeeds (a failure at signing time fails every job of the batch)."""
    name, other, _ = _own_queue(daemon)
    head_only = dataclasses.replace(other.delta(), records=(), tip=None, checkpoints=())
    daemon.call(daemon.handle.engine.merge_delta, head_only)
    healthy = f"h{secrets.token_hex(4)}"
    with daemon.client() as c:
        c.queue_create(healthy)
    engine = daemon.handle.engine

    async def both() -> list[object]:
        record = (Record(b"x", None, 0),)
        jobs = [engine.start_append(engine.resolve(n), record, checked=True) for n in (healthy, name)]
        outcomes: list[object] = []
        for job in jobs:  # both were queued before either was awaited: one batch
            try:
                outcomes.append(await engine.outcome(job))
            except LatticedError as exc:
                outcomes.append(exc)
        return outcomes

    ok, refused = daemon.call(both)
    assert ok == 0
    assert isinstance(refused, BehindPeersError)


def test_a_kv_write_while_the_own_namespace_lacks_its_newest_records_is_exit_6(tmp_path: Path) -> None:
    """The same refusal for our KV namespace (its op log is a queue of kind KV): before the batch changes,
    so the write exits 6 and nothing else in its group commit fails with it."""
    d = start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))
    try:
        assert ctl(d, "kv", "put", "a", "1").exit_code == 0
        other = LatticeQueue(core.empty_state(d.handle.identity.public_key, "kv", KIND_KV), d.handle.identity)
        for _ in range(3):
            other.offer(b"an op of a second history")
            other.commit()
        head_only = dataclasses.replace(other.delta(), records=(), tip=None, checkpoints=())
        state = d.call(d.handle.engine.merge_delta, head_only)
        assert not state.complete
        line = one_error_line(ctl(d, "kv", "put", "b", "2"), ExitCode.INTEGRITY)
        assert "yet" in line, line
        one_error_line(ctl(d, "kv", "incr", "n"), ExitCode.INTEGRITY)
        assert ctl(d, "kv", "get", "a").stdout == "1\n"
        assert ctl(d, "kv", "get", "b").exit_code == ExitCode.NOT_FOUND
    finally:
        d.stop()
