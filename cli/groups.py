"""``latticectl`` work-queue commands: ``group``, ``dlq``, ``dequeue``, ``ack``, ``nack``, ``extend``,
``ack-up-to`` and ``work``.

``dequeue`` hands a record to a script the way Lockd's CLI does: with ``--env`` it prints ``export``
lines (``LATTICE_GROUP``, ``LATTICE_QUEUE``, ``LATTICE_OFFSET``, ``LATTICE_LEASE``, ``LATTICE_ATTEMPT``,
``LATTICE_CORRELATION_ID``, ``LATTICE_PAYLOAD`` = a file holding the payload), so that
``lease=$(latticectl dequeue jobs --env) && eval "$lease"`` can be followed by ``latticectl ack
"$LATTICE_GROUP" "$LATTICE_LEASE"`` (which removes that file, as ``nack`` does). Exit codes beyond
:mod:`cli.boundary`'s usual ones: 9 when a lease is stale or unknown, 10 when ``dequeue`` found nothing
(within ``--wait``), 11 when a cap is reached.

Why one module: it is the work-queue command group (``group``, ``dlq``, the lease commands and ``work``):
the typer declarations are long (an option and its help per setting), and the commands share their option
types, the lease output and the ``--env`` export for scripts. It is loaded lazily, only for these commands.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.boundary import one_line
from cli.common import note, settings
from cli.output import emit, field_lines, human, table_lines, text_of_bytes, to_json, write
from cli.work import Worker, lease_env
from latticed.api.client.blocking_client import Client, Lease
from latticed.errors import EmptyError, LeaseError

ClientFactory = Callable[[typer.Context], Client]

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
GroupArg = Annotated[
    str, typer.Argument(metavar="GROUP", help="NAME of your group, OWNER/NAME for another's.")
]
LeaseArg = Annotated[str, typer.Argument(metavar="LEASE", help="The lease token dequeue printed.")]
Seconds = Annotated[float | None, typer.Option(metavar="S", min=0.0, help="Seconds.")]

group_app = typer.Typer(help="Consumer groups (work queues) over one or more queues.", no_args_is_help=True)
dlq_app = typer.Typer(help="A group's dead-letter queue: list, show, redrive, purge.", no_args_is_help=True)


def _short(source: str) -> str:
    """``OWNER/NAME`` with the owner cut to 8 hex digits (tables stay readable)."""
    owner, sep, name = source.rpartition("/")
    return f"{owner[:8]}../{name}" if sep else source


def _when(epoch_s: float | None, now: float | None = None) -> str:
    """A moment as local time and how far away it is: "(in 2.5s)", "(now)" or "(1.0s ago)"."""
    if epoch_s is None:
        return "-"
    delta = epoch_s - (time.time() if now is None else now)
    rounded = round(delta, 1)
    away = "now" if rounded == 0 else f"in {rounded:.1f}s" if rounded > 0 else f"{-rounded:.1f}s ago"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_s)) + f" ({away})"


def _lease_fields(lease: Lease) -> dict[str, object]:
    fields: dict[str, object] = {
        "group": lease.group,
        "queue": lease.queue,
        "offset": lease.offset,
        "lease": lease.lease,
        "attempt": lease.attempt,
        "correlation id": lease.correlation_id,
        "expires": _when(lease.expires_at),
    }
    if lease.key is not None:
        fields["key"] = lease.key
    for name, value in lease.headers:
        fields[f"header {name}"] = value
    if lease.payload_from is not None:
        fields["payload from"] = lease.payload_from
    return fields


#: ``dequeue --env`` payload files: this prefix, a tag of the lease, and mkstemp's random part.
PAYLOAD_PREFIX = "lattice-payload-"


def _payload_pattern(lease: str) -> str:
    """The name of a lease's payload files up to mkstemp's part: ``ack``/``nack`` find them by the token
    alone, so a script that never removes ``$LATTICE_PAYLOAD`` leaves nothing behind."""
    tag = hashlib.blake2b(lease.encode(), digest_size=8, person=b"latticed.payload").hexdigest()
    return f"{PAYLOAD_PREFIX}{tag}-"


def _write_payload(value: bytes, path: Path | None, lease: str) -> Path:
    if path is None:
        fd, name = tempfile.mkstemp(prefix=_payload_pattern(lease))  # mode 0600, O_EXCL
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(value)
        except BaseException:
            os.unlink(name)
            raise
        return Path(name)
    path.write_bytes(value)
    return path


def _remove_payloads(lease: str) -> None:
    """Remove the temporary payload files ``dequeue --env`` wrote for ``lease`` (ours, regular files;
    never a ``--payload-out`` path, which the caller chose and owns)."""
    for path in Path(tempfile.gettempdir()).glob(_payload_pattern(lease) + "*"):
        with contextlib.suppress(OSError):
            info = path.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                path.unlink()


@contextlib.contextmanager
def _settling(lease: str) -> Iterator[None]:
    """Around an ack or nack: once the lease is over (settled, or stale: its record comes back under a new
    lease and payload file), its payload file goes. A broken connection keeps it for a retry."""
    try:
        yield
    except LeaseError:
        _remove_payloads(lease)
        raise
    _remove_payloads(lease)


#: What a group gets for an option left out; the daemon applies them (``GroupSpec`` in
#: latticed/crdt/group_spec.py, which tests hold these to). Not imported from there: that would load the
#: signing stack into every latticectl start just to print help.
GROUP_DEFAULTS: dict[str, float] = {
    "max_attempts": 5,
    "visibility_s": 30.0,
    "backoff_base_s": 1.0,
    "backoff_cap_s": 300.0,
    "retention_s": 60.0,
    "max_consumers": 0,
    "max_in_flight": 0,
}


def _secs(seconds: float) -> str:
    return f"{seconds:g}s"


_factory: list[ClientFactory] = []


def _client(ctx: typer.Context) -> Client:
    return _factory[0](ctx)


# --- groups -----------------------------------------------------------------------------------
@group_app.command("create")
def group_create(
    ctx: typer.Context,
    *,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The new group's name.")],
    queue: Annotated[
        list[str], typer.Option("--queue", "-q", metavar="QUEUE", help="A queue to consume; repeatable.")
    ],
    filter: Annotated[
        str | None,
        typer.Option(
            "--filter",
            metavar="EXPR",
            help="Only records whose key and headers match EXPR (see docs/workqueues.md).",
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            min=0,
            help="Dead-letter after N failed attempts (0: never).",
            show_default=str(GROUP_DEFAULTS["max_attempts"]),
        ),
    ] = None,
    visibility: Annotated[
        float | None,
        typer.Option(
            metavar="S", min=0.001, help="Lease length.", show_default=_secs(GROUP_DEFAULTS["visibility_s"])
        ),
    ] = None,
    retry_backoff: Annotated[
        float | None,
        typer.Option(
            metavar="S",
            min=0.0,
            help="First retry delay (doubles).",
            show_default=_secs(GROUP_DEFAULTS["backoff_base_s"]),
        ),
    ] = None,
    backoff_cap: Annotated[
        float | None,
        typer.Option(
            metavar="S",
            min=0.0,
            help="Longest retry delay.",
            show_default=_secs(GROUP_DEFAULTS["backoff_cap_s"]),
        ),
    ] = None,
    retention: Annotated[
        float | None,
        typer.Option(
            metavar="S",
            min=0.0,
            help="Keep done records for inspection.",
            show_default=_secs(GROUP_DEFAULTS["retention_s"]),
        ),
    ] = None,
    max_consumers: Annotated[
        int | None,
        typer.Option(metavar="N", min=0, help="Consumer cap (0: none).", show_default="0"),
    ] = None,
    max_in_flight: Annotated[
        int | None,
        typer.Option(metavar="N", min=0, help="Leases per consumer (0: no cap).", show_default="0"),
    ] = None,
    description: Annotated[str | None, typer.Option(metavar="TEXT")] = None,
    allow_remote: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-remote",
            metavar="ID",
            help="Only this daemon identity's workers may consume it remotely; repeatable.",
            show_default="any peer with the network key",
        ),
    ] = None,
    no_remote: Annotated[
        bool, typer.Option("--no-remote", help="Only workers of this daemon may consume it.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create a consumer group over one or more queues (yours or replicated ones)."""
    if no_remote and allow_remote:
        raise typer.BadParameter("--no-remote and --allow-remote exclude each other", ctx=ctx)
    info = _client(ctx).group_create(
        name,
        queue,
        filter=filter,
        max_attempts=max_attempts,
        visibility=visibility,
        retry_backoff=retry_backoff,
        backoff_cap=backoff_cap,
        retention=retention,
        max_consumers=max_consumers,
        max_in_flight=max_in_flight,
        description=description,
        remote_consumers=[] if no_remote else allow_remote or None,
    )
    emit(info, field_lines(info), as_json=as_json)


@group_app.command("edit")
def group_edit(
    ctx: typer.Context,
    *,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Your group.")],
    filter: Annotated[str | None, typer.Option("--filter", metavar="EXPR", help="A new filter.")] = None,
    max_attempts: Annotated[int | None, typer.Option(metavar="N", min=0)] = None,
    visibility: Annotated[float | None, typer.Option(metavar="S", min=0.001)] = None,
    retry_backoff: Annotated[float | None, typer.Option(metavar="S", min=0.0)] = None,
    backoff_cap: Annotated[float | None, typer.Option(metavar="S", min=0.0)] = None,
    retention: Annotated[float | None, typer.Option(metavar="S", min=0.0)] = None,
    max_consumers: Annotated[int | None, typer.Option(metavar="N", min=0)] = None,
    max_in_flight: Annotated[int | None, typer.Option(metavar="N", min=0)] = None,
    description: Annotated[str | None, typer.Option(metavar="TEXT")] = None,
    allow_remote: Annotated[
        list[str] | None,
        typer.Option("--allow-remote", metavar="ID", help="Only these identities consume it remotely."),
    ] = None,
    no_remote: Annotated[bool, typer.Option("--no-remote", help="No remote consumers.")] = False,
    any_remote: Annotated[
        bool, typer.Option("--any-remote", help="Any peer with the network key may consume it.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Change a group's settings (those given); see docs/workqueues.md for leases in flight."""
    if sum((bool(allow_remote), no_remote, any_remote)) > 1:
        raise typer.BadParameter("give one of --allow-remote, --no-remote, --any-remote", ctx=ctx)
    remote: list[str] | str | None = "any" if any_remote else [] if no_remote else allow_remote or None
    info = _client(ctx).group_edit(
        name,
        filter=filter,
        max_attempts=max_attempts,
        visibility=visibility,
        retry_backoff=retry_backoff,
        backoff_cap=backoff_cap,
        retention=retention,
        max_consumers=max_consumers,
        max_in_flight=max_in_flight,
        description=description,
        remote_consumers=remote,
    )
    emit(info, field_lines(info), as_json=as_json)


@group_app.command("delete")
def group_delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Your group.")],
    as_json: JsonFlag = False,
) -> None:
    """Delete a group: its leases in flight become unknown, its dead letters are dropped."""
    reply = _client(ctx).group_delete(name)
    emit(reply, [], as_json=as_json)
    if not as_json:
        note(
            f"deleted group {name} ({reply.get('leases_voided')} lease(s) in flight voided, "
            f"{reply.get('dead_letters_dropped')} dead letter(s) dropped)"
        )


@group_app.command("list")
def group_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List groups: those this daemon runs and replicas of others'."""
    groups = _client(ctx).group_list()
    rows = [
        {
            **g,
            "sources": [_short(s) for s in g.get("sources", [])],
            "group": g["group"],
            "counts": _counts(g),
        }
        for g in groups
    ]
    columns = {
        "group": "GROUP",
        "running": "RUNNING",
        "sources": "QUEUES",
        "filter": "FILTER",
        "counts": "COUNTS",
    }
    emit(groups, table_lines(rows, columns) if groups else [], as_json=as_json)
    if not groups and not as_json:
        note("no groups yet (latticectl group create NAME --queue QUEUE)")


def _counts(group: dict[str, object]) -> str:
    """A group's live counts (a replica's from its owner; "stale" when the owner is not connected)."""
    if not group.get("running") and not group.get("live"):
        return "stale: owner not connected"
    return " ".join(f"{k}={group.get(k)}" for k in ("available", "leased", "done", "failed", "dead"))


@group_app.command("stats")
def group_stats(ctx: typer.Context, group: GroupArg, as_json: JsonFlag = False) -> None:
    """Counts (available, leased, done, failed, dead), ack floors and the oldest pending age."""
    stats = _client(ctx).group_stats(group)
    fields: dict[str, object] = {
        key: stats.get(key)
        for key in (
            "group",
            "running",
            "live",
            "stale",
            "available",
            "leased",
            "pending",
            "done",
            "failed",
            "dead",
            "consumers",
        )
        if key in stats
    }
    for source, floor in stats.get("ack_floor", {}).items():
        fields[f"ack floor {_short(source)}"] = f"{floor} of {human(stats.get('ends', {}).get(source))}"
    if "oldest_age_s" in stats:
        age = stats["oldest_age_s"]
        fields["oldest age"] = "-" if age is None else f"{age:.1f}s"
    emit(stats, field_lines(fields), as_json=as_json)


@group_app.command("inspect")
def group_inspect(
    ctx: typer.Context,
    group: GroupArg,
    queue: Annotated[str, typer.Argument(metavar="QUEUE")],
    offset: Annotated[int, typer.Argument(metavar="OFFSET", min=0)],
    as_json: JsonFlag = False,
) -> None:
    """One record as the group sees it: state, attempts and their history."""
    task = _client(ctx).group_inspect(group, queue, offset)
    history = task.pop("history")
    shown = {k: v for k, v in task.items() if v is not None}
    for name in ("expires_at", "retry_at", "done_at"):
        if name in shown:
            shown[name] = _when(shown[name])
    lines = field_lines(shown) + [_attempt_line(a) for a in history]
    emit({**task, "history": history}, lines, as_json=as_json)


def _attempt_line(attempt: dict[str, Any]) -> str:
    """``  attempt 2: nack by pid42.c3 at 2026-... (1.250s): why``"""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(attempt["leased_at_ms"] / 1000))
    took = (attempt["ended_at_ms"] - attempt["leased_at_ms"]) / 1000
    error = attempt.get("error")
    return (
        f"  attempt {attempt['attempt']}: {attempt['outcome']} by {attempt['consumer']} at {started} "
        f"({took:.3f}s)" + (f": {one_line(error)}" if error else "")
    )


# --- leases -----------------------------------------------------------------------------------
def dequeue(
    ctx: typer.Context,
    *,
    group: GroupArg,
    wait: Annotated[
        float | None,
        typer.Option(metavar="S", min=0.0, help="Wait up to S seconds for a record.", show_default="0"),
    ] = None,
    visibility: Annotated[
        float | None, typer.Option(metavar="S", min=0.001, help="Lease length (default: the group's).")
    ] = None,
    env: Annotated[
        bool, typer.Option("--env", help="Print shell export lines (LATTICE_*); payload in a file.")
    ] = False,
    payload_out: Annotated[
        Path | None, typer.Option(metavar="PATH", help="With --env: write the payload here.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Lease one record of GROUP; exit 10 if there is none (within --wait)."""
    lease = _client(ctx).dequeue(group, visibility=visibility, wait=wait)
    if lease is None:
        within = f" within {wait:g}s" if wait else ""
        raise EmptyError(f"no record available in group {group}{within}")
    if env:
        variables = lease_env(lease, None)
        payload = _write_payload(lease.value, payload_out, lease.lease)
        variables["LATTICE_PAYLOAD"] = str(payload)
        try:
            emit(None, [f"export {k}={shlex.quote(v)}" for k, v in variables.items()], as_json=False)
            write("", flush=True)  # a reader gone (or Ctrl-C) shows here, while the file can still go
        except BaseException:
            if payload_out is None:
                payload.unlink(missing_ok=True)
            raise
        return
    fields = _lease_fields(lease)
    fields["value"] = text_of_bytes(lease.value)
    emit(lease, field_lines(fields), as_json=as_json)


def claim(
    ctx: typer.Context,
    *,
    group: GroupArg,
    min_idle: Annotated[
        float, typer.Option(metavar="S", min=0.0, help="Take leases whose holder was idle at least S.")
    ],
    count: Annotated[int, typer.Option(metavar="N", min=1, max=10_000, help="At most N leases.")] = 1,
    visibility: Annotated[
        float | None, typer.Option(metavar="S", min=0.001, help="Lease length (default: the group's).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Take over leases idle at least --min-idle seconds (each costs its record an attempt); exit 10 if
    there is none."""
    leases = _client(ctx).claim(group, min_idle, count, visibility)
    if not leases:
        raise EmptyError(f"no lease of group {group} has been idle for {min_idle:g}s")
    lines: list[str] = []
    for lease in leases:
        fields = _lease_fields(lease)
        fields["value"] = text_of_bytes(lease.value)
        lines += [*field_lines(fields), ""]
    emit(leases, lines[:-1], as_json=as_json)


def ack(ctx: typer.Context, group: GroupArg, lease: LeaseArg, as_json: JsonFlag = False) -> None:
    """Settle a leased record as done; prints its correlation id (exit 9 if the lease is stale).
    Removes the payload file `dequeue --env` wrote for the lease."""
    with _settling(lease):
        correlation = _client(ctx).ack(group, lease)
    emit({"correlation_id": correlation}, correlation, as_json=as_json)


def nack(
    ctx: typer.Context,
    *,
    group: GroupArg,
    lease: LeaseArg,
    delay: Annotated[
        float | None, typer.Option(metavar="S", min=0.0, help="Retry after S (default: backoff).")
    ] = None,
    reason: Annotated[
        str | None,
        typer.Option(
            metavar="TEXT", help="Why it failed (kept in its attempt history, and its dead letter)."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Give a leased record back for a retry (or to the DLQ on its last attempt). Removes the payload
    file `dequeue --env` wrote for the lease."""
    with _settling(lease):
        reply = _client(ctx).nack(group, lease, delay, reason)
    text = "dead-lettered" if reply.get("dead_lettered") else f"retry at {_when(reply.get('retry_at'))}"
    emit(reply, f"{reply.get('correlation_id')}\t{text}", as_json=as_json)


def extend(
    ctx: typer.Context,
    group: GroupArg,
    lease: LeaseArg,
    visibility: Annotated[float, typer.Option(metavar="S", min=0.001, help="Keep it S seconds from now.")],
    as_json: JsonFlag = False,
) -> None:
    """Keep a lease longer; prints the new expiry."""
    expires = _client(ctx).extend(group, lease, visibility)
    emit({"expires_at": expires}, _when(expires), as_json=as_json)


def ack_up_to(
    ctx: typer.Context,
    group: GroupArg,
    queue: Annotated[str, typer.Argument(metavar="QUEUE")],
    offset: Annotated[int, typer.Argument(metavar="OFFSET", min=0, help="Settle every record below it.")],
    as_json: JsonFlag = False,
) -> None:
    """Settle every record of QUEUE below OFFSET at once (leased ones too)."""
    count = _client(ctx).ack_up_to(group, queue, offset)
    emit({"acked": count}, str(count), as_json=as_json)


def work(
    ctx: typer.Context,
    *,
    group: GroupArg,
    command: Annotated[list[str], typer.Argument(metavar="-- COMMAND...", help="Run for each record.")],
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, max=1024, help="Commands run at once.")
    ] = 1,
    visibility: Annotated[
        float | None, typer.Option(metavar="S", min=0.001, help="Lease length (renewed while running).")
    ] = None,
    max_records: Annotated[
        int | None, typer.Option("--max", metavar="N", min=1, help="Stop after N.")
    ] = None,
    idle: Annotated[
        float | None, typer.Option(metavar="S", min=0.0, help="Stop once no record came for S seconds.")
    ] = None,
    nack_delay: Annotated[
        float | None, typer.Option(metavar="S", min=0.0, help="Retry delay after a failure.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run COMMAND for each record (payload on stdin, LATTICE_* set): ack on exit 0, nack otherwise."""
    worker = Worker(
        settings(ctx).socket_path,
        group,
        command,
        concurrency=concurrency,
        visibility=visibility,
        max_records=max_records,
        idle=idle,
        nack_delay=nack_delay,
    )
    summary = worker.run().as_dict()
    if as_json:
        emit(summary, None, as_json=True)
    else:
        sys.stderr.write(" ".join(f"{k}={v}" for k, v in summary.items()) + "\n")


# --- dead letters -----------------------------------------------------------------------------
@dlq_app.command("list")
def dlq_list(
    ctx: typer.Context,
    group: GroupArg,
    limit: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="At most N of them.", show_default="all")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List parked dead letters, oldest first."""
    letters = _client(ctx).dlq_list(group, limit)
    rows = [
        {**d, "queue": _short(d["queue"]), "value": text_of_bytes(d["value"], single_line=True)}
        for d in letters
    ]
    columns = {
        "dlq_offset": "DLQ",
        "queue": "QUEUE",
        "offset": "OFFSET",
        "attempts": "ATTEMPTS",
        "reason": "REASON",
        "last_error": "LAST ERROR",
        "correlation_id": "CORRELATION",
        "value": "VALUE",
    }
    emit(letters, table_lines(rows, columns) if letters else [], as_json=as_json)
    if not letters and not as_json:
        note(f"no dead letters in group {group}")


@dlq_app.command("show")
def dlq_show(
    ctx: typer.Context,
    group: GroupArg,
    offset: Annotated[int, typer.Argument(metavar="DLQ_OFFSET", min=0)],
    as_json: JsonFlag = False,
) -> None:
    """Show one dead letter: origin, attempts with their history, correlation id, payload."""
    letter = _client(ctx).dlq_show(group, offset)
    history = letter.pop("history")
    value = letter.pop("value")
    lines = field_lines(letter) + [_attempt_line(a) for a in history]
    emit(
        to_json({**letter, "history": history, "value": value}),
        [*lines, text_of_bytes(value)],
        as_json=as_json,
    )


def _offsets(ctx: typer.Context, offsets: list[int] | None, everything: bool) -> list[int] | None:
    if bool(offsets) == everything:
        raise typer.BadParameter("give DLQ offsets or --all (not both)", ctx=ctx, param_hint="'OFFSET'")
    return None if everything else offsets


Offsets = Annotated[list[int] | None, typer.Argument(metavar="[DLQ_OFFSET]...", min=0)]
AllFlag = Annotated[bool, typer.Option("--all", help="Every parked dead letter.")]


@dlq_app.command("redrive")
def dlq_redrive(
    ctx: typer.Context,
    group: GroupArg,
    offsets: Offsets = None,
    everything: AllFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Make dead letters available again (fresh attempts); prints how many."""
    count = _client(ctx).dlq_redrive(group, _offsets(ctx, offsets, everything))
    emit({"count": count}, str(count), as_json=as_json)


@dlq_app.command("purge")
def dlq_purge(
    ctx: typer.Context,
    group: GroupArg,
    offsets: Offsets = None,
    everything: AllFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Drop dead letters for good; prints how many."""
    count = _client(ctx).dlq_purge(group, _offsets(ctx, offsets, everything))
    emit({"count": count}, str(count), as_json=as_json)


def register(app: typer.Typer, client: ClientFactory) -> None:
    """Add the work-queue commands to ``latticectl`` (``client`` makes the invocation's client)."""
    _factory[:] = [client]
    app.add_typer(group_app, name="group")
    app.add_typer(dlq_app, name="dlq")
    app.command()(dequeue)
    app.command()(ack)
    app.command()(nack)
    app.command()(extend)
    app.command("ack-up-to")(ack_up_to)
    app.command()(claim)
    app.command()(work)


__all__ = ["dlq_app", "group_app", "register"]
