"""The retention ops of the local API: ``retention_get``, ``retention_set`` and ``queue_verify``.

A policy lives in the queue's signed metadata (:mod:`latticed.host.retention_policy`), so ``retention_set``
is a metadata write of the owner, checked here; ``retention_get`` also says what this daemon holds and
enforces (the owner's limits, or its own cap on a replica). ``queue_verify`` re-checks a stored queue
against its owner's signatures, which is how a replica that dropped records shows its suffix is whole.
"""

from __future__ import annotations

from typing import Any

from latticed.api.server.context import Context, Handler, Reply, Request
from latticed.errors import MalformedError, NotOwnerError
from latticed.host.retention_policy import UNCHANGED, Unchanged, meta_updates, policy_from_meta
from latticed.storage import prune


def _limit(request: Request, name: str) -> int | Unchanged | None:
    """A limit argument: absent (unchanged), nil or 0 (no limit), or a whole number above 0."""
    if name not in request:
        return UNCHANGED
    value = request[name]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedError(f"argument {name!r} must be a whole number (0 or nil: no limit)")
    return value


def _flag(request: Request, name: str) -> bool | Unchanged:
    if name not in request:
        return UNCHANGED
    value = request[name]
    if not isinstance(value, bool):
        raise MalformedError(f"argument {name!r} must be true or false")
    return value


async def retention_set(ctx: Context, request: Request) -> Reply:
    """Change parts of one of our queues' policy (arguments left out stay as they are)."""
    q = ctx.queue(request, writing=True)
    if not ctx.engine.owned(q):
        raise NotOwnerError(
            f"cannot set the retention of {ctx.engine.address(q)}: its owner does (a replica may keep "
            "less with replica_max_bytes)"
        )
    updates = meta_updates(
        max_age_ms=_limit(request, "max_age_ms"),
        max_bytes=_limit(request, "max_bytes"),
        max_records=_limit(request, "max_records"),
        keep_unsettled=_flag(request, "keep_unsettled"),
    )
    current = await _meta(ctx, q)
    changes = {key: value for key, value in updates.items() if current.get(key) != value}
    if changes:
        await ctx.engine.set_meta(q, changes)
    return await retention_get(ctx, request)


async def retention_get(ctx: Context, request: Request) -> Reply:
    """A queue's policy, and what this daemon holds and enforces of it."""
    engine = ctx.engine
    q = ctx.queue(request)
    owned = engine.owned(q)
    if engine.core2.holds(q):  # no replica floor on core 2: it holds from the owner's signed start
        state2 = await engine.core2.value(q)
        meta, (start, end), owner_start, floor = dict(state2.meta), state2.held, state2.held[0], 0
    else:
        state = engine.state(q)
        meta, start, end, floor = state.meta_dict, state.start, state.held_end, state.floor
        owner_start = state.head.start if state.head else 0
    policy, problems = policy_from_meta(meta)
    held_bytes = await engine.inspect(lambda reader: prune.stored_bytes(reader.conn, q))
    service = ctx.retention
    reply: dict[str, Any] = {
        "queue": engine.address(q),
        "owned": owned,
        "policy": policy.to_wire(),
        "problems": problems,
        "start_offset": start,
        "end_offset": end,
        "owner_start": owner_start,
        "records": end - start,
        "bytes": held_bytes,
        "floor": floor,
        "replica_max_bytes": None if owned or service is None or engine.core2.holds(q) else service.cap(q),
    }
    return reply


async def _meta(ctx: Context, q: int) -> dict[str, str]:
    """A queue's signed metadata on either fork core."""
    if ctx.engine.core2.holds(q):
        return dict((await ctx.engine.core2.value(q)).meta)
    return ctx.engine.state(q).meta_dict


async def queue_verify(ctx: Context, request: Request) -> Reply:
    """Re-check a stored queue end to end against its owner's signatures (IntegrityError or StorageError
    if anything does not match); answers how many records were checked."""
    q = ctx.queue(request)
    checked = await ctx.engine.verify(q)
    start, end = await ctx.engine.bounds(q)
    return {
        "queue": ctx.engine.address(q),
        "records": checked,
        "start_offset": start,
        "end_offset": end,
    }


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "retention_set": retention_set,
    "retention_get": retention_get,
    "queue_verify": queue_verify,
}


__all__ = ["queue_verify", "retention_get", "retention_set"]
