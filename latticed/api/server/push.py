"""The outgoing side of a streaming connection (``subscribe``): frames queued by any task, written
together by one sender task, so a burst of replies costs one write."""

from __future__ import annotations

from typing import Any

import trio

from latticed.api.messages import error_reply
from latticed.api.server.connection import Connection
from latticed.api.server.context import Context, OpTable, Reply, Request
from latticed.api.server.request_router import dispatch, parse_request
from latticed.errors import LatticedError
from latticed.groups.committer import Flight

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)


class PushSession:
    """The connection's outgoing side: frames queued by any task, written together by one sender task.

    ``pending`` counts replies still owed (requests being answered, acks awaiting their commit); once the
    subscription ends, the sender drains them and stops."""

    def __init__(self, conn: Connection, scope: trio.CancelScope) -> None:
        self.conn = conn
        self.scope = scope
        self.frames: list[bytes] = []
        self.wake = trio.Event()
        self.pending = 0
        self.closing = False
        self.gone = False
        self.flights: dict[Flight, list[tuple[Any, Reply]]] = {}

    async def next_request(self, ops: OpTable) -> Request | None:
        """The next well-formed request on the connection (one that does not parse is answered with its
        error here); None once the client is gone (``gone`` is then set)."""
        while True:
            try:
                frame = await self.conn.receive_frame()
            except (LatticedError, *_CLOSED):
                frame = None
            if frame is None:
                self.gone = True
                return None
            request, reply = parse_request(frame, ops)
            if reply is None:
                assert request is not None
                return request
            self.send(reply)

    def send(self, message: dict[str, Any]) -> None:
        self.frames.append(self.conn.encode(message))
        self.wake.set()

    async def sender(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            if self.frames:
                data, self.frames = b"".join(self.frames), []
                try:
                    await self.conn.stream.send_all(data)
                except _CLOSED:
                    self.gone = True
                    self.scope.cancel()
                    return
            if self.closing and not self.pending and not self.frames:
                return

    def finish(self) -> None:
        self.closing = True
        self.wake.set()

    def reply_after(self, flight: Flight, rid: Any, reply: Reply, nursery: trio.Nursery) -> None:
        """Queue ``reply`` once ``flight`` is durable (one waiting task per commit, not per ack)."""
        waiting = self.flights.get(flight)
        if waiting is None:
            waiting = self.flights[flight] = []
            nursery.start_soon(self._when_durable, flight)
        waiting.append((rid, reply))
        self.pending += 1

    async def _when_durable(self, flight: Flight) -> None:
        await flight.done.wait()
        for rid, reply in self.flights.pop(flight):
            if flight.error is not None:
                self.send(error_reply(rid, flight.error))
            else:
                self.send({**reply, "id": rid, "ok": True})
            self.pending -= 1
        self.wake.set()

    async def answer(self, ctx: Context, request: Request) -> None:
        self.send(await dispatch(ctx, request))
        self.pending -= 1


__all__ = ["PushSession"]
