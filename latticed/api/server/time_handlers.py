"""Reading by time on the local API: ``offsets_for_times``.

``offsets_for_times`` answers Kafka's ``offsetsForTimes`` for one queue: the first offset held here whose
record timestamp is at or after ``timestamp`` (ms since the epoch), with that record's timestamp, or nil
when no held record's is (then ``end`` says where new records will start). A timestamp is the owner's
clock when its daemon accepted the offer; see :mod:`latticed.storage.timeindex` for clocks that step
back. It reads the time index on a reader connection: an index seek and one segment, on any daemon that
holds the queue (a sealed queue's timestamps are not sealed, so relays answer too).
"""

from __future__ import annotations

from latticed.api.messages import arg_int
from latticed.api.server.context import Context, Handler, Reply, Request
from latticed.storage.timeseek import offset_for_time


async def offsets_for_times(ctx: Context, request: Request) -> Reply:
    """``offset`` and ``timestamp`` of the first record at or after ``timestamp`` (nil: none), ``end``."""
    q = ctx.queue(request)
    timestamp = arg_int(request, "timestamp")
    found = await ctx.engine.inspect(lambda reader: offset_for_time(reader.conn, q, timestamp))
    start, end = await ctx.engine.bounds(q)  # either fork core
    if found is not None and found[0] < start:  # read before a truncation that has committed since
        found = await ctx.engine.inspect(lambda reader: offset_for_time(reader.conn, q, timestamp))
    offset, ts = found if found is not None else (None, None)
    return {"queue": ctx.engine.address(q), "offset": offset, "timestamp": ts, "end": end}


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "offsets_for_times": offsets_for_times,
}
