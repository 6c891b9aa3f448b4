"""``subscribe`` to a group another daemon owns: the same frames as a local subscription
(:mod:`latticed.api.server.subscribe`), with the owner granting the leases.

One long poll for leases is outstanding at the owner while the window has room (it waits there for
records, so nothing polls); records are read from this daemon's replica when it holds them
(:class:`~latticed.groups.remote.RemoteGroups`). Acks read on the connection are forwarded in batches,
several batches in flight at once, each answered once the owner's commit is durable; other requests are
answered as usual. When the link to the owner drops, the subscription waits for it to come back: the
leases it holds stay the owner's until they expire, and an ack that gets through before then counts.

Ending it (``unsubscribe``, or the connection closing) gives back what it still holds (the owner nacks
them as "released") once every ack read before has been answered, so an ack is never overtaken by the
release of its own lease.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import trio

from latticed.api.messages import error_reply
from latticed.api.server.connection import Connection
from latticed.api.server.context import Context, Request
from latticed.api.server.push import PushSession
from latticed.errors import LatticedError, OwnerUnreachableError, ProtocolError
from latticed.groups.remote import RemoteGroup, RemoteGroups
from latticed.process.logs import get_logger, log_event
from latticed.protocol.lease_forwarding import error_for

log = get_logger(__name__)

#: How long one outstanding request for leases waits at the owner before it is asked again.
LONG_POLL_S: Final = 20.0
#: Ack batches in flight to the owner at once, per subscription.
ACK_BATCHES: Final = 4


class _Acks:
    """Acks read on the connection, forwarded in batches; lives in the forwarder's nursery so acks read
    before the client left still reach the owner."""

    def __init__(self, remote: RemoteGroups, target: RemoteGroup, session: PushSession) -> None:
        self.remote = remote
        self.target = target
        self.session = session
        #: (request id, lease, the reply the owner would give when it is known here: the lease's facts)
        self.waiting: list[tuple[Any, str, dict[str, Any] | None]] = []
        self.in_flight = 0
        self.wake = trio.Event()
        self.idle = trio.Event()
        self.idle.set()
        self.closed = False

    def add(self, rid: Any, token: str, reply: dict[str, Any] | None) -> None:
        self.waiting.append((rid, token, reply))
        self.session.pending += 1
        if self.idle.is_set():
            self.idle = trio.Event()
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                while self.waiting and self.in_flight < ACK_BATCHES:
                    batch, self.waiting = self.waiting, []
                    self.in_flight += 1
                    nursery.start_soon(self._send, batch)
                if not self.waiting and not self.in_flight:
                    self.idle.set()
                    if self.closed:
                        return
                self.wake = trio.Event()
                await self.wake.wait()

    async def _send(self, batch: list[tuple[Any, str, dict[str, Any] | None]]) -> None:
        try:
            known = [item for item in batch if item[2] is not None]
            unknown = [item for item in batch if item[2] is None]
            for items, brief in ((known, True), (unknown, False)):
                if items:
                    await self._forward(items, brief)
        finally:
            self.session.pending -= len(batch)
            self.session.wake.set()
            self.in_flight -= 1
            self.wake.set()

    async def _forward(self, batch: list[tuple[Any, str, dict[str, Any] | None]], brief: bool) -> None:
        session = self.session
        try:
            results = await self.remote.ack_many(self.target, [token for _, token, _ in batch], brief=brief)
        except LatticedError as exc:
            for rid, _, _ in batch:
                session.send(error_reply(rid, exc))
        else:
            for (rid, _, known), result in zip(batch, results, strict=True):
                if isinstance(result, dict) and result.get("ok"):
                    session.send({**(known or {}), **result, "id": rid})
                else:
                    error = result.get("error") if isinstance(result, dict) else None
                    error = error if isinstance(error, dict) else {}
                    failure = error_for(str(error.get("code", "error")), str(error.get("message", "")))
                    session.send(error_reply(rid, failure))


async def subscribe_remote(
    ctx: Context,
    conn: Connection,
    request: Request,
    remote: RemoteGroups,
    target: RemoteGroup,
    *,
    window: int,
    visibility: float | None,
    consumer: str,
) -> bool:
    rid, group = request.get("id"), request.get("group")
    first = await remote.take(target, consumer, window, visibility, None)  # may fail: unreachable, allow-list
    # Leases pushed and not settled on this connection, with their expiry (epoch seconds): the window.
    # One that expires at the owner frees its place here too (an extend elsewhere is not seen: the
    # window may then briefly hold one more).
    held: dict[str, float] = {lease["lease"]: lease["expires_at"] for lease in first}
    #: What an ack of each pushed lease answers (as the owner would): kept so acks go to it brief.
    facts: dict[str, dict[str, Any]] = {lease["lease"]: _facts(lease) for lease in first}
    room = trio.Event()
    released: int | None = None
    unsubscribe_id: Any = None

    def settled(token: Any) -> dict[str, Any] | None:
        if held.pop(token, None) is not None:
            room.set()
        return facts.pop(token, None)

    async def pusher() -> None:
        nonlocal room
        session.send({"id": rid, "ok": True, "subscribed": True, "consumer": consumer, "leases": first})
        while True:
            now = time.time()
            for token in [t for t, expires in held.items() if expires <= now]:
                del held[token]
                facts.pop(token, None)
            free = window - len(held)
            # Ask for leases a quarter window at a time (all at once when it runs dry): each ask is a
            # round trip to the owner, and asking per freed place would cost one per record.
            if free <= 0 or (held and free < max(1, window // 2)):
                room = trio.Event()
                with trio.move_on_after(max(min(held.values()) - now, 0.0)):
                    await room.wait()
                continue
            try:
                leases = await remote.take(target, consumer, free, visibility, LONG_POLL_S)
            except OwnerUnreachableError:
                # The link is down (or the owner is slow): wait for it rather than ask again at once.
                with trio.move_on_after(LONG_POLL_S):
                    await remote.links.link_changed()
                continue
            except LatticedError as exc:  # refused now (the group was deleted, the allow-list changed)
                session.send(error_reply(rid, exc))
                return
            if leases:
                for lease in leases:
                    held[lease["lease"]] = lease["expires_at"]
                    facts[lease["lease"]] = _facts(lease)
                session.send({"id": rid, "ok": True, "leases": leases})

    with trio.CancelScope() as scope:
        session = PushSession(conn, scope)
        acks = _Acks(remote, target, session)
        remote.spawn(acks.run)
        try:
            async with trio.open_nursery() as io:
                io.start_soon(session.sender)
                async with trio.open_nursery() as feed:
                    feed.start_soon(pusher)
                    while (inner := await session.next_request(ctx.ops)) is not None:
                        op = inner["op"]
                        same_group = inner.get("group") == group
                        if op == "ack" and same_group and isinstance(inner.get("lease"), str):
                            acks.add(inner.get("id"), inner["lease"], settled(inner["lease"]))
                        elif op == "unsubscribe":
                            unsubscribe_id = inner.get("id")
                            break
                        elif op in ctx.ops.streams:
                            failure = ProtocolError(f"{op} is not allowed during a subscription")
                            session.send(error_reply(inner.get("id"), failure))
                        else:
                            if op == "nack" and same_group:
                                settled(inner.get("lease"))
                            session.pending += 1
                            io.start_soon(session.answer, ctx, inner)
                    feed.cancel_scope.cancel()  # its outstanding take is cancelled at the owner too
                acks.close()
                if session.gone:
                    scope.cancel()
                await acks.idle.wait()
                released = await _release(remote, target, consumer)
                session.send({"id": unsubscribe_id, "ok": True, "done": True, "released": released})
                session.finish()
        finally:
            if released is None:  # the client left: give back what it holds once its acks are through
                acks.close()
                remote.spawn(_release_later, remote, target, consumer, acks)
    return not session.gone


def _facts(lease: dict[str, Any]) -> dict[str, Any]:
    """What the owner's reply to an ack of ``lease`` says (``settled_reply``), known from the lease."""
    return {
        "correlation_id": lease["correlation_id"],
        "queue": lease["queue"],
        "offset": lease["offset"],
        "attempt": lease["attempt"],
    }


async def _release(remote: RemoteGroups, target: RemoteGroup, consumer: str) -> int:
    """Give back what the subscription still holds (0 if the owner cannot be told: they expire there)."""
    try:
        answer = await remote.call(target, "release", {"consumer": consumer})
    except LatticedError as exc:
        log_event(
            log, "group.remote_release_failed", level=logging.INFO, group=target.address, error=str(exc)
        )
        return 0
    count = answer.get("released")
    return count if type(count) is int else 0


async def _release_later(remote: RemoteGroups, target: RemoteGroup, consumer: str, acks: _Acks) -> None:
    await acks.idle.wait()
    await _release(remote, target, consumer)


__all__ = ["LONG_POLL_S", "subscribe_remote"]
