"""Times on the command line: ``--since 2h`` and ``--from-time``/``--to-time ISO8601`` as the first offset
at or after them (the daemon's ``offsets_for_times``).

A time is read as milliseconds since the epoch: an ISO 8601 date and time (without an offset it is this
machine's local time; ``Z`` or ``+02:00`` name one), or a whole number of milliseconds.
"""

from __future__ import annotations

import time
from datetime import datetime

import typer

from latticed.api.client.blocking_client import Client
from latticed.errors import MalformedError
from latticed.host.retention_policy import parse_duration


def parse_time(ctx: typer.Context, text: str, option: str) -> int:
    """Milliseconds since the epoch from ISO 8601 text or a number of milliseconds."""
    if text.strip().isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"expected an ISO 8601 time like 2026-05-01T09:00 or 2026-05-01T09:00:00Z, got {text!r}",
            ctx=ctx,
            param_hint=f"'{option}'",
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # this machine's local time
    return int(moment.timestamp() * 1000)


def parse_since(ctx: typer.Context, text: str) -> int:
    """``now - DURATION`` in milliseconds since the epoch (``2h``, ``30m``, ``7d``, ``90s``)."""
    try:
        ago = parse_duration(text, "--since")
    except MalformedError as exc:
        raise typer.BadParameter(str(exc), ctx=ctx, param_hint="'--since'") from None
    return int(time.time() * 1000) - (ago or 0)


def offset_at(client: Client, queue: str, ts_ms: int) -> tuple[int, bool]:
    """The first offset whose record's timestamp is at or after ``ts_ms``, and True; or, when no record's
    is yet, the queue's end (where the next record goes) and False."""
    reply = client.call("offsets_for_times", queue=queue, timestamp=ts_ms)
    if reply.get("offset") is None:
        return int(reply["end"]), False
    return int(reply["offset"]), True


def chosen(ctx: typer.Context, **options: str | None) -> list[str]:
    """The names of the options given; BadParameter when two of them exclude each other."""
    given = [name for name, value in options.items() if value is not None]
    if len(given) > 1:
        raise typer.BadParameter(f"give one of {', '.join(given)}", ctx=ctx, param_hint=f"'{given[1]}'")
    return given


__all__ = ["chosen", "offset_at", "parse_since", "parse_time"]
