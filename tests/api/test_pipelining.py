"""Pipelined requests on one API connection, raw and through the :class:`Producer`: offers commit and are
answered in request order, a failing one fails alone and in its place, other requests wait for earlier
offers, and a client that leaves with offers in flight harms nothing."""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import sqlite3
import struct
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from support.inprocess import InProcessDaemon, daemon_at

from latticed.api.client.blocking_client import Client
from latticed.api.client.producer import Producer
from latticed.api.server import api_server as server_module
from latticed.api.server.api_server import MAX_IN_FLIGHT
from latticed.api.server.connection import Connection
from latticed.crdt.signing import Identity
from latticed.errors import (
    ConnectionClosedError,
    MalformedError,
    NotFoundError,
    OwnerUnreachableError,
    StorageError,
)
from latticed.protocol.framing import FrameDecoder
from latticed.storage.bridge import StorageHold
from latticed.storage.jobs import SUBMITTER, Job


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    with daemon_at(tmp_path_factory.mktemp("pipelining")) as d:
        yield d


class Pipe:
    """A raw connection: send many requests at once, then read the replies."""

    def __init__(self, daemon: InProcessDaemon) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(daemon.socket))
        self.decoder = FrameDecoder(1 << 24)
        self.next_id = 1

    def send(self, *requests: dict[str, Any]) -> list[int]:
        ids, data = [], b""
        for body in requests:
            ids.append(self.next_id)
            packed = msgpack.packb({"v": 1, "id": self.next_id, **body}, use_bin_type=True)
            data += struct.pack(">I", len(packed)) + packed
            self.next_id += 1
        self.sock.sendall(data)
        return ids

    def replies(self, count: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < count:
            frame = self.decoder.next_frame()
            if frame is None:
                chunk = self.sock.recv(1 << 16)
                assert chunk, f"connection closed after {len(out)} of {count} replies"
                self.decoder.receive_data(chunk)
                continue
            out.append(msgpack.unpackb(frame, raw=False))
        return out

    def close(self) -> None:
        self.sock.close()


def test_pipelined_offers_commit_and_reply_in_request_order(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("ordered")
    pipe = Pipe(daemon)
    count = 3 * MAX_IN_FLIGHT  # more than the server holds at once: it must push back, not drop or stall
    ids = pipe.send(*({"op": "offer", "queue": "ordered", "value": b"v%d" % i} for i in range(count)))
    replies = pipe.replies(count)
    pipe.close()
    assert [r["id"] for r in replies] == ids
    assert all(r["ok"] for r in replies)
    assert [r["offset"] for r in replies] == list(range(count))
    assert [e.value for e in client.range("ordered", 0, count)] == [b"v%d" % i for i in range(count)]


def test_a_failing_pipelined_offer_fails_alone_in_its_place(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("mixed")
    foreign = f"{Identity.generate().public_key.hex()}/theirs"
    pipe = Pipe(daemon)
    pipe.send(
        {"op": "offer", "queue": "mixed", "value": b"a"},
        {"op": "offer", "queue": "no-such-queue", "value": b"x"},
        {"op": "offer_batch", "queue": "mixed", "records": [[b"b", None, None], [b"c", b"k", None]]},
        {"op": "offer_batch", "queue": "mixed", "records": "not a list"},
        {"op": "offer", "queue": foreign, "value": b"y", "wait": 0.2},  # forwarded: no owner to reach
        {"op": "offer", "queue": "mixed", "value": b"d"},
    )
    replies = pipe.replies(6)
    pipe.close()
    assert [r["ok"] for r in replies] == [True, False, True, False, False, True]
    assert replies[0]["offset"] == 0
    assert (replies[2]["first"], replies[2]["count"]) == (1, 2)
    assert replies[5]["offset"] == 3
    assert replies[1]["error"]["code"] == NotFoundError.code
    assert replies[3]["error"]["code"] == MalformedError.code
    assert replies[4]["error"]["code"] == OwnerUnreachableError.code
    assert [e.value for e in client.range("mixed", 0, 10)] == [b"a", b"b", b"c", b"d"]


def test_other_requests_see_every_earlier_offer(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("barrier")
    pipe = Pipe(daemon)
    offers = [{"op": "offer", "queue": "barrier", "value": b"%d" % i} for i in range(20)]
    pipe.send(
        *offers, {"op": "last", "queue": "barrier"}, *offers[:1], {"op": "queue_info", "queue": "barrier"}
    )
    replies = pipe.replies(23)
    pipe.close()
    assert all(r["ok"] for r in replies)
    last = replies[20]
    assert last["entry"][0] == 19 and last["entry"][2] == b"19"
    assert replies[21]["offset"] == 20
    assert replies[22]["info"]["end_offset"] == 21


def test_a_client_leaving_with_offers_in_flight_harms_nothing(
    client: Client, daemon: InProcessDaemon
) -> None:
    client.queue_create("abandoned")
    pipe = Pipe(daemon)
    pipe.send(*({"op": "offer", "queue": "abandoned", "value": b"%d" % i} for i in range(50)))
    pipe.sock.shutdown(socket.SHUT_RDWR)
    pipe.close()
    # Whatever was committed is a gap-free prefix in order, and the daemon goes on serving.
    assert client.offer("abandoned", b"after") >= 0
    values = [e.value for e in client.range("abandoned", 0, 100)]
    assert values.count(b"after") == 1
    abandoned = [v for v in values if v != b"after"]  # frames already sent may still commit, in order
    assert abandoned == [b"%d" % i for i in range(len(abandoned))]


def test_producer_keeps_its_window_and_acks_in_order(client: Client) -> None:
    client.queue_create("produced")
    acks = []
    with Producer(client, "produced", window=8) as producer:
        for i in range(100):
            acks.append(producer.offer(b"p%d" % i, key=b"k" if i % 2 else None, headers={"n": b"%d" % i}))
            assert producer.in_flight <= 8
        acks.append(producer.offer_batch([(b"b0", None, ()), (b"b1", None, [("h", b"v")])]))
    assert all(ack.done for ack in acks)
    assert [ack.result() for ack in acks[:100]] == list(range(100))
    assert list(acks[100].offsets()) == [100, 101]
    entries = client.range("produced", 0, 200)
    assert [e.value for e in entries[:3]] == [b"p0", b"p1", b"p2"]
    assert entries[1].key == b"k" and entries[2].key is None
    assert entries[5].headers == (("n", b"5"),)
    assert entries[101].headers == (("h", b"v"),)


def test_producer_reports_errors_per_offer_and_on_flush(client: Client) -> None:
    client.queue_create("partly")
    producer = Producer(client, "partly", window=4)
    good = producer.offer(b"fine")
    bad = producer.offer(12345)  # type: ignore[arg-type]  # not bytes: refused by the daemon
    later = producer.offer(b"also fine")
    with pytest.raises(MalformedError):
        producer.flush()
    assert good.result() == 0 and later.result() == 1
    with pytest.raises(MalformedError):
        bad.result()
    producer.close()
    with pytest.raises(MalformedError):
        Producer(client, "partly", window=0)


def test_producer_sends_what_waits_behind_a_full_window_as_one_request(client: Client) -> None:
    client.queue_create("coalesced")
    acks = []
    with Producer(client, "coalesced", window=1, batch_records=8) as producer:
        for i in range(200):
            acks.append(producer.offer(b"c%d" % i, key=b"k%d" % i, headers={"i": b"%d" % i}))
            assert producer.in_flight <= 1 and producer.waiting < 8
        sent = producer.requests_sent
    assert producer.records_sent == 200
    assert 200 // 8 <= sent < 200  # batched: never more than 8 records a request, far fewer requests
    assert [ack.result() for ack in acks] == list(range(200))  # each record its own offset, in order
    assert all(ack.count == 1 for ack in acks)
    entries = client.range("coalesced", 0, 199)
    assert [(e.value, e.key, e.headers) for e in entries] == [
        (b"c%d" % i, b"k%d" % i, (("i", b"%d" % i),)) for i in range(200)
    ]


@contextlib.contextmanager
def storage_held(daemon: InProcessDaemon) -> Iterator[None]:
    """Keep the daemon's storage thread inside a batch (so nothing commits) until the block ends."""

    async def start() -> StorageHold:
        return daemon.handle.engine.bridge.hold()

    with daemon.call(start):
        yield


def test_records_batched_together_fail_together_and_alone(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("batched-fail")
    producer = Producer(client, "batched-fail", window=1)
    with storage_held(daemon):
        first = producer.offer(b"first")  # sent at once: the window was empty
        bad = producer.offer(12345)  # type: ignore[arg-type]  # waits behind it (nothing commits now)...
        mate = producer.offer(b"mate")  # ...with this one: one request, refused as a whole
        assert (producer.in_flight, producer.waiting, first.done) == (1, 2, False)
    with pytest.raises(MalformedError):
        producer.flush()
    assert producer.requests_sent == 2
    later = producer.offer(b"later")
    producer.flush()
    assert first.result() == 0 and later.result() == 1
    for ack in (bad, mate):
        with pytest.raises(MalformedError):
            ack.result()
    assert [e.value for e in client.range("batched-fail", 0, 10)] == [b"first", b"later"]
    producer.close()


def test_a_waiting_record_that_cannot_be_encoded_fails_its_batch_not_the_producer(
    client: Client, daemon: InProcessDaemon
) -> None:
    client.queue_create("unencodable")
    producer = Producer(client, "unencodable", window=1)
    with storage_held(daemon):
        first = producer.offer(b"first")
        odd = producer.offer(object())  # type: ignore[arg-type]  # msgpack cannot encode it
        mate = producer.offer(b"mate")
    with pytest.raises(MalformedError):
        producer.flush()
    for ack in (odd, mate):
        with pytest.raises(MalformedError, match="encode"):
            ack.result()
    assert first.result() == 0
    assert producer.offer(b"later").result() == 1  # the connection is fine
    producer.close()
    assert [e.value for e in client.range("unencodable", 0, 10)] == [b"first", b"later"]


def test_producer_poll_reads_acks_and_sends_what_waits(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("polled")
    producer = Producer(client, "polled", window=1)
    with storage_held(daemon):  # no reply before the polling starts (offer() would read it, uncounted)
        acks = [producer.offer(b"%d" % i) for i in range(5)]
        assert producer.in_flight == 1 and producer.waiting == 4
    answered = 0
    while not all(ack.done for ack in acks):
        answered += producer.poll(timeout=10)  # returns as replies arrive, sending the rest meanwhile
    assert answered == producer.requests_sent >= 2
    assert [ack.result() for ack in acks] == list(range(5))
    assert producer.poll() == 0  # nothing in flight: returns at once
    producer.close()


def test_closing_a_producer_fails_what_still_waits_unsent(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("unsent")
    producer = Producer(client, "unsent", window=1)
    with storage_held(daemon):
        producer.offer(b"sent")
        waiting = producer.offer(b"never sent")
        assert producer.waiting == 1
        producer.close()
    with pytest.raises(ConnectionClosedError):
        waiting.result()
    client.offer("unsent", b"after")  # commits after whatever the closed connection had sent
    assert b"never sent" not in [e.value for e in client.range("unsent", 0, 10)]


def test_producer_fails_pending_acks_when_closed(client: Client) -> None:
    client.queue_create("closed-early")
    producer = Producer(client, "closed-early", window=4)
    ack = producer.offer(b"maybe")
    producer.close()
    assert ack.done and ack.error is not None
    with pytest.raises(ConnectionClosedError, match="closed"):
        ack.result()


def test_pipelined_offers_share_group_commits(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("shared")
    before = client.status()["transactions"]
    pipe = Pipe(daemon)
    pipe.send(*({"op": "offer", "queue": "shared", "value": b"%d" % i} for i in range(40)))
    replies = pipe.replies(40)
    pipe.close()
    assert all(r["ok"] for r in replies)
    # Sent together, started together: a handful of commits, not one per offer.
    assert client.status()["transactions"] - before <= 10


async def test_pipelined_requests_in_flight_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client pipelining large batches: the next one is read only once the earlier ones fit the
    connection's byte budget again."""
    monkeypatch.setattr(server_module, "MAX_IN_FLIGHT_BYTES", 1000)
    jobs: list[Job] = []

    def begin(ctx: Any, request: dict[str, Any]) -> tuple[Job, Any]:
        job = Job()
        job.done = trio.Event()
        jobs.append(job)
        return job, lambda result: {}

    class Replies:
        def __init__(self) -> None:
            self.sent: list[dict[str, Any]] = []

        def encode(self, message: dict[str, Any]) -> bytes:
            return msgpack.packb(message)  # type: ignore[no-any-return]

        async def send_encoded(self, data: bytes) -> None:
            unpacker = msgpack.Unpacker()
            unpacker.feed(data)
            self.sent.extend(unpacker)

    conn = Replies()
    pipeline = server_module._Pipeline(None, conn)  # type: ignore[arg-type]
    await pipeline.start(1, begin, {}, 400)
    await pipeline.start(2, begin, {}, 400)
    assert pipeline.in_flight == (2, 800)
    third_started = trio.Event()

    async def third() -> None:
        await pipeline.start(3, begin, {}, 400)  # 1200 bytes in flight: waits for the first
        third_started.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(third)
        await trio.testing.wait_all_tasks_blocked()
        assert not third_started.is_set() and pipeline.in_flight == (3, 1200)
        jobs[0].done.set()
        await third_started.wait()
    assert pipeline.in_flight == (2, 800) and [r["id"] for r in conn.sent] == [1]


async def _waiting_pipeline() -> tuple[Any, socket.socket, list[Job], Any]:
    """A pipeline on a real socket pair with two offers-to-be in flight (jobs the test finishes); the
    client's end is a plain non-blocking socket, read without yielding to trio."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.setblocking(False)
    conn = Connection(trio.SocketStream(trio.socket.from_stdlib_socket(a)), 1 << 24)
    jobs: list[Job] = []

    def begin(ctx: Any, request: dict[str, Any]) -> tuple[Job, Any]:
        job = Job()
        job.done = trio.Event()
        jobs.append(job)
        return job, lambda result: {"offset": result}

    pipeline = server_module._Pipeline(None, conn)  # type: ignore[arg-type]
    await pipeline.start(1, begin, {}, 10)
    await pipeline.start(2, begin, {}, 10)
    return pipeline, b, jobs, conn


def _serving(pipeline: Any, got: list[bytes], until: int = 1 << 30) -> Any:
    """``pipeline.serve`` with a handler that records each request (the connection ends after ``until``)."""

    async def handle(frame: bytes) -> bool:
        got.append(frame)
        return len(got) < until

    return functools.partial(pipeline.serve, handle)


def _finish(job: Job, result: int) -> None:
    """What the bridge does on the event loop once the job's transaction committed."""
    job.result = result
    job.done.set()
    assert job.notify is not None
    job.notify()


def _replies_now(peer: socket.socket) -> list[dict[str, Any]]:
    """The replies already in the client's socket (never waits)."""
    decoder = FrameDecoder(1 << 24)
    with contextlib.suppress(BlockingIOError):
        decoder.receive_data(peer.recv(1 << 16))
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(msgpack.unpackb(frame, raw=False))
    return out


async def test_a_commit_answers_a_waiting_connection_in_order_without_waking_its_task() -> None:
    """The commit's callback writes the finished replies itself, in request order (a later offer that
    finished first waits for the earlier one), and the task keeps waiting for the next request."""
    pipeline, peer, jobs, _ = await _waiting_pipeline()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serving(pipeline, got, until=1))
        await trio.testing.wait_all_tasks_blocked()
        _finish(jobs[1], 8)
        assert _replies_now(peer) == [] and pipeline.in_flight == (2, 20)  # the first is not done yet
        _finish(jobs[0], 7)
        # No checkpoint since: the callback itself wrote both replies.
        assert [(r["id"], r["offset"], r["ok"]) for r in _replies_now(peer)] == [(1, 7, True), (2, 8, True)]
        assert pipeline.in_flight == (0, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # still waiting for the next request
        peer.send(struct.pack(">I", 3) + b"abc")
    assert got == [b"abc"]


async def test_replies_built_while_their_batch_commits_are_sent_once_done_as_built() -> None:
    """While the batch commits (the fsync under way, the event loop idle) the bridge calls each job's
    ``prepare``: the replies are encoded then and nothing is sent; once the commit is done, its callback
    writes those very bytes without encoding again."""
    pipeline, peer, jobs, conn = await _waiting_pipeline()
    encoded: list[int] = []
    encode = conn.encode

    def counting(message: dict[str, Any]) -> bytes:
        encoded.append(message["id"])
        return encode(message)

    conn.encode = counting
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serving(pipeline, []))
        await trio.testing.wait_all_tasks_blocked()
        jobs[0].result, jobs[1].result = 7, 8  # applied on the storage thread; its COMMIT runs
        for job in jobs:
            assert job.prepare is not None
            job.prepare()
        assert encoded == [1, 2] and _replies_now(peer) == []  # built once each, nothing sent yet
        for job in jobs:
            job.done.set()
        assert jobs[0].notify is not None
        jobs[0].notify()
        assert [(r["id"], r["offset"], r["ok"]) for r in _replies_now(peer)] == [(1, 7, True), (2, 8, True)]
        assert encoded == [1, 2] and pipeline._prepared == {} and pipeline.in_flight == (0, 0)
        nursery.cancel_scope.cancel()


async def test_a_reply_built_before_the_commit_is_not_sent_if_it_failed_or_was_retried() -> None:
    """A reply built while the batch committed answers only the result the job ended with: a failed
    COMMIT answers its error, a batch retried (a new result) answers the new one."""
    pipeline, peer, jobs, _ = await _waiting_pipeline()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serving(pipeline, []))
        await trio.testing.wait_all_tasks_blocked()
        jobs[0].result, jobs[1].result = 7, 8
        assert jobs[0].prepare is not None
        jobs[0].prepare()
        jobs[0].error = StorageError("cannot write: the disk is full")  # that COMMIT failed
        jobs[1].result = 9  # ... and this job's batch was retried after it
        for job in jobs:
            job.done.set()
        assert jobs[1].notify is not None
        jobs[1].notify()
        replies = _replies_now(peer)
        assert [(r["id"], r["ok"]) for r in replies] == [(1, False), (2, True)]
        assert replies[0]["error"]["code"] == "storage" and replies[1]["offset"] == 9
        nursery.cancel_scope.cancel()


async def test_replies_the_socket_cannot_take_at_once_are_sent_by_the_task_first() -> None:
    """While another write waits for room, the callback writes nothing: it wakes the task, which sends
    the replies (before anything later) and goes back to waiting."""
    pipeline, peer, jobs, conn = await _waiting_pipeline()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serving(pipeline, []))
        await trio.testing.wait_all_tasks_blocked()
        conn.writing = True
        _finish(jobs[0], 7)
        assert _replies_now(peer) == []
        conn.writing = False
        await trio.testing.wait_all_tasks_blocked()
        assert [r["id"] for r in _replies_now(peer)] == [1] and pipeline.in_flight == (1, 10)
        _finish(jobs[1], 8)
        assert [r["id"] for r in _replies_now(peer)] == [2]
        nursery.cancel_scope.cancel()


def test_pipelined_offers_whose_commit_fails_are_answered_with_its_error_not_the_prepared_reply(
    client: Client, daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adversarial (singles22): each offer's success reply is built while its batch's COMMIT runs; the
    COMMITs fail, so those replies are dropped and every offer is answered, in order, with the storage
    error; nothing was written (the next offer gets offset 0)."""
    client.queue_create("commit-fails")
    store = daemon.handle.engine._writer.store
    commit = store.commit
    failing = [True]

    def failing_commit() -> None:
        if failing[0]:
            # A slow fsync: the event loop runs what was queued before it (the batch's prepare) first.
            trio.from_thread.run_sync(lambda: None, trio_token=daemon.token)
            raise sqlite3.OperationalError("disk I/O error")
        commit()

    built: list[Any] = []
    ok_reply = server_module._ok_reply

    def counting(rid: Any, result: Any, build: Any) -> dict[str, Any]:
        built.append(rid)
        return ok_reply(rid, result, build)

    monkeypatch.setattr(server_module, "_ok_reply", counting)
    monkeypatch.setattr(store, "commit", failing_commit)
    pipe = Pipe(daemon)
    with storage_held(daemon):  # the offers wait together behind the held batch
        ids = pipe.send(*({"op": "offer", "queue": "commit-fails", "value": b"%d" % i} for i in range(5)))
    replies = pipe.replies(5)
    failing[0] = False
    assert sorted(built) == ids  # each success was built (before its COMMIT), once
    assert [r["id"] for r in replies] == ids
    assert [(r["ok"], r["error"]["code"]) for r in replies] == [(False, StorageError.code)] * 5
    pipe.send({"op": "offer", "queue": "commit-fails", "value": b"after"})
    (after,) = pipe.replies(1)
    pipe.close()
    assert (after["ok"], after["offset"]) == (True, 0)
    assert [e.value for e in client.range("commit-fails", 0, 10)] == [b"after"]


async def test_a_pipelined_job_is_started_with_its_connections_callbacks() -> None:
    """The handler starts its job under the connection's submitter, so the bridge gives the job its
    ``notify``, ``prepare`` and ``origin`` before the storage thread can see it (not after its start)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = Connection(trio.SocketStream(trio.socket.from_stdlib_socket(a)), 1 << 24)
    pipeline = server_module._Pipeline(None, conn)  # type: ignore[arg-type]
    during: list[Any] = []

    def begin(ctx: Any, request: dict[str, Any]) -> tuple[Job, Any]:
        during.append(SUBMITTER.get())
        job = Job()
        job.done = trio.Event()
        return job, lambda result: {"offset": result}

    await pipeline.start(1, begin, {}, 10)
    (submitter,) = during
    assert submitter is not None
    assert (submitter.notify, submitter.prepare, submitter.origin) == (
        pipeline._committed,
        pipeline._prepare,
        pipeline,
    )
    assert SUBMITTER.get() is None
    b.close()
    a.close()


@pytest.mark.parametrize("point", ["in the wait", "after the read", "in the handler", "at the end of stream"])
async def test_a_cancel_landing_at_any_point_loses_no_request_and_reads_none_twice(point: str) -> None:
    """One cancel scope spans the connection's requests; a commit's callback cancels it only while the task
    waits for the next request. Wherever the cancel lands (in the wait; after the read woke the task but
    before it ran; while a request is handled, where it must not cancel at all; with the end of the
    stream read), every request is handled once, in order, never inside a cancelled scope, and the task
    takes a new scope only after a cancel."""
    pipeline, peer, jobs, conn = await _waiting_pipeline()
    got: list[bytes] = []
    scopes: list[Any] = []  # the scope each wait ran in
    receive = conn.receive_frame

    async def receive_frame(*, nothing_buffered: bool = False) -> bytes | None:
        scopes.append(pipeline._waiting)
        frame = await receive(nothing_buffered=nothing_buffered)
        if (point, frame) in (("after the read", b"b"), ("at the end of stream", None)):
            pipeline._waiting.cancel()  # the callback ran between the task's wake-up and its resuming
        return frame

    async def handle(frame: bytes) -> bool:
        assert trio.current_effective_deadline() != -math.inf  # not inside a cancelled scope
        await trio.lowlevel.checkpoint()  # would raise Cancelled there, and the request would be lost
        got.append(frame)
        if point == "in the handler" and frame == b"b":
            conn.writing = True  # the reply could not be written: a waiting task would be cancelled
            _finish(jobs[0], 7)
            conn.writing = False
        return True

    conn.receive_frame = receive_frame
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.serve, handle)
        for body in (b"a", b"b", b"c"):
            await trio.testing.wait_all_tasks_blocked()
            if point == "in the wait" and body == b"b":
                pipeline._waiting.cancel()
                await trio.testing.wait_all_tasks_blocked()
            peer.send(struct.pack(">I", 1) + body)
        await trio.testing.wait_all_tasks_blocked()
        peer.shutdown(socket.SHUT_WR)
        await trio.testing.wait_all_tasks_blocked()
        for job in jobs:
            if not job.done.is_set():
                _finish(job, 9)  # the end of stream: the task answers what is left, then returns
    assert got == [b"a", b"b", b"c"]
    assert [r["id"] for r in _replies_now(peer)] == [1, 2] and pipeline.in_flight == (0, 0)
    # A new scope after a cancel that a later request's wait runs in (none is left after the last read).
    waits = [s for s in scopes if s is not None]
    assert len(set(map(id, waits))) == (2 if point in ("in the wait", "after the read") else 1)


async def test_a_reply_that_fails_to_build_in_the_callback_drops_no_request() -> None:
    """The callback takes the finished requests and builds their replies in one pass; if building one
    raises, none of them is dropped: the task is woken, builds them again and sends them all in order."""
    pipeline, peer, jobs, _ = await _waiting_pipeline()
    failures = [RuntimeError("once")]

    def build_failing_once(result: int) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return {"offset": result}

    rid, job, _, size = pipeline._pending[1]
    pipeline._pending[1] = (rid, job, build_failing_once, size)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serving(pipeline, []))
        await trio.testing.wait_all_tasks_blocked()
        jobs[0].result, jobs[1].result = 7, 8
        for job in jobs:
            job.done.set()
        assert jobs[0].notify is not None
        jobs[0].notify()  # the first reply builds, the second raises: both stay pending
        assert _replies_now(peer) == [] and pipeline.in_flight == (2, 20) and not failures
        await trio.testing.wait_all_tasks_blocked()  # the woken task builds and sends both
        replies = _replies_now(peer)
        assert [(r["id"], r["offset"]) for r in replies] == [(1, 7), (2, 8)]
        assert pipeline.in_flight == (0, 0)
        nursery.cancel_scope.cancel()
