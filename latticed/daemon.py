"""The composition root: the only module that knows every component and wires them together.

Start-up order (each step fails early with a clear LatticedError): directories, the data directory's
lock, the identity key, the store (migrated), the API socket; then READY=1 to systemd. One root nursery
holds every service, each started with ``nursery.start`` so "ready" means ready. SIGTERM or SIGINT
cancels that nursery: connections close, the storage thread finishes the jobs it has, the socket file is
removed, and ``run`` returns 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from latticed.api.handlers import Context
from latticed.api.server import serve_api
from latticed.config import DaemonConfig, load_config
from latticed.crdt.signing import Identity
from latticed.errors import LatticedError
from latticed.logs import configure_logging, get_logger, log_event
from latticed.paths import ensure_data_dir, ensure_socket_dir
from latticed.sdnotify import Notifier, watchdog_interval
from latticed.storage.engine import Engine
from latticed.storage.keyfile import load_or_create_identity
from latticed.storage.lockfile import DataDirLock

log = get_logger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: The event loop and the storage thread share the GIL; with CPython's default 5 ms switch interval a
#: busy storage thread can hold a ready event loop back that long, which is the whole latency budget.
GIL_SWITCH_INTERVAL_S = 0.0005


@dataclass(slots=True)
class RunningDaemon:
    """Handed to ``task_status.started``: what an embedding caller (tests) may look at or stop."""

    config: DaemonConfig
    identity: Identity
    engine: Engine
    _scope: trio.CancelScope

    def stop(self) -> None:
        """Begin a clean shutdown (call from the daemon's trio thread)."""
        self._scope.cancel()


async def run_daemon(
    config: DaemonConfig,
    *,
    task_status: trio.TaskStatus[RunningDaemon] = trio.TASK_STATUS_IGNORED,
    handle_signals: bool | None = None,
    env: Mapping[str, str] = os.environ,
) -> None:
    """Run until SIGTERM/SIGINT (or cancellation). ``handle_signals`` defaults to "on the main thread"."""
    if handle_signals is None:
        handle_signals = threading.current_thread() is threading.main_thread()
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
    notifier = Notifier.from_env(env)
    ensure_data_dir(config.data_dir)
    ensure_socket_dir(config.socket_path)
    with DataDirLock(config.data_dir):
        identity = load_or_create_identity(config.identity_key_path)
        async with Engine.open(config.data_dir, identity, group_commit_ms=config.group_commit_ms) as engine:
            context = Context(engine, config.data_dir, config.socket_path, config.max_frame_bytes)
            try:
                async with trio.open_nursery() as nursery:
                    if handle_signals:
                        await nursery.start(_stop_on_signal, nursery.cancel_scope, notifier)
                    await nursery.start(serve_api, context)
                    interval = watchdog_interval(env)
                    if interval is not None:
                        nursery.start_soon(_watchdog, notifier, interval)
                    notifier.ready(f"serving {config.socket_path}")
                    log_event(
                        log,
                        "daemon.ready",
                        identity=identity.public_hex,
                        socket=str(config.socket_path),
                        data_dir=str(config.data_dir),
                        queues=len(engine.queues()),
                    )
                    task_status.started(RunningDaemon(config, identity, engine, nursery.cancel_scope))
            finally:
                notifier.stopping()
                log_event(log, "daemon.stopping")
    notifier.close()
    log_event(log, "daemon.stopped")


async def _stop_on_signal(
    scope: trio.CancelScope,
    notifier: Notifier,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            log_event(log, "daemon.signal", signal=signal.Signals(signum).name)
            notifier.stopping()
            scope.cancel()
            return


async def _watchdog(notifier: Notifier, interval: float) -> None:
    """Ping systemd while the event loop runs; a wedged loop stops the pings and gets us restarted."""
    while True:
        notifier.watchdog()
        await trio.sleep(interval)


def run(config: DaemonConfig) -> int:
    """Run the daemon in this (main) thread until stopped; returns the process exit code."""
    configure_logging(config.log_level, config.log_format)
    try:
        trio.run(run_daemon, config)
    except LatticedError as exc:
        log_event(log, "daemon.failed", level=50, error=str(exc), code=exc.code)
        return EXIT_FAILURE
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m latticed", description="latticed peer-to-peer sync daemon"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser("run", help="run the daemon in the foreground")
    run_cmd.add_argument("--config", type=Path, help="TOML config file")
    run_cmd.add_argument("--data-dir", help="where the store and identity key live")
    run_cmd.add_argument("--socket", help="local API socket path")
    run_cmd.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    run_cmd.add_argument("--log-format", choices=["json", "text"])
    run_cmd.add_argument("--no-mdns", action="store_true", help="do not announce or discover peers by mDNS")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m latticed run --data-dir D --socket S``: a minimal entry point (the CLI is the full one)."""
    args = _parser().parse_args(argv)
    overrides: dict[str, object] = {
        "data_dir": args.data_dir,
        "socket_path": args.socket,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "mdns": False if args.no_mdns else None,
    }
    try:
        config = load_config(args.config, overrides)
    except LatticedError as exc:
        print(f"latticed: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run(config)


__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "RunningDaemon", "main", "run", "run_daemon"]
