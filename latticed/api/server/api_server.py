"""The local API server: accepts Unix-socket connections and answers requests, one task per connection.

Bad input costs only its own connection: a frame that is not a request gets an error reply, an oversized
frame or a cut stream closes that connection, and any unexpected exception is logged and closes that
connection too. Nothing a client sends can raise out of a connection task into the daemon's nursery.

Memory: one request is at most ``max_frame_bytes`` on the wire (a longer one is refused as soon as its
length is read, before its body is buffered); one connection holds at most one frame being received plus
:data:`MAX_IN_FLIGHT` pipelined requests of at most :data:`MAX_IN_FLIGHT_BYTES` together. A request's
decoded form is larger than its frame (Python objects: up to tens of times for a frame of nothing but
tiny containers), which is why the frame limit is the knob. Freed buffers stay in the C heap for reuse
(latticed/process/malloc.py); :class:`MemoryGiveBack` hands back what a burst left idle: after large
requests, and once the API goes quiet after many requests of any size (errors included).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import trio

from latticed.api.messages import error_reply
from latticed.api.server.connection import Connection
from latticed.api.server.consumer_id import CONSUMER, new_consumer_id
from latticed.api.server.context import Context, PipelinedHandler
from latticed.api.server.give_back import BURST_BYTES, MemoryGiveBack
from latticed.api.server.listener import bind_unix_socket, remove_socket
from latticed.api.server.request_router import begin_pipelined, dispatch, parse_request, waited_for_start_gate
from latticed.errors import (
    BehindPeersError,
    ConnectionClosedError,
    LatticedError,
    RemoteProtocolError,
)
from latticed.net.accept import serve_listeners
from latticed.process.logs import get_logger, log_event
from latticed.storage.jobs import Job, Submitter

log = get_logger(__name__)

#: Pipelined requests one connection may have waiting for their commit (see :class:`_Pipeline`)...
MAX_IN_FLIGHT: Final = 64
#: ... and their frames' bytes together: a client pipelining large batches has the next one read only
#: once earlier ones are answered (its socket pushes back meanwhile).
MAX_IN_FLIGHT_BYTES: Final = 32 << 20
_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionClosedError)


async def serve_api(
    ctx: Context,
    *,
    give_back: MemoryGiveBack | None = None,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``ctx.socket_path`` until cancelled; reports started once the socket accepts."""
    give_back = MemoryGiveBack() if give_back is None else give_back
    sock, inode = await bind_unix_socket(ctx.socket_path)
    listener = trio.SocketListener(sock)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(give_back.run)
            await nursery.start(
                functools.partial(
                    serve_listeners,
                    functools.partial(handle_connection, ctx, give_back=give_back),
                    [listener],
                    name="api",
                )
            )
            log_event(log, "api.listening", socket=str(ctx.socket_path))
            task_status.started(ctx.socket_path)
    finally:
        remove_socket(ctx.socket_path, inode)
        with trio.CancelScope(shield=True):
            await listener.aclose()


async def handle_connection(
    ctx: Context, stream: trio.abc.Stream, *, give_back: MemoryGiveBack | None = None
) -> None:
    """Serve one client until it leaves or breaks the protocol; never raises (except Cancelled)."""
    conn = Connection(stream, ctx.max_frame_bytes, on_frame=give_back.received if give_back else None)
    consumer = new_consumer_id(stream)
    CONSUMER.set(consumer)  # this connection's task (and its children) only
    try:
        await _serve(ctx, conn)
    except _CLOSED as exc:
        log_event(log, "api.client_disconnected", error=str(exc))
    except RemoteProtocolError as exc:
        # Oversized frame or garbage length: say why (best effort), then hang up on this client only.
        log_event(log, "api.protocol_error", error=str(exc))
        refusal = RemoteProtocolError(f"{exc} (the daemon's max_frame_bytes); closing the connection")
        with trio.move_on_after(1):
            try:
                await conn.send(error_reply(None, refusal))
            except (*_CLOSED, OSError):
                pass
    except Exception as exc:
        if _only_disconnects(exc):
            # A client that left while a stream task of its connection was sending (tail --follow):
            # the broken pipe arrives wrapped in that task's nursery's exception group.
            log_event(log, "api.client_disconnected", error=str(_first_leaf(exc)))
        else:
            log_event(log, "api.connection_failed", level=40, exc_info=exc)
    finally:
        if ctx.groups is not None:
            ctx.groups.connection_closed(consumer)
        if give_back is not None and conn.held_large_frame:
            give_back.note()  # a large frame cut off with the connection: its buffer is freed now
        await trio.aclose_forcefully(stream)


def _only_disconnects(exc: BaseException) -> bool:
    """Whether ``exc`` is an exception group of nothing but the client going away."""
    if not isinstance(exc, BaseExceptionGroup):
        return False
    return all(isinstance(leaf, _CLOSED) or _only_disconnects(leaf) for leaf in exc.exceptions)


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def _serve(ctx: Context, conn: Connection) -> None:
    pipeline = _Pipeline(ctx, conn)
    await pipeline.serve(functools.partial(_serve_one, ctx, conn, pipeline))


async def _serve_one(ctx: Context, conn: Connection, pipeline: _Pipeline, frame: bytes) -> bool:
    """Handle one request; False when the connection is done (a stream ended it)."""
    request, reply = parse_request(frame, ctx.ops)
    if reply is None:
        assert request is not None
        begin = ctx.ops.pipelined.get(request["op"])
        if begin is not None:
            await pipeline.start(request.get("id"), begin, request, len(frame))
            return True
        # Anything else runs alone, after every earlier request of this connection has been answered:
        # it sees their effects, and its own effects come before those of later requests.
        await pipeline.drain()
        streaming = ctx.ops.streams.get(request["op"])
        if streaming is not None:
            try:
                return await streaming(ctx, conn, request)
            except LatticedError as exc:
                reply = error_reply(request.get("id"), exc)
        else:
            reply = await dispatch(ctx, request)
    else:
        await pipeline.drain()
    await conn.send(reply)
    return True


#: A pipelined request: its id, its started job (or why it could not start), its reply builder, and the
#: size of its frame.
_Pending = tuple[Any, Job | LatticedError, Any, int]


class _Pipeline:
    """A connection's pipelined writes: started as they are read, answered in request order as they commit.

    A client that sends its next offer before the reply to the last one gets its offers into shared group
    commits (up to :data:`MAX_IN_FLIGHT` at a time; then the connection stops reading and the client's
    socket buffer pushes back) instead of one commit per round trip. One task reads: while offers
    are in flight it waits for the next request, and the commit's callback on the event loop writes the
    replies it finished (one pass over a group commit answers all its clients; the task wakes once an
    offer, for the next request). Only what the socket does not take at once cancels the wait (safe:
    :meth:`Connection.receive_frame` loses nothing when cancelled) for the task to send."""

    def __init__(self, ctx: Context, conn: Connection) -> None:
        self._ctx = ctx
        self._conn = conn
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pending_bytes = 0
        self._waiting: trio.CancelScope | None = None
        #: Replies encoded by :meth:`_committed` that the socket did not take at once: the task sends them
        #: before anything else.
        self._unsent = b""
        #: Replies encoded by :meth:`_prepare` while their jobs' batch was committing: id(job) -> (the
        #: result they were built from, the framed reply). Sent only once the job is done, and only if
        #: it ended with that very result and no error.
        self._prepared: dict[int, tuple[Any, bytes]] = {}
        #: What our jobs carry from their start (not assigned after it: the storage thread may already
        #: be reading them).
        self._submitter = Submitter(self._committed, self._prepare, self)

    def _prepare(self) -> None:
        """Called on the event loop while a batch holding our jobs commits (its fsync under way, the loop
        otherwise idle): encode their replies now, so that the commit's callback only writes them. Sends
        nothing: the commit may yet fail (the job's error is answered then) or be retried (a new result)."""
        prepared, encode = self._prepared, self._conn.encode
        for rid, job, build, _ in self._pending:
            if isinstance(job, LatticedError) or job.done.is_set() or job.error is not None:
                continue
            result = job.result  # read once: a retried batch on the storage thread may set another
            if result is None or ((entry := prepared.get(id(job))) is not None and entry[0] is result):
                continue
            try:
                prepared[id(job)] = (result, encode(_ok_reply(rid, result, build)))
            except Exception:
                prepared.pop(id(job), None)  # built again once it is done, and failing as it would have

    def _committed(self) -> None:
        """Called on the event loop when one of our jobs finished. While the task waits for the next
        request, the finished replies are written here, so one pass over a group commit answers all its
        clients and each task wakes only for its next request; what cannot be written (or built) wakes it."""
        waiting = self._waiting
        if waiting is None:
            return  # the task waits for the commit itself (or runs): it answers
        if not self._unsent:
            try:
                data = self._take_finished_data()
            except Exception:
                waiting.cancel()  # the task builds them again and fails as it would have
                return
            self._unsent = self._conn.write_now(data) if data else b""
            if not self._unsent:
                return
        waiting.cancel()

    @property
    def in_flight(self) -> tuple[int, int]:
        """Pipelined requests not answered yet, and their frames' bytes."""
        return len(self._pending), self._pending_bytes

    async def start(self, rid: Any, begin: PipelinedHandler, request: dict[str, Any], size: int) -> None:
        """Start one pipelined request (``size``: its frame's length); waits for earlier ones while the
        connection has :data:`MAX_IN_FLIGHT` requests or :data:`MAX_IN_FLIGHT_BYTES` in flight."""
        begun = begin_pipelined(self._ctx, begin, request, self._submitter)
        # Refused by the catch-up after a start? Then begun once more once it is over, as :func:`dispatch`
        # does; later requests of this connection wait meanwhile, so their order holds.
        if isinstance(begun, BehindPeersError) and await waited_for_start_gate(self._ctx):
            begun = begin_pipelined(self._ctx, begin, request, self._submitter)
        if isinstance(begun, LatticedError):
            self._pending.append((rid, begun, None, size))
        else:
            job, build = begun
            # Set at its start if it went through the bridge; a job completed elsewhere (an offer
            # forwarded to another daemon) gets them here: no checkpoint since, it cannot have finished.
            job.notify, job.prepare, job.origin = self._committed, self._prepare, self
            self._pending.append((rid, job, build, size))
        self._pending_bytes += size
        while self._pending and (
            len(self._pending) >= MAX_IN_FLIGHT or self._pending_bytes >= MAX_IN_FLIGHT_BYTES
        ):
            await self._answer_head()

    async def serve(self, handle: Callable[[bytes], Awaitable[bool]]) -> None:
        """Hand each request to ``handle`` (False: the connection is done) until the client ends the
        stream, answering finished ones meanwhile; then answer the rest.

        One cancel scope spans many requests (entering one costs more than the wait's own bookkeeping):
        ``_committed`` cancels it only while the task waits in :meth:`_next_frame`, and the task leaves it
        after any cancel, for a new one. A cancel that lands after the wait was already over (the task
        woken by the read, not yet run) finds the frame read: it is carried into the next scope and handled
        there, never inside a cancelled one, never lost (``receive_frame`` only waits before a read)."""
        frame: bytes | None = None
        late = False  # ``frame`` was read as a cancel landed: handled in the next scope
        while True:
            with trio.CancelScope() as scope:
                while True:
                    if late:
                        late = False
                    else:
                        frame = await self._next_frame(scope)
                        if scope.cancel_called:
                            late = True
                            break
                    if frame is None:
                        await self.drain()
                        return
                    if not await handle(frame):
                        return
                    # Not kept while waiting for the next request: an idle client must not hold its last
                    # large frame (or, through the handler's locals, its decoded request).
                    frame = None

    async def _next_frame(self, scope: trio.CancelScope) -> bytes | None:
        """The next request, answering finished ones meanwhile; ``scope`` (not cancelled) is the one
        ``_committed`` may cancel while the task waits here."""
        conn = self._conn
        if self._unsent or self._head_finished():
            await self._answer_finished()
        if not self._pending or conn.frame_ready():
            return await conn.receive_frame()
        # Wait for the next request; a commit answers what it finished meanwhile (``_committed``)
        # and cancels the wait only if something is left for the task to send. No frame is buffered
        # (``frame_ready`` just looked, and nothing ran since): straight to the read.
        self._waiting = scope
        try:
            return await conn.receive_frame(nothing_buffered=True)
        finally:
            self._waiting = None

    def _head_finished(self) -> bool:
        """Whether the oldest pipelined request has a reply to send (its job finished or never began)."""
        if not self._pending:
            return False
        job = self._pending[0][1]
        return isinstance(job, LatticedError) or job.done.is_set()

    async def drain(self) -> None:
        """Answer every pipelined request so far."""
        while self._pending:
            await self._answer_head()
        if self._unsent:
            await self._answer_finished()

    async def _answer_head(self) -> None:
        job = self._pending[0][1]
        if not isinstance(job, LatticedError):
            await job.done.wait()
        await self._answer_finished()

    async def _answer_finished(self) -> None:
        """Send what ``_committed`` could not, then the replies of the finished requests at the head,
        in one write (one group commit usually finishes several)."""
        if self._unsent:
            data, self._unsent = self._unsent, b""
            await self._conn.send_encoded(data)
        data = self._take_finished_data()
        if data:
            await self._conn.send_encoded(data)

    def _take_finished_data(self) -> bytes:
        """The framed replies of the finished requests at the head, in order, and those requests dropped
        (in one pass): replies :meth:`_prepare` encoded from the result the job ended with, the others
        encoded now. If building one raises, no request is dropped (the caller builds them again)."""
        pending = self._pending
        parts: list[bytes] = []
        taken: list[_Pending] = []
        prepared, encode = self._prepared, self._conn.encode
        try:
            while pending:
                head = pending[0]
                rid, job, build, size = head
                if isinstance(job, LatticedError):
                    parts.append(encode(error_reply(rid, job)))
                elif not job.done.is_set():
                    break
                else:
                    entry = prepared.get(id(job)) if prepared else None
                    if entry is not None and job.error is None and entry[0] is job.result:
                        parts.append(entry[1])
                    else:
                        parts.append(encode(_reply(rid, job, build)))
                    if entry is not None:
                        del prepared[id(job)]
                pending.popleft()
                taken.append(head)
                self._pending_bytes -= size
        except BaseException:
            pending.extendleft(reversed(taken))
            self._pending_bytes += sum(t[3] for t in taken)
            raise
        return parts[0] if len(parts) == 1 else b"".join(parts)


def _reply(rid: Any, job: Job | LatticedError, build: Any) -> dict[str, Any]:
    """The reply to a pipelined request whose job has finished (or that failed before it started)."""
    if isinstance(job, LatticedError):
        return error_reply(rid, job)
    if job.error is not None:
        return error_reply(rid, job.error)
    return _ok_reply(rid, job.result, build)


def _ok_reply(rid: Any, result: Any, build: Any) -> dict[str, Any]:
    reply: dict[str, Any] = build(result)
    reply["id"] = rid
    reply["ok"] = True
    return reply


__all__ = [
    "BURST_BYTES",
    "MAX_IN_FLIGHT",
    "MAX_IN_FLIGHT_BYTES",
    "MemoryGiveBack",
    "dispatch",
    "handle_connection",
    "parse_request",
    "serve_api",
]
