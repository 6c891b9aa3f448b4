"""``latticectl``: talk to the local latticed daemon over its unix socket.

``QUEUE`` is ``NAME`` for one of your own queues or ``OWNER/NAME`` for another identity's. KV keys take
the same ``[OWNER/]KEY`` form where reading another's key makes sense; the part before the first ``/``
counts as an owner only when it is a 64-hex-digit public key, so ``config/db`` is an ordinary key.
Command-line values are stored as their UTF-8 bytes. Output rules are in :mod:`cli.output`; exit codes in
:mod:`cli.boundary`.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer

from cli.boundary import BoundaryGroup
from cli.groups import register as register_work_queues
from cli.output import (
    emit,
    emit_entries,
    entry_text,
    field_lines,
    human,
    table_lines,
    text_of_bytes,
)
from latticed.api.client import Client
from latticed.errors import NotFoundError

#: Lines sent per ``offer_batch`` round trip by ``offer --file``.
OFFER_BATCH_LINES = 1000

#: Epilog of the commands that print entries.
_ENTRY_FORMAT = (
    "Entries print one a line, tab-separated: OFFSET, key=KEY when there is a key, NAME=VALUE per header, "
    "then the value (bytes that are not UTF-8 as \\xNN escapes). With --json, one object a line; bytes that "
    'are not UTF-8 appear as {"base64": "..."}.'
)

_OWNER_HEX = re.compile(r"[0-9a-fA-F]{64}")

app = typer.Typer(
    name="latticectl",
    cls=BoundaryGroup,
    help="Control the local latticed daemon: queues, records, KV state and work queues.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
queue_app = typer.Typer(help="Create, list and inspect queues.", no_args_is_help=True)
meta_app = typer.Typer(help="Read and write a queue's metadata.", no_args_is_help=True)
kv_app = typer.Typer(help="Signed key-value state: values, hashes, sets and counters.", no_args_is_help=True)
app.add_typer(queue_app, name="queue")
app.add_typer(meta_app, name="meta")
app.add_typer(kv_app, name="kv")

# --- shared parameters ----------------------------------------------------------------------------

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print JSON (one object per line for records) instead of text.")
]
QueueArg = Annotated[
    str, typer.Argument(metavar="QUEUE", help="NAME for your own queue, OWNER/NAME for another's.")
]
OwnKey = Annotated[str, typer.Argument(metavar="KEY", help="One of your own keys.")]
AnyKey = Annotated[
    str, typer.Argument(metavar="[OWNER/]KEY", help="Your key, or OWNER/KEY for another identity's.")
]
Offset = Annotated[int, typer.Argument(metavar="OFFSET", min=0, help="Record offset.")]
MetaKey = Annotated[str, typer.Argument(metavar="KEY", help="Metadata key.")]
Value = Annotated[str, typer.Argument(metavar="VALUE", help="Stored as its UTF-8 bytes.")]
Field = Annotated[str, typer.Argument(metavar="FIELD", help="Hash field.")]
Member = Annotated[str, typer.Argument(metavar="MEMBER", help="Set member.")]


@dataclass(frozen=True)
class _Settings:
    socket_path: Path | None


@app.callback()
def _root(
    ctx: typer.Context,
    socket: Annotated[
        Path | None,
        typer.Option(
            "--socket",
            envvar="LATTICED_SOCKET",
            metavar="PATH",
            help="The daemon's socket (default: where latticed puts it).",
        ),
    ] = None,
) -> None:
    ctx.obj = _Settings(socket)


def _client(ctx: typer.Context) -> Client:
    """A client for this invocation, closed when the command ends."""
    settings = ctx.find_object(_Settings)
    socket_path = settings.socket_path if settings is not None else None
    return ctx.find_root().with_resource(Client(socket_path))


def _bytes(text: str) -> bytes:
    """A command-line string as the bytes the user typed (undecodable argv bytes survive)."""
    return text.encode("utf-8", "surrogateescape")


def _pairs(ctx: typer.Context, option: str, items: Sequence[str] | None) -> list[tuple[str, str]]:
    """Parse repeated ``KEY=VALUE`` options; the value may be empty and may contain ``=``."""
    pairs = []
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx=ctx, param_hint=f"'{option}'")
        pairs.append((key, value))
    return pairs


def _split_owner(text: str) -> tuple[str | None, str]:
    """``OWNER/KEY`` to ``(owner, key)`` when OWNER is a public key in hex, else ``(None, text)``."""
    owner, sep, key = text.partition("/")
    if sep and key and _OWNER_HEX.fullmatch(owner):
        return owner.lower(), key
    return None, text


def _check_owner(ctx: typer.Context, owner: str | None) -> str | None:
    if owner is not None and not _OWNER_HEX.fullmatch(owner):
        raise typer.BadParameter(
            f"{owner!r} is not a public key (64 hex digits)", ctx=ctx, param_hint="'--owner'"
        )
    return owner.lower() if owner is not None else None


def _found(value: Any, what: str) -> Any:
    """``value``, or NotFoundError (exit 4) when the daemon answered None."""
    if value is None:
        raise NotFoundError(what)
    return value


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
        "metrics": info.get("metrics") or "off",
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
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Name of the new queue (owned by this daemon).")
    ],
    meta: Annotated[
        list[str] | None, typer.Option("--meta", metavar="K=V", help="Metadata entry; repeatable.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a queue; prints its full name, OWNER/NAME."""
    pairs = _pairs(ctx, "--meta", meta)
    full = _client(ctx).queue_create(name, dict(pairs) if pairs else None)
    emit({"queue": full}, full, as_json=as_json)


_QUEUE_COLUMNS = {"queue": "QUEUE", "size": "SIZE", "start_offset": "START", "end_offset": "END"}


@queue_app.command("list")
def queue_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the queues this daemon holds (its own and replicated ones)."""
    queues = _client(ctx).queue_list()
    emit(queues, table_lines(queues, _QUEUE_COLUMNS) if queues else [], as_json=as_json)


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
        str | None, typer.Argument(metavar="VALUE", help="The record's value (or use --file).")
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
    as_json: JsonFlag = False,
) -> None:
    """Append a record to one of your queues; prints its offset (FIRST..LAST with --file)."""
    if (value is None) == (file is None):
        raise typer.BadParameter("give either VALUE or --file, not both", ctx=ctx, param_hint="'VALUE'")
    headers = [(name, _bytes(text)) for name, text in _pairs(ctx, "--header", header)]
    record_key = _bytes(key) if key is not None else None
    client = _client(ctx)
    if value is not None:
        offset = client.offer(queue, _bytes(value), key=record_key, headers=headers or None)
        emit({"offset": offset}, str(offset), as_json=as_json)
        return
    assert file is not None
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


@app.command(epilog=_ENTRY_FORMAT)
def peek(
    ctx: typer.Context,
    queue: QueueArg,
    offset: Offset,
    entry: Annotated[bool, typer.Option("--entry", help="Show the whole entry, not just the value.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print the value (or, with --entry, the entry) at OFFSET."""
    missing = f"no record at offset {offset} in queue {queue!r}"
    client = _client(ctx)
    if entry:
        found = _found(client.peek_entry(queue, offset), missing)
        emit(found, entry_text(found), as_json=as_json)
    else:
        value = _found(client.peek(queue, offset), missing)
        emit({"offset": offset, "value": value}, text_of_bytes(value), as_json=as_json)


@app.command(epilog=_ENTRY_FORMAT)
def first(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Print the queue's first (oldest retained) entry."""
    found = _found(_client(ctx).first(queue), f"queue {queue!r} is empty")
    emit(found, entry_text(found), as_json=as_json)


@app.command(epilog=_ENTRY_FORMAT)
def last(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Print the queue's last entry."""
    found = _found(_client(ctx).last(queue), f"queue {queue!r} is empty")
    emit(found, entry_text(found), as_json=as_json)


@app.command("range", epilog=_ENTRY_FORMAT)
def range_(
    ctx: typer.Context,
    queue: QueueArg,
    from_offset: Annotated[int, typer.Argument(metavar="FROM", min=0, help="First offset.")],
    to_offset: Annotated[int, typer.Argument(metavar="TO", min=0, help="Last offset (included).")],
    as_json: JsonFlag = False,
) -> None:
    """Print the entries at offsets FROM..TO (both included), one a line."""
    emit_entries(_client(ctx).range(queue, from_offset, to_offset), as_json=as_json)


@app.command(epilog=_ENTRY_FORMAT)
def tail(
    ctx: typer.Context,
    queue: QueueArg,
    from_offset: Annotated[
        int | None,
        typer.Option("--from", metavar="N", min=0, help="Start at offset N (default: the first record)."),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep waiting for new records (Ctrl-C to stop).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print entries one per line; with --follow, also those appended later, as they arrive."""
    emit_entries(_client(ctx).tail(queue, from_offset, follow=follow), as_json=as_json, live=follow)


@app.command()
def truncate(
    ctx: typer.Context,
    queue: QueueArg,
    new_start: Annotated[
        int, typer.Argument(metavar="NEW_START", min=0, help="The new first offset; older records go.")
    ],
) -> None:
    """Drop the records of one of your queues before NEW_START."""
    _client(ctx).truncate(queue, new_start)


# --- queue metadata -------------------------------------------------------------------------------


@meta_app.command("get")
def meta_get(ctx: typer.Context, queue: QueueArg, key: MetaKey, as_json: JsonFlag = False) -> None:
    """Print one metadata value of a queue."""
    value = _found(_client(ctx).meta_get(queue, key), f"queue {queue!r} has no metadata key {key!r}")
    emit({"key": key, "value": value}, value, as_json=as_json)


@meta_app.command("set")
def meta_set(ctx: typer.Context, queue: QueueArg, key: MetaKey, value: Value) -> None:
    """Set one metadata value of one of your queues."""
    _client(ctx).meta_set(queue, key, value)


# --- KV -------------------------------------------------------------------------------------------


def _value_lines(value: object) -> list[str]:
    """A KV value as text: bytes as is, a set one member a line, a hash ``FIELD<TAB>VALUE`` lines."""
    if isinstance(value, bytes):
        return [text_of_bytes(value)]
    if isinstance(value, dict):
        return [f"{human(k)}\t{human(v)}" for k, v in sorted(value.items())]
    if isinstance(value, set | frozenset):
        return [human(m) for m in sorted(value)]
    return [human(value)]


@kv_app.command("put")
def kv_put(
    ctx: typer.Context,
    key: OwnKey,
    value: Value,
    ttl: Annotated[
        float | None, typer.Option("--ttl", metavar="SECONDS", help="Expire the key after SECONDS.")
    ] = None,
) -> None:
    """Set a key to VALUE."""
    if ttl is not None and ttl <= 0:
        raise typer.BadParameter("must be > 0", ctx=ctx, param_hint="'--ttl'")
    _client(ctx).kv_put(key, _bytes(value), ttl=ttl)


@kv_app.command("get")
def kv_get(ctx: typer.Context, key: AnyKey, as_json: JsonFlag = False) -> None:
    """Print a key's value (a counter, hash or set is printed as such)."""
    owner, name = _split_owner(key)
    value = _found(_client(ctx).kv_get(name, owner=owner), f"no key {key!r}")
    emit({"key": key, "value": value}, _value_lines(value), as_json=as_json)


@kv_app.command("del")
def kv_del(ctx: typer.Context, key: OwnKey) -> None:
    """Delete one of your keys."""
    _client(ctx).kv_del(key)


@kv_app.command("list")
def kv_list(
    ctx: typer.Context,
    prefix: Annotated[str, typer.Argument(metavar="PREFIX", help="Only keys starting with PREFIX.")] = "",
    owner: Annotated[
        str | None, typer.Option("--owner", metavar="OWNER", help="Another identity's keys (hex).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List keys and values, one KEY<TAB>VALUE a line."""
    items = _client(ctx).kv_list(prefix, owner=_check_owner(ctx, owner))
    emit(items, [f"{k}\t{human(v)}" for k, v in sorted(items.items())], as_json=as_json)


@kv_app.command("hset")
def kv_hset(ctx: typer.Context, key: OwnKey, field: Field, value: Value) -> None:
    """Set FIELD of the hash at KEY."""
    _client(ctx).kv_hset(key, _bytes(field), _bytes(value))


@kv_app.command("hget")
def kv_hget(ctx: typer.Context, key: AnyKey, field: Field, as_json: JsonFlag = False) -> None:
    """Print FIELD of the hash at KEY."""
    owner, name = _split_owner(key)
    value = _found(_client(ctx).kv_hget(name, _bytes(field), owner=owner), f"no field {field!r} in {key!r}")
    emit({"key": key, "field": field, "value": value}, text_of_bytes(value), as_json=as_json)


@kv_app.command("hgetall")
def kv_hgetall(ctx: typer.Context, key: AnyKey, as_json: JsonFlag = False) -> None:
    """Print every field of the hash at KEY, one FIELD<TAB>VALUE a line."""
    owner, name = _split_owner(key)
    fields = _client(ctx).kv_hgetall(name, owner=owner)
    emit(fields, _value_lines(fields), as_json=as_json)


@kv_app.command("hdel")
def kv_hdel(ctx: typer.Context, key: OwnKey, field: Field) -> None:
    """Delete FIELD from the hash at KEY."""
    _client(ctx).kv_hdel(key, _bytes(field))


@kv_app.command("sadd")
def kv_sadd(ctx: typer.Context, key: OwnKey, member: Member) -> None:
    """Add MEMBER to the set at KEY."""
    _client(ctx).kv_sadd(key, _bytes(member))


@kv_app.command("srem")
def kv_srem(ctx: typer.Context, key: OwnKey, member: Member) -> None:
    """Remove MEMBER from the set at KEY."""
    _client(ctx).kv_srem(key, _bytes(member))


@kv_app.command("smembers")
def kv_smembers(ctx: typer.Context, key: AnyKey, as_json: JsonFlag = False) -> None:
    """Print the members of the set at KEY, one a line, sorted."""
    owner, name = _split_owner(key)
    members = _client(ctx).kv_smembers(name, owner=owner)
    emit(members, _value_lines(members), as_json=as_json)


@kv_app.command("incr")
def kv_incr(
    ctx: typer.Context,
    key: OwnKey,
    by: Annotated[int, typer.Option("--by", help="Amount to add (may be negative).")] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Add to the counter at KEY; prints the new value."""
    total = _client(ctx).kv_incr(key, by=by)
    emit({"key": key, "value": total}, str(total), as_json=as_json)


register_work_queues(app, _client)


def main() -> None:
    """Entry point of the ``latticectl`` script."""
    app(prog_name="latticectl")


__all__ = ["OFFER_BATCH_LINES", "app", "main"]
