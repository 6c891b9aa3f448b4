"""``subscribe``: the server pushes leased records to one connection, keeping at most ``max_in_flight``
of them unsettled, and takes requests (acks above all) on the same connection meanwhile.

Frames pushed: first ``{"id", "ok": true, "subscribed": true, "consumer", "leases": [...]}``, then
``{"id", "ok": true, "leases": [...]}`` whenever records are available and the window has room (several
leases per frame when several are ready). The window frees as leases end, whether acked here or on any
other connection: every lease end wakes the pusher, nothing polls. Other requests on the connection are
answered as they complete, each with its own id. ``unsubscribe`` (or the connection closing) ends the
subscription and gives back the leases it still holds, each counted as a failed attempt ("released");
the reply to ``unsubscribe`` is ``{"id", "ok": true, "done": true, "released": n}``.

Throughput: an ack on this connection is applied as soon as its frame is read and its reply is queued
until the group commit carrying it is durable; everything queued goes out in one write. So a worker that
pipelines acks costs a few syscalls per commit, not per record.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

import trio

from latticed.api.messages import arg_int, arg_str, error_reply
from latticed.api.server.connection import Connection
from latticed.api.server.consumer_id import consumer_id
from latticed.api.server.context import Context, Handler, Reply, Request, StreamHandler
from latticed.api.server.group_handlers import (
    arg_seconds,
    lease_wire,
    remote_of,
    runtime_of,
    service_of,
    settled_reply,
)
from latticed.api.server.push import PushSession
from latticed.api.server.remote_subscribe import subscribe_remote
from latticed.errors import LatticedError, MalformedError, ProtocolError

MAX_SUBSCRIBE_IN_FLIGHT: Final = 10_000
_subscriptions = itertools.count(1)


async def unsubscribe(ctx: Context, request: Request) -> Reply:
    """Outside a subscription there is nothing to end."""
    return {"done": True, "released": 0}


async def subscribe(ctx: Context, conn: Connection, request: Request) -> bool:
    window = arg_int(request, "max_in_flight", default=1)
    if not 1 <= window <= MAX_SUBSCRIBE_IN_FLIGHT:
        raise MalformedError(f"argument 'max_in_flight' is an integer in [1, {MAX_SUBSCRIBE_IN_FLIGHT}]")
    visibility = arg_seconds(request, "visibility", positive=True)
    consumer = f"{consumer_id()}.s{next(_subscriptions)}"
    found = remote_of(ctx, request)
    if found is not None:  # another daemon's group: its owner leases, acks are forwarded in batches
        return await subscribe_remote(
            ctx, conn, request, found[0], found[1], window=window, visibility=visibility, consumer=consumer
        )
    service, rt = service_of(ctx), runtime_of(ctx, request)
    rid, group = request.get("id"), request.get("group")
    first = service.take(rt, consumer, visibility, window)  # registers the consumer; may hit the cap
    released: int | None = None
    unsubscribe_id: Any = None

    async def pusher() -> None:
        leases = first
        session.send(
            {
                "id": rid,
                "ok": True,
                "subscribed": True,
                "consumer": consumer,
                "leases": [lease_wire(rt.name, x) for x in leases],
            }
        )
        while True:
            room = window - rt.dispatcher.in_flight(consumer)
            leases = service.take(rt, consumer, visibility, room) if room > 0 else []
            if leases:
                session.send({"id": rid, "ok": True, "leases": [lease_wire(rt.name, x) for x in leases]})
            await rt.changed.wait()  # set by new records, lease ends, acks: re-check then

    def ack_inline(inner: Request, io: trio.Nursery) -> None:
        try:
            target = rt if inner.get("group") == group else runtime_of(ctx, inner)
            changes, flight = service.ack_submit(target, arg_str(inner, "lease"))
        except LatticedError as exc:
            session.send(error_reply(inner.get("id"), exc))
            return
        session.reply_after(flight, inner.get("id"), settled_reply(changes), io)

    with trio.CancelScope() as scope:
        session = PushSession(conn, scope)
        try:
            async with trio.open_nursery() as io:
                io.start_soon(session.sender)
                async with trio.open_nursery() as feed:
                    feed.start_soon(pusher)
                    while (inner := await session.next_request(ctx.ops)) is not None:
                        if inner["op"] == "ack":
                            ack_inline(inner, io)
                        elif inner["op"] == "unsubscribe":
                            unsubscribe_id = inner.get("id")
                            break
                        elif inner["op"] in ctx.ops.streams:
                            failure = ProtocolError(f"{inner['op']} is not allowed during a subscription")
                            session.send(error_reply(inner.get("id"), failure))
                        else:
                            session.pending += 1
                            io.start_soon(session.answer, ctx, inner)
                    feed.cancel_scope.cancel()
                if session.gone:
                    scope.cancel()
                released = service.drop_consumer(rt, consumer)
                session.send({"id": unsubscribe_id, "ok": True, "done": True, "released": released})
                session.finish()
        finally:
            if released is None:
                service.drop_consumer(rt, consumer)
    return not session.gone


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "unsubscribe": unsubscribe,
}
STREAMS: dict[str, StreamHandler] = {
    "subscribe": subscribe,
}


__all__ = ["MAX_SUBSCRIBE_IN_FLIGHT", "subscribe"]
