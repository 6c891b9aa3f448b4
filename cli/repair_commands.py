"""``latticectl queue repair QUEUE [--drop]``: the way out for a core-2 queue found corrupt at load (its
stored value is not what its owner signed; ``doctor`` names it and advises this command). A replica's copy
is dropped and fetched again from peers; our own queue is dropped only with ``--drop``, since records no
peer holds are lost. A refusal changes nothing: one line on stderr, exit code 1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from cli.boundary import ExitCode
from cli.common import JsonFlag, QueueArg, note
from cli.output import emit
from latticed.api.client.blocking_client import Client

ClientFactory = Callable[[typer.Context], Client]
_factory: list[ClientFactory] = []


def repair(
    ctx: typer.Context,
    queue: QueueArg,
    drop: Annotated[
        bool,
        typer.Option(
            "--drop",
            help="Also drop your own queue (peers send back what they hold; records no peer holds are lost).",
        ),
    ] = False,
    release: Annotated[
        bool,
        typer.Option(
            "--release",
            help="Your own queue dropped with --drop that no peer holds: let it be written again (its "
            "writes are refused until a peer sends it back).",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Drop a queue found corrupt here (`doctor` names it) so that peers send it again: another daemon's
    queue is fetched again whole and verified; your own needs --drop, and then takes no write until a
    peer sent it back (or --release). A queue that is not corrupt is left alone (exit code 1)."""
    done = _factory[0](ctx).queue_repair(queue, drop=drop, release=release)
    message = str(done.get("message") or "")
    if done.get("repaired"):
        emit(done, message, as_json=as_json)
        return
    if as_json:
        emit(done, None, as_json=True)
    else:
        note(f"not repaired: {message}")
    raise typer.Exit(ExitCode.ERROR)


def register(queue_app: typer.Typer, client: ClientFactory) -> None:
    """Add ``queue repair`` (``client`` makes the invocation's client)."""
    _factory[:] = [client]
    queue_app.command("repair")(repair)


__all__ = ["register", "repair"]
