"""``queue_upgrade``: the owner continues its queues of fork core 1 on core 2 (where a fork freezes the
queue and the owner recovers it), and ``queue_recover`` of a forked core-1 queue, which converts it from
its fork point. Offsets do not change, so readers go on; replicas that speak ``heads-v2`` follow when
the converted queue reaches them (docs/lattice.md, "Converting a core-1 queue").
"""

from __future__ import annotations

from typing import Any

from latticed.api.messages import arg_bool, arg_str
from latticed.api.server.context import Context, Handler, Reply, Request
from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.queue2.from_core1 import CONVERTED_EPOCH, fork_point
from latticed.errors import LatticedError, MalformedError, NotOwnerError

__all__ = ["OPS", "recover_core1"]


async def _convert(ctx: Context, q: int, *, recover: bool, keep_mine: bool) -> dict[str, Any]:
    engine = ctx.engine
    address = engine.address(q)
    if engine.core2.holds(q):
        start, end = (await engine.core2.value(q)).held
        return {"queue": address, "converted": False, "start_offset": start, "end_offset": end}
    state = engine.state(q)
    if state.owner != engine.public_key:
        raise NotOwnerError(
            f"cannot convert {address}: only its owner's daemon can (replicas follow once the owner's "
            "converted queue reaches them)"
        )
    start, end = await engine.core2.upgrade_core1(q, state, recover=recover, keep_mine=keep_mine)
    return {
        "queue": address,
        "converted": True,
        "epoch": CONVERTED_EPOCH,
        "start_offset": start,
        "end_offset": end,
    }


async def queue_upgrade(ctx: Context, request: Request) -> Reply:
    """Convert one of our core-1 queues (``queue``), or with ``all`` every one we own, to core 2. One
    already on core 2 is left as it is (``converted`` false); with ``all``, a queue that cannot be
    converted now (forked: recover it; or not caught up) is listed with the reason and the rest go on."""
    if not arg_bool(request, "all", False):
        if arg_str(request, "queue", optional=True) is None:
            raise MalformedError("name a queue, or ask for all of them")
        return {"queues": [await _convert(ctx, ctx.queue(request), recover=False, keep_mine=False)]}
    engine = ctx.engine
    done: list[dict[str, Any]] = []
    for q in engine.queues(KIND_QUEUE):
        if not engine.owned(q) or engine.core2.holds(q):
            continue
        try:
            done.append(await _convert(ctx, q, recover=False, keep_mine=False))
        except LatticedError as exc:
            done.append({"queue": engine.address(q), "converted": False, "error": str(exc)})
    return {"queues": done}


async def recover_core1(ctx: Context, q: int, *, keep_mine: bool) -> Reply:
    """``queue_recover`` of a core-1 queue: a forked one converts to core 2 from its fork point."""
    engine = ctx.engine
    state = engine.state(q)
    if fork_point(state) is None:
        raise MalformedError(
            f"{engine.address(q)} is not forked: there is nothing to recover (`latticectl queue upgrade "
            f"{state.name}` moves it to fork core 2)"
        )
    done = await _convert(ctx, q, recover=True, keep_mine=keep_mine)
    return {k: done[k] for k in ("queue", "epoch", "start_offset", "end_offset")}


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {"queue_upgrade": queue_upgrade}
