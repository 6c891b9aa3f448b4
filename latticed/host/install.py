"""What ``latticed init`` writes, and where: a service that replicates out of the box, with a private key.

Two layouts, matching the shipped systemd units (``systemd/``):

========== ==================================== ===========================================================
            system (``latticed.service``)        user (``latticed-user.service``, ``systemctl --user``)
========== ==================================== ===========================================================
config      ``/etc/latticed/latticed.toml``      ``$XDG_CONFIG_HOME/latticed/latticed.toml`` (``~/.config``)
data        ``/var/lib/latticed`` (StateDir)     ``$XDG_STATE_HOME/latticed`` (``~/.local/state``)
unit        ``/etc/systemd/system/``             ``$XDG_CONFIG_HOME/systemd/user/``
========== ==================================== ===========================================================

The network key lives in the data directory, next to the identity: it is a secret like the identity, and
it is the one place the sandboxed system service may write (``ProtectSystem=strict``), which
``latticectl join`` needs to store a new key. The units' own ``ExecStart=`` finds ``latticed`` only where a
distribution or ``pip`` (system: systemd's search path, ``/usr/local/bin`` included) or ``pipx`` (user:
``~/.local/bin``) put it, so ``init`` also writes a drop-in whose ``ExecStart=`` is the ``latticed`` of the
installation that ran it (a venv, pipx, anywhere), with ``--config`` naming the file it wrote.

Everything here is a pure function of its arguments except :func:`write_file`; ``root`` prefixes every
path written (an image being built, or a test) while the files still name the real paths.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from latticed.errors import StorageError
from latticed.host.paths import identity_key_path
from latticed.protocol.addresses import HostPort

Scope = Literal["system", "user"]

CONFIG_NAME = "latticed.toml"
NETWORK_KEY_NAME = "network.key"
UNIT_NAME = "latticed.service"
DROP_IN_NAME = "10-latticed-init.conf"
SYSUSERS_NAME = "latticed.conf"
DEFAULT_LISTEN: HostPort = ("0.0.0.0", 7464)
#: The shipped files, by the name they are installed under (package data: ``latticed/units/``).
SHIPPED = {
    "system": "latticed.service",
    "user": "latticed-user.service",
    "sysusers": "sysusers.d-latticed.conf",
}

__all__ = [
    "DEFAULT_LISTEN",
    "Layout",
    "format_listen",
    "Scope",
    "default_config_files",
    "latticed_command",
    "layout_for",
    "render_config",
    "render_drop_in",
    "shipped_file",
    "systemd_quote",
    "write_file",
]


@dataclass(frozen=True, slots=True)
class Layout:
    """The real paths of one installation (as the daemon sees them) and where to write them (``root``)."""

    scope: Scope
    config_file: Path
    data_dir: Path
    unit_dir: Path
    root: Path | None = None

    @property
    def network_key_file(self) -> Path:
        return self.data_dir / NETWORK_KEY_NAME

    @property
    def identity_file(self) -> Path:
        return identity_key_path(self.data_dir)

    @property
    def unit_file(self) -> Path:
        return self.unit_dir / UNIT_NAME

    @property
    def drop_in_file(self) -> Path:
        return self.unit_dir / f"{UNIT_NAME}.d" / DROP_IN_NAME

    @property
    def sysusers_file(self) -> Path | None:
        return Path("/etc/sysusers.d") / SYSUSERS_NAME if self.scope == "system" else None

    def target(self, path: Path) -> Path:
        """Where ``path`` is written: under ``root`` if one is given."""
        return self.root / path.relative_to(path.anchor) if self.root is not None else path


def _xdg(env: Mapping[str, str], name: str, fallback: str) -> Path:
    value = env.get(name)
    # The XDG spec: an empty or relative value is invalid and must be ignored.
    if value and Path(value).is_absolute():
        return Path(value)
    home = env.get("HOME") or str(Path.home())
    return Path(home) / fallback


def layout_for(scope: Scope, env: Mapping[str, str] = os.environ, root: Path | None = None) -> Layout:
    """The system layout (fixed paths, optionally under ``root``) or the user's (from XDG variables)."""
    if scope == "system":
        return Layout(
            scope,
            config_file=Path("/etc/latticed") / CONFIG_NAME,
            data_dir=Path("/var/lib/latticed"),
            unit_dir=Path("/etc/systemd/system"),
            root=root,
        )
    config_home = _xdg(env, "XDG_CONFIG_HOME", ".config")
    return Layout(
        scope,
        config_file=config_home / "latticed" / CONFIG_NAME,
        data_dir=_xdg(env, "XDG_STATE_HOME", ".local/state") / "latticed",
        unit_dir=config_home / "systemd" / "user",
    )


def default_config_files(env: Mapping[str, str] = os.environ, *, euid: int | None = None) -> list[Path]:
    """Where ``latticed init`` writes the config, the caller's own layout first: the user's, then the
    system's (for root, the system's first)."""
    user, system = layout_for("user", env).config_file, layout_for("system").config_file
    return [system, user] if (os.geteuid() if euid is None else euid) == 0 else [user, system]


def latticed_command() -> list[str]:
    """How to start this installation's ``latticed``: the script next to our interpreter (a venv, pipx),
    else the interpreter itself with ``-m latticed`` (a ``pip install --user`` whose script is elsewhere)."""
    script = Path(sys.executable).with_name("latticed")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "latticed"]


_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def systemd_quote(arg: str) -> str:
    """One ``ExecStart=`` word: quoted if needed; ``%`` and ``$`` escaped so systemd takes them literally."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_drop_in(command: Sequence[str], config_file: Path) -> str:
    exec_start = " ".join(systemd_quote(a) for a in [*command, "run", "--config", str(config_file)])
    return (
        "# Written by `latticed init`: start the latticed of the installation that ran it (pip, pipx and\n"
        "# venvs put the script where the unit's own ExecStart= may not look), with the config init wrote.\n"
        "# Delete this file to use the unit's ExecStart= instead; `systemctl cat latticed` shows both.\n"
        "[Service]\n"
        "# The empty line clears the unit's command before setting ours.\n"
        "ExecStart=\n"
        f"ExecStart={exec_start}\n"
    )


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escapes are a subset of TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def format_listen(address: HostPort) -> str:
    """``HOST:PORT`` as the config writes it (IPv6 in brackets)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def render_config(
    layout: Layout,
    *,
    listen: HostPort = DEFAULT_LISTEN,
    mdns: bool = True,
    mdns_interfaces: Sequence[str] = (),
    peers: Sequence[HostPort] = (),
) -> str:
    """The commented TOML config; every key is a ``latticed run`` option (see ``latticed run --help``)."""
    service = "latticed.service" if layout.scope == "system" else "latticed-user.service (systemctl --user)"
    interfaces = ", ".join(_toml(i) for i in mdns_interfaces)
    peer_list = ", ".join(_toml(format_listen(p)) for p in peers)
    lines = [
        f"# latticed configuration, written by `latticed init` for {service}.",
        "# Every key is the snake_case name of a `latticed run` option (`latticed run --help`); an option",
        "# given on the command line overrides the key here.",
        "",
        "# The store, the identity key (identity.key: your write authority) and the network key.",
        f"data_dir = {_toml(str(layout.data_dir))}",
        "",
        "# The network key is the shared secret of your network: daemons holding the same key find each",
        "# other and replicate, nobody else gets past the handshake or reads the mDNS announcements. Bring",
        "# another machine in with `latticectl invite` here and `latticectl join TOKEN` there (the token",
        "# is a secret too), or copy this file to it. `latticectl join` may replace the key in this file.",
        f"network_key_file = {_toml(str(layout.network_key_file))}",
        "",
        '# Where peers connect: every IPv4 interface by default. "[::]:7464" for IPv6, or one address.',
        f"listen = {_toml(format_listen(listen))}",
        "",
        "# Announce this daemon on the LAN with mDNS and find the others (only members of the network can",
        "# read the announcements). Limit it to some interfaces (names or IPv4 addresses) if you like.",
        f"mdns = {'true' if mdns else 'false'}",
        f"mdns_interfaces = [{interfaces}]" if mdns_interfaces else '# mdns_interfaces = ["eth0"]',
        "",
        "# Peers to dial that mDNS cannot see (another subnet, across the internet), HOST:PORT each.",
        f"peers = [{peer_list}]" if peers else '# peers = ["192.0.2.10:7464"]',
        "",
        "# Accept only these identities (64 hex digits each, `latticectl id` on each); empty: any peer",
        "# holding the network key. A peer blocked with `latticectl peers block ID` is refused either way.",
        "# allowed_peers = []",
        "",
        "# Replicate only the queues matching these OWNER/NAME globs; empty: everything we hear of.",
        "# replicate = []",
        "",
        "# Keep at most this much of each replicated queue here (its oldest records go, on this daemon",
        "# only); per queue by OWNER/NAME glob, the first match wins (none: no cap). Owners set their own",
        "# queues' retention with `latticectl queue retention set`.",
        '# replica_max_bytes = "20MB"',
        '# replica_queue_caps = ["*/logs-*=100MB", "*/audit=none"]',
        "",
        '# log_level = "INFO"    # DEBUG, INFO, WARNING, ERROR',
        '# log_format = "json"   # or "text"; under systemd the journal keeps either',
        "",
    ]
    return "\n".join(lines)


def shipped_file(key: str) -> str:
    """The text of a shipped systemd file (``system``, ``user`` or ``sysusers``)."""
    from importlib import resources  # noqa: PLC0415 - only init writes unit files

    return (resources.files("latticed") / "units" / SHIPPED[key]).read_text(encoding="utf-8")


def _make_parents(path: Path) -> None:
    """Missing parent directories, each 0755 whatever the umask: the service user must read the config."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        directory.mkdir()
        directory.chmod(0o755)


def write_file(path: Path, text: str, mode: int) -> None:
    """Write ``text`` atomically (temporary file, fsync, rename) with ``mode``, creating parents (0755)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        _make_parents(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as file:
            os.fchmod(fd, mode)  # the umask may have taken bits away
            file.write(text.encode("utf-8"))
            file.flush()
            os.fsync(fd)
        os.replace(tmp, path)
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
