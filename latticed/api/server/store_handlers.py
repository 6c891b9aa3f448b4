"""The store's own ops on the local API: ``store_compact``.

``store_compact`` gives every free page of the store back to the file system, cuts the WAL and writes
the disk reserve again (latticed/storage/space.py), and answers the sizes before and after. The storage
thread does it, so writes wait meanwhile: seconds for a store that was never compacted (one ``VACUUM``),
little after that.
"""

from __future__ import annotations

from latticed.api.server.context import Context, Handler, Reply, Request


async def store_compact(ctx: Context, request: Request) -> Reply:
    """Compact the store; ``before_bytes``, ``after_bytes``, ``freed_bytes``, ``vacuumed``."""
    result = await ctx.engine.compact_store()
    if ctx.health is not None:
        await ctx.health.refresh_disk()
    return {**result, "disk": ctx.health.disk_status() if ctx.health else None}


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "store_compact": store_compact,
}
