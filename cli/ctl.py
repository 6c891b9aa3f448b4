"""``latticectl``: talk to the local latticed daemon over its unix socket.

``QUEUE`` is ``NAME`` for one of your own queues or ``OWNER/NAME`` for another identity's; KV keys of
another identity are ``OWNER/KEY`` the same way (:mod:`cli.kv_commands`). Command-line values are stored as
their UTF-8 bytes. ``--socket`` and ``--json`` go before or after the command (:mod:`cli.common`). Output
rules are in :mod:`cli.output`; exit codes in :mod:`cli.boundary`.

Why one module: it is ``latticectl``'s root command table: the queue and record commands every invocation
may need, and the lazy table of the command groups that live in their own modules (``_ELSEWHERE``);
``latticectl id`` and ``status`` import only this, so it holds just what they and their neighbours need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer
from typer.core import TyperGroup

from cli import lazy
from cli.boundary import BoundaryGroup, version_option
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
from cli.fork_commands import fork_text
from cli.fork_commands import register as register_fork
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
from cli.repair_commands import register as register_repair
from cli.retention_commands import (
    KeepUnsettled,
    MaxAge,
    MaxBytes,
    MaxRecords,
    policy_of,
    policy_options,
)
from cli.retention_commands import register as register_retention
from cli.why_commands import register as register_why

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


def _listed_in_one_paragraph(command: Any) -> None:
    """Give ``command`` its docstring's first paragraph, its lines joined, as the line its group's
    ``--help`` lists it by: typer's listing keeps a docstring's line breaks (its own page joins them), so
    a summary longer than the column came out as a ragged line and a stub."""
    if command.short_help is None and command.help:
        command.short_help = " ".join(command.help.split("\n\n")[0].split())


class _CtlGroup(BoundaryGroup):
    """The root group: its commands are built on first use (:mod:`cli.lazy`), and each of them also takes
    ``--socket`` after its own name."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._socket_param: Any = None
        self.commands = lazy.LazyCommands(_COMMANDS, self._prepare)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        lazy.lighten(self.get_params(ctx))  # here: typer adds its completion options after __init__
        return super().parse_args(ctx, args)

    def _prepare(self, command: Any) -> None:
        """Give a newly built command (each below it, for a group) ``--socket`` and the light conversion."""
        if self._socket_param is None:
            self._socket_param = _socket_option()
            lazy.lighten([self._socket_param])
        help_names = self.context_settings.get("help_option_names", ["--help"])
        for sub in lazy.subcommands(command):
            if not isinstance(sub, TyperGroup) and all(p.name != "socket" for p in sub.params):
                sub.params.append(self._socket_param)
            lazy.lighten_command(sub, help_names)
            _listed_in_one_paragraph(sub)


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
    _version: Annotated[bool, version_option("latticectl")] = False,
) -> None:
    ctx.obj = Settings(socket, as_json)
    if as_json:
        ctx.default_map = lazy.FlagDefaults(ctx.command, "as_json")


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
    """Show identity, version, uptime, queues, records, storage, and the group-commit, replication and
    retention counters since start."""
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
        "transactions": info.get("transactions"),  # group commits since start
        "replication": _counters_text(info.get("replication"), "not running"),
        "retention": _counters_text(info.get("retention"), "not running"),
        "replication lag": info.get("replication_lag") or "none",
        # Queues no link pushes to us (every one pruned): records come after a HAVE and a graft timer.
        "off the eager tree": info.get("cut_off_queues") or "none",
        "disk": _disk_text(info.get("disk")),
        "forked queues": [_forked_text(f) for f in info.get("forked_queues") or []] or "none",
        "corrupt queues": [_corrupt_text(c) for c in info.get("corrupt_queues") or []] or "none",
        "clock skew": [_skew_text(r) for r in info.get("clock_skew") or []] or "none",
        "incompatible peers": [
            f"{r.get('peer', '?')[:16]} at {r.get('address')}: {r.get('reason')}"
            for r in info.get("incompatible_peers") or []
        ]
        or "none",
        "core-2 queues": [str(b.get("message")) for b in info.get("core2_blind_peers") or []]
        or "every connected peer receives them",
        "other runs": _identity_lines(info.get("identity_runs")),
    }
    emit(info, field_lines(fields), as_json=as_json)


def _forked_text(fork: dict[str, Any]) -> str:
    """A ``status`` line of a forked queue: core 2's fork point and what to do, core 1's proof."""
    text = fork_text({**fork, "forked": True}) or f"proof {str(fork.get('proof') or '?')[:16]}"
    return f"{fork.get('queue')} ({text})"


def _corrupt_text(entry: dict[str, Any]) -> str:
    """A ``status`` line of a queue found corrupt at load (``doctor`` says why, at length)."""
    address = str(entry.get("queue"))
    repair = f"{address.rpartition('/')[2]} --drop" if entry.get("owned") else address
    return f"{address}: not what its owner signed, not served; `latticectl queue repair {repair}`"


def _identity_lines(facts: object) -> list[str] | str:
    """Another run of this identity, or identities seen running twice here (`latticectl identity`)."""
    if not isinstance(facts, dict):
        return "-"
    lines = [f"writes refused: {facts['refusing']}"] if facts.get("refusing") else []
    lines += [
        f"another run at {r.get('address')}: this daemon is the {r.get('this_daemon_is')} one"
        for r in facts.get("other_runs") or []
        if not facts.get("refusing")
    ]
    lines += [
        f"peer {str(s.get('identity'))[:16]} runs twice, at {s.get('earlier', {}).get('address')} and "
        f"{s.get('later', {}).get('address')}"
        for s in facts.get("seen_twice") or []
    ]
    if facts.get("catching_up"):
        lines.append(str(facts["catching_up"]))
    return lines or "one daemon (no other run of it seen)"


def _counters_text(counters: object, absent: str) -> str:
    """A service's counters since start as ``name=value, ...`` on one line (``bytes_*`` in units)."""
    if not isinstance(counters, dict):
        return absent
    return ", ".join(f"{k}={_size(v) if k.startswith('bytes_') else human(v)}" for k, v in counters.items())


def _disk_text(disk: object) -> str:
    """Free space of the data directory's file system, LOW when under 5 % or 1 GiB."""
    if not isinstance(disk, dict):
        return "-"
    if "free_bytes" not in disk:
        return f"unknown ({disk.get('error')})"
    free, total = disk["free_bytes"], disk["total_bytes"]
    percent = 100 * free / total if total else 0
    low = "LOW: " if disk.get("low") else ""
    return f"{low}{_size(free)} free of {_size(total)} ({percent:.0f} %)"


def _skew_text(reading: dict[str, Any]) -> str:
    offset = int(reading.get("offset_ms") or 0)
    who = reading.get("peer") or reading.get("address")
    return f"{str(who)[:16]} {abs(offset) / 1000:.1f} s {'ahead' if offset > 0 else 'behind'}"


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
    readers: Annotated[
        str | None,
        typer.Option(
            "--readers",
            metavar="ID,ID",
            help="Seal the queue: only these identities (latticectl id) and this daemon's read its records; "
            "'' for this daemon alone. Other daemons store and relay them encrypted (docs/privacy.md).",
        ),
    ] = None,
    producers: ProducersOption = None,
    core: Annotated[
        int | None,
        typer.Option(
            "--core",
            min=1,
            max=2,
            help="Fork core: 2 freezes the queue at a fork of its owner until `queue recover` "
            "(docs/lattice.md); 0.2.0 daemons never receive a core-2 queue, so keep 1 while they run. "
            "Default: the daemon's default_queue_core (2 unless configured).",
        ),
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
    ids = None if readers is None else [r.strip() for r in readers.split(",") if r.strip()]
    retention = policy_of(policy_options(ctx, max_age, max_bytes, max_records, keep_unsettled))
    full = _client(ctx).queue_create(
        name,
        dict(entries) if entries else None,
        readers=ids,
        retention=retention,
        producers=_ids(producers),
        core=core,
    )
    emit({"queue": full}, full, as_json=as_json)


def _ids(text: str | None) -> list[str] | None:
    return None if text is None else [i.strip() for i in text.split(",") if i.strip()]


@queue_app.command("edit")
def queue_edit(
    ctx: typer.Context,
    queue: QueueArg,
    producers: ProducersOption = None,
    no_producers: Annotated[
        bool, typer.Option("--no-producers", help="No daemon but this one offers into it.")
    ] = False,
) -> None:
    """Change who may offer into one of your queues from other daemons (signed metadata)."""
    if (producers is None) == (not no_producers):
        raise typer.BadParameter(
            "give one of --producers or --no-producers", ctx=ctx, param_hint="'--producers'"
        )
    allowed = [] if no_producers else _ids(producers)
    _client(ctx).queue_producers(queue, allowed)
    note(f"{queue} takes offers from {', '.join(allowed) if allowed else 'this daemon only'}")


ProducersOption = Annotated[
    str | None,
    typer.Option(
        "--producers",
        metavar="ID,ID|*",
        help="Identities (latticectl id) whose daemons may offer into it ('*': any daemon of the network); "
        "the owner signs their records, each with header lattice.producer=ID.",
    ),
]


ReaderArg = Annotated[str, typer.Argument(metavar="ID", help="A reader's identity (latticectl id on it).")]


@queue_app.command("share")
def queue_share(
    ctx: typer.Context,
    queue: QueueArg,
    reader: ReaderArg,
    history: Annotated[
        bool, typer.Option("--history", help="Also give it every earlier key epoch (all older records).")
    ] = False,
) -> None:
    """Let another identity read a sealed queue of yours, from the current key epoch on."""
    epochs = _client(ctx).queue_share(queue, reader, history=history)
    if epochs:
        note(f"shared key epoch(s) {', '.join(map(str, epochs))} of {queue} with {reader}")
    else:
        note(f"{reader} already reads those key epochs of {queue}")


@queue_app.command("unshare")
def queue_unshare(ctx: typer.Context, queue: QueueArg, reader: ReaderArg) -> None:
    """Stop an identity reading a sealed queue: a new key from the next offset on (it keeps what it could
    read before)."""
    done = _client(ctx).queue_unshare(queue, reader)
    if done["removed"]:
        start, epoch = done["start"], done["epoch"]
        note(f"removed {reader}: records of {queue} from offset {start} on use key epoch {epoch}")
    else:
        note(f"{reader} is not a reader of {queue}; nothing changed")


_QUEUE_COLUMNS = {
    "queue": "QUEUE",
    "size": "SIZE",
    "start_offset": "START",
    "end_offset": "END",
    "core": "CORE",
    "forked": "FORKED",
}


@queue_app.command("list")
def queue_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the queues this daemon holds (its own and replicated ones)."""
    queues = _client(ctx).queue_list()
    emit(queues, table_lines(queues, _QUEUE_COLUMNS) if queues else [], as_json=as_json)
    if not queues and not as_json:
        note("no queues yet (latticectl queue create NAME)")


@queue_app.command("info")
def queue_info(ctx: typer.Context, queue: QueueArg, as_json: JsonFlag = False) -> None:
    """Show a queue's owner, offsets, size, metadata and whether it is forked. created_ms is when this
    daemon first stored the queue (its owner: created it; a replica: first received it): no creation time
    is signed, so it differs between daemons."""
    info = _client(ctx).queue_info(queue)
    fork = fork_text(info)
    fields = {**info, "sealed": _sealed_text(info.get("sealed")), **({"fork": fork} if fork else {})}
    emit(info, field_lines(fields), as_json=as_json)


def _sealed_text(sealed: Any) -> str:
    if not sealed:
        return "no"
    if "error" in sealed:
        return f"yes, but its sealing metadata is broken: {sealed['error']}"
    readable = "this daemon reads it" if sealed["readable"] else "NOT readable here"
    epoch = sealed["epochs"][-1]
    return (
        f"key epoch {sealed['epoch']} from offset {epoch['start']}, {readable}; "
        f"readers {', '.join(sealed['readers'])}"
    )


# --- records --------------------------------------------------------------------------------------


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
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            metavar="SECONDS",
            min=0,
            help="Another daemon's queue: how long to wait for its owner to be reached and answer "
            "(then exit 14). Default 10.",
        ),
    ] = None,
    skip: Annotated[
        int,
        typer.Option(
            "--skip",
            metavar="N",
            min=0,
            help="With --file: leave out the first N lines (to go on after an interrupted offer --file, "
            "which says N).",
        ),
    ] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Append a record to one of your queues, or to another daemon's queue that lists this daemon as a
    producer (its owner signs it); prints its offset (FIRST..LAST with --file).

    With --file, a progress bar shows on a terminal. Ctrl-C finishes the request in flight, says which
    lines were offered and how to go on (--skip N), and exits with 130."""
    if sum(given is not None for given in (value, file, value_file)) != 1:
        raise typer.BadParameter(
            "give exactly one of VALUE, --file or --value-file", ctx=ctx, param_hint="'VALUE'"
        )
    if skip and file is None:
        raise typer.BadParameter("--skip goes with --file", ctx=ctx, param_hint="'--skip'")
    headers = [(name, to_bytes(text)) for name, text in pairs(ctx, "--header", header)]
    record_key = to_bytes(key) if key is not None else None
    client = _client(ctx)
    if file is None:
        data = to_bytes(value) if value is not None else _open_input(ctx, value_file or "-").read()
        offset = client.offer(queue, data, key=record_key, headers=headers or None, wait=wait)
        emit({"offset": offset}, str(offset), as_json=as_json)
        return
    from cli.offer_file import offer_lines  # noqa: PLC0415 - only --file needs it

    stream = _open_input(ctx, file)
    offered = offer_lines(
        client,
        queue,
        stream,
        file,
        (record_key, headers),
        lines_per_batch=OFFER_BATCH_LINES,
        skip=skip,
        wait=wait,
    )
    first_offset, last_offset, count = offered.first, offered.last, offered.count
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
    from_offset: Annotated[int | None, typer.Argument(metavar="FROM", min=0, help="First offset.")] = None,
    to_offset: Annotated[
        int | None, typer.Argument(metavar="TO", min=0, help="Last offset (included).")
    ] = None,
    *,
    from_time: Annotated[
        str | None,
        typer.Option(
            "--from-time", metavar="TIME", help="Instead of FROM: the first record stamped at or after TIME."
        ),
    ] = None,
    to_time: Annotated[
        str | None,
        typer.Option("--to-time", metavar="TIME", help="Instead of TO: up to the records stamped at TIME."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print the entries at offsets FROM..TO (both included, clamped to what the queue holds), or those
    stamped --from-time..--to-time (TIME: ISO 8601, local time unless it names a zone, or ms since the
    epoch; either bound may be left out; docs/operations.md, "Reading by time").

    Any size: a large range is fetched in several requests and printed as it arrives (with a progress bar
    on a terminal when the output goes elsewhere)."""
    client = _client(ctx)
    if from_time is not None or to_time is not None:
        from_offset, to_offset = _time_range(
            ctx, client, queue, (from_offset, to_offset), (from_time, to_time)
        )
    elif from_offset is None or to_offset is None:
        raise typer.BadParameter("give FROM and TO, or --from-time/--to-time", ctx=ctx, param_hint="'FROM'")
    if from_offset > to_offset:
        if from_time is not None or to_time is not None:
            note(f"no records of {queue} stamped in that time")
            return
        raise typer.BadParameter(f"FROM {from_offset} is after TO {to_offset}", ctx=ctx, param_hint="'FROM'")
    from cli.print_records import print_range  # noqa: PLC0415 - only range needs it

    printed = print_range(client, queue, from_offset, to_offset, as_json=as_json)
    if not printed and not as_json:
        note(f"no records in {from_offset}..{to_offset} of {queue}: {_holds(client.queue_info(queue))}")


def _time_range(
    ctx: typer.Context,
    client: Any,
    queue: str,
    offsets: tuple[int | None, int | None],
    times: tuple[str | None, str | None],
) -> tuple[int, int]:
    """``--from-time``/``--to-time`` as inclusive offsets: from the first record stamped at or after the
    first, up to the last before the first record stamped after the second."""
    from cli.times import offset_at, parse_time  # noqa: PLC0415 - only reading by time needs it

    from_time, to_time = times
    if offsets != (None, None):
        raise typer.BadParameter(
            "give FROM and TO, or --from-time/--to-time, not both", ctx=ctx, param_hint="'FROM'"
        )
    lo = 0 if from_time is None else offset_at(client, queue, parse_time(ctx, from_time, "--from-time"))[0]
    if to_time is None:
        return lo, max(int(client.queue_info(queue)["end_offset"]) - 1, lo)
    hi = offset_at(client, queue, parse_time(ctx, to_time, "--to-time") + 1)[0]
    return lo, hi - 1


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
    *,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="DURATION",
            help="Start at the first record stamped at most this long ago (2h, 30m, 7d).",
        ),
    ] = None,
    from_time: Annotated[
        str | None,
        typer.Option(
            "--from-time",
            metavar="TIME",
            help="Start at the first record stamped at or after TIME (ISO 8601 or ms).",
        ),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep waiting for new records (Ctrl-C to stop).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print entries one per line; with --follow, also those appended later, as they arrive.

    --since and --from-time start at the first record stamped at or after that time (docs/operations.md,
    "Reading by time"); when none is yet, at the end: only records appended from then on."""
    offset: int | None
    if since is not None or from_time is not None:
        from cli.times import chosen, offset_at, parse_since, parse_time  # noqa: PLC0415 - by time only

        chosen(ctx, **{"--from": from_offset, "--since": since, "--from-time": from_time})
        ts = parse_since(ctx, since) if since is not None else parse_time(ctx, str(from_time), "--from-time")
        offset, last_n = offset_at(_client(ctx), queue, ts)[0], None
    else:
        offset, last_n = _tail_start(ctx, from_offset)
    if follow:
        entries = _client(ctx).tail(queue, offset, follow=True, last=last_n, on_event=_tail_event)
        emit_entries(entries, as_json=as_json, live=True)
        return
    from cli.print_records import print_tail  # noqa: PLC0415 - only a bounded tail needs it

    print_tail(_client(ctx), queue, offset, last_n, as_json=as_json)


def _tail_event(event: dict[str, Any]) -> None:
    """One line on stderr when a followed queue (fork core 2) freezes at a fork, or is recovered."""
    queue = event.get("queue", "the queue")
    if event.get("event") == "forked":
        point = event.get("fork_point")
        note(f"queue {queue} forked at offset {point}: frozen; waiting for its owner's recovery")
    elif event.get("event") == "recovered":
        note(
            f"queue {queue} recovered by its owner (epoch {event.get('epoch')}): going on from offset "
            f"{event.get('next_offset')}"
        )


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


#: The commands other modules define, by module: each module is imported only when one of its commands
#: runs (or when --help lists them all), so that e.g. ``latticectl id`` loads nothing of ``work``.
#: tests/command_line/test_cli_lazy.py checks that these names are exactly what each module registers.
_ELSEWHERE: dict[str, lazy.Registrar] = {
    "cli.kv_commands": (["kv"], lambda module: app.add_typer(module.kv_app, name="kv")),
    "cli.groups": (
        ["group", "dlq", "dequeue", "ack", "nack", "extend", "ack-up-to", "claim", "work"],
        lambda module: module.register(app, _client),
    ),
    "cli.join": (["invite", "join"], lambda module: module.register(app, _client)),
    "cli.peers": (["peers", "identity"], lambda module: module.register(app)),
    "cli.doctor": (["doctor"], lambda module: module.register(app)),
    "cli.store_commands": (["store"], lambda module: module.register(app)),
    "cli.bundle_commands": (["bundle"], lambda module: module.register(app)),
}
_COMMANDS = lazy.CommandTable(app, _ELSEWHERE)
register_retention(queue_app, _client)
register_why(queue_app, _client)
register_fork(queue_app, _client)
register_repair(queue_app, _client)


def main() -> None:
    """Entry point of the ``latticectl`` script."""
    app(prog_name="latticectl")


__all__ = ["OFFER_BATCH_LINES", "app", "main"]
