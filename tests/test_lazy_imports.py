"""Processes that only talk to the daemon stay light: Spark starts a fresh Python process per streaming
query for the source's planner, and its imports are part of every query's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import latticed


def test_the_package_re_exports_load_on_first_use() -> None:
    assert latticed.Record.__module__ == "latticed.crdt.records"
    assert latticed.LatticeQueue.__module__ == "latticed.facades.lattice_queue"
    assert set(latticed.__all__) <= set(dir(latticed))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = latticed.nope  # type: ignore[attr-defined]


def test_the_spark_planner_process_loads_neither_the_core_nor_compute() -> None:
    pytest.importorskip("pyspark")
    script = (
        "import sys\n"
        "import latticed.spark.source\n"
        "heavy = ['latticed.crdt.queue', 'latticed.crdt.forks', 'nacl', 'pyarrow.compute', 'trio']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    argv = [sys.executable, "-c", script]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# --- latticectl: a command imports what it needs -------------------------------------------

#: Never needed by a command that only asks the daemon something and prints text. Not listed: what typer
#: itself imports (inspect, dataclasses, subprocess...) and pathlib (the client takes paths).
HEAVY_FOR_THE_CLI = [
    "pydantic",  # typer converts values with it; cli.lazy converts plain ones without
    "rich",  # typer's help and tracebacks only
    "json",  # --json only
    "tomllib",
    "latticed.host.config",  # the socket's default path is in latticed.host.socket_path
    "latticed.host.invite",
    "latticed.host.checklist",
    "zeroconf",
    "nacl",
    "trio",
    "pyspark",
    "latticed.spark",
]
#: The command modules, each loaded only for its own commands.
COMMAND_MODULES = ["cli.kv_commands", "cli.groups", "cli.work", "cli.join", "cli.peers", "cli.doctor"]

_RUN_AND_LIST = """
import sys
before = set(sys.modules)
sys.argv = ["latticectl", *sys.argv[1:]]
import cli.ctl
try:
    cli.ctl.main()
except SystemExit as exc:
    code = exc.code
imported = sorted(set(sys.modules) - before)
import json
sys.stderr.write("\\n" + json.dumps([code, imported]) + "\\n")
"""


@pytest.fixture(scope="module")
def daemon_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from support.inprocess import start_in_process  # noqa: PLC0415 - trio, only for the tests that need a daemon

    from latticed.host.config import DaemonConfig  # noqa: PLC0415 - as above

    root = tmp_path_factory.mktemp("ctl")
    daemon = start_in_process(DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"))
    with daemon.client() as client:
        client.queue_create("q")
    yield daemon.socket
    daemon.stop()


def imports_of(socket: Path, *args: str) -> tuple[int, str, set[str]]:
    """Run ``latticectl ARGS`` in a fresh interpreter: its exit code, stdout, and what it imported beyond
    what the interpreter had at start."""
    env = {**os.environ, "LATTICED_SOCKET": str(socket)}
    argv = [sys.executable, "-c", _RUN_AND_LIST, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    code, modules = json.loads(proc.stderr.splitlines()[-1])
    return code, proc.stdout, set(modules)


@pytest.mark.parametrize("args", [["id"], ["status"], ["--socket", "{socket}", "status"], ["queue", "list"]])
def test_latticectl_id_and_status_import_only_what_they_need(daemon_socket: Path, args: list[str]) -> None:
    code, out, modules = imports_of(daemon_socket, *[a.format(socket=daemon_socket) for a in args])
    assert code == 0 and out, out
    heavy = [m for m in [*HEAVY_FOR_THE_CLI, *COMMAND_MODULES] if m in modules]
    assert heavy == []
    assert "cli.ctl" in modules and "latticed.api.client.blocking_client" in modules  # it did run here


def test_a_command_of_another_module_loads_that_module_only(daemon_socket: Path) -> None:
    # str arguments, a value from a default and an int with a range: no pydantic either
    code, _, modules = imports_of(daemon_socket, "dequeue", "nogroup", "--wait", "0")
    assert code == 4  # no such group: it reached the daemon
    assert {"cli.groups", "cli.work"} <= modules
    others = ["cli.kv_commands", "cli.join", "cli.peers", "cli.doctor"]
    assert [m for m in [*HEAVY_FOR_THE_CLI, *others] if m in modules] == []
    code, _, modules = imports_of(daemon_socket, "range", "q", "0", "3")
    assert code == 0
    assert [m for m in [*HEAVY_FOR_THE_CLI, *COMMAND_MODULES] if m in modules] == []


def test_json_and_help_load_what_they_need(daemon_socket: Path) -> None:
    code, out, modules = imports_of(daemon_socket, "--json", "id")
    assert code == 0 and "json" in modules and json.loads(out)["identity"]
    code, out, modules = imports_of(daemon_socket, "--help")
    assert code == 0 and "work" in out and "doctor" in out  # --help lists every command
    assert set(COMMAND_MODULES) <= modules
