"""``latticectl queue why NAME``: why this daemon's copy of a queue is where it is, in one verdict line,
then what it holds, what exists, and each peer that holds the queue (docs/operations.md, "Why a replica
is behind")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import typer

from cli.common import JsonFlag, QueueArg
from cli.output import emit, field_lines, table_lines
from latticed.api.client.blocking_client import Client

ClientFactory = Callable[[typer.Context], Client]
_factory: list[ClientFactory] = []


def _when(wall: float | None) -> str:
    return "-" if wall is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))


def _holds(row: dict[str, Any]) -> str:
    if row.get("held_end") is None:
        return "?"
    start, end = row.get("held_start"), row["held_end"]
    return "nothing" if start == end else f"{start}..{end - 1}"


def lines(why: dict[str, Any]) -> list[str]:
    """The human form: the verdict, then the facts, then one row per peer."""
    lo, hi = why["holds"]
    out = [why["verdict"], ""]
    out += field_lines(
        {
            "queue": why["queue"],
            "holds here": "nothing" if lo == hi else f"{lo}..{hi - 1} ({hi - lo} records)",
            "exists": f"up to offset {why['exists_end'] - 1} (the owner's newest head, or a peer)",
            "behind": why["behind"],
            "replication": "running" if why["replicating"] else "not running (no --listen, --peer or peers)",
        }
    )
    rows = [
        {
            "peer": p["peer"][:16] + (" (owner)" if p["is_owner"] else ""),
            "state": "blocked" if p["blocked"] else "connected" if p["connected"] else "offline",
            "since": _when(p["since"]),
            "holds": _holds(p),
            "in_flight": f"{p['in_flight']} out" + (", asked" if p["asked"] else ""),
            "last_error": p["last_error"] or "-",
        }
        for p in why["peers"]
    ]
    columns = {
        "peer": "PEER",
        "state": "STATE",
        "since": "SINCE",
        "holds": "HOLDS",
        "in_flight": "IN FLIGHT",
        "last_error": "LAST ERROR",
    }
    if rows:
        out += ["", *table_lines(rows, columns)]
    return out


def why(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Say why this daemon's copy of QUEUE is where it is: up to date, behind (and who holds the rest),
    owner offline, a blocked peer, capped here by replica_max_bytes, or frozen by a fork."""
    reply = _factory[0](ctx).call("queue_why", queue=queue)
    reply.pop("ok", None)
    reply.pop("id", None)
    emit(reply, lines(reply), as_json=as_json)


def register(queue_app: typer.Typer, client: ClientFactory) -> None:
    """Add ``queue why`` (``client`` makes the invocation's client)."""
    _factory[:] = [client]
    queue_app.command("why")(why)


__all__ = ["lines", "register", "why"]
