"""latticectl and latticed without a daemon: help, argument errors, the error boundary, output, completion."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

import cli.ctl
import cli.daemon
from cli.boundary import ExitCode, exit_code_for
from cli.output import entry_text, to_json
from latticed.api.client import Entry
from latticed.config import DaemonConfig
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
    StorageError,
    WrongTypeError,
)

runner = CliRunner()
BIN = Path(sys.executable).parent


def ctl(*args: str, **kwargs: Any) -> Result:
    return runner.invoke(cli.ctl.app, list(args), prog_name="latticectl", **kwargs)


def daemon(*args: str, **kwargs: Any) -> Result:
    return runner.invoke(cli.daemon.app, list(args), prog_name="latticed", **kwargs)


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
DAEMON_COMMANDS = [" ".join(p) for p in command_paths(cli.daemon.app)]


def test_every_command_is_there() -> None:
    expected = {
        "id", "status", "queue create", "queue list", "queue info", "offer", "peek", "first", "last",
        "range", "tail", "truncate", "meta get", "meta set", "kv put", "kv get", "kv del", "kv list",
        "kv hset", "kv hget", "kv hgetall", "kv hdel", "kv sadd", "kv srem", "kv smembers", "kv incr",
    }  # fmt: skip
    assert expected <= set(CTL_COMMANDS)
    assert {"run", "network-key new", "version"} <= set(DAEMON_COMMANDS)


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
        (["offer", "q"], "either VALUE or --file"),
        (["offer", "q", "v", "--file", "-"], "either VALUE or --file"),
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
    """Stands in for latticed.api.client.Client; each method raises or returns ``outcome``."""

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
    monkeypatch.setattr(cli.ctl, "Client", lambda *a, **k: FakeClient(outcome))


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

    monkeypatch.setattr(cli.ctl, "Client", lambda *a, **k: Batching(None))
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

    monkeypatch.setattr(cli.daemon, "run_daemon", fake_run_daemon)
    monkeypatch.setattr(cli.daemon, "configure_logging", lambda *args: calls.append(("logging", args)))
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

    monkeypatch.setattr(cli.daemon, "run_daemon", failing)
    line = assert_one_line_error(
        daemon("run", "--data-dir", str(tmp_path), "--socket", str(tmp_path / "s")),
        ExitCode.STORAGE,
        "latticed",
    )
    assert "data directory" in line


def test_version() -> None:
    result = daemon("version")
    assert result.exit_code == 0
    assert result.stdout.strip() == "0.1.0"


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
    assert cli.ctl._lag_text(lags) == text
