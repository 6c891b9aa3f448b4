"""``offer --file`` stopped by Ctrl-C says what it committed and how to go on (``--skip``); ``range`` of
any size pages by itself; progress bars only where they cannot garble the output."""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from cli import progress
from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client
from latticed.host.config import DaemonConfig

runner = CliRunner()
MAX_FRAME = 1 << 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    root = tmp_path_factory.mktemp("records")
    d = start_in_process(
        DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock", max_frame_bytes=MAX_FRAME)
    )
    yield d
    d.stop()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def test_ctrl_c_during_offer_file_says_what_was_committed_and_how_to_go_on(
    daemon: InProcessDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [f"line {i}".encode() for i in range(5500)]
    data = tmp_path / "big.txt"
    data.write_bytes(b"\n".join(lines) + b"\n")
    with daemon.client() as c:
        c.queue_create("big")
        c.offer("big", b"before")  # the file's records do not start at offset 0
    real = Client.offer_batch
    calls = 0

    def offer_then_ctrl_c(self: Client, queue: str, records: Any) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 3:  # Ctrl-C while the third request is in flight
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, queue, records)

    monkeypatch.setattr(Client, "offer_batch", offer_then_ctrl_c)
    stopped = ctl(daemon, "offer", "big", "--file", str(data))
    monkeypatch.undo()
    assert stopped.exit_code == ExitCode.INTERRUPTED
    assert stopped.stdout == ""
    [message] = stopped.stderr.splitlines()
    assert message.startswith(f"interrupted: lines 1..3000 of {data} were offered (offsets 1..3000)")
    assert message.endswith(f"latticectl offer big --file {data} --skip 3000")
    with daemon.client() as c:
        assert c.queue_info("big")["end_offset"] == 3001, "the request in flight finished, no more"
    resumed = ctl(daemon, "offer", "big", "--file", str(data), "--skip", "3000")
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout == "3001..5500\n"
    with daemon.client() as c:
        assert [e.value for e in c.range_pages("big", 1, 10**9)] == lines


def test_skip_goes_with_file(daemon: InProcessDaemon) -> None:
    result = ctl(daemon, "offer", "big", "x", "--skip", "3")
    assert result.exit_code == ExitCode.USAGE and "--skip goes with --file" in result.stderr


def test_range_larger_than_a_reply_pages_by_itself(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        c.queue_create("wide")
        for _ in range(6):
            c.offer_batch("wide", [(b"x" * 100_000, None, ())] * 5)
        with pytest.raises(Exception, match="does not fit in one reply"):
            c.range("wide", 0, 29)
    result = ctl(daemon, "range", "wide", "0", "1999999")
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == [str(i) for i in range(30)]
    assert result.stderr == "", "no bar when stderr is not a terminal"
    empty = ctl(daemon, "range", "wide", "40", "50")
    assert empty.exit_code == 0 and empty.stdout == "" and "no records in 40..50" in empty.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_over_records_only_on_a_terminal_and_only_when_the_records_go_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    many = range(progress.MIN_RECORDS_FOR_BAR)
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # records piped into a file
    assert list(progress.over_records(many, len(many), "reading")) == list(many)
    assert "reading" in err.getvalue()
    err.seek(0)
    err.truncate()
    monkeypatch.setattr(sys, "stdout", _Terminal())  # records on the terminal: no bar between them
    assert list(progress.over_records(many, len(many), "reading")) == list(many)
    assert err.getvalue() == ""
