"""``latticectl store compact``: give the store's free space back to the file system.

Deleted records (truncation, retention) free pages inside the store; latticed gives them back by itself
after large deletions, and ``compact`` does the rest at once: every free page, the WAL cut back, the disk
reserve written again. A store made before incremental auto-vacuum is converted here with one ``VACUUM``,
which needs free disk about the size of the store. Writes wait while it runs.
"""

from __future__ import annotations

from typing import Any

import typer

from cli.common import JsonFlag, note, settings
from cli.output import emit
from latticed.api.client.blocking_client import Client

store_app = typer.Typer(
    help="Manage the store file: give freed space back to the disk.", no_args_is_help=True
)


def _mib(nbytes: Any) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB" if isinstance(nbytes, int) else "?"


@store_app.command("compact")
def compact(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Give every free page of the store back to the file system, and say how much that was."""
    # No reply timeout: converting a large old store (one VACUUM) takes as long as it takes.
    client = ctx.find_root().with_resource(Client(settings(ctx).socket_path, timeout=None))
    result = client.store_compact()
    if as_json:
        emit(result, None, as_json=True)
        return
    how = " (converted to incremental auto-vacuum)" if result.get("vacuumed") else ""
    note(
        f"store compacted{how}: {_mib(result.get('before_bytes'))} -> {_mib(result.get('after_bytes'))}, "
        f"{_mib(result.get('freed_bytes'))} given back to the file system"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")


__all__ = ["register", "store_app"]
