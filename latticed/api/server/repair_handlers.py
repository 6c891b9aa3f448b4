"""``queue_repair``: the way out for a core-2 queue found corrupt at load (its stored value is not what its
owner signed: :mod:`latticed.storage.corruption`), short of restoring the whole data directory.

A replica's copy is dropped, and the links that speak ``heads-v2`` restart so that peers send the queue
again whole (nothing is lost: the owner and the other replicas hold it, and every byte is verified as it
arrives). Our own queue is dropped only when asked with ``drop`` (peers send back what they hold; records
no peer holds are lost), and the refusal says what would be lost. A queue that is not corrupt is never
dropped. Local API 1, additive: a daemon without the op answers "unknown op", which the client turns into
one line naming both releases.

Our own queue, once dropped, takes no write (nor is it created again) until a peer's copy as long as the
one dropped merged back, across restarts (:mod:`latticed.storage.dropped_own`): writing before would sign
a second history at offsets peers hold. ``release`` is the operator saying no peer holds it.
"""

from __future__ import annotations

from typing import Any

from latticed.api.messages import arg_bool, arg_str
from latticed.api.server.context import Context, Handler, Reply, Request

__all__ = ["OPS", "queue_repair"]


def _refused(address: str, owned: bool, message: str) -> Reply:
    return {"queue": address, "owned": owned, "repaired": False, "message": message}


def _records(bounds: tuple[int, int] | None) -> str:
    if bounds is None:
        return "no records"
    lo, hi = bounds
    return f"{hi - lo} record{'' if hi - lo == 1 else 's'} (offsets {lo}..{hi}, end exclusive)"


async def _release(ctx: Context, queue: str) -> Reply:
    """``--release``: the operator says no peer holds our dropped queue; it may be written again."""
    own = ctx.engine.public_key.hex()
    owner, _, name = queue.rpartition("/")
    if owner not in ("", own):
        return _refused(queue, False, f"{queue} is not this daemon's queue: only its owner releases it")
    end = await ctx.engine.core2.release_dropped(name)
    address = f"{own}/{name}"
    if end is None:
        return _refused(
            address, True, f"{address} was not dropped by `queue repair --drop`: nothing to release"
        )
    return {
        "queue": address,
        "owned": True,
        "repaired": True,
        "records": end,
        "links_restarted": 0,
        "message": f"{address} may be written again from what is here; the {end} record(s) it had before "
        "`queue repair --drop` that no peer sent back are given up (a peer that still holds them would "
        "see a fork)",
    }


async def queue_repair(ctx: Context, request: Request) -> Reply:
    """Drop a corrupt core-2 queue here so replication fetches it again (see the module docstring).
    Replies ``repaired`` (false: refused, ``message`` says why), ``owned``, ``records`` (how many were
    dropped), ``links_restarted`` and a one-line ``message``."""
    drop = arg_bool(request, "drop", False)
    engine = ctx.engine
    if arg_bool(request, "release", False):
        return await _release(ctx, arg_str(request, "queue"))
    q = ctx.queue(request)
    address = engine.address(q)
    core2 = engine.core2
    if not core2.holds(q):
        return _refused(
            address,
            engine.owned(q),
            f"{address} is on fork core 1, whose queues are checked as each delta arrives, not found corrupt "
            "at load: nothing to repair",
        )
    owned = core2.owned(q)
    corrupt = await core2.corrupt_error(q)
    if corrupt is None:
        return _refused(
            address, owned, f"{address} is not corrupt (it is what its owner signed): nothing to repair"
        )
    bounds = await core2.stored_bounds(q)
    if owned and not drop:
        return _refused(
            address,
            owned,
            f"{address} is this daemon's own queue: repairing it drops its {_records(bounds)} and metadata "
            "here; peers send back what they hold, and records no peer holds are lost. Run it again with "
            "--drop to do that (or restore the data directory from a backup)",
        )
    if not await core2.drop_corrupt(q, 0 if bounds is None else bounds[1]):  # another repair dropped it
        return _refused(address, owned, f"{address} is not corrupt any more (another repair dropped it)")
    replication = ctx.replication
    restarted = 0 if replication is None else replication.restart_core2_links(f"queue repair {address}")
    count = 0 if bounds is None else bounds[1] - bounds[0]
    refetch = (
        f"its {restarted} peer link(s) that carry core-2 queues restarted to fetch it again"
        if restarted
        else "it is fetched again when a peer that holds it connects"
    )
    name = address.rpartition("/")[2]
    wait = f"it takes no write until it is back (or `queue repair {name} --release`); " if owned else ""
    reply: dict[str, Any] = {
        "queue": address,
        "owned": owned,
        "repaired": True,
        "records": count,
        "links_restarted": restarted,
        "message": f"dropped the corrupt copy of {address} ({_records(bounds)}); {wait}{refetch}",
    }
    return reply


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {"queue_repair": queue_repair}
