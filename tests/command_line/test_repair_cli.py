"""``latticectl queue repair`` (one line, exit code 0 when repaired and 1 when refused, no traceback) and
``latticectl doctor`` with the daemon stopped, which reads the store read-only and names each queue found
corrupt with the ``queue repair`` command for it, as the running daemon's doctor does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.corrupt_daemon import make_corrupt
from support.inprocess import daemon_at
from typer.testing import CliRunner, Result

import cli.ctl
from cli import repair_commands
from cli.boundary import ExitCode
from cli.offline_store import store_checks
from latticed.crdt.signing import Identity
from latticed.host.paths import identity_key_path

runner = CliRunner()


def _ctl(socket: Path, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(socket), *args], prog_name="latticectl")


def test_queue_repair_says_what_it_did_or_why_not_in_one_line(tmp_path: Path) -> None:
    x = make_corrupt(tmp_path)
    with daemon_at(tmp_path) as d:
        refused = _ctl(d.socket, "queue", "repair", "own")
        assert refused.exit_code == ExitCode.ERROR and refused.stdout == ""
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith("not repaired: ") and "--drop" in refused.stderr
        assert _ctl(d.socket, "queue", "repair", "good").exit_code == ExitCode.ERROR
        assert _ctl(d.socket, "queue", "repair", "nope").exit_code == ExitCode.NOT_FOUND

        done = _ctl(d.socket, "queue", "repair", x)
        assert done.exit_code == 0, done.output
        assert done.stdout.count("\n") == 1 and done.stdout.startswith(f"dropped the corrupt copy of {x}")
        dropped = _ctl(d.socket, "queue", "repair", "own", "--drop", "--json")
        assert dropped.exit_code == 0, dropped.output
        assert json.loads(dropped.stdout)["records"] == 2
        again = _ctl(d.socket, "queue", "repair", "own", "--json")
        assert again.exit_code == ExitCode.NOT_FOUND
        fork = _ctl(d.socket, "queue", "create", "own")  # peers hold what it had: refused, one line
        assert fork.exit_code == ExitCode.INTEGRITY and fork.stderr.count("\n") == 1, fork.output
        assert "Traceback" not in fork.stderr and "queue repair own --release" in fork.stderr
        released = _ctl(d.socket, "queue", "repair", "own", "--release")
        assert released.exit_code == 0 and released.stdout.count("\n") == 1, released.output
        assert _ctl(d.socket, "queue", "create", "own").exit_code == 0
        twice = _ctl(d.socket, "queue", "repair", "own", "--release")
        assert twice.exit_code == ExitCode.ERROR and "nothing to release" in twice.stderr


def test_doctor_without_the_daemon_names_the_corrupt_queues_and_their_repair(tmp_path: Path) -> None:
    x = make_corrupt(tmp_path)
    data = tmp_path / "data"
    config = tmp_path / "latticed.toml"
    config.write_text(f'data_dir = "{data}"\nsocket_path = "{tmp_path / "api.sock"}"\n')
    before = (data / "latticed.db").read_bytes()
    result = runner.invoke(cli.ctl.app, ["doctor", "--json", "--config", str(config)], prog_name="latticectl")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["daemon_running"] is False
    store = [c for c in report["checks"] if c["check"] == "store"]
    own = Identity.from_seed(identity_key_path(data).read_bytes()).public_key.hex() + "/own"
    assert sorted(c["detail"].split(": its stored")[0].rsplit(" ", 1)[-1] for c in store) == sorted([x, own])
    assert all(c["ok"] is False for c in store)
    fixes = " ".join(c["fix"] for c in store)
    assert f"`latticectl queue repair {x}`" in fixes and "`latticectl queue repair own --drop`" in fixes
    assert (data / "latticed.db").read_bytes() == before

    with daemon_at(tmp_path) as d, d.client() as client:
        client.queue_repair(x)
        client.queue_repair("own", drop=True)
    result = runner.invoke(cli.ctl.app, ["doctor", "--json", "--config", str(config)], prog_name="latticectl")
    store = [c for c in json.loads(result.stdout)["checks"] if c["check"] == "store"]
    assert [(c["ok"], "1 core-2 queue(s) read" in c["detail"]) for c in store] == [(True, True)]


def test_the_offline_store_check_of_a_data_dir_without_a_store_is_not_applicable(tmp_path: Path) -> None:
    (check,) = store_checks(tmp_path)
    assert check.check == "store" and check.ok is None and "no store at" in check.detail
    help_text = runner.invoke(cli.ctl.app, ["queue", "repair", "--help"], prog_name="latticectl").stdout
    assert "--drop" in help_text and repair_commands.repair.__doc__ is not None


def test_a_store_this_user_may_not_read_is_not_a_failure_but_says_whose_doctor_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "latticed.db").write_bytes(b"")
    monkeypatch.setattr("cli.offline_store.os.access", lambda path, mode: False)  # as a user other than root
    (check,) = store_checks(tmp_path)
    assert check.ok is None and "run doctor as the daemon's user" in check.detail


def test_status_stays_readable_while_queues_are_corrupt_naming_each_with_its_repair(tmp_path: Path) -> None:
    x = make_corrupt(tmp_path)
    with daemon_at(tmp_path) as d:
        shown = _ctl(d.socket, "status")
        assert shown.exit_code == 0, shown.output  # was exit 7: the first corrupt queue's StorageError
        [line] = [line for line in shown.stdout.splitlines() if line.startswith("corrupt queues:")]
        assert f"{x}: not what its owner signed, not served; `latticectl queue repair {x}`" in line, line
        assert "/own: not what its owner signed, not served; `latticectl queue repair own --drop`" in line
        facts = json.loads(_ctl(d.socket, "status", "--json").stdout)
        assert sorted(c["queue"].rpartition("/")[2] for c in facts["corrupt_queues"]) == ["own", "x"]
        assert facts["queues"] == 3 and facts["records"] == 1  # only ``good`` is counted
        assert _ctl(d.socket, "queue", "repair", x).exit_code == 0
        after = json.loads(_ctl(d.socket, "status", "--json").stdout)
        assert [c["queue"].rpartition("/")[2] for c in after["corrupt_queues"]] == ["own"]
