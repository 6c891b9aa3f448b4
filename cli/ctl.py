"""``latticectl``: talk to the local latticed daemon over its unix socket.

``QUEUE`` is ``NAME`` for one of your own queues or ``OWNER/NAME`` for another identity's; KV keys of
another identity are ``OWNER/KEY`` the same way (:mod:`cli.kv`). Command-line values are stored as their
UTF-8 bytes. ``--socket`` and ``--json`` go before or after the command (:mod:`cli.common`). Output rules
are in :mod:`cli.output`; exit codes in :mod:`cli.boundary`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer
from typer.core import TyperGroup

from cli.boundary import BoundaryGroup
from cli.common import (
    SOCKET_HELP,
    JsonFlag,
    QueueArg,
    Settings,
    found,
    note,
    pairs,
    settings,
    to_bytes,
)
from cli.common import client as _client
from cli.groups import register as register_work_queues
from cli.join import register as register_membership
from cli.kv import kv_app
from cli.output import (
    emit,
    emit_entries,
    entry_text,
    field_lines,
    human,
    table_lines,
    text_of_bytes,
    write_bytes,
)
from cli.retention import (
    KeepUnsettled,
    MaxAge,
    MaxBytes,
    MaxRecords,
    policy_of,
    policy_options,
)
from cli.retention import register as register_retention

#: Lines sent per ``offer_batch`` round trip by ``offer --file``.
OFFER_BATCH_LINES = 1000

#: Epilog of the commands that print entries.
_ENTRY_FORMAT = (
    "Entries print one a line, tab-separated: OFFSET, key=KEY when there is a key, NAME=VALUE per header, "
    "then the value (bytes that are not UTF-8 as \\xNN escapes). With --json, one object a line; bytes that "
    'are not UTF-8 appear as {"base64": "..."}.'
)


def _take_socket(ctx: typer.Context, value: Path | None) -> None:
    """``--socket`` after the command: it overrides one given before it (or ``LATTICED_SOCKET``)."""
    if value is not None:
        settings(ctx).socket_path = value


def _socket_option() -> Any:
    """The ``--socket`` option as a click parameter, made by typer once for every command to share."""
    holder = typer.Typer()

    @holder.command()
    def hold(
        socket: Annotated[
            Path | None,
            typer.Option(
                "--socket", metavar="PATH", help=SOCKET_HELP, callback=_take_socket, expose_value=False
            ),
        ] = None,
    ) -> None:
        """Never run."""

    [param] = [p for p in typer.main.get_command(holder).params if p.name == "socket"]
    return param


class _CtlGroup(BoundaryGroup):
    """The root group: every command under it also takes ``--socket`` after its own name."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        param = _socket_option()
        pending: list[Any] = list(self.commands.values())
        while pending:
            command = pending.pop()
            if isinstance(command, TyperGroup):
                pending.extend(command.commands.values())
            elif all(p.name != "socket" for p in command.params):
                command.params.append(param)


def _json_defaults(command: Any) -> dict[str, Any]:
    """A click ``default_map`` turning on ``--json`` for every command below ``command`` that has it."""
    if isinstance(command, TyperGroup):
        return {name: _json_defaults(sub) for name, sub in command.commands.items()}
    return {"as_json": True} if any(p.name == "as_json" for p in command.params) else {}


app = typer.Typer(
    name="latticectl",
    cls=_CtlGroup,
    help="Control the local latticed daemon: queues, records, KV state and work queues.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
queue_app = typer.Typer(help="Create, list and inspect queues.", no_args_is_help=True)
meta_app = typer.Typer(help="Read, write, list and delete a queue's metadata.", no_args_is_help=True)
app.add_typer(queue_app, name="queue")
app.add_typer(meta_app, name="meta")
app.add_typer(kv_app, name="kv")

# --- shared parameters ----------------------------------------------------------------------------

Offset = Annotated[int, typer.Argument(metavar="OFFSET", min=0, help="Record offset.")]
MetaKey = Annotated[str, typer.Argument(metavar="KEY", help="Metadata key.")]
MetaValue = Annotated[str, typer.Argument(metavar="VALUE", help="Metadata values are text.")]


@app.callback()
def _root(
    ctx: typer.Context,
    socket: Annotated[
        Path | None, typer.Option("--socket", envvar="LATTICED_SOCKET", metavar="PATH", help=SOCKET_HELP)
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print JSON, as --json after the command does (where it prints data)."),
    ] = False,
) -> None:
    ctx.obj = Settings(socket, as_json)
    if as_json:
        ctx.default_map = _json_defaults(ctx.command)


# --- identity and status --------------------------------------------------------------------------


@app.command("id")
def identity(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Print this daemon's public identity (the owner part of its queues)."""
    ident = _client(ctx).identity()
    emit({"identity": ident}, ident, as_json=as_json)


def _duration(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return human(seconds)
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    units = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{unit}" for n, unit in units if n] or ["0s"]
    return " ".join(shown[:2])


def _size(nbytes: object) -> str:
    if not isinstance(nbytes, int | float):
        return human(nbytes)
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@app.command()
def status(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Show identity, version, uptime, queues, records and storage."""
    info = _client(ctx).status()
    fields = {
        "identity": info.get("identity"),
        "version": info.get("version"),
        "uptime": _duration(info.get("uptime_s")),
        "queues": info.get("queues"),
        "records": info.get("records"),
        "storage": _size(info.get("storage_bytes")),
        "data dir": info.get("data_dir"),
        "socket": info.get("socket"),
        "listen": info.get("listen") or "not listening (local only)",
        "replication lag": info.get("replication_lag") or "none",
    }
    emit(info, field_lines(fields), as_json=as_json)


_PEER_COLUMNS = {
    "public_key": "IDENTITY",
    "address": "ADDRESS",
    "sources": "FOUND",
    "connected": "CONNECTED",
    "lag": "LAG",
}


@app.command()
def peers(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List known peers: identity, address, how found, connected?, and lag per queue."""
    rows = _client(ctx).peers()
    shown = [{**row, "lag": _lag_text(row.get("lag") or {})} for row in rows]
    emit(rows, table_lines(shown, _PEER_COLUMNS) if rows else ["no peers"], as_json=as_json)


def _lag_text(lags: dict[str, int]) -> str:
    """Summed over queues: records the peer lacks ("behind"), and records it holds that we lack ("ahead":
    this daemon is still catching up, e.g. after a restore). ``--json`` has them per queue."""
    behind = sum(lag for lag in lags.values() if lag > 0)
    ahead = -sum(lag for lag in lags.values() if lag < 0)
    parts = [f"{count} records {word}" for count, word in ((behind, "behind"), (ahead, "ahead")) if count]
    return ", ".join(parts) or "in sync"


# --- queues ---------------------------------------------------------------------------------------


@queue_app.command("create")
def queue_create(
    ctx: typer.Context,
    *,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Name of the new queue (owned by this daemon).")
    ],
    meta: Annotated[
        list[str] | None, typer.Option("--meta", metavar="K=V", help="Metadata entry; repeatable.")
    ] = None,
    max_age: MaxAge = None,
    max_bytes: MaxBytes = None,
    max_records: MaxRecords = None,
    keep_unsettled: KeepUnsettled = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a queue; prints its full name, OWNER/NAME. The retention options set its policy (see
    queue retention)."""
    entries = pairs(ctx, "--meta", meta)
    retention = policy_of(policy_options(ctx, max_age, max_bytes, max_records, keep_unsettled))
    full = _client(ctx).queue_create(name, dict(entries) if entries else None, retention=retention)
    emit({"queue": full}, full, as_json=as_json)


_QUEUE_COLUMNS = {"queue": "QUEUE", "size": "SIZE", "start_offset": "START", "end_offset": "END"}


@queue_app.command("list")
def queue_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the queues this daemon holds (its own and replicated ones)."""
    queues = _client(ctx).queue_list()
    emit(queues, table_lines(queues, _QUEUE_COLUMNS) if queues else [], as_json=as_json)
    if not queues and not as_json:
        note("no queues yet (latticectl queue create NAME)")


@queue_app.command("info")
def queue_info(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Show a queue's owner, offsets, size, metadata and whether it is forked."""
    info = _client(ctx).queue_info(queue)
    emit(info, field_lines(info), as_json=as_json)


# --- records --------------------------------------------------------------------------------------


def _read_batches(stream: BinaryIO, lines_per_batch: int) -> Iterator[tuple[list[bytes], int]]:
    """Lines (without ``\\n`` or ``\\r\\n``) in batches, each with the number of bytes it consumed."""
    batch: list[bytes] = []
    consumed = 0
    for line in stream:
        consumed += len(line)
        batch.append(line.removesuffix(b"\n").removesuffix(b"\r"))
        if len(batch) == lines_per_batch:
            yield batch, consumed
            batch, consumed = [], 0
    if batch:
        yield batch, consumed


@contextlib.contextmanager
def _progress(stream: BinaryIO) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(nbytes)``: a progress bar on stderr for a regular file on a terminal, else a no-op."""
    total: int | None = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        st = os.fstat(stream.fileno())
        if stat.S_ISREG(st.st_mode):
            total = st.st_size - stream.tell()
    if total is None or not sys.stderr.isatty():
        yield lambda _n: None
        return
    with typer.progressbar(length=total, label="offering", file=sys.stderr) as bar:
        yield bar.update


def _open_input(ctx: typer.Context, path: str) -> BinaryIO:
    if path == "-":
        return typer.get_binary_stream("stdin")
    return ctx.with_resource(open(path, "rb"))


@app.command()
def offer(
    ctx: typer.Context,
    *,
    queue: QueueArg,
    value: Annotated[
        str | None,
        typer.Argument(metavar="VALUE", help="The record's value (or use --file or --value-file)."),
    ] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="The record's key.")] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", metavar="K=V", help="A header; repeatable.")
    ] = None,
    file: Annotated[
        str | None,
        typer.Option(
            "--file",
            "-f",
            metavar="PATH|-",
            help=f"Offer one record per line of PATH (- for stdin), {OFFER_BATCH_LINES} per round trip; "
            "--key and --header apply to every record.",
        ),
    ] = None,
    value_file: Annotated[
        str | None,
        typer.Option(
            "--value-file",
            metavar="PATH|-",
            help="Offer ONE record whose value is the whole of PATH (- for stdin), byte for byte: "
            "binary data, several lines.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Append a record to one of your queues; prints its offset (FIRST..LAST with --file)."""
    if sum(given is not None for given in (value, file, value_file)) != 1:
        raise typer.BadParameter(
            "give exactly one of VALUE, --file or --value-file", ctx=ctx, param_hint="'VALUE'"
        )
    headers = [(name, to_bytes(text)) for name, text in pairs(ctx, "--header", header)]
    record_key = to_bytes(key) if key is not None else None
    client = _client(ctx)
    if file is None:
        data = to_bytes(value) if value is not None else _open_input(ctx, value_file or "-").read()
        offset = client.offer(queue, data, key=record_key, headers=headers or None)
        emit({"offset": offset}, str(offset), as_json=as_json)
        return
    stream = _open_input(ctx, file)
    first_offset: int | None = None
    last_offset: int | None = None
    count = 0
    with _progress(stream) as advance:
        for lines, consumed in _read_batches(stream, OFFER_BATCH_LINES):
            offsets = client.offer_batch(queue, [(line, record_key, headers) for line in lines])
            if offsets:
                first_offset = offsets[0] if first_offset is None else first_offset
                last_offset = offsets[-1]
            count += len(offsets)
            advance(consumed)
    summary = {"first": first_offset, "last": last_offset, "count": count}
    emit(summary, [f"{first_offset}..{last_offset}"] if count else [], as_json=as_json)
    if not count and not as_json:
        note(f"no lines in {file}: nothing offered")


@app.command(epilog=_ENTRY_FORMAT)
def peek(
    ctx: typer.Context,
    *,
    queue: QueueArg,
    offset: Offset,
    entry: Annotated[bool, typer.Option("--entry", help="Show the whole entry, not just the value.")] = False,
    raw: Annotated[
        bool,
        typer.Option("--raw", help="Write the value's bytes to stdout exactly as stored (no newline added)."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print the value (or, with --entry, the entry) at OFFSET.

    The value prints as text; bytes that are not UTF-8 show as \\xNN escapes and control characters
    other than newline and tab as escapes too. --raw gives the exact bytes (e.g. into a file)."""
    missing = f"no record at offset {offset} in queue {queue!r}"
    client = _client(ctx)
    if entry:
        found_entry = found(client.peek_entry(queue, offset), missing)
        emit(found_entry, entry_text(found_entry), as_json=as_json)
        return
    value = found(client.peek(queue, offset), missing)
    if raw:
        write_bytes(value)
    else:
        emit({"offset": offset, "value": value}, text_of_bytes(value), as_json=as_json)


@app.command(epilog=_ENTRY_FORMAT)
def first(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Print the queue's first (oldest retained) entry."""
    found_entry = found(_client(ctx).first(queue), f"queue {queue!r} is empty")
    emit(found_entry, entry_text(found_entry), as_json=as_json)


@app.command(epilog=_ENTRY_FORMAT)
def last(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Print the queue's last entry."""
    found_entry = found(_client(ctx).last(queue), f"queue {queue!r} is empty")
    emit(found_entry, entry_text(found_entry), as_json=as_json)


def _holds(info: dict[str, Any]) -> str:
    start, end = info.get("start_offset"), info.get("end_offset")
    return "it is empty" if start == end else f"it holds {start}..{end - 1 if isinstance(end, int) else end}"


@app.command("range", epilog=_ENTRY_FORMAT)
def range_(
    ctx: typer.Context,
    queue: QueueArg,
    from_offset: Annotated[int, typer.Argument(metavar="FROM", min=0, help="First offset.")],
    to_offset: Annotated[int, typer.Argument(metavar="TO", min=0, help="Last offset (included).")],
    as_json: JsonFlag = False,
) -> None:
    """Print the entries at offsets FROM..TO (both included, clamped to what the queue holds)."""
    if from_offset > to_offset:
        raise typer.BadParameter(f"FROM {from_offset} is after TO {to_offset}", ctx=ctx, param_hint="'FROM'")
    client = _client(ctx)
    entries = client.range(queue, from_offset, to_offset)
    emit_entries(entries, as_json=as_json)
    if not entries and not as_json:
        note(f"no records in {from_offset}..{to_offset} of {queue}: {_holds(client.queue_info(queue))}")


def _tail_start(ctx: typer.Context, text: str | None) -> tuple[int | None, int | None]:
    """``--from`` as (offset, last): ``N`` an offset, ``-N`` the last N records, ``end`` only new ones."""
    if text is None:
        return None, None
    if text == "end":
        return None, 0
    try:
        number = int(text)
    except ValueError:
        number = None
    if number is None or text.strip() != text:
        raise typer.BadParameter(
            f"expected an offset, -N or 'end', got {text!r}", ctx=ctx, param_hint="'--from'"
        )
    return (number, None) if number >= 0 and not text.startswith("-") else (None, -number)


@app.command(epilog=_ENTRY_FORMAT)
def tail(
    ctx: typer.Context,
    queue: QueueArg,
    from_offset: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="N|-N|end",
            help="Start at offset N, at the last N records (-N), or after the last record (end: only "
            "records appended from now on).",
            show_default="the first record",
        ),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep waiting for new records (Ctrl-C to stop).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print entries one per line; with --follow, also those appended later, as they arrive."""
    offset, last_n = _tail_start(ctx, from_offset)
    entries = _client(ctx).tail(queue, offset, follow=follow, last=last_n)
    emit_entries(entries, as_json=as_json, live=follow)


def _records(count: int) -> str:
    return f"{count} record{'' if count == 1 else 's'}"


@app.command()
def truncate(
    ctx: typer.Context,
    queue: QueueArg,
    new_start: Annotated[
        int, typer.Argument(metavar="NEW_START", min=0, help="The new first offset; older records go.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Drop the records of one of your queues before NEW_START (past the end: all of them, and the next
    record gets offset NEW_START)."""
    result = _client(ctx).truncate(queue, new_start)
    if as_json:
        emit(result, None, as_json=True)
        return
    dropped, start, end = result["dropped"], result["start_offset"], result["end_offset"]
    if not dropped and start != new_start:
        note(f"nothing dropped: {queue} already starts at {start}")
    elif start == end:
        note(f"dropped {_records(dropped)}; {queue} is empty and its next record gets offset {end}")
    else:
        note(f"dropped {_records(dropped)}; {queue} now holds {start}..{end - 1}")


# --- queue metadata -------------------------------------------------------------------------------


@meta_app.command("get")
def meta_get(ctx: typer.Context, queue: QueueArg, key: MetaKey, as_json: JsonFlag = False) -> None:
    """Print one metadata value of a queue."""
    value = found(_client(ctx).meta_get(queue, key), f"queue {queue!r} has no metadata key {key!r}")
    emit({"key": key, "value": value}, value, as_json=as_json)


@meta_app.command("set")
def meta_set(ctx: typer.Context, queue: QueueArg, key: MetaKey, value: MetaValue) -> None:
    """Set one metadata value of one of your queues."""
    _client(ctx).meta_set(queue, key, value)
    note(f"set metadata {key!r} of {queue}")


@meta_app.command("list")
def meta_list(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Print a queue's metadata, one KEY<TAB>VALUE a line, sorted by key."""
    meta = _client(ctx).meta_list(queue)
    emit(meta, [f"{k}\t{human(v)}" for k, v in sorted(meta.items())], as_json=as_json)
    if not meta and not as_json:
        note(f"{queue} has no metadata")


@meta_app.command("del")
def meta_del(ctx: typer.Context, queue: QueueArg, key: MetaKey) -> None:
    """Delete one metadata key of one of your queues (a key that is not set is not an error)."""
    existed = _client(ctx).meta_del(queue, key)
    note(
        f"deleted metadata {key!r} of {queue}"
        if existed
        else f"{queue} has no metadata {key!r}: nothing deleted"
    )


register_work_queues(app, _client)
register_membership(app, _client)
register_retention(queue_app, _client)


def main() -> None:
    """Entry point of the ``latticectl`` script."""
    app(prog_name="latticectl")


__all__ = ["OFFER_BATCH_LINES", "app", "main"]
