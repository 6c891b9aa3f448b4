"""Local API ops of queues on fork core 2 only: ``queue_recover`` (the owner continues a frozen queue in a
new epoch) and ``queue_fork_show`` (what this daemon kept aside past a fork point). Every other op reaches
core-2 queues through the engine's core-aware calls; the forks ``status`` lists are the health service's.
"""

from __future__ import annotations

from typing import Any, Final

from latticed.api.messages import arg_bool, arg_int
from latticed.api.server.context import Context, Handler, Reply, Request
from latticed.api.server.upgrade_handlers import recover_core1
from latticed.crdt.head import QueueKind
from latticed.crdt.wire import records_to_wire
from latticed.errors import MalformedError, NotOwnerError, OtherCoreError
from latticed.storage.core2_view import frozen_since_ms, recover_hint

#: Evidence records ``queue_fork_show`` returns at most (it always counts them all).
MAX_SHOWN: Final = 1000


async def forks(ctx: Context) -> list[dict[str, Any]]:
    """The forked queues ``status`` and ``doctor`` list: the health service's, on both cores (a context
    without one, as some tests build: the frozen core-2 ones)."""
    if ctx.health is not None:
        return await ctx.health.forks()
    await ctx.engine.core2.load_all()
    return ctx.engine.core2.forked_entries()


def corrupt(ctx: Context) -> list[dict[str, Any]]:
    """The queues found corrupt when they loaded (``doctor``): load every one first (:func:`forks`)."""
    return ctx.engine.core2.corrupt_entries()


def core2_count(ctx: Context) -> int:
    """How many core-2 queues (of every kind) this daemon holds: what a peer without ``heads-v2`` misses."""
    return sum(len(ctx.engine.core2.queues(kind)) for kind in QueueKind)


def _core2_queue(ctx: Context, request: Request, what: str) -> int:
    q = ctx.queue(request)
    if not ctx.engine.core2.holds(q):
        raise OtherCoreError(
            f"{ctx.engine.address(q)} is on fork core 1, which has no {what} (a fork stops it where each "
            "replica stands; create queues with --core 2 to have them frozen and recovered)"
        )
    return q


async def queue_recover(ctx: Context, request: Request) -> Reply:
    """Continue our forked queue from its fork point in a new epoch; ``keep_mine``: offer again the
    records this daemon held past the fork point (its evidence) as the new epoch's first records."""
    q = ctx.queue(request)
    if not ctx.engine.core2.holds(q):  # a forked core-1 queue: converted from its fork point
        return await recover_core1(ctx, q, keep_mine=arg_bool(request, "keep_mine", False))
    core2 = ctx.engine.core2
    state = await core2.value(q)
    if not core2.owned(q):
        raise NotOwnerError(
            f"cannot recover {core2.address(q)}: only its owner's daemon can (this daemon holds a replica); "
            "it goes on here once the owner's recovery arrives"
        )
    if not state.forked:
        raise MalformedError(f"{core2.address(q)} is not forked: there is nothing to recover")
    epoch = await core2.recover_queue(q, keep_mine=arg_bool(request, "keep_mine", False))
    start, end = (await core2.value(q)).held
    return {"queue": core2.address(q), "epoch": epoch, "start_offset": start, "end_offset": end}


async def queue_fork_show(ctx: Context, request: Request) -> Reply:
    """The fork of a core-2 queue as this daemon knows it: the fork point, each branch's newest head,
    and the evidence (records it held past a fork point) counted by piece, with at most ``limit``
    records shown."""
    q = _core2_queue(ctx, request, "fork evidence")
    limit = min(max(arg_int(request, "limit", default=10), 0), MAX_SHOWN)
    core2 = ctx.engine.core2
    state = await core2.value(q)
    evidence = await core2.evidence(q)
    chains = state.chains
    shown: list[list[Any]] = []
    for _, first, records in evidence.pieces:
        room = limit - len(shown)
        if room <= 0:
            break
        wire = records_to_wire(list(records[:room]))
        shown += [[first + i, *fields] for i, fields in enumerate(wire)]
    return {
        "queue": core2.address(q),
        "forked": state.forked,
        "epoch": chains.epoch,
        "fork_point": chains.fork_point,
        "frozen_since_ms": frozen_since_ms(state),
        "branches": [
            {
                "epoch": tip.head.epoch,
                "version": tip.head.version,
                "end": tip.head.end,
                "head_hash": tip.head.head_hash.hex(),
                "timestamp_ms": tip.head.timestamp,
            }
            for tip in chains.tips
        ]
        if state.forked
        else [],
        "evidence": {
            "pieces": [[epoch, first, len(records)] for epoch, first, records in evidence.pieces],
            "records": sum(len(records) for _, _, records in evidence.pieces),
            "dropped": evidence.dropped,
            "shown": shown,
        },
    }


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "queue_recover": queue_recover,
    "queue_fork_show": queue_fork_show,
}

__all__ = ["MAX_SHOWN", "OPS", "forks", "recover_hint"]
