"""Pipelined offers to one queue, the way a Kafka producer sends: many requests in flight on one connection,
and what queues up behind them goes out as one batch.

A blocking ``Client.offer`` waits a whole round trip, durable commit included, before it may send the
next record, so one client gets one record per commit. A :class:`Producer` keeps up to ``window``
requests in flight: the daemon starts each as it arrives and answers them in order as their group
commits land, so one client's records share commits and the socket never sits idle. Records offered
while the window is full wait in the producer and leave together, as one ``offer_batch``, as soon as a
request is answered (up to ``batch_records`` records or ``batch_bytes`` bytes): the daemon then pays
for one request where it would have paid for many, which is what lets single-record offers approach
the bulk path's rate. Each offer returns an :class:`Ack` that resolves when the daemon acknowledged its
record (durable then, as with ``Client.offer``).
"""

from __future__ import annotations

import select
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Self

from latticed.api.client.blocking_client import Client, _header_list
from latticed.api.client.packed_offer import batch_fields
from latticed.api.messages import API_VERSION, error_from_reply
from latticed.errors import ConnectionClosedError, LatticedError, MalformedError, RemoteProtocolError

#: Requests in flight by default: enough to fill a group commit, few enough to bound the wait for an ack.
DEFAULT_WINDOW: Final = 16
#: Records that wait behind a full window and leave as one request, at most (Kafka's ``batch.size``).
DEFAULT_BATCH_RECORDS: Final = 512
DEFAULT_BATCH_BYTES: Final = 1 << 20

RawRecord = tuple[bytes, bytes | None, list[Any] | None]


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
            self._producer._await_one()
        if self.error is not None:
            raise self.error
        assert self.first is not None
        return self.first

    def offsets(self) -> range:
        return range(self.result(), self.result() + self.count)


class Producer:
    """Offers to ``queue`` with up to ``window`` requests unacknowledged at once, over a connection of its
    own; records offered meanwhile wait and leave as one request.

    Records are committed, and acknowledged, in the order they were offered. A request that fails (a bad
    record, a full disk) fails alone, with every record in it: records that waited together behind a full
    window form one request, so they commit or fail together, as in a Kafka producer batch. Requests
    already sent after a failed one may still commit. Use ``window=1, batch_records=1`` where a failure
    must stop everything after it. Not thread-safe. Leaving the ``with`` block normally waits for every
    acknowledgment (and raises the first error among them)."""

    def __init__(
        self,
        client: Client,
        queue: str,
        window: int = DEFAULT_WINDOW,
        *,
        batch_records: int = DEFAULT_BATCH_RECORDS,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        if window < 1 or batch_records < 1 or batch_bytes < 1:
            raise MalformedError("a producer's window and batch limits are at least 1")
        self.queue = queue
        self.window = window
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self._conn = client.open_stream(client.timeout)
        #: The local API versions of the daemon: batches go as columns to one that takes them.
        self._versions = client.api_versions()
        #: Requests sent and not answered yet: (request id, the acks it answers, one per record or batch).
        self._pending: deque[tuple[int, list[Ack]]] = deque()
        #: Records waiting for a free slot in the window, and their acks.
        self._waiting: list[RawRecord] = []
        self._waiting_acks: list[Ack] = []
        self._waiting_bytes = 0
        #: Why waiting records could not be sent (not encodable), for :meth:`flush` to raise.
        self._unsent_error: LatticedError | None = None
        self._next_id = 1
        #: Requests sent and records in them, since the producer was made (a Kafka-like ``metrics()``).
        self.requests_sent = 0
        self.records_sent = 0

    def offer(
        self,
        value: bytes,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Sequence[tuple[str, bytes]] | None = None,
    ) -> Ack:
        """Send one record, or queue it behind a full window; waits only while the records queued there
        reach ``batch_records`` or ``batch_bytes``."""
        ack = Ack(self, 1)
        record = (value, key, _header_list(headers))
        if not self._waiting and len(self._pending) < self.window:
            self._send(_single_offer(record), [ack], 1)
            return ack
        self._waiting.append(record)
        self._waiting_acks.append(ack)
        self._waiting_bytes += (len(value) if isinstance(value, bytes | bytearray) else 0) + len(key or b"")
        self._collect_ready()
        while self._waiting and (
            len(self._waiting) >= self.batch_records or self._waiting_bytes >= self.batch_bytes
        ):
            self._await_one()  # the window is full and so is the batch: wait for room
        return ack

    def offer_batch(self, records: Sequence[tuple[bytes, bytes | None, Sequence[tuple[str, bytes]]]]) -> Ack:
        """Send many records as one request (one commit, one ack), after the records already waiting."""
        if not records:
            raise MalformedError("an offer batch holds at least one record")
        while self._waiting or len(self._pending) >= self.window:
            self._await_one()
        ack = Ack(self, len(records))
        self._send({"op": "offer_batch", **batch_fields(records, self._versions)}, [ack], len(records))
        return ack

    def poll(self, timeout: float = 0.0) -> int:
        """Read the acknowledgments that arrive within ``timeout`` seconds (sending what waits as room
        frees up); returns how many requests were answered. A producer reads acknowledgments only inside
        its calls: a caller that pauses between offers and wants ``Ack.acked_at`` exact polls meanwhile."""
        answered = self._collect_ready()
        if self._pending and timeout > 0 and not answered:
            sock = self._conn.sock
            if sock is not None and select.select([sock], [], [], timeout)[0]:
                answered = self._collect_ready()
        return answered

    def _send(self, request: dict[str, Any], acks: list[Ack], records: int, *, queued: bool = False) -> None:
        """Send one request. One that cannot be encoded fails its records: raised to the caller who
        offered them, or, for records that had been waiting (``queued``), kept for their acks and
        :meth:`flush`. A broken connection fails every record not yet acknowledged, and is raised."""
        rid = self._next_id
        self._next_id += 1
        try:
            self._conn.send({"v": API_VERSION, "id": rid, "queue": self.queue, **request})
        except MalformedError as exc:
            self._resolve(acks, None, exc)
            if not queued:
                raise
            if self._unsent_error is None:
                self._unsent_error = exc
            return
        except LatticedError as exc:
            self._resolve(acks, None, exc)
            self._fail_all(exc)
            raise
        self._pending.append((rid, acks))
        self.requests_sent += 1
        self.records_sent += records

    def _send_waiting(self) -> None:
        """Send the waiting records as one request if the window has room."""
        if not self._waiting or len(self._pending) >= self.window:
            return
        records, acks = self._waiting, self._waiting_acks
        self._waiting, self._waiting_acks, self._waiting_bytes = [], [], 0
        request = (
            _single_offer(records[0]) if len(records) == 1 else {"op": "offer_batch", "records": records}
        )
        self._send(request, acks, len(records), queued=True)

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    @property
    def waiting(self) -> int:
        """Records queued behind a full window."""
        return len(self._waiting)

    def flush(self) -> None:
        """Send what waits and wait for every acknowledgment; raises the first error among the offers
        not yet acknowledged."""
        failed: LatticedError | None = None
        while self._pending or self._waiting:
            for ack in self._await_one():
                if failed is None and ack.error is not None:
                    failed = ack.error
        unsent, self._unsent_error = self._unsent_error, None
        problem = failed if failed is not None else unsent
        if problem is not None:
            raise problem

    def _collect_ready(self) -> int:
        """Answer the requests whose replies are already here, without waiting."""
        answered = 0
        while self._pending and self._conn.reply_ready():
            self._receive_one()
            answered += 1
        self._send_waiting()
        return answered

    def _await_one(self) -> list[Ack]:
        """Wait for the oldest request's answer (sending waiting records first if there is room)."""
        self._send_waiting()
        if not self._pending:
            return []  # what waited could not be sent (its acks say why): nothing to wait for
        acks = self._receive_one()
        self._send_waiting()
        return acks

    def _receive_one(self) -> list[Ack]:
        if not self._pending:
            raise LatticedError("no offer is waiting for an acknowledgment")
        try:
            reply = self._conn.receive()
        except LatticedError as exc:
            self._fail_all(exc)
            raise
        rid, acks = self._pending.popleft()
        if reply.get("id") != rid:
            problem = RemoteProtocolError(f"reply for request {reply.get('id')!r} while waiting for {rid}")
            self._resolve(acks, None, problem)
            self._fail_all(problem)
            self._conn.close()
            raise problem
        if reply.get("ok"):
            first: Any = reply["offset"] if "offset" in reply else reply.get("first")
            self._resolve(acks, int(first), None)
        else:
            self._resolve(acks, None, error_from_reply(reply.get("error")))
        return acks

    @staticmethod
    def _resolve(acks: list[Ack], first: int | None, error: LatticedError | None) -> None:
        now = time.perf_counter()
        for ack in acks:
            ack.first, ack.error, ack.acked_at = first, error, now
            if first is not None:
                first += ack.count

    def _fail_all(self, error: LatticedError) -> None:
        lost = ConnectionClosedError(f"no acknowledgment: {error}")
        while self._pending:
            _, acks = self._pending.popleft()
            self._resolve(acks, None, lost)
        acks, self._waiting, self._waiting_acks, self._waiting_bytes = self._waiting_acks, [], [], 0
        self._resolve(acks, None, lost)

    def close(self) -> None:
        """Close the connection; offers still unacknowledged may or may not have been committed (those
        still waiting in the producer were not sent)."""
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


def _single_offer(record: RawRecord) -> dict[str, Any]:
    value, key, headers = record
    return {"op": "offer", "value": value, "key": key, "headers": headers}


__all__ = ["DEFAULT_BATCH_BYTES", "DEFAULT_BATCH_RECORDS", "DEFAULT_WINDOW", "Ack", "Producer"]
