"""``latticectl queue recover``, ``queue upgrade`` and ``queue fork show``: a queue on fork core 2 that its
owner forked is frozen at the fork point everywhere; its owner continues it in a new epoch, and any daemon
shows what it kept aside past the fork point (docs/lattice.md, "Forks under v2 heads"). ``upgrade`` moves
an owner's core-1 queue to core 2 (and ``recover`` a forked one, from its fork point)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from cli.boundary import ExitCode
from cli.common import JsonFlag, QueueArg, note
from cli.output import emit, field_lines
from latticed.api.client.blocking_client import Client
from latticed.errors import MalformedError

ClientFactory = Callable[[typer.Context], Client]
_factory: list[ClientFactory] = []

fork_app = typer.Typer(help="What a forked queue (fork core 2) kept aside past its fork point.")


def _when(ms: object) -> str:
    if not isinstance(ms, int):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def fork_text(info: dict[str, Any]) -> str | None:
    """``forked at offset N, frozen since T, recover with ...`` for a frozen core-2 queue (None if not)."""
    point = info.get("fork_point")
    if info.get("core") != 2 or not info.get("forked") or point is None:
        return None
    name = info.get("name") or str(info.get("queue", "?")).rpartition("/")[2]
    how = (
        f"recover with `latticectl queue recover {name}`"
        if info.get("owned")
        else "waiting for its owner's `latticectl queue recover`"
    )
    return f"forked at offset {point}, frozen since {_when(info.get('frozen_since_ms'))}, {how}"


def recover(
    ctx: typer.Context,
    queue: QueueArg,
    keep_mine: Annotated[
        bool,
        typer.Option(
            "--keep-mine",
            help="Offer again this daemon's records from past the fork point as the new epoch's first ones.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Continue your forked queue (fork core 2) from its fork point in a new epoch: it is writable again
    everywhere once the new epoch reaches each daemon. Only the owner's daemon can."""
    done = _factory[0](ctx).queue_recover(queue, keep_mine=keep_mine)
    emit(
        done,
        f"recovered {done.get('queue')} in epoch {done.get('epoch')}: it holds offsets "
        f"{done.get('start_offset')}..{done.get('end_offset')} (end exclusive)",
        as_json=as_json,
    )


def upgrade(
    ctx: typer.Context,
    queue: Annotated[
        str | None, typer.Argument(metavar="[NAME]", help="One of your queues (omit with --all).")
    ] = None,
    all_queues: Annotated[
        bool, typer.Option("--all", help="Every queue of yours still on fork core 1.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Move your queue from fork core 1 to fork core 2, where a fork freezes the queue until you recover
    it. Offsets and records stay; peers that speak heads-v2 follow (a 0.2.0 peer keeps the queue where it
    was). A forked queue is moved by `queue recover`. Only the owner's daemon can."""
    if (queue is None) == (not all_queues):
        raise MalformedError("name one queue, or give --all")
    done = _factory[0](ctx).queue_upgrade(queue, all_queues=all_queues)
    failed = [entry for entry in done if entry.get("error")]
    lines = []
    for entry in done:
        if entry.get("error"):
            note(f"{entry.get('queue')}: not moved: {entry['error']}")
        else:
            verb = "moved to fork core 2" if entry.get("converted") else "already on fork core 2"
            span = f"offsets {entry.get('start_offset')}..{entry.get('end_offset')} (end exclusive)"
            lines.append(f"{entry.get('queue')}: {verb}, {span}")
    emit(done, lines, as_json=as_json)
    if failed:
        raise typer.Exit(ExitCode.ERROR)


@fork_app.command("show")
def fork_show(
    ctx: typer.Context,
    queue: QueueArg,
    limit: Annotated[
        int, typer.Option("--limit", min=0, max=1000, help="Show at most this many kept records.")
    ] = 10,
    as_json: JsonFlag = False,
) -> None:
    """The fork point, each branch's newest head and the records this daemon kept aside past the fork
    point (counted; the first --limit shown)."""
    shown = _factory[0](ctx).queue_fork_show(queue, limit=limit)
    if as_json:
        emit(shown, None, as_json=True)
        return
    if not shown.get("forked"):
        note(f"{shown.get('queue')} is not forked (epoch {shown.get('epoch')})")
    evidence = shown.get("evidence") or {}
    lines = field_lines(
        {
            "queue": shown.get("queue"),
            "epoch": shown.get("epoch"),
            "fork point": shown.get("fork_point"),
            "frozen since": _when(shown.get("frozen_since_ms")) if shown.get("forked") else "-",
            "branches": [
                f"version {b.get('version')} ending at {b.get('end')}, head {str(b.get('head_hash'))[:16]}"
                for b in shown.get("branches") or []
            ]
            or "none",
            "kept aside": f"{evidence.get('records', 0)} records in {len(evidence.get('pieces') or [])} "
            f"piece(s), {evidence.get('dropped', 0)} more dropped by the bound",
        }
    )
    for offset, key, value, _ts, _headers in evidence.get("shown") or []:
        lines.append(
            f"{offset}\t{'' if key is None else 'key=' + repr(key)[2:-1] + chr(9)}{repr(value)[2:-1]}"
        )
    emit(shown, lines, as_json=False)


def register(queue_app: typer.Typer, client: ClientFactory) -> None:
    """Add ``queue recover``, ``queue upgrade`` and ``queue fork show`` (``client`` makes the
    invocation's client)."""
    _factory[:] = [client]
    queue_app.command("recover")(recover)
    queue_app.command("upgrade")(upgrade)
    queue_app.add_typer(fork_app, name="fork")


__all__ = ["fork_text", "register"]
