"""``latticed`` starts fast where nothing waits, and a refused start says why at once: another daemon on the
socket or the data directory, or the listen port taken (two users' ``init --user`` on one host), is found
before the daemon (trio, the store, zeroconf, nacl, prometheus) is imported, and the port's error names the
address and what to do. ``init`` chooses a free port when the default one is taken."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import typer.main
from typer.testing import CliRunner

import cli.latticed_command
from latticed.daemon import run_daemon
from latticed.errors import LatticedError
from latticed.host.config import DaemonConfig
from latticed.host.data_dir_lock import DataDirLock
from latticed.host.install import DEFAULT_LISTEN
from latticed.host.listen_probe import INIT_PORT_TRIES

#: What a refused ``latticed run`` (and ``init``, ``--help``) must not import: the daemon and its network.
HEAVY = ["trio", "zeroconf", "prometheus_client", "latticed.daemon", "latticed.storage.engine", "pydantic"]

_RUN_AND_LIST = """
import sys
before = set(sys.modules)
sys.argv = ["latticed", *sys.argv[1:]]
import cli.latticed_command
try:
    cli.latticed_command.main()
except SystemExit as exc:
    code = exc.code
imported = sorted(set(sys.modules) - before)
import json
sys.stderr.write("\\n" + json.dumps([code, imported]) + "\\n")
"""


def latticed(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, list[str], set[str]]:
    """Run ``latticed ARGS`` in a fresh interpreter: exit code, stdout, stderr lines, modules it imported."""
    argv = [sys.executable, "-c", _RUN_AND_LIST, *args]
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=60, check=False)
    *lines, _, report = proc.stderr.splitlines()
    code, modules = json.loads(report)
    return code, proc.stdout, lines, set(modules)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _run_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--data-dir",
        str(tmp_path / "data"),
        "--socket",
        str(tmp_path / "d.sock"),
        "--no-mdns",
        *extra,
    ]


def test_a_taken_listen_port_is_refused_before_the_daemon_loads_naming_it_and_the_fix(
    tmp_path: Path, taken_port: int
) -> None:
    config = tmp_path / "latticed.toml"
    config.write_text(f'listen = "127.0.0.1:{taken_port}"\n')
    code, out, lines, modules = latticed(*_run_args(tmp_path, "--config", str(config)))
    assert code == 1 and out == ""
    [line] = lines
    assert line.startswith(
        f"latticed: error: cannot listen on 127.0.0.1:{taken_port}: port {taken_port} is in use"
    )
    assert f"edit listen in {config}" in line and "--listen 127.0.0.1:0" in line
    assert [m for m in HEAVY if m in modules] == []
    assert not (tmp_path / "data").exists()  # nothing created


def test_a_locked_data_dir_and_a_served_socket_are_refused_before_the_daemon_loads(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    with DataDirLock(data):
        code, _, lines, modules = latticed(*_run_args(tmp_path))
    assert code == 8 and lines == [
        f"latticed: error: another latticed is using the data directory {data}; stop it first"
    ]
    assert [m for m in HEAVY if m in modules] == []

    with socket.socket(socket.AF_UNIX) as served:
        served.bind(str(tmp_path / "d.sock"))
        served.listen()
        code, _, lines, modules = latticed(*_run_args(tmp_path))
    assert code == 8 and "already serving" in lines[0]
    assert [m for m in HEAVY if m in modules] == []


def test_the_daemon_itself_names_a_taken_port_and_the_fix(tmp_path: Path, taken_port: int) -> None:
    """The port may be taken between the CLI's probe and the listener (or by an embedding caller)."""
    config = DaemonConfig(
        data_dir=tmp_path / "data",
        socket_path=tmp_path / "d.sock",
        listen=("127.0.0.1", taken_port),
        mdns=False,
        insecure_public_network_key=True,
    )
    with pytest.raises(BaseException) as caught:  # trio wraps it in nursery groups
        trio.run(run_daemon, config)
    leaf: BaseException = caught.value
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, LatticedError)
    assert f"cannot listen on 127.0.0.1:{taken_port}: port {taken_port} is in use" in str(leaf)
    assert "--listen 127.0.0.1:0" in str(leaf)


def _user_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "cfg"), "XDG_STATE_HOME": str(home / "state")}


def test_init_and_help_load_nothing_of_the_daemon(tmp_path: Path) -> None:
    code, out, _, modules = latticed(
        "init", "--user", "--no-systemd", "--listen", "127.0.0.1:0", env=_user_env(tmp_path)
    )
    assert code == 0 and "network key" in out
    assert [m for m in HEAVY if m in modules] == []
    code, out, _, modules = latticed("--help")
    assert code == 0 and "init" in out
    assert [m for m in [*HEAVY, "rich"] if m in modules] == []


@pytest.fixture
def default_port_taken() -> Iterator[None]:
    """Someone listens on the default port (here, or already: another daemon on this host)."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(DEFAULT_LISTEN)
        holder.listen()
    except OSError:
        holder.close()  # already taken: as good
        yield
        return
    with holder:
        yield


def test_init_takes_the_next_free_port_when_the_default_is_taken_and_keeps_it(
    tmp_path: Path, default_port_taken: None
) -> None:
    runner = CliRunner()
    argv = ["init", "--user", "--no-systemd"]
    result = runner.invoke(cli.latticed_command.app, argv, env=_user_env(tmp_path), prog_name="latticed")
    assert result.exit_code == 0, result.output
    written = tomllib.loads((tmp_path / "cfg" / "latticed" / "latticed.toml").read_text())["listen"]
    host, port = written.rsplit(":", 1)
    assert host == "0.0.0.0" and DEFAULT_LISTEN[1] < int(port) <= DEFAULT_LISTEN[1] + INIT_PORT_TRIES
    assert f"listen      {written} (port {DEFAULT_LISTEN[1]} is in use on this host" in result.stdout
    # Again (its own daemon may hold that port by now): the config keeps its port, nothing is rewritten.
    with socket.socket() as own:
        own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        own.bind(("0.0.0.0", int(port)))
        own.listen()
        again = runner.invoke(cli.latticed_command.app, argv, env=_user_env(tmp_path), prog_name="latticed")
    assert again.exit_code == 0, again.output
    assert "(unchanged)" in again.stdout.splitlines()[0] and "listen " not in again.stdout


def test_run_help_at_80_columns_shows_every_option_whole() -> None:
    result = CliRunner().invoke(
        cli.latticed_command.app, ["run", "--help"], terminal_width=80, prog_name="latticed"
    )
    assert result.exit_code == 0
    params = typer.main.get_command(cli.latticed_command.app).commands["run"].params  # type: ignore[attr-defined]
    names = [opt for p in params for opt in [*p.opts, *p.secondary_opts]]
    assert "--insecure-public-network-key" in names
    for name in names:
        assert name in result.stdout, name
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
