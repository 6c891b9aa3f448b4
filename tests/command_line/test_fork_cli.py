"""latticectl and queues on fork core 2: ``queue create --core 2`` (and a clear line from a daemon too old
for it), a fork shown by ``queue info``/``status``/``queue fork show``, a refused write (exit 6),
``queue recover``, and a ``tail --follow`` that says on stderr what happened and goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from support.inprocess import InProcessDaemon, start_in_process
from support.paths import ROOT
from typer.testing import CliRunner, Result

import cli.ctl
from cli.boundary import ExitCode
from cli.fork_commands import fork_text
from latticed.api.client.blocking_client import Client
from latticed.api.server.core2_handlers import recover_hint
from latticed.crdt import queue2
from latticed.crdt.queue2 import Delta
from latticed.crdt.records import make_record
from latticed.host.config import DaemonConfig
from latticed.storage.core2_engine import Core2Engine
from latticed.storage.core2_view import frozen_since_ms
from latticed.storage.engine import Engine

runner = CliRunner()
NOW = 1_700_000_000_000


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    d = start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))
    yield d
    d.stop()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def _fork(daemon: InProcessDaemon, name: str, copy_dir: Path, copy_records: int) -> Delta:
    """What a copy of the owner's store that went on writing ``copy_records`` holds (merge it to fork)."""
    engine = daemon.handle.engine

    async def take() -> Delta:
        q = engine.core2.lookup(engine.public_key, name)
        assert q is not None
        return await engine.core2.delta_for(q, None)

    held: Delta = daemon.call(take)
    copy_dir.mkdir()

    async def copy() -> Delta:
        async with Engine.open(copy_dir, daemon.handle.identity) as e:
            c = Core2Engine(e)
            merged = await c.merge(held)
            await c.commit(
                merged.q, [make_record(b"copy%d" % i, timestamp=NOW + i) for i in range(copy_records)]
            )
            return await c.delta_for(merged.q, None)

    result: Delta = trio.run(copy)
    return result


def _merge(daemon: InProcessDaemon, d: Delta) -> None:
    engine = daemon.handle.engine

    async def merge() -> None:
        await engine.core2.merge(d)

    daemon.call(merge)


class _Follow:
    """``latticectl tail NAME --follow`` in its own process; its stdout and stderr lines as they come."""

    def __init__(self, daemon: InProcessDaemon, name: str) -> None:
        script = (
            "import sys; from cli.entry import latticectl; "
            f"sys.argv = ['latticectl', '--socket', {str(daemon.socket)!r}, 'tail', {name!r}, '--follow']; "
            "latticectl()"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self._guard = threading.Timer(60, self.proc.kill)  # a hung read must not hang the suite
        self._guard.start()

    def out(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().rstrip("\n")

    def err(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.readline().rstrip("\n")

    def stop(self) -> None:
        self._guard.cancel()
        self.proc.kill()
        self.proc.wait(10)


def test_a_forked_queue_through_latticectl(daemon: InProcessDaemon, tmp_path: Path) -> None:
    created = ctl(daemon, "queue", "create", "f", "--core", "2")
    assert created.exit_code == 0, created.output
    with daemon.client() as c:
        c.offer_batch("f", [(b"s%d" % i, None, []) for i in range(10)])
        copied = _fork(daemon, "f", tmp_path / "copy", 3)
        c.offer_batch("f", [(b"o%d" % i, None, []) for i in range(2)])
    listed = ctl(daemon, "queue", "list")
    assert listed.stdout.splitlines()[0].split()[-2:] == ["CORE", "FORKED"]
    follow = _Follow(daemon, "f")
    try:
        lines = [follow.out() for _ in range(12)]
        assert [line.split("\t")[0] for line in lines] == [str(i) for i in range(12)]
        _merge(daemon, copied)
        assert follow.err() == (
            f"queue {daemon.handle.identity.public_key.hex()}/f forked at offset 10: frozen; "
            "waiting for its owner's recovery"
        )
        refused = ctl(daemon, "offer", "f", "x")
        assert refused.exit_code == ExitCode.INTEGRITY
        assert "forked at offset 10" in refused.stderr and len(refused.stderr.splitlines()) == 1
        info = ctl(daemon, "queue", "info", "f")
        assert "forked at offset 10, frozen since " in info.stdout
        assert "recover with `latticectl queue recover f`" in info.stdout
        assert "forked at offset 10" in ctl(daemon, "status").stdout
        shown = ctl(daemon, "queue", "fork", "show", "f")
        assert shown.exit_code == 0, shown.output
        assert "2 records in 1 piece(s)" in shown.stdout and "10\to0" in shown.stdout
        recovered = ctl(daemon, "queue", "recover", "f")
        assert recovered.exit_code == 0, recovered.output
        assert "epoch 1" in recovered.stdout
        assert follow.err().endswith("recovered by its owner (epoch 1): going on from offset 10")
        assert ctl(daemon, "offer", "f", "after").exit_code == 0
        assert follow.out() == "10\tafter"
    finally:
        follow.stop()


def test_recover_refusals_and_a_daemon_too_old_for_core_2(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ctl(daemon, "queue", "create", "one").exit_code == 0
    other_core = ctl(daemon, "queue", "recover", "one")
    assert other_core.exit_code == ExitCode.USAGE and "queue upgrade one" in other_core.stderr
    assert ctl(daemon, "queue", "create", "two", "--core", "2").exit_code == 0
    not_forked = ctl(daemon, "queue", "recover", "two")
    assert not_forked.exit_code == ExitCode.USAGE and "not forked" in not_forked.stderr
    assert ctl(daemon, "queue", "create", "three", "--core", "3").exit_code == ExitCode.USAGE

    real_call = Client.call
    calls: list[str] = []

    def older(self: Client, op: str, **args: Any) -> dict[str, Any]:
        calls.append(op)
        reply = real_call(self, op, **args)
        if op == "hello":  # what a daemon from before fork core 2 answers
            return {k: v for k, v in reply.items() if k != "queue_cores"} | {"release": "0.2.0"}
        return reply

    monkeypatch.setattr(Client, "call", older)
    gap = ctl(daemon, "queue", "create", "old", "--core", "2")
    assert gap.exit_code == ExitCode.ERROR
    assert (
        gap.stderr.count("\n") == 1
        and "latticed 0.2.0, which cannot create queues on fork core 2" in gap.stderr
    )
    assert "queue_create" not in calls  # nothing was created


def test_the_fork_line_and_the_bounds_it_reads() -> None:
    info = {"core": 2, "forked": True, "fork_point": 7, "name": "q", "owned": False, "frozen_since_ms": None}
    assert (
        fork_text(info)
        == "forked at offset 7, frozen since ?, waiting for its owner's `latticectl queue recover`"
    )
    assert fork_text({**info, "core": 1}) is None
    assert f"`{recover_hint('q')}`" in str(fork_text({**info, "owned": True}))
    assert frozen_since_ms(queue2.empty_state(b"\x01" * 32, "q")) is None  # not forked: not frozen
