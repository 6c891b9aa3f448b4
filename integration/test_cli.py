"""Every latticectl command end to end against a real ``latticed run`` process.

One daemon serves the whole module (started through the installed ``latticed`` script); each test uses
its own queue and key names. Most commands go through ``CliRunner``; exit codes, stderr, pipes and signals
go through the installed ``latticectl`` script.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import queue as queue_mod
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from typer.testing import CliRunner, Result

import cli.ctl
from cli.boundary import ExitCode

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0
WAIT_S = 10.0

runner = CliRunner()


@dataclass
class Daemon:
    """A running daemon and how to reach it."""

    socket: Path
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def ctl(self, *args: str, input: str | bytes | None = None) -> Result:
        """latticectl in-process (CliRunner)."""
        return runner.invoke(
            cli.ctl.app, ["--socket", str(self.socket), *args], input=input, prog_name="latticectl"
        )

    def ok(self, *args: str, input: str | bytes | None = None) -> str:
        """Run a command that must succeed; its stdout."""
        result = self.ctl(*args, input=input)
        assert result.exit_code == 0, (args, result.exit_code, result.output)
        assert result.stderr == ""
        return result.stdout

    def write(self, *args: str) -> str:
        """Run a command that prints no result: it must succeed and say what it did in one stderr line."""
        result = self.ctl(*args)
        assert result.exit_code == 0, (args, result.exit_code, result.output)
        assert result.stdout == ""
        [line] = result.stderr.splitlines()
        assert not line.startswith("latticectl: error")
        return line

    def fails(self, code: int | tuple[int, ...], *args: str) -> str:
        """Run a command that must fail with ``code``: one stderr line, no traceback, no stdout."""
        result = self.ctl(*args)
        codes = code if isinstance(code, tuple) else (code,)
        assert result.exit_code in codes, (args, result.exit_code, result.output)
        assert "Traceback" not in result.output
        assert result.stdout == ""
        [line] = result.stderr.splitlines()
        assert line.startswith("latticectl: error: ")
        return line

    def script(self, *args: str) -> list[str]:
        """Argv of the installed latticectl script against this daemon."""
        return [str(BIN / "latticectl"), "--socket", str(self.socket), *args]


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """``latticed run`` in a fresh data dir; ready when it says READY=1 (sd_notify) or its socket accepts."""
    base = tmp_path_factory.mktemp("cli")
    sock, data, log = base / "s.sock", base / "data", base / "daemon.log"
    notify_path = base / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path)}
    env.pop("LATTICED_SOCKET", None)
    argv = [str(BIN / "latticed"), "run", "--data-dir", str(data), "--socket", str(sock), "--no-mdns"]
    with log.open("wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = False
        while not ready:
            assert proc.poll() is None, f"latticed exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, (
                f"latticed not ready in {START_TIMEOUT_S}s:\n{log.read_text()}"
            )
            # Wake on the READY=1 datagram, else re-check the socket now and then.
            if select.select([notify], [], [], 0.05)[0]:
                ready = b"READY=1" in notify.recv(4096).split(b"\n")
            ready = ready or _accepts(sock)
        yield Daemon(sock, data, proc, log)
    finally:
        notify.close()
        proc.terminate()
        try:
            code = proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        assert code == 0, f"latticed exited {code} on SIGTERM:\n{log.read_text()}"  # a clean shutdown


@pytest.fixture
def identity(daemon: Daemon) -> str:
    return daemon.ok("id").strip()


@pytest.fixture
def qname(daemon: Daemon) -> str:
    """A new queue of this daemon, with a name no other test uses."""
    name = f"q{secrets.token_hex(4)}"
    daemon.ok("queue", "create", name)
    return name


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines()]


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll a cheap condition (a round trip to the daemon) until it holds; bounded."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Lines:
    """Lines of a child's stdout, read by a thread so a test can wait for the next one with a timeout."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._lines: queue_mod.Queue[bytes] = queue_mod.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._lines.put(line)

    def next(self) -> bytes:
        return self._lines.get(timeout=WAIT_S)

    def next_within(self, timeout: float) -> bytes:
        """The next line, or queue.Empty after ``timeout``."""
        return self._lines.get(timeout=timeout)


# --- identity and status --------------------------------------------------------------------------


def test_id(daemon: Daemon, identity: str) -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", identity)
    assert json.loads(daemon.ok("id", "--json")) == {"identity": identity}


def test_status(daemon: Daemon, identity: str) -> None:
    raw = json.loads(daemon.ok("status", "--json"))
    expected = {"identity", "version", "uptime_s", "queues", "records", "storage_bytes", "data_dir", "socket"}
    assert expected <= set(raw)
    assert raw["identity"] == identity
    text = daemon.ok("status")
    assert re.search(rf"^identity:\s+{identity}$", text, re.MULTILINE), text
    for label in ("version", "uptime", "queues", "records", "storage"):
        assert re.search(rf"^{label}:", text, re.MULTILINE), text


def test_installed_script(daemon: Daemon, identity: str) -> None:
    proc = subprocess.run(daemon.script("id"), capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, identity + "\n", "")
    proc = subprocess.run(
        daemon.script("queue", "info", "no-such-queue"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == ExitCode.NOT_FOUND
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("latticectl: error: ")


# --- queues ---------------------------------------------------------------------------------------


def test_queue_create_list_info(daemon: Daemon, identity: str) -> None:
    name = f"q{secrets.token_hex(4)}"
    full = daemon.ok("queue", "create", name, "--meta", "team=data", "--meta", "expr=a=b").strip()
    assert full == f"{identity}/{name}"

    listed = json.loads(daemon.ok("queue", "list", "--json"))
    assert full in {q["queue"] for q in listed}
    text = daemon.ok("queue", "list")
    assert text.splitlines()[0].split() == ["QUEUE", "SIZE", "START", "END", "CORE", "FORKED"]
    assert any(line.split()[0] == full for line in text.splitlines()[1:])

    info = json.loads(daemon.ok("queue", "info", name, "--json"))
    assert {"owner", "name", "start_offset", "end_offset", "size", "meta", "forked"} <= set(info)
    assert (info["owner"], info["name"], info["size"], info["forked"]) == (identity, name, 0, False)
    assert info["meta"] == {"team": "data", "expr": "a=b"}
    assert json.loads(daemon.ok("queue", "info", full, "--json")) == info  # OWNER/NAME names the same
    assert re.search(r"^size:\s+0$", daemon.ok("queue", "info", name), re.MULTILINE)


# --- records --------------------------------------------------------------------------------------


def test_offer_peek_first_last_range_tail(daemon: Daemon, qname: str) -> None:
    assert daemon.ok("offer", qname, "hello world") == "0\n"
    assert daemon.ok("offer", qname, "two\nlines", "--key", "k1", "-H", "ct=text", "-H", "ct=again") == "1\n"
    # A command-line argument that is not UTF-8 (surrogate-escaped by Python) is stored as the raw bytes.
    assert json.loads(daemon.ok("offer", qname, "bin\udcff", "--json")) == {"offset": 2}

    assert daemon.ok("peek", qname, "0") == "hello world\n"
    assert daemon.ok("peek", qname, "1") == "two\nlines\n"
    assert daemon.ok("peek", qname, "2") == "bin\\xff\n"
    assert json.loads(daemon.ok("peek", qname, "2", "--json")) == {
        "offset": 2,
        "value": {"base64": "Ymlu/w=="},
    }
    assert daemon.ok("peek", qname, "1", "--entry") == "1\tkey=k1\tct=text\tct=again\ttwo\\nlines\n"
    entry = json.loads(daemon.ok("peek", qname, "1", "--entry", "--json"))
    assert entry["offset"] == 1
    assert entry["key"] == "k1"
    assert entry["value"] == "two\nlines"
    assert entry["headers"] == [["ct", "text"], ["ct", "again"]]
    assert isinstance(entry["timestamp"], int)
    daemon.fails(ExitCode.NOT_FOUND, "peek", qname, "99")

    assert daemon.ok("first", qname) == "0\thello world\n"
    assert json.loads(daemon.ok("last", qname, "--json"))["value"] == {"base64": "Ymlu/w=="}

    assert daemon.ok("range", qname, "0", "1").splitlines() == [
        "0\thello world",
        "1\tkey=k1\tct=text\tct=again\ttwo\\nlines",
    ]
    assert [e["offset"] for e in json_lines(daemon.ok("range", qname, "1", "2", "--json"))] == [1, 2]

    assert [e["offset"] for e in json_lines(daemon.ok("tail", qname, "--from", "0", "--json"))] == [0, 1, 2]
    assert daemon.ok("tail", qname, "--from", "2") == "2\tbin\\xff\n"


def test_first_of_empty_queue_is_not_found(daemon: Daemon, qname: str) -> None:
    daemon.fails(ExitCode.NOT_FOUND, "first", qname)
    daemon.fails(ExitCode.NOT_FOUND, "last", qname)


def test_offer_file(daemon: Daemon, qname: str, tmp_path: Path) -> None:
    lines = [f"line {i}" for i in range(2500)]
    path = tmp_path / "records.txt"
    path.write_text("\n".join(lines) + "\n")
    assert daemon.ok("offer", qname, "--file", str(path), "--header", "src=file") == "0..2499\n"
    # stdin, through CliRunner's input
    summary = json.loads(daemon.ok("offer", qname, "--file", "-", "--json", input="x\ny\n"))
    assert summary == {"first": 2500, "last": 2501, "count": 2}
    assert daemon.ok("peek", qname, "1234") == "line 1234\n"
    assert daemon.ok("peek", qname, "2499", "--entry") == "2499\tsrc=file\tline 2499\n"
    assert daemon.ok("peek", qname, "2501", "--entry") == "2501\ty\n"
    assert json.loads(daemon.ok("queue", "info", qname, "--json"))["size"] == 2502


def test_offer_stdin_of_the_real_script(daemon: Daemon, qname: str) -> None:
    proc = subprocess.run(
        daemon.script("offer", qname, "--file", "-"),
        input=b"a\nb\nc",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"0..2\n", b"")  # no progress bar on a pipe


def _read_all(fd: int, into: bytearray) -> None:
    """Read a pseudo-terminal until its other end is closed everywhere (EIO), so the writer never blocks."""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 65536):
            into += chunk


def test_offer_file_shows_a_progress_bar_on_a_terminal_only(
    daemon: Daemon, qname: str, tmp_path: Path
) -> None:
    path = tmp_path / "records.txt"
    path.write_bytes(b"".join(b"record %d\n" % i for i in range(3000)))
    argv = daemon.script("offer", qname, "--file", str(path))
    leader, follower = pty.openpty()
    drawn = bytearray()
    reader = threading.Thread(target=_read_all, args=(leader, drawn))
    reader.start()
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower, timeout=60, check=False
        )
    finally:
        os.close(follower)
        reader.join(30)
        os.close(leader)
    assert (proc.returncode, proc.stdout) == (0, b"0..2999\n")  # stdout stays exactly the result
    assert b"offering" in drawn and b"100%" in drawn, drawn
    # stderr not a terminal (stdout is): no bar, not even its label
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(argv, stdout=follower, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(follower)
        os.close(leader)
    assert (proc.returncode, proc.stderr) == (0, b"")


def test_tail_follow_sees_a_later_record_and_stops_on_ctrl_c(daemon: Daemon, qname: str) -> None:
    daemon.ok("offer", qname, "before")
    # Ctrl-C as a terminal gives it: a test run started in the background (CI under `cmd &`) has SIGINT
    # ignored, which a child inherits (Python then installs no KeyboardInterrupt handler); a handler here
    # is reset to the default at exec.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            daemon.script("tail", qname, "--from", "0", "--follow", "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stdout is not None
        lines = Lines(proc.stdout)
        assert json.loads(lines.next())["value"] == "before"  # the tail is running
        daemon.ok("offer", qname, "after")
        assert json.loads(lines.next()) | {"timestamp": 0} == {
            "queue": json.loads(daemon.ok("queue", "info", qname, "--json"))["queue"],
            "offset": 1,
            "key": None,
            "value": "after",
            "timestamp": 0,
            "headers": [],
        }
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT_S) == ExitCode.INTERRUPTED
        assert proc.stderr is not None
        assert proc.stderr.read() == b""
    finally:
        proc.kill()
        proc.wait()


def test_tail_into_head_exits_quietly(daemon: Daemon, qname: str) -> None:
    """``latticectl tail q --follow | head -1``: the next write hits a closed pipe; no traceback."""
    daemon.ok("offer", qname, "first")
    tail = subprocess.Popen(
        daemon.script("tail", qname, "--from", "0", "--follow"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.Popen(["head", "-n", "1"], stdin=tail.stdout, stdout=subprocess.PIPE)
    assert tail.stdout is not None
    tail.stdout.close()  # only head holds the read end now
    try:
        assert head.communicate(timeout=WAIT_S)[0] == b"0\tfirst\n"
        daemon.ok("offer", qname, "second")  # tail writes it, into a pipe nobody reads
        assert tail.wait(timeout=WAIT_S) == ExitCode.STDOUT_CLOSED
        assert tail.stderr is not None
        assert tail.stderr.read() == b""
    finally:
        tail.kill()
        tail.wait()


def test_big_listing_into_head_exits_quietly(daemon: Daemon, qname: str, tmp_path: Path) -> None:
    path = tmp_path / "many.txt"
    path.write_text("".join(f"record number {i}\n" for i in range(20000)))  # far more than a pipe holds
    daemon.ok("offer", qname, "--file", str(path))
    proc = subprocess.run(
        f"{' '.join(daemon.script('range', qname, '0', '19999'))} | head -n 1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout == b"0\trecord number 0\n"
    assert proc.stderr == b""
    assert proc.returncode == ExitCode.STDOUT_CLOSED


def test_truncate(daemon: Daemon, qname: str) -> None:
    for i in range(5):
        daemon.ok("offer", qname, f"r{i}")
    assert daemon.write("truncate", qname, "3") == f"dropped 3 records; {qname} now holds 3..4"
    assert daemon.ok("first", qname) == "3\tr3\n"
    info = json.loads(daemon.ok("queue", "info", qname, "--json"))
    assert (info["start_offset"], info["end_offset"], info["size"]) == (3, 5, 2)
    daemon.fails(ExitCode.NOT_FOUND, "peek", qname, "1")
    assert daemon.write("truncate", qname, "2") == f"nothing dropped: {qname} already starts at 3"
    note = daemon.write("truncate", qname, "100")  # past the end
    assert note == f"dropped 2 records; {qname} is empty and its next record gets offset 100"
    assert daemon.ok("offer", qname, "next") == "100\n"
    assert json.loads(daemon.ok("truncate", qname, "101", "--json")) == {
        "dropped": 1,
        "start_offset": 101,
        "end_offset": 101,
    }


def test_range_says_why_it_is_empty_and_refuses_a_reversed_one(daemon: Daemon, qname: str) -> None:
    daemon.ok("offer", qname, "only")
    result = daemon.ctl("range", qname, "5", "9")
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == f"no records in 5..9 of {qname}: it holds 0..0\n"
    assert "FROM 9 is after TO 5" in daemon.fails(ExitCode.USAGE, "range", qname, "9", "5")


def test_tail_from_the_end_and_the_last_n(daemon: Daemon, qname: str) -> None:
    for i in range(5):
        daemon.ok("offer", qname, f"old {i}")
    assert daemon.ok("tail", qname, "--from", "-2") == "3\told 3\n4\told 4\n"
    assert daemon.ok("tail", qname, "--from=-9") == "".join(f"{i}\told {i}\n" for i in range(5))
    assert daemon.ok("tail", qname, "--from", "end") == ""
    proc = subprocess.Popen(
        daemon.script("tail", qname, "--from", "end", "--follow"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        lines = Lines(proc.stdout)
        # The tail has started once a record offered after it shows; keep offering until one does.
        deadline = time.monotonic() + WAIT_S
        first = b""
        while not first:
            assert time.monotonic() < deadline, "the tail printed nothing"
            daemon.ok("offer", qname, "new")
            with contextlib.suppress(queue_mod.Empty):
                first = lines.next_within(0.2)
        offset, value = first.decode().rstrip("\n").split("\t")
        assert int(offset) >= 5 and value == "new"  # nothing from before the tail began
    finally:
        proc.kill()
        proc.wait()


def test_binary_and_multi_line_values_round_trip(daemon: Daemon, qname: str, tmp_path: Path) -> None:
    payload = b"line one\r\nline two\n\x00\xff\xfe\x1b[2J binary\n"
    path = tmp_path / "blob.bin"
    path.write_bytes(payload)
    assert daemon.ok("offer", qname, "--value-file", str(path)) == "0\n"
    proc = subprocess.run(
        daemon.script("offer", qname, "--value-file", "-"),
        input=payload,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (0, b"1\n")
    for offset in ("0", "1"):
        raw = subprocess.run(
            daemon.script("peek", qname, offset, "--raw"), capture_output=True, timeout=60, check=False
        )
        assert (raw.returncode, raw.stdout, raw.stderr) == (0, payload, b"")
    assert daemon.ok("peek", qname, "0") == "line one\\r\nline two\n\\x00\\xff\\xfe\\x1b[2J binary\n\n"
    assert json.loads(daemon.ok("queue", "info", qname, "--json"))["size"] == 2


def test_socket_and_json_before_or_after_the_command(daemon: Daemon, identity: str) -> None:
    """The installed script, as the README promises: ``--socket`` after the command works too."""
    for argv in (
        [str(BIN / "latticectl"), "id", "--socket", str(daemon.socket)],
        [str(BIN / "latticectl"), "--json", "id", "--socket", str(daemon.socket)],
        [
            str(BIN / "latticectl"),
            "--socket",
            "/nonexistent/x.sock",
            "id",
            "--json",
            "--socket",
            str(daemon.socket),
        ],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, (argv, proc.stderr)
        assert proc.stdout in (identity + "\n", json.dumps({"identity": identity}) + "\n"), proc.stdout


# --- queue metadata -------------------------------------------------------------------------------


def test_meta(daemon: Daemon, qname: str) -> None:
    assert daemon.write("meta", "set", qname, "schema", "v2") == f"set metadata 'schema' of {qname}"
    assert daemon.ok("meta", "get", qname, "schema") == "v2\n"
    assert json.loads(daemon.ok("meta", "get", qname, "schema", "--json")) == {"key": "schema", "value": "v2"}
    daemon.fails(ExitCode.NOT_FOUND, "meta", "get", qname, "absent")
    assert json.loads(daemon.ok("queue", "info", qname, "--json"))["meta"]["schema"] == "v2"


# --- KV -------------------------------------------------------------------------------------------


def test_kv_values(daemon: Daemon, identity: str) -> None:
    p = f"kv{secrets.token_hex(3)}/"
    assert daemon.write("kv", "put", p + "a", "alpha") == f"set '{p}a' (5 bytes)"
    daemon.write("kv", "put", p + "b", "beta")
    assert daemon.ok("kv", "get", p + "a") == "alpha\n"
    assert daemon.ok("kv", "get", f"{identity}/{p}a") == "alpha\n"  # OWNER/KEY
    assert json.loads(daemon.ok("kv", "get", p + "a", "--json")) == {"key": p + "a", "value": "alpha"}
    assert daemon.ok("kv", "list", p) == f"{p}a\talpha\n{p}b\tbeta\n"
    assert json.loads(daemon.ok("kv", "list", p, "--owner", identity, "--json")) == {
        p + "a": "alpha",
        p + "b": "beta",
    }
    assert daemon.write("kv", "del", p + "a") == f"deleted '{p}a' (if it was set)"
    daemon.fails(ExitCode.NOT_FOUND, "kv", "get", p + "a")
    assert daemon.ok("kv", "list", p) == f"{p}b\tbeta\n"
    # Another identity's namespace is OWNER/...: here our own, named the way another's would be.
    assert daemon.ok("kv", "list", f"{identity}/{p}") == f"{p}b\tbeta\n"
    assert f"{p}b\tbeta\n" in daemon.ok("kv", "list", f"{identity}/")
    empty = daemon.ctl("kv", "list", f"{identity}/{p}zz")
    assert (empty.exit_code, empty.stdout) == (0, "")
    assert empty.stderr == f"no keys starting with '{p}zz' in the namespace of {identity}\n"


def test_kv_ttl(daemon: Daemon) -> None:
    key = f"ttl{secrets.token_hex(3)}"
    daemon.write("kv", "put", key, "soon gone", "--ttl", "0.2")
    daemon.write("kv", "put", key + "-kept", "stays")
    wait_until(lambda: daemon.ctl("kv", "get", key).exit_code == ExitCode.NOT_FOUND, "the key to expire")
    daemon.fails(ExitCode.NOT_FOUND, "kv", "get", key)
    assert daemon.ok("kv", "get", key + "-kept") == "stays\n"


def test_kv_hash(daemon: Daemon, identity: str) -> None:
    key = f"h{secrets.token_hex(3)}"
    daemon.write("kv", "hset", key, "name", "ada")
    daemon.write("kv", "hset", key, "lang", "en")
    assert daemon.ok("kv", "hget", key, "name") == "ada\n"
    assert daemon.ok("kv", "hget", f"{identity}/{key}", "lang") == "en\n"
    assert daemon.ok("kv", "hgetall", key) == "lang\ten\nname\tada\n"
    assert json.loads(daemon.ok("kv", "hgetall", key, "--json")) == {"name": "ada", "lang": "en"}
    daemon.write("kv", "hdel", key, "name")
    daemon.fails(ExitCode.NOT_FOUND, "kv", "hget", key, "name")
    assert json.loads(daemon.ok("kv", "hgetall", key, "--json")) == {"lang": "en"}


def test_kv_set(daemon: Daemon, identity: str) -> None:
    key = f"s{secrets.token_hex(3)}"
    for member in ("b", "a", "c"):
        daemon.write("kv", "sadd", key, member)
    daemon.write("kv", "srem", key, "c")
    assert daemon.ok("kv", "smembers", key) == "a\nb\n"
    assert json.loads(daemon.ok("kv", "smembers", f"{identity}/{key}", "--json")) == ["a", "b"]


def test_kv_counter(daemon: Daemon) -> None:
    key = f"c{secrets.token_hex(3)}"
    assert daemon.ok("kv", "incr", key) == "1\n"
    assert daemon.ok("kv", "incr", key, "--by", "10") == "11\n"
    assert json.loads(daemon.ok("kv", "incr", key, "--by", "-2", "--json")) == {"key": key, "value": 9}


# --- errors ---------------------------------------------------------------------------------------


def test_unknown_queue(daemon: Daemon) -> None:
    for args in (
        ["queue", "info", "nope"],
        ["peek", "nope", "0"],
        ["tail", "nope"],
        ["meta", "get", "nope", "k"],
    ):
        assert "nope" in daemon.fails(ExitCode.NOT_FOUND, *args)


def test_another_owners_queue(daemon: Daemon) -> None:
    """A queue of an owner we hold no key for: writes fail with one line, not found or not owner; an
    offer is forwarded to that owner (remote producers), which cannot be reached: exit 14 after --wait."""
    other = f"{secrets.token_hex(32)}/theirs"
    either = (ExitCode.NOT_FOUND, ExitCode.NOT_OWNER)
    daemon.fails(ExitCode.OWNER_UNREACHABLE, "offer", other, "x", "--wait", "0.2")
    daemon.fails(either, "truncate", other, "1")
    daemon.fails(either, "meta", "set", other, "k", "v")
    daemon.fails(ExitCode.NOT_FOUND, "queue", "info", other)
