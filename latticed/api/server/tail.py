"""``tail``: the server pushes a queue's records to one connection as they are committed.

No polling: between batches the task waits on the store's per-queue wakeup (storage/live.py), which each
commit sets (and, on a replica, a verified delta on its way to the store: storage/ahead.py).
Flow control is the socket: each push is one bounded batch (``max_records`` / ``max_bytes``) sent with
``send_all``, so a slow reader stalls only its own task, and the server holds at most one encoded batch
for it (the records read are dropped before the send waits). What stalled readers hold together is
bounded too: a batch may take at most a quarter of what is left of :data:`TAIL_BUFFER_BUDGET` (and at
least :data:`MIN_TAIL_BATCH_BYTES`), so the more readers are stalled, the smaller the next batches, and 150
stalled readers hold a few tens of MiB, not 150 full batches.
The client ends a tail by closing the connection or sending any frame (which the connection then handles
as an ordinary request).

The start is ``from`` (an offset; nil: the first record) or ``last`` (the last N records present when the
request arrives; 0: only records appended from then on).

Frames pushed: ``{"id", "ok": true, <columns>, "next_offset"}`` per batch; with ``follow=false`` a final
``{"id", "ok": true, "done": true, "next_offset"}`` once the end present at the request is reached.

A queue on fork core 2 that is frozen (its owner forked it) while the tail has read up to its fork point
or past it: a client that sent ``events: true`` gets one ``{"id", "ok": true, "event": "forked",
"fork_point", "epoch", "frozen_since_ms", "next_offset"}`` frame and the tail waits at the fork point;
once the owner's recovery arrives, one ``{"event": "recovered", "epoch", "next_offset"}`` frame, then
the new epoch's records from the fork point. A client that did not send ``events`` (older ones) gets
an error instead (ForkedQueueError), which ends its tail with one clear line; so does one that read past
the fork point when a recovery arrives that it was not told of as a fork (a replica that learns of the
recovery first). A followed queue's new epoch always goes on from the fork point (its version 1 ends
there), announced by a ``recovered`` frame.
"""

from __future__ import annotations

from typing import Any

import trio

from latticed.api.messages import TAIL_BATCH_BYTES, TAIL_BATCH_RECORDS, arg_bool, arg_int
from latticed.api.server.api_ports import TailStore
from latticed.api.server.connection import Connection
from latticed.api.server.context import Context, StreamHandler
from latticed.api.server.handlers import columns_reply
from latticed.crdt.queue2 import QueueState2
from latticed.errors import ForkedQueueError, LatticedError, OtherCoreError, StorageError
from latticed.storage.core2_view import frozen_since_ms

MAX_TAIL_BATCH_RECORDS = 10_000
#: Bytes of encoded batches all tails of a daemon may hold while their readers are slow.
TAIL_BUFFER_BUDGET = 64 << 20
#: A batch is never made smaller than this (a record larger than a batch still goes out alone).
MIN_TAIL_BATCH_BYTES = 64 << 10


class _Buffered:
    """Bytes of encoded batches waiting for their readers, in this process (trio code only: no lock)."""

    held = 0

    @classmethod
    def grant(cls, wanted: int) -> int:
        """How large the next batch may be: a quarter of what the budget has left, within bounds."""
        left = max(0, TAIL_BUFFER_BUDGET - cls.held)
        return max(min(wanted, left // 4), min(wanted, MIN_TAIL_BATCH_BYTES))


def tail_buffered_bytes() -> int:
    """Bytes of encoded batches the tails hold now (waiting for slow readers)."""
    return _Buffered.held


class _Watch:
    """Set by the task watching the client; the tail checks it between batches."""

    def __init__(self) -> None:
        self.stop = False
        self.client_gone = False
        self.waiting: trio.CancelScope | None = None

    def fire(self, *, gone: bool) -> None:
        self.stop = True
        self.client_gone = gone
        if self.waiting is not None:
            self.waiting.cancel()


async def serve_tail(ctx: Context, conn: Connection, request: dict[str, Any]) -> bool:
    """Stream records until done (``follow=false``) or the client speaks or leaves.

    Returns False when the client went away (the connection should close)."""
    rid = request.get("id")
    q = ctx.queue(request)
    follow = arg_bool(request, "follow", True)
    start = arg_int(request, "from", optional=True)
    max_records = min(
        max(arg_int(request, "max_records", default=TAIL_BATCH_RECORDS), 1), MAX_TAIL_BATCH_RECORDS
    )
    max_bytes = min(max(arg_int(request, "max_bytes", default=TAIL_BATCH_BYTES), 1), ctx.max_reply_bytes)
    last = arg_int(request, "last", optional=True)
    if ctx.engine.core2.holds(q):
        return await _serve_tail2(ctx, conn, request, q, _Bounds(start, last, max_records, max_bytes))
    engine: TailStore = ctx.engine
    state = engine.state(q)
    if last is not None:  # the last N records present now (0: only those appended from now on)
        pos = max(state.held_end - max(last, 0), state.start)
    else:
        pos = state.start if start is None else max(start, 0)
    stop_at = None if follow else state.held_end
    address = engine.address(q)
    watch = _Watch()

    async def watcher() -> None:
        speaking = await conn.watch()
        watch.fire(gone=not speaking)

    failure: LatticedError | None = None
    converted = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher)
        while not watch.stop:
            try:  # its owner may move the queue to core 2 meanwhile: same offsets, followed there
                if ctx.engine.core2.holds(q):
                    raise OtherCoreError(address)
                state = engine.state(q)
                pos = max(pos, state.start)
                # Following, a replica streams verified records while they are still being committed here
                # (storage/ahead.py); a bounded tail ends at what was committed when it began.
                end = engine.visible_end(q) if stop_at is None else min(stop_at, state.held_end)
                if pos < end:
                    batch_bytes = _Buffered.grant(max_bytes)
                    columns = await engine.read_visible(q, pos, end, max_records, batch_bytes)
                    try:
                        columns = ctx.sealer.open_columns(q, columns, partial=True)
                    except LatticedError as exc:  # raised past the nursery, so it is one error, not a group
                        failure = exc
                        break
                    if columns.offsets:
                        pos = columns.offsets[-1] + 1
                        frame = conn.encode(
                            {
                                "id": rid,
                                "ok": True,
                                "queue": address,
                                **columns_reply(columns),
                                "next_offset": pos,
                            }
                        )
                        del columns  # only the encoded batch waits for a slow reader
                        _Buffered.held += len(frame)
                        try:
                            await conn.send_encoded(frame)
                        finally:
                            _Buffered.held -= len(frame)
                        del frame
                    elif engine.state(q).start <= pos < engine.state(q).held_end:
                        raise StorageError(f"queue {engine.address(q)} is missing records from offset {pos}")
                    continue
                if stop_at is not None:
                    await conn.send({"id": rid, "ok": True, "done": True, "next_offset": pos})
                    break
                with trio.CancelScope() as scope:
                    watch.waiting = scope
                    await engine.wait_past(q, pos, ahead=True)
                watch.waiting = None
            except OtherCoreError:
                converted = True
                break

        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if converted and not watch.stop:
        return await _serve_tail2(ctx, conn, request, q, _Bounds(pos, None, max_records, max_bytes))
    return not watch.client_gone


def _recovered_at(value: QueueState2) -> int:
    """Where an epoch after the first goes on from: the end of its version 1, which the owner's recovery
    signs at the fork point of the epoch before."""
    chains = value.chains
    if chains.shared:
        return chains.shared[0][1]
    return min((tip.leaves()[0][1] for tip in chains.tips), default=value.held[0])


class _Bounds:
    """A tail request's start and batch bounds, as parsed."""

    def __init__(self, start: int | None, last: int | None, max_records: int, max_bytes: int) -> None:
        self.start, self.last, self.max_records, self.max_bytes = start, last, max_records, max_bytes

    def first_offset(self, lo: int, hi: int) -> int:
        """Where the tail begins in a queue holding ``[lo, hi)``."""
        if self.last is not None:  # the last N records present now (0: only those appended from now on)
            return max(hi - max(self.last, 0), lo)
        return lo if self.start is None else max(self.start, 0)


async def _send_batch(conn: Connection, frame_fields: dict[str, Any]) -> None:
    frame = conn.encode(frame_fields)
    _Buffered.held += len(frame)
    try:
        await conn.send_encoded(frame)
    finally:
        _Buffered.held -= len(frame)


async def _serve_tail2(ctx: Context, conn: Connection, request: dict[str, Any], q: int, b: _Bounds) -> bool:
    """:func:`serve_tail` for a queue on fork core 2: records read from the store, and the fork and
    recovery events of the module docstring."""
    rid = request.get("id")
    follow = arg_bool(request, "follow", True)
    events = arg_bool(request, "events", False)
    core2 = ctx.engine.core2
    value = await core2.value(q)
    lo, hi = value.held
    pos = b.first_offset(lo, hi)
    stop_at = None if follow else hi
    address = core2.address(q)
    epoch = value.chains.epoch
    told: int | None = None  # the fork point the reader was told of (in ``epoch``)
    failure: LatticedError | None = None
    watch = _Watch()

    async def watcher() -> None:
        speaking = await conn.watch()
        watch.fire(gone=not speaking)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher)
        while not watch.stop:
            changed = core2.changed(q)
            value = await core2.value(q)
            lo, hi = value.held
            if value.chains.epoch != epoch:  # the owner recovered: its new epoch goes on from the fork
                epoch, told, resumed = value.chains.epoch, None, _recovered_at(value)
                if pos > resumed and not events:  # it read records the new epoch supersedes
                    failure = ForkedQueueError(
                        f"queue {address} was forked at offset {resumed} and recovered by its owner: the "
                        f"records read from offset {resumed} on are superseded; read again from there"
                    )
                    break
                pos = min(pos, resumed)
                if events:
                    await conn.send(
                        {
                            "id": rid,
                            "ok": True,
                            "event": "recovered",
                            "queue": address,
                            "epoch": epoch,
                            "next_offset": pos,
                        }
                    )
            point = value.chains.fork_point
            if point is not None and told is None and stop_at is None and pos >= point:
                if not events:  # raised past the nursery, so it is one error, not a group
                    failure = ForkedQueueError(
                        f"queue {address} forked at offset {point}: frozen; waiting for its owner's recovery "
                        "(this client cannot follow it there: use a newer latticectl)"
                    )
                    break
                pos = told = point
                await conn.send(
                    {
                        "id": rid,
                        "ok": True,
                        "event": "forked",
                        "queue": address,
                        "fork_point": point,
                        "epoch": epoch,
                        "frozen_since_ms": frozen_since_ms(value),
                        "next_offset": pos,
                    }
                )
                continue
            pos = max(pos, lo)
            end = hi if stop_at is None else min(stop_at, hi)
            if pos < end:
                columns = await core2.read(q, pos, end, b.max_records, _Buffered.grant(b.max_bytes))
                if not columns.offsets:
                    raise StorageError(f"queue {address} is missing records from offset {pos}")
                pos = columns.offsets[-1] + 1
                await _send_batch(
                    conn,
                    {"id": rid, "ok": True, "queue": address, **columns_reply(columns), "next_offset": pos},
                )
                continue
            if stop_at is not None:
                await conn.send({"id": rid, "ok": True, "done": True, "next_offset": pos})
                break
            with trio.CancelScope() as scope:
                watch.waiting = scope
                await changed.wait()
            watch.waiting = None
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return not watch.client_gone


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
STREAMS: dict[str, StreamHandler] = {
    "tail": serve_tail,
}


__all__ = ["MIN_TAIL_BATCH_BYTES", "TAIL_BUFFER_BUDGET", "serve_tail", "tail_buffered_bytes"]
