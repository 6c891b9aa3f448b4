"""latticectl and latticed without a daemon: help, argument errors, the error boundary, output, completion."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
from support.paths import ROOT
from typer.testing import CliRunner, Result

import cli.common
import cli.ctl
import cli.groups
import cli.latticed_command
import cli.peers
from cli import lazy
from cli.boundary import ExitCode, exit_code_for
from cli.output import entry_text, text_of_bytes, to_json
from latticed.api.client.blocking_client import Entry
from latticed.errors import (
    AlreadyExistsError,
    BadSignatureError,
    BehindPeersError,
    ConnectionClosedError,
    ForkedQueueError,
    LatticedError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
    NotReaderError,
    StorageError,
    WrongTypeError,
)
from latticed.host.config import DaemonConfig
from latticed.version import RELEASE

runner = CliRunner()
BIN = Path(sys.executable).parent


def ctl(*args: str, **kwargs: Any) -> Result:
    return runner.invoke(cli.ctl.app, list(args), prog_name="latticectl", **kwargs)


def daemon(*args: str, **kwargs: Any) -> Result:
    return runner.invoke(cli.latticed_command.app, list(args), prog_name="latticed", **kwargs)


def assert_one_line_error(result: Result, code: int, program: str = "latticectl") -> str:
    """The boundary's contract: the exit code, exactly one stderr line, nothing on stdout, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{program}: error: "), lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""
    return lines[0]


def command_paths(app: typer.Typer) -> Iterator[list[str]]:
    """Every command and group of an app, as argument lists."""

    def walk(command: Any, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return walk(typer.main.get_command(app), [])


# --- help -----------------------------------------------------------------------------------------

CTL_COMMANDS = [" ".join(p) for p in command_paths(cli.ctl.app)]
DAEMON_COMMANDS = [" ".join(p) for p in command_paths(cli.latticed_command.app)]


def test_every_command_is_there() -> None:
    expected = {
        "id", "status", "queue create", "queue list", "queue info", "offer", "peek", "first", "last",
        "range", "tail", "truncate", "meta get", "meta set", "meta list", "meta del", "kv put", "kv get",
        "kv del", "kv list",
        "kv hset", "kv hget", "kv hgetall", "kv hdel", "kv sadd", "kv srem", "kv smembers", "kv incr",
    }  # fmt: skip
    assert expected <= set(CTL_COMMANDS)
    assert {"run", "network-key new", "version", "migrate"} <= set(DAEMON_COMMANDS)


@pytest.mark.parametrize("command", CTL_COMMANDS)
def test_ctl_help(command: str) -> None:
    result = ctl(*command.split(), "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout
    assert f"latticectl {command}".strip() in result.stdout


@pytest.mark.parametrize("command", DAEMON_COMMANDS)
def test_daemon_help(command: str) -> None:
    result = daemon(*command.split(), "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout


def test_printing_commands_take_json() -> None:
    for command in ["id", "status", "queue list", "queue info", "offer", "peek", "first", "last", "range",
                    "tail", "meta get", "kv get", "kv list", "kv hget", "kv hgetall", "kv smembers",
                    "kv incr", "queue create"]:  # fmt: skip
        assert "--json" in ctl(*command.split(), "--help").stdout, command


def test_socket_option_shows_its_environment_variable() -> None:
    assert "LATTICED_SOCKET" in ctl("--help").stdout


# --- usage errors (exit 2, one line) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["queue", "create", "q", "--meta", "novalue"], "KEY=VALUE"),
        (["queue", "create", "q", "--meta", "=v"], "KEY=VALUE"),
        (["offer", "q", "v", "--header", "x"], "KEY=VALUE"),
        (["offer", "q"], "exactly one of VALUE, --file or --value-file"),
        (["offer", "q", "v", "--file", "-"], "exactly one of VALUE, --file or --value-file"),
        (["offer", "q", "--file", "a", "--value-file", "b"], "exactly one of VALUE, --file or --value-file"),
        (["range", "q", "5", "2"], "FROM 5 is after TO 2"),
        (["tail", "q", "--from", "soon"], "-N or 'end'"),
        (["kv", "list", "--owner", "a" * 64, "b" * 64 + "/x"], "two owners"),
        (["kv", "list", "--owner", "bob"], "64 hex digits"),
        (["kv", "put", "k", "v", "--ttl", "0"], "> 0"),
        (["peek", "q", "minus-one"], "OFFSET"),
        (["range", "q", "5"], "TO"),
        (["nosuch"], "nosuch"),
        (["queue", "create"], "NAME"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], needle: str, tmp_path: Path) -> None:
    line = assert_one_line_error(ctl("--socket", str(tmp_path / "none.sock"), *args), ExitCode.USAGE)
    assert needle.lower() in line.lower()
    assert "--help" in line  # says where to look


def test_meta_value_may_be_empty_or_contain_equals(tmp_path: Path) -> None:
    # Parsing succeeds, so the failure is the missing daemon (3), not usage (2).
    result = ctl(
        "--socket", str(tmp_path / "none.sock"), "queue", "create", "q", "--meta", "a=", "--meta", "b=c=d"
    )
    assert result.exit_code == ExitCode.NOT_RUNNING


def test_group_without_command_shows_help() -> None:
    result = ctl("kv")
    assert result.exit_code == ExitCode.USAGE
    assert "hgetall" in result.output


# --- daemon not running ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["id"],
        ["status", "--json"],
        ["queue", "list"],
        ["offer", "q", "v"],
        ["tail", "q", "--follow"],
        ["kv", "get", "k"],
    ],
)
def test_daemon_not_running(args: list[str], tmp_path: Path) -> None:
    sock = tmp_path / "absent.sock"
    line = assert_one_line_error(ctl("--socket", str(sock), *args), ExitCode.NOT_RUNNING)
    assert str(sock) in line


def test_socket_from_environment(tmp_path: Path) -> None:
    sock = tmp_path / "env.sock"
    line = assert_one_line_error(ctl("id", env={"LATTICED_SOCKET": str(sock)}), ExitCode.NOT_RUNNING)
    assert str(sock) in line


def test_installed_script_not_running(tmp_path: Path) -> None:
    """The real executable: exit code and a single stderr line, no traceback."""
    sock = tmp_path / "absent.sock"
    proc = subprocess.run(
        [str(BIN / "latticectl"), "--socket", str(sock), "status"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == ExitCode.NOT_RUNNING
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"latticectl: error: latticed is not running at {sock}"]


# --- the boundary, driven through a fake client ---------------------------------------------------


@dataclass
class FakeClient:
    """Stands in for latticed.api.client.blocking_client.Client; each method raises or returns ``outcome``."""

    outcome: Any

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        def call(*args: object, **kwargs: object) -> Any:
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

        return call


def with_fake(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> None:
    monkeypatch.setattr(cli.common, "Client", lambda *a, **k: FakeClient(outcome))


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NotFoundError("no queue 'x'"), ExitCode.NOT_FOUND),
        (NotOwnerError("not yours"), ExitCode.NOT_OWNER),
        (BadSignatureError("bad sig"), ExitCode.INTEGRITY),
        (ForkedQueueError("forked"), ExitCode.INTEGRITY),
        (BehindPeersError("a peer holds more of it"), ExitCode.INTEGRITY),
        (StorageError("disk full\nreally"), ExitCode.STORAGE),
        (AlreadyExistsError("exists"), ExitCode.EXISTS),
        (MalformedError("bad name"), ExitCode.USAGE),
        (WrongTypeError("key 'n' holds a plain value, not a counter"), ExitCode.WRONG_TYPE),
        (NotReaderError("not a reader of its key epoch 0"), ExitCode.NOT_READER),
        (LatticedError("other"), ExitCode.ERROR),
        (ExceptionGroup("nursery", [NotFoundError("deep")]), ExitCode.NOT_FOUND),
        (ConnectionResetError(104, "Connection reset by peer"), ExitCode.NOT_RUNNING),
    ],
)
def test_project_errors_map_to_exit_codes(
    error: BaseException, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_fake(monkeypatch, error)
    assert_one_line_error(ctl("queue", "info", "x"), code)


def test_error_code_carried_on_a_generic_error() -> None:
    generic = LatticedError("remote says no")
    generic.code = "not_owner"
    assert exit_code_for(generic) == ExitCode.NOT_OWNER
    assert exit_code_for(ConnectionClosedError("gone")) == ExitCode.NOT_RUNNING
    assert exit_code_for(ValueError("bug")) is None


def test_keyboard_interrupt_exits_130_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake(monkeypatch, KeyboardInterrupt())
    result = ctl("tail", "q", "--follow")
    assert result.exit_code == ExitCode.INTERRUPTED
    assert result.output == ""


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake(monkeypatch, ValueError("a bug"))
    result = ctl("id")
    assert isinstance(result.exception, ValueError)


def test_missing_record_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake(monkeypatch, None)
    line = assert_one_line_error(ctl("peek", "q", "7"), ExitCode.NOT_FOUND)
    assert "offset 7" in line
    assert_one_line_error(ctl("kv", "get", "nope"), ExitCode.NOT_FOUND)
    assert_one_line_error(ctl("first", "q"), ExitCode.NOT_FOUND)


def test_unreadable_offer_file_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with_fake(monkeypatch, [0])
    line = assert_one_line_error(ctl("offer", "q", "--file", str(tmp_path / "missing.txt")), ExitCode.ERROR)
    assert "No such file" in line


def test_offer_file_batches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One offer_batch round trip per OFFER_BATCH_LINES lines; CRLF and LF both end a line."""
    calls: list[list[tuple[bytes, bytes | None, Any]]] = []

    class Batching(FakeClient):
        def offer_batch(self, queue: str, records: list[tuple[bytes, bytes | None, Any]]) -> list[int]:
            start = sum(len(c) for c in calls)
            calls.append(records)
            return list(range(start, start + len(records)))

    monkeypatch.setattr(cli.common, "Client", lambda *a, **k: Batching(None))
    monkeypatch.setattr(cli.ctl, "OFFER_BATCH_LINES", 2)
    path = tmp_path / "lines.txt"
    path.write_bytes(b"a\r\nb\nc\n\nlast-without-newline")
    result = ctl("offer", "q", "--file", str(path), "--key", "k", "--header", "h=1")
    assert result.exit_code == 0, result.output
    assert result.stdout == "0..4\n"
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    assert [len(c) for c in calls] == [2, 2, 1]
    assert [r[0] for c in calls for r in c] == [b"a", b"b", b"c", b"", b"last-without-newline"]
    assert calls[0][0][1:] == (b"k", [("h", b"1")])


# --- output ---------------------------------------------------------------------------------------


def test_bytes_in_json() -> None:
    assert to_json(b"text") == "text"
    assert to_json(b"\xff\x00") == {"base64": base64.b64encode(b"\xff\x00").decode()}
    assert to_json({b"\xff": b"v", b"f": {b"m", b"a"}}) == {"base64:/w==": "v", "f": ["a", "m"]}
    entry = Entry("o/q", 3, None, b"\xfe", 17, (("ct", b"json"), ("ct", b"again")))
    assert json.loads(json.dumps(to_json(entry))) == {
        "queue": "o/q", "offset": 3, "key": None, "value": {"base64": "/g=="}, "timestamp": 17,
        "headers": [["ct", "json"], ["ct", "again"]],
    }  # fmt: skip


def test_entry_text_stays_on_one_line() -> None:
    entry = Entry("o/q", 5, b"user", b"two\nlines\t\xff", 0, (("h", b"v"),))
    assert entry_text(entry) == "5\tkey=user\th=v\ttwo\\nlines\\t\\xff"


def test_json_output_of_a_scalar(monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake(monkeypatch, b"\x80bin")
    result = ctl("peek", "q", "0", "--json")
    assert json.loads(result.stdout) == {"offset": 0, "value": {"base64": "gGJpbg=="}}
    assert ctl("peek", "q", "0").stdout == "\\x80bin\n"


# --- latticed -------------------------------------------------------------------------------------


def test_run_bad_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("data_dir = [\n")
    line = assert_one_line_error(daemon("run", "--config", str(bad)), ExitCode.USAGE, "latticed")
    assert str(bad) in line


def test_run_unknown_config_key(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('log-level = "DEBUG"\n')
    line = assert_one_line_error(daemon("run", "--config", str(conf)), ExitCode.USAGE, "latticed")
    assert "log_level" in line  # the hint for the snake_case spelling


@pytest.mark.parametrize(
    "args", [["--listen", "nonsense"], ["--peer", "[::1]"], ["--log-level", "LOUD"], ["--log-format", "xml"]]
)
def test_run_bad_options(args: list[str], tmp_path: Path) -> None:
    assert_one_line_error(
        daemon("run", "--data-dir", str(tmp_path), "--socket", str(tmp_path / "s"), *args),
        ExitCode.USAGE,
        "latticed",
    )


def test_run_missing_config_file(tmp_path: Path) -> None:
    assert_one_line_error(daemon("run", "--config", str(tmp_path / "nope.toml")), ExitCode.USAGE, "latticed")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Replace the daemon and logging set-up with recorders; returns what ``latticed run`` started."""
    calls: list[tuple[str, Any]] = []

    async def fake_run_daemon(config: DaemonConfig, **_: object) -> None:
        calls.append(("run_daemon", config))

    monkeypatch.setattr(cli.latticed_command, "run_daemon", fake_run_daemon)
    monkeypatch.setattr(
        cli.latticed_command, "configure_logging", lambda *args: calls.append(("logging", args))
    )
    return calls


def test_run_builds_the_config(started: list[tuple[str, Any]], tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('log_format = "text"\nmdns = true\npeers = ["192.0.2.1:7000"]\n')
    data, sock = str(tmp_path / "data"), str(tmp_path / "s.sock")
    result = daemon(
        "run", "--config", str(conf), "--data-dir", data, "--socket", sock, "--no-mdns",
        "--listen", "127.0.0.1:0", "--peer", "192.0.2.2:7001", "--peer", "[::1]:7002",
        "--mdns-interface", "127.0.0.1", "--log-level", "debug",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [what for what, _ in started] == ["logging", "run_daemon"]  # logging first, then the daemon
    [(_, logging_args), (_, config)] = started
    assert logging_args == ("DEBUG", "text")
    assert config.data_dir == tmp_path / "data"
    assert config.socket_path == tmp_path / "s.sock"
    assert config.mdns is False
    assert config.listen == ("127.0.0.1", 0)
    assert config.peers == (("192.0.2.2", 7001), ("::1", 7002))  # options replace the file's list
    assert config.mdns_interfaces == ("127.0.0.1",)
    assert config.log_level == "DEBUG"
    assert config.log_format == "text"  # from the file: not overridden


def test_run_failure_inside_trio_is_one_line(
    started: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def failing(config: DaemonConfig, **_: object) -> None:
        raise ExceptionGroup("root nursery", [StorageError(f"cannot write to the data directory {tmp_path}")])

    monkeypatch.setattr(cli.latticed_command, "run_daemon", failing)
    line = assert_one_line_error(
        daemon("run", "--data-dir", str(tmp_path), "--socket", str(tmp_path / "s")),
        ExitCode.STORAGE,
        "latticed",
    )
    assert "data directory" in line


def test_version() -> None:
    result = daemon("version")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == f"latticed {RELEASE}"
    assert daemon("--version").stdout == result.stdout


def test_network_key_new(tmp_path: Path) -> None:
    path = tmp_path / "network.key"
    result = daemon("network-key", "new", str(path))
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_text().strip()
    assert len(key) == 64
    assert key not in result.output  # a secret: never printed
    line = assert_one_line_error(daemon("network-key", "new", str(path)), ExitCode.EXISTS, "latticed")
    assert "not overwriting" in line
    assert path.read_text().strip() == key


# --- completion -----------------------------------------------------------------------------------


def test_show_completion_bash() -> None:
    result = ctl("--show-completion", "bash")
    assert result.exit_code == 0
    assert "_LATTICECTL_COMPLETE=complete_bash" in result.stdout
    assert "complete -o default -F" in result.stdout


def test_completion_candidates_from_the_script() -> None:
    """What bash runs on TAB, through the installed script: subcommands, then an option of one."""
    env = {
        **os.environ,
        "_LATTICECTL_COMPLETE": "complete_bash",
        "COMP_WORDS": "latticectl q",
        "COMP_CWORD": "1",
    }
    proc = subprocess.run(
        [str(BIN / "latticectl")], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["queue"]
    env.update(COMP_WORDS="latticectl kv h", COMP_CWORD="2")
    proc = subprocess.run(
        [str(BIN / "latticectl")], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert set(proc.stdout.split()) == {"hset", "hget", "hgetall", "hdel"}


def test_log_level_completion() -> None:
    env = {
        "_LATTICED_COMPLETE": "complete_bash",
        "COMP_WORDS": "latticed run --log-level W",
        "COMP_CWORD": "3",
    }
    result = daemon(env=env)
    assert result.stdout.split() == ["WARNING"]


@pytest.mark.parametrize(
    ("lags", "text"),
    [
        ({}, "in sync"),
        ({"o/a": 0, "o/b": 0}, "in sync"),
        ({"o/a": 3, "o/b": 2}, "5 records behind"),
        ({"o/a": -4}, "4 records ahead"),  # the peer holds records we lack: we are catching up
        ({"o/a": 3, "o/b": -4}, "3 records behind, 4 records ahead"),
    ],
)
def test_peer_lag_says_which_side_lacks_records(lags: dict[str, int], text: str) -> None:
    assert cli.peers.lag_text(lags) == text


@pytest.mark.parametrize(
    ("row", "text"),
    [
        ({"deltas_sent": 7, "deltas_acked": 5}, "7/5"),  # two pushes not answered yet
        ({"deltas_sent": 0, "deltas_acked": 0}, "0/0"),
        ({"deltas_sent": None, "deltas_acked": None}, "-"),  # no link: nothing counted
        ({"status": "connected"}, "-"),  # a daemon too old to count
    ],
)
def test_peer_deltas_column_is_sent_then_acked(row: dict[str, Any], text: str) -> None:
    assert cli.peers.deltas_text(row) == text


# --- --socket and --json before or after the command ----------------------------------------------


def leaf_paths(app: typer.Typer) -> Iterator[list[str]]:
    """Every command (not group) of an app, as argument lists."""

    def walk(command: Any, path: list[str]) -> Iterator[list[str]]:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            yield path
        for name, sub in (subcommands or {}).items():
            yield from walk(sub, [*path, name])

    return walk(typer.main.get_command(app), [])


CTL_LEAVES = [" ".join(p) for p in leaf_paths(cli.ctl.app)]


def test_every_command_takes_socket_after_its_name() -> None:
    assert {"status", "queue list", "kv get", "group create", "dlq list", "work"} <= set(CTL_LEAVES)
    for command in CTL_LEAVES:
        assert "--socket" in ctl(*command.split(), "--help").stdout, command


def test_socket_after_the_command(tmp_path: Path) -> None:
    sock = tmp_path / "after.sock"
    line = assert_one_line_error(ctl("status", "--socket", str(sock)), ExitCode.NOT_RUNNING)
    assert str(sock) in line


def test_socket_after_the_command_wins_over_before_and_environment(tmp_path: Path) -> None:
    before, after, env = (tmp_path / f"{n}.sock" for n in ("before", "after", "env"))
    result = ctl(
        "--socket", str(before), "kv", "get", "k", "--socket", str(after), env={"LATTICED_SOCKET": str(env)}
    )
    line = assert_one_line_error(result, ExitCode.NOT_RUNNING)
    assert str(after) in line and str(before) not in line


def test_json_before_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake(monkeypatch, b"\x80bin")
    assert json.loads(ctl("--json", "peek", "q", "0").stdout) == {
        "offset": 0,
        "value": {"base64": "gGJpbg=="},
    }
    with_fake(monkeypatch, [])
    result = ctl("--json", "queue", "list")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "[]\n", "")  # JSON says it: no note
    assert ctl("--json", "group", "list").stdout == "[]\n"  # a nested group's command too


# --- defaults in --help ---------------------------------------------------------------------------

WIDE = {"COLUMNS": "250"}  # so rich does not wrap the help text


def test_group_create_help_shows_the_defaults_the_daemon_applies() -> None:
    from latticed.crdt.group_spec import GroupSpec  # noqa: PLC0415 - heavy, and only this test needs it

    spec = GroupSpec("g", ("a/b",))
    assert {
        "max_attempts": spec.max_attempts,
        "visibility_s": spec.visibility_s,
        "backoff_base_s": spec.backoff_base_s,
        "backoff_cap_s": spec.backoff_cap_s,
        "retention_s": spec.retention_s,
        "max_consumers": spec.max_consumers,
        "max_in_flight": spec.max_in_flight,
    } == cli.groups.GROUP_DEFAULTS
    text = " ".join(ctl("group", "create", "--help", env=WIDE).stdout.split())
    for option, default in [
        ("--max-attempts", "5"),
        ("--visibility", "30s"),
        ("--retry-backoff", "1s"),
        ("--backoff-cap", "300s"),
        ("--retention", "60s"),
    ]:
        assert option in text and f"[default: ({default})]" in text, (option, text)


def test_run_help_shows_the_defaults() -> None:
    text = " ".join(daemon("run", "--help", env=WIDE).stdout.split())
    for default in ("INFO", "json", "--mdns", "none (local only)", "every queue"):
        assert f"[default: ({default})]" in text, default
    assert str(cli.latticed_command.default_data_dir()) in text


def test_a_groups_help_lists_each_command_by_its_summary_in_one_paragraph() -> None:
    """Typer's listing kept a docstring's line breaks (the command's own page joins them), so a summary
    longer than the column came out as a ragged line and a stub: each is listed by its first paragraph,
    lines joined."""
    root = typer.main.get_command(cli.ctl.app)
    listed = [sub for name in list(root.commands) for sub in lazy.subcommands(root.commands[name])]
    assert len(listed) > 60
    for command in listed:
        first = " ".join((command.help or "").split("\n\n")[0].split())
        assert command.short_help == first and "\n" not in command.short_help, command.name
    lines = ctl("--help", env=WIDE).stdout.splitlines()
    [range_line] = [line for line in lines if line.startswith("│ range ")]
    assert "or those stamped --from-time..--to-time" in range_line
    lines = ctl("queue", "--help", env=WIDE).stdout.splitlines()
    [why_line] = [line for line in lines if line.startswith("│ why ")]
    assert "behind (and who holds the rest), owner offline" in why_line


# --- what commands say ----------------------------------------------------------------------------


@dataclass
class Recorder(FakeClient):
    """A fake client that records each call (method, args, kwargs) and answers ``outcome``."""

    calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        def call(*args: object, **kwargs: object) -> Any:
            self.calls.append((name, args, kwargs))
            return self.outcome

        return call


def record(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> Recorder:
    recorder = Recorder(outcome)
    monkeypatch.setattr(cli.common, "Client", lambda *a, **k: recorder)
    return recorder


@pytest.mark.parametrize(
    ("args", "note"),
    [
        (["kv", "put", "k", "v"], "set 'k' (1 byte)"),
        (["kv", "put", "k", "vv", "--ttl", "60"], "set 'k' (2 bytes, expires in 60s)"),
        (["kv", "hset", "user", "name", "ada"], "set field 'name' of hash 'user'"),
        (["kv", "del", "k"], "deleted 'k' (if it was set)"),
        (["meta", "set", "q", "a", "1"], "set metadata 'a' of q"),
    ],
)
def test_writes_say_what_they_did_on_stderr(
    monkeypatch: pytest.MonkeyPatch, args: list[str], note: str
) -> None:
    record(monkeypatch, None)
    result = ctl(*args)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", note + "\n")


@pytest.mark.parametrize(
    ("args", "note"),
    [
        (["dlq", "list", "g"], "no dead letters in group g"),
        (["queue", "list"], "no queues yet"),
        (["group", "list"], "no groups yet"),
        (["kv", "list", "pre"], "no keys starting with 'pre'"),
        (["meta", "list", "q"], "q has no metadata"),
    ],
)
def test_empty_listings_say_so_on_stderr(monkeypatch: pytest.MonkeyPatch, args: list[str], note: str) -> None:
    record(monkeypatch, {} if args[0] in ("kv", "meta") else [])
    result = ctl(*args)
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr.startswith(note), result.stderr


@pytest.mark.parametrize(
    ("reply", "note"),
    [
        ({"dropped": 3, "start_offset": 3, "end_offset": 5}, "dropped 3 records; q now holds 3..4"),
        ({"dropped": 0, "start_offset": 7, "end_offset": 9}, "nothing dropped: q already starts at 7"),
        ({"dropped": 5, "start_offset": 100, "end_offset": 100}, "dropped 5 records; q is empty and its next "
         "record gets offset 100"),
    ],
)  # fmt: skip
def test_truncate_says_what_it_dropped(
    monkeypatch: pytest.MonkeyPatch, reply: dict[str, int], note: str
) -> None:
    record(monkeypatch, reply)
    result = ctl("truncate", "q", "100" if reply["start_offset"] == 100 else "3")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", note + "\n")
    assert json.loads(ctl("truncate", "q", "3", "--json").stdout) == reply


def test_nack_retry_time_is_never_negative_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.groups._when(100.0, now=100.02).endswith("(now)")
    assert cli.groups._when(100.0, now=99.96).endswith("(now)")  # was "(in 0.0s)" / "(in -0.0s)"
    assert cli.groups._when(100.0, now=97.5).endswith("(in 2.5s)")
    assert cli.groups._when(100.0, now=101.0).endswith("(1.0s ago)")
    record(monkeypatch, {"correlation_id": "c1", "retry_at": time.time()})
    out = ctl("nack", "g", "lease.1").stdout
    assert out.startswith("c1\tretry at ") and "-0.0" not in out


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (None, (None, None)),
        ("7", (7, None)),
        ("0", (0, None)),
        ("-3", (None, 3)),
        ("end", (None, 0)),
        ("-0", (None, 0)),
    ],
)
def test_tail_from(monkeypatch: pytest.MonkeyPatch, option: str | None, expected: tuple[Any, Any]) -> None:
    recorder = record(monkeypatch, [])
    result = ctl("tail", "q", *([] if option is None else ["--from", option]))
    assert result.exit_code == 0, result.output
    [(name, args, kwargs)] = recorder.calls
    assert name == "tail" and (args[1], kwargs["last"]) == expected


def test_offer_value_file_is_one_record_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    payload = b"line one\r\nline two\n\x00\xff\xfe binary\n"
    path = tmp_path / "blob.bin"
    path.write_bytes(payload)
    recorder = record(monkeypatch, 7)
    result = ctl("offer", "q", "--value-file", str(path), "--key", "k")
    assert (result.exit_code, result.stdout) == (0, "7\n")
    [(name, args, kwargs)] = recorder.calls
    assert (name, args, kwargs["key"]) == ("offer", ("q", payload), b"k")
    recorder.calls.clear()
    assert ctl("offer", "q", "--value-file", "-", input=payload).stdout == "7\n"
    assert recorder.calls[0][1] == ("q", payload)


def test_peek_raw_writes_the_exact_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    value = b"\x00\xffbin\nary\x1b[31m"
    record(monkeypatch, value)
    assert ctl("peek", "q", "0", "--raw").stdout_bytes == value
    # As text: readable and harmless to a terminal, lines kept.
    assert ctl("peek", "q", "0").stdout == "\\x00\\xffbin\nary\\x1b[31m\n"


def test_text_of_bytes_escapes_control_characters() -> None:
    assert text_of_bytes(b"a\x1b[2J\nb\tc\x00\x7f") == "a\\x1b[2J\nb\tc\\x00\\x7f"
    assert text_of_bytes(b"a\nb\t", single_line=True) == "a\\nb\\t"


def test_kv_list_of_another_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = "ab" * 32
    recorder = record(monkeypatch, {})
    for args in (
        [f"{owner}/pre"],
        ["pre", "--owner", owner],
        [f"{owner.upper()}/pre", "--owner", owner],
    ):
        recorder.calls.clear()
        assert ctl("kv", "list", *args).exit_code == 0
        assert recorder.calls == [("kv_list", ("pre",), {"owner": owner})], args
    recorder.calls.clear()
    ctl("kv", "list", f"{owner}/")
    assert recorder.calls == [("kv_list", ("",), {"owner": owner})]
    recorder.calls.clear()
    ctl("kv", "list", "config/db")  # not a public key: an ordinary prefix
    assert recorder.calls == [("kv_list", ("config/db",), {"owner": None})]


# --- README ---------------------------------------------------------------------------------------


def test_readme_lists_every_exit_code() -> None:
    readme = (ROOT / "README.md").read_text()
    table = re.findall(r"^\| (\d+) \| ", readme, re.MULTILINE)
    assert [int(code) for code in table] == sorted(int(code) for code in ExitCode)


# --- latticed run on a socket already served ------------------------------------------------------


def test_run_on_a_served_socket_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.latticed_command, "configure_logging", lambda *args: None)
    sock_path, data = tmp_path / "busy.sock", tmp_path / "data"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as busy:
        busy.bind(str(sock_path))
        busy.listen()
        result = daemon("run", "--data-dir", str(data), "--socket", str(sock_path), "--no-mdns")
        line = assert_one_line_error(result, ExitCode.EXISTS, "latticed")
    assert "already serving" in line
    assert not data.exists()  # no data directory, so no identity either
