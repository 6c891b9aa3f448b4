"""``latticectl doctor``: a checklist, ✔ or ✘, with one line on how to fix each ✘ (- : not applicable).

With the daemon running it checks itself (:mod:`latticed.host.checklist`, through the ``doctor`` API op);
without it, this checks what it can from the config (``--config FILE`` as for ``latticed run``, else the
one ``latticed init`` wrote, else the defaults; its socket is the one tried unless ``--socket`` is given)
and reads the store read-only, naming each queue the daemon would find corrupt at its start
(:mod:`cli.offline_store`), with the ``queue repair`` for it.
Either way the Spark extra is checked here, in the environment ``latticectl`` runs in. Exit code 1 when
any check fails (a daemon that is not running is one of them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import JsonFlag, settings
from cli.offline_store import store_checks
from cli.output import emit
from latticed.api.client.blocking_client import Client
from latticed.errors import ConnectionClosedError, LatticedError, MalformedError
from latticed.host.checklist import Check, check_spark, offline_checks
from latticed.host.config import load_config

_MARK = {True: "✔", False: "✘", None: "-"}
_START_FIX = (
    "start it: `systemctl start latticed` (or `systemctl --user start latticed`), or `latticed run --config "
    "FILE`; or point --socket at the socket it serves"
)


def _lines(checks: list[Check]) -> list[str]:
    lines = []
    for check in checks:
        lines.append(f"{_MARK[check.ok]} {check.check}: {check.detail}")
        if check.ok is False and check.fix:
            lines.append(f"    fix: {check.fix}")
    failed = sum(1 for c in checks if c.ok is False)
    lines.append("all checks passed" if not failed else f"{failed} problem{'s' if failed != 1 else ''} found")
    return lines


def default_config() -> Path | None:
    """The config ``latticed init`` wrote (``init --user``'s, then the system's), if there is one."""
    from latticed.host.install import default_config_files  # noqa: PLC0415 - only without --config

    return next((path for path in default_config_files() if path.is_file()), None)


def run_checks(socket: Path | None, config_file: Path | None) -> tuple[bool, list[Check]]:
    """(whether the daemon answered, the checks). Without ``config_file``, the config ``init`` wrote."""
    config = None
    found = config_file is None and (config_file := default_config()) is not None
    try:
        config = load_config(config_file, {"socket_path": socket})
    except MalformedError as exc:
        if config_file is not None:
            return False, [Check("config", False, str(exc), f"fix {config_file}")]
    path = socket if socket is not None else config.socket_path if config is not None else None
    checks: list[Check] = []
    with Client(path, timeout=30.0) as client:
        try:
            status = client.status()
        except ConnectionClosedError as exc:
            checks.append(Check("socket", False, str(exc), _START_FIX))
        else:
            checks.append(
                Check(
                    "socket",
                    True,
                    f"latticed {status.get('version')} answers at {client.socket_path} "
                    f"(identity {str(status.get('identity'))[:16]})",
                )
            )
            try:
                checks += [Check.from_wire(raw) for raw in client.doctor()]
            except LatticedError as exc:
                checks.append(Check("daemon", False, f"its checklist failed: {exc}", "upgrade latticed"))
            checks.append(check_spark())
            return True, checks
    if config is None:
        assert config_file is None
        checks.append(Check("config", False, "the default config does not load", "pass --config FILE"))
        return False, checks
    if config_file is None:
        source = "the defaults (no --config, and `latticed init` wrote none)"
    else:
        source = f"{config_file}" + (
            " (where `latticed init` writes it; --config for another)" if found else ""
        )
    checks.append(Check("config", None, f"the daemon is not running: checking the config from {source}"))
    checks += offline_checks(config)
    checks += store_checks(config.data_dir)
    checks.append(check_spark())
    return False, checks


def doctor(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE",
            envvar="LATTICED_CONFIG",
            help="The daemon's config (as for `latticed run`): its socket, and what to check when it is not "
            "running. Default: the one `latticed init` wrote (--user's, then the system's), if any.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check that this daemon works as a service: socket, data directory and key permissions, disk space,
    network key, listen address, mDNS interfaces, each peer, clocks, forks, the Spark extra. ✘ lines say
    how to fix them; exit code 1 if any."""
    running, checks = run_checks(settings(ctx).socket_path, config)
    ok = all(check.ok is not False for check in checks)
    report = {"ok": ok, "daemon_running": running, "checks": [c.to_wire() for c in checks]}
    emit(report, _lines(checks), as_json=as_json)
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``doctor`` to ``latticectl``."""
    app.command()(doctor)


__all__ = ["register", "run_checks"]
