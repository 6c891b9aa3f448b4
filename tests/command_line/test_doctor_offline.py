"""``latticectl doctor`` with the daemon stopped checks the config ``latticed init`` wrote, not the bare
defaults: no false ✘ telling the user to do what init already did."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli.ctl
import cli.latticed_command
from latticed.host.install import default_config_files

runner = CliRunner()


def _env(home: Path) -> dict[str, str | None]:
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "cfg"),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_RUNTIME_DIR": str(home / "run"),  # no daemon serves there
        "LATTICED_SOCKET": None,
        "LATTICED_CONFIG": None,
        "RUNTIME_DIRECTORY": None,
    }


def test_doctor_without_a_daemon_reads_the_config_init_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("latticed.host.install.os.geteuid", lambda: 1000)  # a user: their own config first
    init = ["init", "--user", "--no-systemd", "--listen", "127.0.0.1:0", "--no-mdns"]
    made = runner.invoke(cli.latticed_command.app, init, env=_env(tmp_path), prog_name="latticed")
    assert made.exit_code == 0, made.output
    config = tmp_path / "cfg" / "latticed" / "latticed.toml"

    result = runner.invoke(cli.ctl.app, ["doctor", "--json"], env=_env(tmp_path), prog_name="latticectl")
    assert result.exit_code == 1  # the daemon is not running, and it has no peers yet
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert str(config) in checks["config"]["detail"]
    assert "where `latticed init` writes it" in checks["config"]["detail"]
    failed = sorted(c["check"] for c in json.loads(result.stdout)["checks"] if c["ok"] is False)
    assert failed == ["peer", "socket"]
    assert checks["network key"]["ok"] is True and checks["listen"]["ok"] is True
    assert str(tmp_path / "state" / "latticed") in checks["data dir"]["detail"]


def test_the_default_configs_put_the_callers_own_layout_first(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    user, system = tmp_path / "cfg" / "latticed" / "latticed.toml", Path("/etc/latticed/latticed.toml")
    assert default_config_files(env, euid=1000) == [user, system]
    assert default_config_files(env, euid=0) == [system, user]


def test_the_spark_check_finds_the_extra_without_importing_it() -> None:
    script = (
        "import sys\nfrom latticed.host.checklist import check_spark\nc = check_spark()\n"
        "print(c.ok, sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    installed = importlib.util.find_spec("pyspark") is not None
    assert out.stdout.split(" ", 1) == [str(True if installed else None), "[]\n"]
