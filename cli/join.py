"""``latticectl invite`` and ``latticectl join``: bring another daemon into this daemon's network.

A token is decoded here before the daemon is asked, so a typo fails at once (exit 2) and nothing changes.
``join -`` reads the token from stdin, which keeps the secret out of shell history and ``ps``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from cli.output import emit
from latticed.api.client.blocking_client import Client
from latticed.host.invite import decode_invite
from latticed.protocol.addresses import parse_host_port

ClientFactory = Callable[[typer.Context], Client]
_factory: list[ClientFactory] = []

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

SECRET_NOTE = (
    "this token is a secret: it holds the network key, and anyone who has it can join the network. Send it "
    "only over a private channel; if it leaks, make a new network key (docs/operations.md)."
)


def invite(
    ctx: typer.Context,
    address: Annotated[
        list[str] | None,
        typer.Option(
            "--address",
            metavar="HOST:PORT",
            help="Where the other daemon can reach this one (default: this daemon's listen addresses); "
            "repeatable.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print a one-line token with which another daemon joins this network (latticectl join TOKEN).

    The token holds the network key, this daemon's identity and its addresses. It is a SECRET."""
    addresses = address or []
    for item in addresses:
        parse_host_port(item)  # a usage error before the daemon is asked
    token = _factory[0](ctx).invite(addresses)
    emit({"token": token}, token, as_json=as_json)
    typer.echo(f"latticectl: note: {SECRET_NOTE}", err=True)


def join(
    ctx: typer.Context,
    token: Annotated[
        str,
        typer.Argument(
            metavar="TOKEN",
            help="A token from `latticectl invite` on a member of the network; - reads stdin.",
        ),
    ],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Switch networks even if this daemon shares its current private key with peers (they stay "
            "in the old network).",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Join the network of TOKEN: store its network key, remember the inviting peer, replicate.

    The daemon switches to the new key without a restart. If it already shares another private key with
    peers it refuses (exit 8), since switching cuts it off from them, unless --force."""
    text = sys.stdin.read() if token == "-" else token
    decode_invite(text)  # a typo fails here (exit 2), before anything changes
    joined = _factory[0](ctx).join(text, force=force)
    addresses = ", ".join(joined.get("addresses") or [])
    if joined.get("key_changed"):
        first = f"joined network {joined['network']}; its key is stored in {joined['key_file']}"
    else:
        first = f"already in network {joined['network']}"
    lines = [first, f"dialling peer {str(joined['peer'])[:16]} at {addresses}; `latticectl peers` shows it"]
    emit(joined, lines, as_json=as_json)


def register(app: typer.Typer, client: ClientFactory) -> None:
    """Add ``invite`` and ``join`` to ``latticectl`` (``client`` makes the invocation's client)."""
    _factory[:] = [client]
    app.command()(invite)
    app.command()(join)


__all__ = ["register"]
