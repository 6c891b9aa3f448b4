"""Pipelined offers to one queue, the way a Kafka producer sends: many requests in flight on one connection.

A blocking ``Client.offer`` waits a whole round trip, durable commit included, before it may send the
next record, so one client gets one record per commit. A :class:`Producer` keeps up to ``window`` offers
in flight: the daemon starts each as it arrives and answers them in order as their group commits land,
so one client's records share commits and the socket never sits idle. Each offer returns an :class:`Ack`
that resolves when the daemon acknowledged it (the record is durable then, as with ``Client.offer``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Self

from latticed.api.client import Client, _header_list, error_from_reply
from latticed.api.protocol import API_VERSION
from latticed.errors import ConnectionClosedError, LatticedError, MalformedError, RemoteProtocolError

#: Offers in flight by default: enough to fill a group commit, few enough to bound the wait for an ack.
DEFAULT_WINDOW: Final = 16


class Ack:
    """The daemon's answer to one offer: ``first`` offset and ``count`` of records, or ``error``."""

    __slots__ = ("_producer", "acked_at", "count", "error", "first")

    def __init__(self, producer: Producer, count: int) -> None:
        self._producer = producer
        self.count = count
        self.first: int | None = None
        self.error: LatticedError | None = None
        #: ``time.perf_counter()`` when the acknowledgment was read (None while in flight).
        self.acked_at: float | None = None

    @property
    def done(self) -> bool:
        return self.acked_at is not None

    def result(self) -> int:
        """The first offset assigned (waits for the acknowledgment; raises the daemon's error)."""
        while self.acked_at is None:
            self._producer._receive_one()
        if self.error is not None:
            raise self.error
        assert self.first is not None
        return self.first

    def offsets(self) -> range:
        return range(self.result(), self.result() + self.count)


class Producer:
    """Offers to ``queue`` with up to ``window`` unacknowledged at once, over a connection of its own.

    Offers are committed, and acknowledged, in the order they were made. One that fails (a bad record,
    a full disk) fails alone: offers already sent after it may still commit, as with a Kafka producer
    that has several requests in flight; use ``window=1`` where a failure must stop everything after it.
    Not thread-safe. Leaving the ``with`` block normally waits for every acknowledgment (and raises the
    first error among them)."""

    def __init__(self, client: Client, queue: str, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise MalformedError("a producer's window is at least 1")
        self.queue = queue
        self.window = window
        self._conn = client.open_stream(client.timeout)
        self._pending: deque[tuple[int, Ack]] = deque()
        self._next_id = 1

    def offer(
        self,
        value: bytes,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Sequence[tuple[str, bytes]] | None = None,
    ) -> Ack:
        """Send one record; waits only while ``window`` offers are unacknowledged."""
        return self._send({"op": "offer", "value": value, "key": key, "headers": _header_list(headers)}, 1)

    def offer_batch(self, records: Sequence[tuple[bytes, bytes | None, Sequence[tuple[str, bytes]]]]) -> Ack:
        """Send many records as one request (one commit, one ack)."""
        if not records:
            raise MalformedError("an offer batch holds at least one record")
        return self._send({"op": "offer_batch", "records": records}, len(records))

    def _send(self, request: dict[str, Any], count: int) -> Ack:
        while len(self._pending) >= self.window:
            self._receive_one()
        rid = self._next_id
        self._next_id += 1
        self._conn.send({"v": API_VERSION, "id": rid, "queue": self.queue, **request})
        ack = Ack(self, count)
        self._pending.append((rid, ack))
        return ack

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Wait for every acknowledgment; raises the first error among the offers still in flight."""
        failed: LatticedError | None = None
        while self._pending:
            ack = self._receive_one()
            if failed is None and ack.error is not None:
                failed = ack.error
        if failed is not None:
            raise failed

    def _receive_one(self) -> Ack:
        if not self._pending:
            raise LatticedError("no offer is waiting for an acknowledgment")
        try:
            reply = self._conn.receive()
        except LatticedError as exc:
            self._fail_all(exc)
            raise
        rid, ack = self._pending.popleft()
        if reply.get("id") != rid:
            problem = RemoteProtocolError(f"reply for request {reply.get('id')!r} while waiting for {rid}")
            self._resolve(ack, None, problem)
            self._fail_all(problem)
            self._conn.close()
            raise problem
        if reply.get("ok"):
            first: Any = reply["offset"] if "offset" in reply else reply.get("first")
            self._resolve(ack, int(first), None)
        else:
            self._resolve(ack, None, error_from_reply(reply.get("error")))
        return ack

    @staticmethod
    def _resolve(ack: Ack, first: int | None, error: LatticedError | None) -> None:
        ack.first, ack.error, ack.acked_at = first, error, time.perf_counter()

    def _fail_all(self, error: LatticedError) -> None:
        lost = ConnectionClosedError(f"no acknowledgment: {error}")
        while self._pending:
            _, ack = self._pending.popleft()
            self._resolve(ack, None, lost)

    def close(self) -> None:
        """Close the connection; offers still unacknowledged may or may not have been committed."""
        self._fail_all(ConnectionClosedError("the producer was closed"))
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()


__all__ = ["DEFAULT_WINDOW", "Ack", "Producer"]
