"""latticectl commands against an in-process daemon, as a script or a user meets them: what ``dequeue
--env`` leaves in the temporary directory, and what ``status`` shows as text."""

from __future__ import annotations

import secrets
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from cli.boundary import ExitCode, StdoutClosed
from latticed.host.config import DaemonConfig

runner = CliRunner()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    root = tmp_path_factory.mktemp("cmds")
    d = start_in_process(
        DaemonConfig(
            data_dir=root / "data", socket_path=root / "api.sock", listen=("127.0.0.1", 0), mdns=False
        )
    )
    yield d
    d.stop()


@pytest.fixture
def tmpdir_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of this test's own, so what is left in it is ours to see."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def _group(daemon: InProcessDaemon, records: int) -> str:
    name = f"g{secrets.token_hex(4)}"
    with daemon.client() as c:
        c.queue_create(f"{name}-src")
        for i in range(records):
            c.offer(f"{name}-src", b"payload %d" % i)
        c.group_create(name, [f"{name}-src"], max_attempts=1)
    return name


def _dequeue_env(daemon: InProcessDaemon, group: str) -> dict[str, str]:
    result = ctl(daemon, "dequeue", group, "--env")
    assert result.exit_code == 0, result.output
    variables = {}
    for line in result.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        [variables[name]] = shlex.split(value)
    return variables


def test_ack_and_nack_remove_the_payload_file_dequeue_env_wrote(
    daemon: InProcessDaemon, tmpdir_: Path
) -> None:
    group = _group(daemon, 3)
    acked, nacked, stale = (_dequeue_env(daemon, group) for _ in range(3))
    files = [Path(v["LATTICE_PAYLOAD"]) for v in (acked, nacked, stale)]
    assert all(f.parent == tmpdir_ for f in files) and files[0].read_bytes() == b"payload 0"
    assert ctl(daemon, "ack", group, acked["LATTICE_LEASE"]).exit_code == 0
    assert not files[0].exists() and files[1].exists()
    assert ctl(daemon, "nack", group, nacked["LATTICE_LEASE"]).exit_code == 0
    assert not files[1].exists() and files[2].exists()
    with daemon.client() as c:  # the lease is gone before the script settles it: exit 9, file gone too
        c.ack(group, stale["LATTICE_LEASE"])
    assert ctl(daemon, "ack", group, stale["LATTICE_LEASE"]).exit_code == ExitCode.LEASE
    assert list(tmpdir_.iterdir()) == []


def test_a_payload_out_file_is_the_callers_and_stays(daemon: InProcessDaemon, tmpdir_: Path) -> None:
    group = _group(daemon, 1)
    chosen = tmpdir_ / "mine.bin"
    result = ctl(daemon, "dequeue", group, "--env", "--payload-out", str(chosen))
    lease = next(line for line in result.stdout.splitlines() if "LATTICE_LEASE=" in line).partition("=")[2]
    assert ctl(daemon, "ack", group, shlex.split(lease)[0]).exit_code == 0
    assert chosen.read_bytes() == b"payload 0"


def test_a_dequeue_env_whose_reader_went_away_removes_its_file(
    daemon: InProcessDaemon, tmpdir_: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _group(daemon, 1)

    def closed(*args: object, **kwargs: object) -> None:
        raise StdoutClosed

    import cli.groups  # noqa: PLC0415 - latticectl loads it lazily

    monkeypatch.setattr(cli.groups, "emit", closed)
    result = ctl(daemon, "dequeue", group, "--env")
    assert result.exit_code == ExitCode.STDOUT_CLOSED
    assert list(tmpdir_.iterdir()) == []


def test_status_text_shows_the_counters_the_docs_list(daemon: InProcessDaemon) -> None:
    # One write of its own, so the count of transactions does not depend on the tests run before it.
    with daemon.client() as c:
        c.queue_create("counted")
        c.offer("counted", b"one")
    result = ctl(daemon, "status")
    assert result.exit_code == 0, result.output
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in result.stdout.splitlines()}
    with daemon.client() as c:
        info = c.status()
    assert int(lines["transactions"]) >= 1
    replication = dict(pair.split("=", 1) for pair in lines["replication"].split(", "))
    assert set(replication) == set(info["replication"]) and replication["connected"] == "0"
    assert replication["queues_cut_off"] == "0" and lines["off the eager tree"] == "none"
    retention = dict(pair.split("=", 1) for pair in lines["retention"].split(", "))
    assert set(retention) == set(info["retention"])
    assert retention["records_truncated"] == "0" and retention["bytes_truncated"] == "0 B"
