"""``latticectl queue retention set|show`` and ``latticectl queue verify``, and the retention options of
``queue create`` (``--max-age``, ``--max-bytes``, ``--max-records``, ``--keep-unsettled``).

Sizes and durations are parsed here (:mod:`latticed.host.retention_policy`), so a typo fails at once (exit 2)
and nothing is sent; the policy itself lives in the queue's signed metadata (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from cli.common import JsonFlag, QueueArg, note
from cli.output import emit, field_lines
from latticed.api.client.blocking_client import Client
from latticed.errors import MalformedError
from latticed.host.retention_policy import (
    UNCHANGED,
    RetentionPolicy,
    Unchanged,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)

ClientFactory = Callable[[typer.Context], Client]
_factory: list[ClientFactory] = []

retention_app = typer.Typer(
    help="A queue's retention: how long and how much of it is kept (docs/operations.md).",
    no_args_is_help=True,
)

_AGE_HELP = "Drop records older than this: 7d, 12h, 30m, 90s, 500ms or seconds; none: no limit."
_BYTES_HELP = "Keep at most this many bytes of records, as stored: 50MB, 20MiB or bytes; none: no limit."
_RECORDS_HELP = "Keep at most this many records; none: no limit."
_KEEP_HELP = "Never drop a record a consumer group on the owner's daemon has not settled."
_KEEP_FLAGS = "--keep-unsettled/--no-keep-unsettled"

# For ``queue create`` (left out: no limit)...
MaxAge = Annotated[
    str | None, typer.Option("--max-age", metavar="DURATION", help=_AGE_HELP, show_default="no limit")
]
MaxBytes = Annotated[
    str | None, typer.Option("--max-bytes", metavar="SIZE", help=_BYTES_HELP, show_default="no limit")
]
MaxRecords = Annotated[
    str | None, typer.Option("--max-records", metavar="N", help=_RECORDS_HELP, show_default="no limit")
]
KeepUnsettled = Annotated[
    bool | None, typer.Option(_KEEP_FLAGS, help=_KEEP_HELP, show_default="--no-keep-unsettled")
]
# ...and for ``queue retention set`` (left out: as it is).
SetMaxAge = Annotated[
    str | None, typer.Option("--max-age", metavar="DURATION", help=_AGE_HELP, show_default="unchanged")
]
SetMaxBytes = Annotated[
    str | None, typer.Option("--max-bytes", metavar="SIZE", help=_BYTES_HELP, show_default="unchanged")
]
SetMaxRecords = Annotated[
    str | None, typer.Option("--max-records", metavar="N", help=_RECORDS_HELP, show_default="unchanged")
]
SetKeepUnsettled = Annotated[
    bool | None, typer.Option(_KEEP_FLAGS, help=_KEEP_HELP, show_default="unchanged")
]


def _parsed(
    ctx: typer.Context, option: str, text: str | None, parse: Callable[[str, str], int | None]
) -> int | Unchanged | None:
    if text is None:
        return UNCHANGED
    try:
        return parse(text, option)
    except MalformedError as exc:
        raise typer.BadParameter(str(exc), ctx=ctx, param_hint=f"'{option}'") from None


def _count(text: str, option: str) -> int | None:
    if text.strip().lower() in ("none", "0"):
        return None
    if not text.isascii() or not text.isdigit():
        raise MalformedError(f"{option}: {text!r} is not a whole number (or 'none')")
    return int(text)


def policy_options(
    ctx: typer.Context,
    max_age: str | None,
    max_bytes: str | None,
    max_records: str | None,
    keep_unsettled: bool | None,
) -> dict[str, Any]:
    """The options given, parsed, as ``retention_set`` arguments (what is not given is left out)."""
    parsed: dict[str, Any] = {
        "max_age_ms": _parsed(ctx, "--max-age", max_age, parse_duration),
        "max_bytes": _parsed(ctx, "--max-bytes", max_bytes, parse_size),
        "max_records": _parsed(ctx, "--max-records", max_records, _count),
        "keep_unsettled": UNCHANGED if keep_unsettled is None else keep_unsettled,
    }
    return {name: value for name, value in parsed.items() if not isinstance(value, Unchanged)}


def policy_of(options: dict[str, Any]) -> RetentionPolicy | None:
    """The policy a new queue gets from the create options (None: none given)."""
    if not options:
        return None
    return RetentionPolicy(
        max_age_ms=options.get("max_age_ms"),
        max_bytes=options.get("max_bytes"),
        max_records=options.get("max_records"),
        keep_unsettled=bool(options.get("keep_unsettled", False)),
    )


def _lines(info: dict[str, Any]) -> list[str]:
    policy = info.get("policy") or {}
    records = policy.get("max_records")
    fields: dict[str, object] = {
        "queue": info.get("queue"),
        "max age": format_duration(policy.get("max_age_ms")),
        "max bytes": format_size(policy.get("max_bytes")),
        "max records": "none" if records is None else f"{records}",
        "keep unsettled": bool(policy.get("keep_unsettled")),
        "enforced by": "this daemon (the owner)" if info.get("owned") else "the owner's daemon",
    }
    start, end = info.get("start_offset"), info.get("end_offset")
    held = f"{info.get('records')} records, {format_size(info.get('bytes'))}"
    if isinstance(start, int) and isinstance(end, int) and end > start:
        held += f", offsets {start}..{end - 1}"
    fields["held here"] = held
    if not info.get("owned"):
        cap = info.get("replica_max_bytes")
        fields["replica cap here"] = (
            format_size(cap) if cap is not None else "none (keeps what the owner keeps)"
        )
        if info.get("floor"):
            fields["dropped here below"] = info.get("floor")
    lines = field_lines(fields)
    lines += [f"unreadable: {problem}" for problem in info.get("problems") or []]
    return lines


@retention_app.command("show")
def show(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Show a queue's retention policy and what this daemon holds of it."""
    info = _factory[0](ctx).retention_get(queue)
    emit(info, _lines(info), as_json=as_json)


@retention_app.command("set")
def set_(
    ctx: typer.Context,
    *,
    queue: QueueArg,
    max_age: SetMaxAge = None,
    max_bytes: SetMaxBytes = None,
    max_records: SetMaxRecords = None,
    keep_unsettled: SetKeepUnsettled = None,
    as_json: JsonFlag = False,
) -> None:
    """Change the retention of one of your queues (options left out stay as they are; none removes a
    limit). Replicas see it in the queue's signed metadata; this daemon enforces it."""
    options = policy_options(ctx, max_age, max_bytes, max_records, keep_unsettled)
    if not options:
        raise typer.BadParameter(
            "give at least one of --max-age, --max-bytes, --max-records, --keep-unsettled",
            ctx=ctx,
            param_hint="'--max-age'",
        )
    info = _factory[0](ctx).retention_set(queue, **options)
    if as_json:
        emit(info, None, as_json=True)
        return
    policy = info.get("policy") or {}
    records = policy.get("max_records")
    note(
        f"retention of {info.get('queue')}: max age {format_duration(policy.get('max_age_ms'))}, "
        f"max bytes {format_size(policy.get('max_bytes'))}, "
        f"max records {'none' if records is None else records}, "
        f"keep unsettled {'yes' if policy.get('keep_unsettled') else 'no'}"
    )


def verify(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Re-check the queue as stored here against its owner's signatures (exit 6 if anything fails)."""
    result = _factory[0](ctx).queue_verify(queue)
    start, end = result.get("start_offset"), result.get("end_offset")
    held = "empty" if start == end else f"offsets {start}..{end - 1 if isinstance(end, int) else end}"
    emit(
        result, f"verified {result.get('records')} records of {result.get('queue')} ({held})", as_json=as_json
    )


def register(queue_app: typer.Typer, client: ClientFactory) -> None:
    """Add ``queue retention`` and ``queue verify`` (``client`` makes the invocation's client)."""
    _factory[:] = [client]
    queue_app.add_typer(retention_app, name="retention")
    queue_app.command("verify")(verify)


__all__ = ["KeepUnsettled", "MaxAge", "MaxBytes", "MaxRecords", "policy_of", "policy_options", "register"]
