"""``latticed init`` and what it writes: a config that parses, holds no public key and names the layout the
units use; files that are never overwritten without --force, an identity and a private key never."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import pytest
from support.paths import ROOT
from typer.testing import CliRunner, Result

import cli.init
import cli.latticed_command
from cli.boundary import ExitCode
from latticed.host.config import load_config
from latticed.host.identity_key import load_or_create_identity
from latticed.host.install import layout_for, render_config, render_drop_in, shipped_file, systemd_quote
from latticed.host.netkey import DEFAULT_NETWORK_KEY, read_network_key, write_network_key

SYSTEMD_DIR = ROOT / "systemd"
runner = CliRunner()


def user_env(home: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "cfg"),
        "XDG_STATE_HOME": str(home / "state"),
    }


def init(home: Path, *args: str) -> Result:
    return runner.invoke(
        cli.latticed_command.app, ["init", "--user", *args], env=user_env(home), prog_name="latticed"
    )


def one_line_error(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    [line] = result.stderr.splitlines()
    assert line.startswith("latticed: error: ")
    return line


# --- the config writer ----------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["system", "user"])
def test_written_config_parses_and_names_the_layout(scope: Any, tmp_path: Path) -> None:
    layout = layout_for(scope, user_env(tmp_path))
    text = render_config(layout)
    path = tmp_path / "latticed.toml"
    path.write_text(text)
    config = load_config(path, {}, env={"HOME": str(tmp_path)})
    assert config.data_dir == layout.data_dir
    assert config.network_key_file == layout.network_key_file == layout.data_dir / "network.key"
    assert config.listen == ("0.0.0.0", 7464)
    assert config.mdns is True
    assert not config.insecure_public_network_key
    assert DEFAULT_NETWORK_KEY.hex() not in text
    assert "network_key_file" in tomllib.loads(text)
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert len(comments) > 20  # a commented file: every setting says what it is for


def test_system_layout_is_where_the_system_unit_looks() -> None:
    layout = layout_for("system", {})
    unit = (SYSTEMD_DIR / "latticed.service").read_text()
    assert layout.config_file == Path("/etc/latticed/latticed.toml")
    assert "--config %E/latticed/latticed.toml" in unit  # %E = /etc in the system manager
    assert layout.data_dir == Path("/var/lib") / "latticed"
    assert "\nStateDirectory=latticed\n" in unit


def test_user_layout_follows_xdg(tmp_path: Path) -> None:
    layout = layout_for("user", user_env(tmp_path))
    assert layout.config_file == tmp_path / "cfg" / "latticed" / "latticed.toml"
    assert layout.data_dir == tmp_path / "state" / "latticed"
    assert layout.unit_file == tmp_path / "cfg" / "systemd" / "user" / "latticed.service"
    fallback = layout_for("user", {"HOME": str(tmp_path), "XDG_CONFIG_HOME": "relative/ignored"})
    assert fallback.config_file == tmp_path / ".config" / "latticed" / "latticed.toml"
    assert fallback.data_dir == tmp_path / ".local" / "state" / "latticed"
    assert "--config %E/latticed/latticed.toml" in (SYSTEMD_DIR / "latticed-user.service").read_text()


def test_config_carries_the_given_options(tmp_path: Path) -> None:
    layout = layout_for("user", user_env(tmp_path / 'odd "dir" \\ é'))
    text = render_config(
        layout, listen=("::", 7000), mdns_interfaces=["127.0.0.1", "eth0"], peers=[("2001:db8::1", 7464)]
    )
    path = tmp_path / "c.toml"
    path.write_text(text)
    config = load_config(path, {}, env={})
    assert config.data_dir == layout.data_dir  # quotes, backslashes and non-ASCII survive
    assert config.listen == ("::", 7000)
    assert config.mdns_interfaces == ("127.0.0.1", "eth0")
    assert config.peers == (("2001:db8::1", 7464),)


def test_systemd_quote() -> None:
    assert systemd_quote("/opt/venv/bin/latticed") == "/opt/venv/bin/latticed"
    assert systemd_quote("/a b/c") == '"/a b/c"'
    assert systemd_quote('/x"y\\z') == '"/x\\"y\\\\z"'
    assert systemd_quote("/100%/$HOME") == '"/100%%/$$HOME"'
    drop_in = render_drop_in(["/a b/python", "-m", "latticed"], Path("/etc/latticed/latticed.toml"))
    assert 'ExecStart="/a b/python" -m latticed run --config /etc/latticed/latticed.toml\n' in drop_in


def test_shipped_units_are_the_repository_files() -> None:
    assert shipped_file("system") == (SYSTEMD_DIR / "latticed.service").read_text()
    assert shipped_file("user") == (SYSTEMD_DIR / "latticed-user.service").read_text()
    assert shipped_file("sysusers") == (SYSTEMD_DIR / "sysusers.d-latticed.conf").read_text()


# --- latticed init --------------------------------------------------------------------------------


def test_init_user_writes_config_identity_private_key_and_unit(tmp_path: Path) -> None:
    result = init(tmp_path)
    assert result.exit_code == 0, result.output
    layout = layout_for("user", user_env(tmp_path))
    key = read_network_key(layout.network_key_file)
    assert key != DEFAULT_NETWORK_KEY
    assert stat.S_IMODE(layout.network_key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.identity_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.data_dir.stat().st_mode) == 0o700
    identity = load_or_create_identity(layout.identity_file)
    config = load_config(layout.config_file, {}, env=user_env(tmp_path))
    assert config.network_key_file == layout.network_key_file and config.data_dir == layout.data_dir
    assert layout.unit_file.read_text() == (SYSTEMD_DIR / "latticed-user.service").read_text()
    drop_in = layout.drop_in_file.read_text()
    assert f"run --config {layout.config_file}\n" in drop_in and "\nExecStart=\n" in drop_in
    out = result.stdout
    for path in (layout.config_file, layout.identity_file, layout.network_key_file, layout.drop_in_file):
        assert str(path) in out
    assert identity.public_hex in out
    assert "next:" in out and "latticectl invite" in out and "systemctl --user" in out
    assert key.hex() not in result.output  # the secret is never printed


def test_init_refuses_to_overwrite_and_force_keeps_identity_and_key(tmp_path: Path) -> None:
    assert init(tmp_path).exit_code == 0
    layout = layout_for("user", user_env(tmp_path))
    config_before = layout.config_file.read_text()
    key_before, identity_before = layout.network_key_file.read_bytes(), layout.identity_file.read_bytes()

    again = init(tmp_path)  # the same settings: nothing to overwrite
    assert again.exit_code == 0, again.output
    assert "(unchanged)" in again.stdout and "(kept" in again.stdout

    line = one_line_error(init(tmp_path, "--listen", "127.0.0.1:7000"), ExitCode.EXISTS)
    assert str(layout.config_file) in line and "--force" in line
    assert layout.config_file.read_text() == config_before

    forced = init(tmp_path, "--listen", "127.0.0.1:7000", "--force")
    assert forced.exit_code == 0, forced.output
    assert 'listen = "127.0.0.1:7000"' in layout.config_file.read_text()
    assert layout.network_key_file.read_bytes() == key_before
    assert layout.identity_file.read_bytes() == identity_before


def test_init_keeps_an_existing_identity(tmp_path: Path) -> None:
    layout = layout_for("user", user_env(tmp_path))
    layout.data_dir.mkdir(parents=True, mode=0o700)
    identity = load_or_create_identity(layout.identity_file)
    result = init(tmp_path)
    assert result.exit_code == 0, result.output
    assert f"(kept): {identity.public_hex}" in result.stdout
    assert load_or_create_identity(layout.identity_file).public_key == identity.public_key


def test_a_public_default_key_file_is_replaced_only_with_force(tmp_path: Path) -> None:
    layout = layout_for("user", user_env(tmp_path))
    layout.data_dir.mkdir(parents=True, mode=0o700)
    write_network_key(layout.network_key_file, DEFAULT_NETWORK_KEY)
    line = one_line_error(init(tmp_path), ExitCode.EXISTS)
    assert "public default key" in line
    assert not layout.config_file.exists() and not layout.identity_file.exists()  # nothing made
    assert init(tmp_path, "--force").exit_code == 0
    assert read_network_key(layout.network_key_file) != DEFAULT_NETWORK_KEY


def test_init_without_systemd_writes_no_unit(tmp_path: Path) -> None:
    result = init(tmp_path, "--no-systemd", "--no-mdns", "--peer", "192.0.2.1:7464")
    assert result.exit_code == 0, result.output
    layout = layout_for("user", user_env(tmp_path))
    assert not layout.unit_file.exists() and not layout.drop_in_file.exists()
    config = load_config(layout.config_file, {}, env=user_env(tmp_path))
    assert config.mdns is False and config.peers == (("192.0.2.1", 7464),)
    assert f"latticed run --config {layout.config_file}" in result.stdout


def test_system_init_under_a_root_directory(tmp_path: Path) -> None:
    root = tmp_path / "image"
    result = runner.invoke(cli.latticed_command.app, ["init", "--root", str(root)], prog_name="latticed")
    assert result.exit_code == 0, result.output
    config_text = (root / "etc/latticed/latticed.toml").read_text()
    assert 'data_dir = "/var/lib/latticed"' in config_text  # the real paths, not the image's
    assert 'network_key_file = "/var/lib/latticed/network.key"' in config_text
    assert read_network_key(root / "var/lib/latticed/network.key") != DEFAULT_NETWORK_KEY
    assert (root / "var/lib/latticed/identity.key").stat().st_size == 32
    assert (root / "etc/systemd/system/latticed.service").read_text() == shipped_file("system")
    drop_in = (root / "etc/systemd/system/latticed.service.d/10-latticed-init.conf").read_text()
    assert "run --config /etc/latticed/latticed.toml\n" in drop_in
    assert (root / "etc/sysusers.d/latticed.conf").read_text() == shipped_file("sysusers")
    assert (
        "systemd-sysusers" in result.stdout and "LATTICED_SOCKET=/run/latticed/latticed.sock" in result.stdout
    )


def test_system_init_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.init.os, "geteuid", lambda: 1000)

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("init went on to lay out the real /etc")

    monkeypatch.setattr(cli.init, "layout_for", must_not_run)
    result = runner.invoke(cli.latticed_command.app, ["init"], prog_name="latticed")
    line = one_line_error(result, ExitCode.ERROR)
    assert "sudo latticed init" in line and "--user" in line


def test_root_is_only_for_the_system_layout(tmp_path: Path) -> None:
    one_line_error(init(tmp_path, "--root", str(tmp_path)), ExitCode.USAGE)
    assert not (tmp_path / "cfg").exists()


def test_keys_made_by_root_belong_to_the_owner_of_the_data_directory(tmp_path: Path) -> None:
    """A service that already ran owns /var/lib/latticed; a key root adds there must be readable by it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to hand files to another user")
    root = tmp_path / "image"
    data = root / "var/lib/latticed"
    data.mkdir(parents=True, mode=0o700)
    os.chown(data, 4321, 4321)
    result = runner.invoke(cli.latticed_command.app, ["init", "--root", str(root)], prog_name="latticed")
    assert result.exit_code == 0, result.output
    for name in ("identity.key", "network.key"):
        info = (data / name).stat()
        assert (info.st_uid, info.st_gid) == (4321, 4321), name
