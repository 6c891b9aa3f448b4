"""``latticed``: run the daemon, make a network key, migrate the store, print the version.

``latticed run`` builds its :class:`~latticed.host.config.DaemonConfig` with
:func:`~latticed.host.config.load_config`:
defaults from the environment, then ``--config FILE``, then the options given here (an option left out
does not override the file). Errors become one line on stderr and an exit code at the boundary
(:mod:`cli.boundary`); a bad config is exit 2.

Start-up stays short where nothing waits: the daemon (trio, the store, zeroconf, nacl, prometheus) is
imported only by ``run``, after the refusals that need none of it (another daemon on the socket or the
data directory, the listen port taken), and values convert without pydantic (:mod:`cli.lazy`). Help is
click's plain layout, which wraps but never cuts an option's name at 80 columns.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from cli import lazy
from cli.boundary import BoundaryGroup, version_option
from cli.init import register as register_init
from cli.migrate import register as register_migrate
from latticed.host.config import (
    LOG_FORMATS,
    LOG_LEVELS,
    DaemonConfig,
    LogFormat,
    default_data_dir,
    default_socket_path,
    load_config,
)
from latticed.version import describe


class _DaemonGroup(BoundaryGroup):
    """The root group; its commands' plain values convert without pydantic."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        lazy.lighten(self.get_params(ctx))  # here: typer adds its completion options after __init__
        help_names = self.context_settings.get("help_option_names", ["--help"])
        for command in lazy.subcommands(self)[1:]:
            lazy.lighten_command(command, help_names)
        return super().parse_args(ctx, args)


app = typer.Typer(
    name="latticed",
    cls=_DaemonGroup,
    help="latticed: peer-to-peer sync daemon for signed queues and KV state.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
#: DaemonConfig's defaults, shown in ``run --help`` (its options default to None: "not given, keep the
#: config file's value").
_DEFAULTS: dict[str, object] = {f.name: f.default for f in dataclasses.fields(DaemonConfig)}

network_key_app = typer.Typer(help="Manage the network key peers share.", no_args_is_help=True)
app.add_typer(network_key_app, name="network-key")


@app.command()
def run(
    *,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            metavar="PATH",
            help="Where the store and identity live ($STATE_DIRECTORY under systemd).",
            show_default=str(default_data_dir()),
        ),
    ] = None,
    socket: Annotated[
        Path | None,
        typer.Option(
            "--socket",
            metavar="PATH",
            help="The local API socket to serve ($LATTICED_SOCKET).",
            show_default=str(default_socket_path()),
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE", envvar="LATTICED_CONFIG", help="A TOML config file."),
    ] = None,
    mdns: Annotated[
        bool | None,
        typer.Option(
            "--mdns/--no-mdns",
            help="Find peers on the LAN with mDNS.",
            show_default="--mdns" if _DEFAULTS["mdns"] else "--no-mdns",
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Accept peers here (port 0: any).",
            show_default="none (local only)",
        ),
    ] = None,
    peer: Annotated[
        list[str] | None,
        typer.Option("--peer", metavar="HOST:PORT", help="Dial this peer; repeatable.", show_default="none"),
    ] = None,
    mdns_interface: Annotated[
        list[str] | None,
        typer.Option(
            "--mdns-interface",
            metavar="IP",
            help="Run mDNS on this interface; repeatable.",
            show_default="every interface",
        ),
    ] = None,
    network_key_file: Annotated[
        Path | None,
        typer.Option(
            "--network-key-file",
            metavar="PATH",
            help="The network key (see network-key new).",
            show_default="DATA_DIR/network.key if join kept one there, else the public key: anyone can join",
        ),
    ] = None,
    insecure_public_network_key: Annotated[
        bool | None,
        typer.Option(
            "--insecure-public-network-key",
            help="Listen beyond loopback without a network key: anyone can join. Never for real data.",
        ),
    ] = None,
    allow_peer: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-peer",
            metavar="ID",
            help="Accept only peers with these identities (64 hex digits, `latticectl id`); repeatable. "
            "A blocked peer stays refused (latticectl peers block).",
            show_default="any peer holding the network key",
        ),
    ] = None,
    replicate: Annotated[
        list[str] | None,
        typer.Option(
            "--replicate",
            metavar="PATTERN",
            help="Replicate only OWNER/NAME matching this glob; repeatable.",
            show_default="every queue",
        ),
    ] = None,
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            "--metrics-listen",
            metavar="[HOST:]PORT",
            help="Serve Prometheus metrics over HTTP here (a bare port: loopback; 0: any). Default: off.",
        ),
    ] = None,
    replica_max_bytes: Annotated[
        str | None,
        typer.Option(
            "--replica-max-bytes",
            metavar="SIZE",
            help="Keep at most this much of each replicated queue (50MB, 20MiB): its oldest records are "
            "dropped here only, and what stays still verifies.",
            show_default="no cap",
        ),
    ] = None,
    replica_queue_cap: Annotated[
        list[str] | None,
        typer.Option(
            "--replica-queue-cap",
            metavar="PATTERN=SIZE",
            help="The cap of replicated queues whose OWNER/NAME matches this glob (none: no cap); "
            "repeatable, the first match wins over --replica-max-bytes.",
            show_default="none",
        ),
    ] = None,
    retention_interval: Annotated[
        float | None,
        typer.Option(
            "--retention-interval",
            metavar="SECONDS",
            help="How often retention checks record ages and purges expired KV keys (byte and record "
            "limits are also checked as commits cross them).",
            show_default=str(_DEFAULTS["retention_interval_s"]),
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            metavar="LEVEL",
            autocompletion=lambda: LOG_LEVELS,
            help=f"Lowest level logged: {', '.join(LOG_LEVELS)}.",
            show_default=str(_DEFAULTS["log_level"]),
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            metavar="FORMAT",
            autocompletion=lambda: LOG_FORMATS,
            help=f"Log lines as {' or '.join(LOG_FORMATS)}.",
            show_default=str(_DEFAULTS["log_format"]),
        ),
    ] = None,
) -> None:
    """Run the daemon in the foreground until SIGINT or SIGTERM."""
    overrides: dict[str, object] = {
        "data_dir": data_dir,
        "socket_path": socket,
        "mdns": mdns,
        "listen": listen,
        "peers": peer or None,
        "mdns_interfaces": mdns_interface or None,
        "network_key_file": network_key_file,
        "insecure_public_network_key": insecure_public_network_key,
        "allowed_peers": allow_peer or None,
        "replicate": replicate or None,
        "metrics_listen": metrics_listen,
        "replica_max_bytes": replica_max_bytes,
        "replica_queue_caps": replica_queue_cap or None,
        "retention_interval_s": retention_interval,
        "log_level": log_level,
        "log_format": log_format,
    }
    daemon_config = load_config(config, overrides)
    refuse_early(daemon_config, config)
    configure_logging(daemon_config.log_level, daemon_config.log_format)
    import trio  # noqa: PLC0415 - after the refusals: see the module docstring

    trio.run(run_daemon, daemon_config)


def configure_logging(level: str, log_format: LogFormat) -> None:
    """:func:`latticed.process.logs.configure_logging`, imported when ``run`` gets this far."""
    from latticed.process.logs import configure_logging as configure  # noqa: PLC0415

    configure(level, log_format)


async def run_daemon(config: DaemonConfig) -> None:
    """:func:`latticed.daemon.run_daemon`, imported when ``run`` gets this far."""
    from latticed.daemon import run_daemon as run_it  # noqa: PLC0415

    await run_it(config)


def refuse_early(config: DaemonConfig, config_file: Path | None = None) -> None:
    """What would make the daemon refuse, checked before it is imported: a daemon serving the socket,
    one holding the data directory's lock, the listen port taken (the daemon checks each again itself)."""
    from latticed.api.server.served import refuse_if_served  # noqa: PLC0415
    from latticed.host.data_dir_lock import DataDirLock  # noqa: PLC0415
    from latticed.host.listen_probe import probe_listen  # noqa: PLC0415

    refuse_if_served(config.socket_path)
    if config.data_dir.is_dir():
        with DataDirLock(config.data_dir):
            pass
    if config.listen is not None:
        probe_listen(config.listen, config_file=config_file)


@network_key_app.command("new")
def network_key_new(
    path: Annotated[Path, typer.Argument(help="File to create (mode 0600); an existing file is kept.")],
) -> None:
    """Write a new random network key to PATH; copy it to every host of the network."""
    from latticed.host.netkey import network_key_fingerprint, write_network_key  # noqa: PLC0415

    key = write_network_key(path)
    typer.echo(f"wrote network key to {path} (fingerprint {network_key_fingerprint(key)})")


register_init(app)
register_migrate(app)


@app.command()
def version() -> None:
    """Print latticed's release and the wire, store and local API versions it speaks."""
    typer.echo(describe("latticed"))


@app.callback()
def _root(
    _version: Annotated[bool, version_option("latticed")] = False,
) -> None:
    """latticed: peer-to-peer sync daemon for signed queues and KV state."""


def main() -> None:
    """Entry point of the ``latticed`` script."""
    app(prog_name="latticed")


__all__ = ["app", "configure_logging", "main", "refuse_early", "run_daemon"]
