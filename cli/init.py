"""``latticed init``: set up a daemon that replicates out of the box, under a private network key.

It writes the commented config, the identity, a new private network key, and (unless ``--no-systemd``) the
systemd unit with a drop-in that starts this installation's ``latticed``; then prints what it made and what
to run next. Locations: :mod:`latticed.host.install`. Nothing is overwritten without ``--force``, and the
identity and a private network key never are: a new identity loses write authority over your queues, a new
key cuts the daemon off from its network (``docs/operations.md`` says how to rotate one on purpose).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from latticed.errors import AlreadyExistsError, LatticedError, MalformedError
from latticed.host.install import (
    DEFAULT_LISTEN,
    Layout,
    format_listen,
    latticed_command,
    layout_for,
    render_config,
    render_drop_in,
    shipped_file,
    write_file,
)

#: Hidden from the system unit by ProtectHome=yes: a latticed installed there cannot start as a service.
_HIDDEN_FROM_SYSTEM = (Path("/home"), Path("/root"), Path("/run/user"))


def init(
    *,
    user: Annotated[
        bool, typer.Option("--user", help="Set up a per-user service (systemctl --user), not the system one.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Rewrite an existing config and unit files; the identity and key are always kept."
        ),
    ] = False,
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Where peers connect (0: any port).",
            show_default=f"{format_listen(DEFAULT_LISTEN)}, or the next free port if another program "
            "has it; a rewritten config keeps its own",
        ),
    ] = None,
    mdns: Annotated[
        bool, typer.Option("--mdns/--no-mdns", help="Find peers on the LAN with mDNS (announce, browse).")
    ] = True,
    mdns_interface: Annotated[
        list[str] | None,
        typer.Option("--mdns-interface", metavar="IP", help="Run mDNS only on this interface; repeatable."),
    ] = None,
    peer: Annotated[
        list[str] | None,
        typer.Option("--peer", metavar="HOST:PORT", help="A peer mDNS cannot see; repeatable."),
    ] = None,
    systemd: Annotated[
        bool,
        typer.Option(
            "--systemd/--no-systemd",
            help="Also install the systemd unit, with a drop-in that starts this installation's latticed.",
        ),
    ] = True,
    root: Annotated[
        Path | None,
        typer.Option(
            "--root",
            metavar="DIR",
            help="System layout only: write under DIR (an image being built); files name the real paths.",
        ),
    ] = None,
) -> None:
    """Write a config, an identity and a private network key (and the systemd unit); print the next steps."""
    if user and root is not None:
        raise MalformedError(
            "--root is for the system layout; --user follows $XDG_CONFIG_HOME, $XDG_STATE_HOME"
        )
    if not user and root is None and os.geteuid() != 0:
        raise LatticedError(
            "the system service's files go in /etc and /var/lib: run `sudo latticed init`, or "
            "`latticed init --user` for a service of your own"
        )
    # Imported here: `latticed run` imports this module too, and needs none of it.
    from latticed.host.identity_key import load_or_create_identity  # noqa: PLC0415
    from latticed.host.netkey import (  # noqa: PLC0415
        DEFAULT_NETWORK_KEY,
        network_key_fingerprint,
        new_network_key,
        read_network_key,
        replace_network_key,
        write_network_key,
    )
    from latticed.host.paths import ensure_data_dir  # noqa: PLC0415
    from latticed.protocol.addresses import parse_host_port  # noqa: PLC0415

    peers = [parse_host_port(p) for p in peer or []]
    layout = layout_for("user" if user else "system", os.environ, root)
    listen_at, listen_note = _choose_listen(layout, listen)

    files = [("config", layout.config_file, render_config(
        layout, listen=listen_at, mdns=mdns, mdns_interfaces=mdns_interface or (), peers=peers
    ))]  # fmt: skip
    command = latticed_command()
    if systemd:
        files.append(("unit", layout.unit_file, shipped_file(layout.scope)))
        files.append(("drop-in", layout.drop_in_file, render_drop_in(command, layout.config_file)))
        if layout.sysusers_file is not None:
            files.append(("sysusers", layout.sysusers_file, shipped_file("sysusers")))

    # Decide everything before writing anything: a refusal leaves no trace.
    status = {path: _state(layout.target(path), text) for _, path, text in files}
    key_path = layout.target(layout.network_key_file)
    old_key = read_network_key(key_path) if key_path.exists() else None
    conflicts = [str(path) for path, state in status.items() if state == "differs"]
    if old_key == DEFAULT_NETWORK_KEY:
        conflicts.append(f"{layout.network_key_file} (holds the public default key)")
    if conflicts and not force:
        raise AlreadyExistsError(
            f"already there: {', '.join(conflicts)}; pass --force to rewrite (the identity and a private "
            "network key are always kept)"
        )

    ensure_data_dir(layout.target(layout.data_dir))
    identity_existed = layout.target(layout.identity_file).exists()
    identity = load_or_create_identity(layout.target(layout.identity_file))
    if old_key is None:
        key = write_network_key(key_path)
    elif old_key == DEFAULT_NETWORK_KEY:
        key = new_network_key()
        replace_network_key(key_path, key)
    else:
        key = old_key
    for secret in (layout.identity_file, layout.network_key_file):
        _owned_like_its_directory(layout.target(secret))
    for _, path, text in files:
        if status[path] != "same":
            write_file(layout.target(path), text, 0o644)

    words = {"new": "written", "differs": "rewritten", "same": "unchanged"}
    out = [f"{what:<12}{path} ({words[status[path]]})" for what, path, _ in files]
    out.insert(1, f"{'identity':<12}{layout.identity_file} ({'kept' if identity_existed else 'created'}): "
                  f"{identity.public_hex}")  # fmt: skip
    key_word = "kept" if old_key not in (None, DEFAULT_NETWORK_KEY) else "created"
    out.insert(2, f"{'network key':<12}{layout.network_key_file} ({key_word}, fingerprint "
                  f"{network_key_fingerprint(key)}): private, keep it secret")  # fmt: skip
    if listen_note:
        out.append(f"{'listen':<12}{listen_note}")
    if layout.root is not None:
        out.append(f"(all of it under {layout.root})")
    typer.echo("\n".join(out))
    for line in _warnings(layout, command, systemd):
        typer.echo(f"latticed: warning: {line}", err=True)
    typer.echo("\n".join(_next_steps(layout, systemd)))


def _choose_listen(layout: Layout, given: str | None) -> tuple[tuple[str, int], str | None]:
    """The listen address to write, and a line saying why when it is not what was asked for.

    Given: that, with a note if it is in use now. Not given: the existing config's (rewriting a config
    must not move a running daemon's port), else the default port or, when another program (say, another
    user's daemon) holds it, the next free one."""
    from latticed.host.config import read_config_file  # noqa: PLC0415
    from latticed.host.listen_probe import first_free_listen, probe_listen  # noqa: PLC0415
    from latticed.protocol.addresses import parse_host_port  # noqa: PLC0415

    if given is not None:
        address = parse_host_port(given, allow_port_zero=True)
        try:
            probe_listen(address)
        except LatticedError:
            return (
                address,
                f"{format_listen(address)}, in use now: free it or choose another before you start",
            )
        return address, None
    config_file = layout.target(layout.config_file)
    if layout.root is None and config_file.exists():
        try:
            kept = read_config_file(config_file).get("listen")
            if isinstance(kept, str):
                return parse_host_port(kept, allow_port_zero=True), None
        except MalformedError:
            pass  # a broken config: it is rewritten only with --force, then with a port chosen afresh
    if layout.root is not None:  # an image being built: this host's ports say nothing about its
        return DEFAULT_LISTEN, None
    chosen = first_free_listen(DEFAULT_LISTEN)
    if chosen is None:
        return DEFAULT_LISTEN, (
            f"{format_listen(DEFAULT_LISTEN)} and the ports after it are in use on this host: set listen "
            "in the config to a free port before you start the daemon"
        )
    if chosen != DEFAULT_LISTEN:
        return chosen, (
            f"{format_listen(chosen)} (port {DEFAULT_LISTEN[1]} is in use on this host, maybe by another "
            "user's latticed)"
        )
    return chosen, None


def _owned_like_its_directory(path: Path) -> None:
    """Give a key file root just made to the owner of its data directory (the ``latticed`` user, once the
    service has run), or the daemon could not read it. A directory root just made is left to systemd, which
    hands a ``StateDirectory=`` owned by someone else to the service user, with everything in it."""
    if os.geteuid() != 0:
        return
    owner = path.parent.stat()
    if path.stat().st_uid != owner.st_uid or path.stat().st_gid != owner.st_gid:
        os.chown(path, owner.st_uid, owner.st_gid)


def _state(path: Path, text: str) -> str:
    """``new``, ``same`` (already holds ``text``) or ``differs``."""
    try:
        return "same" if path.read_text(encoding="utf-8") == text else "differs"
    except FileNotFoundError:
        return "new"
    except (OSError, UnicodeDecodeError):
        return "differs"


def _warnings(layout: Layout, command: list[str], systemd: bool) -> list[str]:
    program = Path(command[0])
    if systemd and layout.scope == "system" and any(program.is_relative_to(p) for p in _HIDDEN_FROM_SYSTEM):
        return [
            f"{program} is under a directory the system unit hides (ProtectHome=yes), so the service "
            "cannot start it: install latticed outside /home and /root (e.g. a venv in /opt/latticed) "
            "and run init again with --force"
        ]
    return []


def _next_steps(layout: Layout, systemd: bool) -> list[str]:
    if not systemd:
        start = [f"  latticed run --config {layout.config_file}"]
        ctl = "latticectl"
    elif layout.scope == "system":
        start = [
            "  systemd-sysusers                 # creates the user the service runs as",
            "  systemctl daemon-reload && systemctl enable --now latticed",
        ]
        ctl = "LATTICED_SOCKET=/run/latticed/latticed.sock latticectl"
    else:
        start = [
            "  systemctl --user daemon-reload && systemctl --user enable --now latticed",
            "  loginctl enable-linger $USER     # optional: keep it running while you are logged out",
        ]
        ctl = "latticectl"
    return [
        "",
        "next: start it",
        *start,
        "then bring in your other machines, after `latticed init` on each:",
        f"  here:  {ctl} invite    # prints a token: a SECRET, it holds the network key",
        "  there: latticectl join TOKEN",
        "(daemons on one LAN that share the network key also find each other by themselves)",
    ]


def register(app: typer.Typer) -> None:
    """Add ``init`` to ``latticed``."""
    app.command("init")(init)


__all__ = ["init", "register"]
