"""The local API's ops for sealed queues: ``queue_share`` and ``queue_unshare`` (creating one is
``queue_create`` with ``readers``). See :mod:`latticed.storage.sealer` and docs/privacy.md."""

from __future__ import annotations

from latticed.api.handlers import Context, Reply, Request, handler
from latticed.api.wire import arg_bool, arg_str
from latticed.crdt.signing import parse_public_key
from latticed.storage.sealer import sealer_of


@handler("queue_share")
async def queue_share(ctx: Context, request: Request) -> Reply:
    """Give a reader the current key epoch (``history``: every earlier one too)."""
    q = ctx.queue(request)
    reader = parse_public_key(arg_str(request, "reader"))
    given = await sealer_of(ctx.engine).share(q, reader, history=arg_bool(request, "history", False))
    return {"epochs": given, "sealed": sealer_of(ctx.engine).describe(q)}


@handler("queue_unshare")
async def queue_unshare(ctx: Context, request: Request) -> Reply:
    """Remove a reader: a new key epoch from the queue's next offset, without it."""
    q = ctx.queue(request)
    reader = parse_public_key(arg_str(request, "reader"))
    removed, epoch, start = await sealer_of(ctx.engine).unshare(q, reader)
    return {"removed": removed, "epoch": epoch, "start": start}


__all__ = ["queue_share", "queue_unshare"]
