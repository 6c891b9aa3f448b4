"""The one table of the local API's ops, built from the handler modules' own tables.

Each handler module lists its ops in module-level ``OPS`` (request/reply), ``STREAMS`` and ``PIPELINED``
dicts; nothing registers itself on import. :func:`build_op_table` is called once by the composition root,
and a name claimed twice is a bug caught at start-up. :mod:`.produce_handlers` lists no op of its own: the
``offer`` and ``offer_batch`` handlers of :mod:`.handlers` call it for offers into other daemons' queues
and idempotent offers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from latticed.api.server import (
    bundle_handlers,
    core2_handlers,
    group_handlers,
    handlers,
    member_handlers,
    peer_handlers,
    repair_handlers,
    retention_handlers,
    store_handlers,
    subscribe,
    tail,
    time_handlers,
    upgrade_handlers,
    why_handlers,
)
from latticed.api.server.context import Context, Handler, OpTable, PipelinedHandler, Reply, Request

V = TypeVar("V")

_REQUEST_REPLY: tuple[Mapping[str, Handler], ...] = (
    handlers.OPS,
    bundle_handlers.OPS,
    core2_handlers.OPS,
    group_handlers.OPS,
    member_handlers.OPS,
    peer_handlers.OPS,
    repair_handlers.OPS,
    retention_handlers.OPS,
    store_handlers.OPS,
    subscribe.OPS,
    time_handlers.OPS,
    upgrade_handlers.OPS,
    why_handlers.OPS,
)


def _merged(tables: tuple[Mapping[str, V], ...], taken: set[str]) -> dict[str, V]:
    merged: dict[str, V] = {}
    for table in tables:
        for name, fn in table.items():
            if name in taken:
                raise ValueError(f"API op {name!r} is defined twice")
            taken.add(name)
            merged[name] = fn
    return merged


def _run_alone(begin: PipelinedHandler) -> Handler:
    """A pipelined op as an ordinary handler (inside ``subscribe``'s connection, or not pipelining)."""

    async def run(ctx: Context, request: Request) -> Reply:
        job, build = begin(ctx, request)
        return build(await ctx.engine.outcome(job))

    return run


def build_op_table() -> OpTable:
    taken: set[str] = set()
    pipelined = _merged((handlers.PIPELINED,), taken)
    request_reply = _merged(_REQUEST_REPLY, taken)
    streams = _merged(
        (bundle_handlers.STREAMS, group_handlers.STREAMS, subscribe.STREAMS, tail.STREAMS), taken
    )
    request_reply.update({name: _run_alone(begin) for name, begin in pipelined.items()})
    return OpTable(handlers=request_reply, streams=streams, pipelined=pipelined)


__all__ = ["build_op_table"]
