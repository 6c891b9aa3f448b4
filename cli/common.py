"""What every ``latticectl`` command module shares: the invocation's settings and client, the common
arguments, ``[OWNER/]NAME`` addressing, and the short notes written to stderr.

``--socket`` and ``--json`` are accepted before the command (``latticectl --json status``) and after it
(``latticectl status --json``); the one after the command wins. :class:`Settings` holds what was given.

Notes: a command whose result is not printed on stdout (a write, an empty listing) says what happened in
one short line on stderr, so stdout stays exactly what a script parses.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from latticed.api.client.blocking_client import Client
from latticed.errors import NotFoundError

_OWNER_HEX = re.compile(r"[0-9a-fA-F]{64}")


@dataclass
class Settings:
    """The options every command takes; set by the root (before the command) and by the command itself."""

    socket_path: Path | None = None
    as_json: bool = False


def settings(ctx: typer.Context) -> Settings:
    found = ctx.find_object(Settings)
    return found if found is not None else ctx.ensure_object(Settings)


def client(ctx: typer.Context) -> Client:
    """A client for this invocation, closed when the command ends."""
    return ctx.find_root().with_resource(Client(settings(ctx).socket_path))


SOCKET_HELP = "The daemon's socket (default: where latticed puts it)."

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print JSON (one object per line for records) instead of text.")
]
QueueArg = Annotated[
    str, typer.Argument(metavar="QUEUE", help="NAME for your own queue, OWNER/NAME for another's.")
]


def note(text: str) -> None:
    """One line on stderr saying what a command did when stdout shows nothing of it."""
    sys.stderr.write(text + "\n")


def to_bytes(text: str) -> bytes:
    """A command-line string as the bytes the user typed (undecodable argv bytes survive)."""
    return text.encode("utf-8", "surrogateescape")


def pairs(ctx: typer.Context, option: str, items: Sequence[str] | None) -> list[tuple[str, str]]:
    """Parse repeated ``KEY=VALUE`` options; the value may be empty and may contain ``=``."""
    parsed = []
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx=ctx, param_hint=f"'{option}'")
        parsed.append((key, value))
    return parsed


def is_owner_hex(text: str) -> bool:
    return _OWNER_HEX.fullmatch(text) is not None


def split_owner(text: str, *, allow_empty: bool = False) -> tuple[str | None, str]:
    """``OWNER/REST`` to ``(owner, rest)`` when OWNER is a public key in hex, else ``(None, text)``.
    ``allow_empty``: ``OWNER/`` alone names the owner with an empty rest (``kv list OWNER/``)."""
    owner, sep, rest = text.partition("/")
    if sep and (rest or allow_empty) and is_owner_hex(owner):
        return owner.lower(), rest
    return None, text


def found(value: Any, what: str) -> Any:
    """``value``, or NotFoundError (exit 4) when the daemon answered None."""
    if value is None:
        raise NotFoundError(what)
    return value


__all__ = [
    "SOCKET_HELP",
    "JsonFlag",
    "QueueArg",
    "Settings",
    "client",
    "found",
    "is_owner_hex",
    "note",
    "pairs",
    "settings",
    "split_owner",
    "to_bytes",
]
