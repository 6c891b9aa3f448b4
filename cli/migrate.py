"""``latticed migrate``: upgrade a stopped daemon's store to this release's schema, or say what that would do.

The daemon migrates its store at every start, so this command is optional: it lets an operator see the
steps first (``--dry-run`` opens the store read-only and writes nothing, so it also runs beside a daemon)
and do the upgrade while the daemon is down. Migrating takes the data directory's lock, so it refuses
while a daemon holds the store. Either way a store of a newer schema is refused, naming the release that
wrote it (exit 7), and a missing store is exit 4: nothing is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from latticed.host.config import default_data_dir, load_config


def migrate(
    *,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Say what would change (schemas, steps, the copy kept); write nothing."
        ),
    ] = False,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            metavar="PATH",
            help="The data directory holding the store.",
            show_default=str(default_data_dir()),
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", metavar="FILE", envvar="LATTICED_CONFIG", help="Read data_dir from this config."
        ),
    ] = None,
) -> None:
    """Upgrade the store to this release's schema (the daemon also does it when it starts)."""
    from latticed.storage.store import db_path  # noqa: PLC0415 - the store only once a command runs
    from latticed.storage.upgrade import describe_plan, plan_upgrade  # noqa: PLC0415

    directory = load_config(config, {"data_dir": data_dir}).data_dir
    path = db_path(directory)
    plan = plan_upgrade(path)  # a missing store stops here: migrate creates nothing
    if dry_run:
        typer.echo(describe_plan(plan))
        return
    from latticed.host.data_dir_lock import DataDirLock  # noqa: PLC0415
    from latticed.storage.schema import migrate as run_migrations  # noqa: PLC0415
    from latticed.storage.sqlite import connect  # noqa: PLC0415

    with DataDirLock(directory):
        plan = plan_upgrade(path)  # again: a daemon may have migrated it meanwhile
        if not plan.steps:
            typer.echo(describe_plan(plan))
            return
        conn = connect(path, writer=True)
        try:
            _, copy = run_migrations(conn, path)
        finally:
            conn.close()
    kept = f"; the copy from before is {copy} (delete it once you will not roll back)" if copy else ""
    typer.echo(f"migrated store {path} from schema {plan.schema} to {plan.target}{kept}")


def register(app: typer.Typer) -> None:
    """Add ``migrate`` to ``latticed``."""
    app.command("migrate")(migrate)


__all__ = ["migrate", "register"]
