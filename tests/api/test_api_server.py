"""The local API against an in-process daemon (trio in a background thread), through the blocking client
and raw sockets: every op, error replies, hostile input, and fuzzed frames that must never crash the
server or change data they do not address."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import socket
import struct
import termios
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.api_fuzz import FUZZ_ARG_NAMES
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner

import cli.ctl
from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client, Entry
from latticed.api.server import tail as tail_module
from latticed.api.server.op_table import build_op_table
from latticed.api.server.tail import MIN_TAIL_BATCH_BYTES, tail_buffered_bytes
from latticed.crdt.head import queue_id
from latticed.crdt.signing import Identity
from latticed.errors import (
    AlreadyExistsError,
    ConnectionClosedError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
    ProtocolError,
    StorageError,
    WrongTypeError,
)
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig
from latticed.version import API_VERSIONS

MAX_FRAME = 1 << 20
GUARDED = "guarded-queue-7f3a9"
GUARDED_KEY = "guarded-key-7f3a9"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    root = tmp_path_factory.mktemp("api")
    config = DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock", max_frame_bytes=MAX_FRAME)
    d = start_in_process(config)
    with d.client() as c:
        c.queue_create(GUARDED, {"kept": "yes"})
        c.offer_batch(GUARDED, [(f"g{i}".encode(), b"k", [("h", b"v")]) for i in range(50)])
        c.kv_put(GUARDED_KEY, b"kept")
    yield d
    d.stop()


@pytest.fixture
def client(daemon: InProcessDaemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


def guarded_snapshot(daemon: InProcessDaemon) -> tuple[Any, ...]:
    with daemon.client() as c:
        info = c.queue_info(GUARDED)
        return info, c.range(GUARDED, 0, 10**9), c.kv_get(GUARDED_KEY)


# ------------------------------------------------------------------ raw framing helpers


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def request(op: str, **args: Any) -> bytes:
    return frame(msgpack.packb({"v": 1, "id": 7, "op": op, **args}, use_bin_type=True))


class Raw:
    """A raw connection that reads replies frame by frame."""

    def __init__(self, path: Path, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> dict[str, Any] | None:
        """The next reply, or None when the server closed the connection."""
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
                    out: dict[str, Any] = msgpack.unpackb(body, raw=False, strict_map_key=False)
                    return out
            data = self.sock.recv(65536)
            if not data:
                return None
            self.buf += data

    def pending(self) -> int:
        """Bytes the server sent that sit unread in our receive queue."""
        out = bytearray(4)
        fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, out)
        return int.from_bytes(out, "little")

    def wait_sender_blocked(self, timeout: float = 10.0) -> int:
        """Wait until the server's pushes start and then stop arriving while we read nothing (the socket
        buffers are full: the server waits on us); returns the bytes queued then."""
        self.sock.recv(1, socket.MSG_PEEK)  # blocks until the first push arrives
        deadline = time.monotonic() + timeout
        last = -1
        while (queued := self.pending()) != last:
            assert time.monotonic() < deadline, "the server never stopped sending"
            last = queued
            time.sleep(0.01)
        return queued

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------ every op through the client


def test_node_ops(client: Client, daemon: InProcessDaemon) -> None:
    me = client.identity()
    assert me == daemon.handle.identity.public_hex
    status = client.status()
    assert status["identity"] == me and status["queues"] >= 1 and status["records"] >= 50
    assert status["socket"] == str(daemon.socket) and status["listen"] is None
    assert status["storage_bytes"] > 0 and status["uptime_s"] >= 0
    assert client.call("hello")["versions"] == list(API_VERSIONS) == [1, 2]


def test_queue_ops(client: Client) -> None:
    full = client.queue_create("orders", {"team": "a"})
    me = client.identity()
    assert full == f"{me}/orders"
    with pytest.raises(AlreadyExistsError):
        client.queue_create("orders")
    assert client.offer("orders", b"v0", key=b"k0", headers={"h": b"1"}) == 0
    assert client.offer_batch("orders", [(b"v1", None, ()), (b"v2", b"k2", [("a", b"b")])]) == [1, 2]
    assert client.peek("orders", 1) == b"v1" and client.peek("orders", 9) is None
    e0 = Entry(full, 0, b"k0", b"v0", client.peek_entry("orders", 0).timestamp, (("h", b"1"),))  # type: ignore[union-attr]
    assert client.peek_entry(full, 0) == e0
    assert client.first("orders") == e0
    last = client.last("orders")
    assert last is not None and (last.offset, last.key, last.headers) == (2, b"k2", (("a", b"b"),))
    assert [e.value for e in client.range("orders", -5, 100)] == [b"v0", b"v1", b"v2"]
    assert [e.offset for e in client.range("orders", 1, 1)] == [1]
    batch = client.read("orders", 1, max_records=1)
    assert (batch.offsets, batch.values, batch.next_offset, batch.end_offset) == ([1], [b"v1"], 2, 3)
    assert batch.headers == [()] and len(batch) == 1
    client.meta_set("orders", "color", "red")
    assert client.meta_get("orders", "color") == "red" and client.meta_get("orders", "nope") is None
    client.truncate("orders", 2)
    info = client.queue_info("orders")
    assert info["start_offset"] == 2 and info["end_offset"] == 3 and info["size"] == 1
    assert info["meta"] == {"team": "a", "color": "red"} and info["owned"] and not info["forked"]
    assert info["known_end"] == 3 and info["version"] >= 5 and info["queue"] == full
    assert client.call("info", queue="orders")["info"] == info  # CAD040's name for it
    assert client.read("orders", 0).offsets == [2]
    assert [e.offset for e in client.tail("orders", None, follow=False)] == [2]
    assert [q for q in client.queue_list() if q["queue"] == full] == [info]
    client.offer("orders", b"v3")  # a listed queue that changes is listed anew
    assert [q["end_offset"] for q in client.queue_list() if q["queue"] == full] == [4]


def test_kv_ops(client: Client) -> None:
    client.kv_put("a", b"1")
    assert client.kv_get("a") == b"1"
    assert client.kv_incr("n", 5) == 5 and client.kv_incr("n") == 6
    client.kv_hset("h", b"f", b"v")
    client.kv_hset("h", b"g", b"w")
    client.kv_hdel("h", b"g")
    assert client.kv_hget("h", b"f") == b"v" and client.kv_hget("h", b"g") is None
    assert client.kv_hgetall("h") == {b"f": b"v"}
    client.kv_sadd("s", b"x")
    client.kv_sadd("s", b"y")
    client.kv_srem("s", b"x")
    assert client.kv_smembers("s") == {b"y"}
    put_at = time.monotonic()
    client.kv_put("ttl", b"t", ttl=0.5)
    assert client.kv_get("ttl") == b"t" or time.monotonic() - put_at >= 0.5
    while client.kv_get("ttl") is not None:  # gone once the TTL passed, and not before
        assert time.monotonic() - put_at < 10, "the TTL never expired"
        time.sleep(0.01)
    assert time.monotonic() - put_at >= 0.5
    client.kv_del("a")
    assert client.kv_get("a") is None
    listed = client.kv_list()
    assert listed["n"] == 6 and listed["h"] == {b"f": b"v"} and listed["s"] == {b"y"} and "a" not in listed
    assert client.kv_list("h") == {"h": {b"f": b"v"}}
    assert client.kv_get("n", owner=client.identity()) == 6
    with pytest.raises(WrongTypeError, match="hash"):
        client.kv_incr("h")  # a hash is not a counter: the typed error crosses the wire
    with pytest.raises(MalformedError, match="64-bit"):
        client.kv_incr("n", 2**63 - 1)
    assert client.kv_incr("n", 0) == 6


def test_incr_on_a_value_exits_with_the_wrong_type_code(client: Client, daemon: InProcessDaemon) -> None:
    """The typed error crosses the wire and becomes the documented exit code (README, cli/boundary.py)."""
    client.kv_put("wrongtype-n", b"5")
    result = CliRunner().invoke(cli.ctl.app, ["--socket", str(daemon.socket), "kv", "incr", "wrongtype-n"])
    assert result.exit_code == ExitCode.WRONG_TYPE == 12, result.output
    assert result.stderr == "latticectl: error: key 'wrongtype-n' holds a plain value, not a counter\n"
    assert client.kv_get("wrongtype-n") == b"5"


def test_foreign_queues_read_but_not_written(client: Client, daemon: InProcessDaemon) -> None:
    bob = Identity.from_seed(b"b" * 32)
    source = LatticeQueue.create(bob, "feed")
    source.offer(b"from bob")
    daemon.call(daemon.handle.engine.merge_delta, source.delta())
    address = f"{bob.public_hex}/feed"
    assert client.peek(address, 0) == b"from bob"
    info = client.queue_info(address)
    assert not info["owned"] and info["owner"] == bob.public_hex
    with pytest.raises(NotOwnerError):
        client.offer(address, b"nope")
    with pytest.raises(NotOwnerError):
        client.truncate(address, 1)


def test_error_replies(client: Client) -> None:
    with pytest.raises(NotFoundError):
        client.offer("missing", b"x")
    with pytest.raises(NotFoundError):
        client.peek(f"{'ab' * 32}/nothing", 0)
    with pytest.raises(MalformedError):
        client.peek("zz/bad", 0)  # not a public key
    with pytest.raises(MalformedError):
        client.call("offer", queue=GUARDED, value="text, not bytes")
    with pytest.raises(MalformedError):
        client.call("peek", queue=GUARDED, offset="1")
    with pytest.raises(ProtocolError, match="unknown op"):
        client.call("launch_missiles")
    assert client.identity()  # the connection is still good after error replies


@pytest.mark.parametrize(
    "records",
    [
        [],
        "not a list",
        [[b"v", None]],
        [[b"v", None, None, None]],
        [(b"v", None, None), "junk"],
        [[b"v", None, None], [b"w", None, None, None]],
        [[b"ok", None, None], ["text", None, None]],
        [[b"ok", None, None], [b"v", 5, None]],
        [[b"ok", None, None], [b"v", b"k" * (64 * 1024 + 1), None]],
        [[b"ok", None, None], [b"v", None, [["h", "text"]]]],
        [[b"ok", None, None], [b"v", None, 7]],
    ],
)
def test_a_malformed_batch_offer_stores_nothing(
    client: Client, daemon: InProcessDaemon, records: Any
) -> None:
    with contextlib.suppress(AlreadyExistsError):
        client.queue_create("batch-checks")
    before = client.queue_info("batch-checks")["end_offset"]
    with pytest.raises(MalformedError):
        client.call("offer_batch", queue="batch-checks", records=records)
    assert client.queue_info("batch-checks")["end_offset"] == before
    assert client.identity()


def test_an_empty_batch_offer_signs_nothing(client: Client) -> None:
    client.queue_create("empty-batch")
    version = client.queue_info("empty-batch")["version"]
    assert client.offer_batch("empty-batch", []) == []  # the client sends nothing
    with pytest.raises(MalformedError, match="non-empty"):
        client.call("offer_batch", queue="empty-batch", records=[])  # the server signs nothing
    info = client.queue_info("empty-batch")
    assert (info["version"], info["end_offset"]) == (version, 0)


def test_a_batch_offer_keeps_every_field(client: Client) -> None:
    client.queue_create("batch-fields")
    records = [
        (b"v%d" % i, b"k%d" % i if i % 2 else None, [("n", b"%d" % i)] if i % 3 == 0 else ())
        for i in range(9)
    ]
    assert client.offer_batch("batch-fields", records) == list(range(9))
    got = client.read("batch-fields", 0)
    assert got.values == [r[0] for r in records] and got.keys == [r[1] for r in records]
    assert got.headers == [tuple(r[2]) for r in records]
    assert len(set(got.timestamps)) == 1
    tail = client.tail("batch-fields", 0, follow=False)
    assert [(e.value, e.key, e.headers) for e in tail] == [(r[0], r[1], tuple(r[2])) for r in records]


def test_range_larger_than_a_frame_is_refused_not_truncated(client: Client) -> None:
    client.queue_create("wide")
    for _ in range(2):
        client.offer_batch("wide", [(b"x" * 200_000, None, ())] * 4)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        client.offer_batch("wide", [(b"x" * 200_000, None, ())] * 8)  # a request over the frame limit
    with pytest.raises(MalformedError, match="page through them with the read op") as refused:
        client.range("wide", 0, 7)
    assert "latticectl range" in str(refused.value), "the message names what exists"
    batch = client.read("wide", 0, max_bytes=500_000)
    assert 1 <= len(batch) < 8 and batch.next_offset == len(batch)
    # range_pages (what `latticectl range` uses) pages through it by itself, halving what does not fit
    paged = list(client.range_pages("wide", 0, 10**9))
    assert [e.offset for e in paged] == list(range(8)) and all(len(e.value) == 200_000 for e in paged)
    assert [e.offset for e in client.range_pages("wide", 3, 5, page=2)] == [3, 4, 5]
    assert list(client.range_pages("wide", 8, 100)) == []


def test_tail_pushes_new_records_and_bounds_batches(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("live")
    got: list[Entry] = []
    ready = threading.Event()

    def consume() -> None:
        with daemon.client(timeout=None) as c:
            it = c.tail("live", 0)
            ready.set()
            for entry in it:
                got.append(entry)
                if len(got) == 2501:
                    it.close()

    t = threading.Thread(target=consume)
    t.start()
    ready.wait()
    client.offer("live", b"first")
    client.offer_batch("live", [(b"%d" % i, None, ()) for i in range(2500)])
    t.join(20)
    assert not t.is_alive()
    assert [e.offset for e in got] == list(range(2501)) and got[0].value == b"first"

    raw = Raw(daemon.socket)
    try:
        raw.send(request("tail", queue="live", follow=False))
        sizes = []
        while (reply := raw.reply()) is not None and not reply.get("done"):
            sizes.append(len(reply["offsets"]))
        assert reply is not None and reply["next_offset"] == 2501
        assert sum(sizes) == 2501 and max(sizes) <= 1000  # bounded pushes
        raw.send(request("id"))  # after a finished tail the connection serves requests again
        after = raw.reply()
        assert after is not None and after["ok"]
    finally:
        raw.close()


def test_slow_tail_reader_does_not_stop_the_daemon(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("firehose")
    for _ in range(10):
        client.offer_batch("firehose", [(b"y" * 10_000, None, ())] * 100)  # 10 MB
    raw = Raw(daemon.socket)
    try:
        raw.send(request("tail", queue="firehose", follow=True))
        queued = raw.wait_sender_blocked()
        assert 0 < queued < 10_000_000  # it waits on us with most of the queue still to send
        assert client.offer("firehose", b"still writable") == 1000
        n = 0
        while n < 1001:
            reply = raw.reply()
            assert reply is not None and reply["ok"]
            n += len(reply["offsets"])
        assert n == 1001
    finally:
        raw.close()


def test_a_full_disk_fails_writes_and_reads_go_on(client: Client, daemon: InProcessDaemon) -> None:
    client.queue_create("tight")
    client.offer("tight", b"before")
    engine = daemon.handle.engine

    def limit(pages: int) -> Any:
        return lambda _batch, writer: writer.store.set_max_page_count(pages)

    daemon.call(engine.call_in_writer, lambda _b, w: w.store.set_max_page_count(w.store.page_count() + 4))
    try:
        with pytest.raises(StorageError, match="full") as failure:
            client.offer_batch("tight", [(b"z" * 4000, None, ())] * 200)
        assert failure.value.code == "storage"
        assert client.peek("tight", 0) == b"before"  # reads are served as before
        assert client.queue_info("tight")["end_offset"] == 1
    finally:
        daemon.call(engine.call_in_writer, limit(1 << 30))
    assert client.offer("tight", b"after") == 1


# ------------------------------------------------------------------ hostile input over raw sockets


def test_garbage_bytes_get_an_error_and_a_close(daemon: InProcessDaemon) -> None:
    raw = Raw(daemon.socket)
    try:
        raw.send(b"\xff\xff\xff\xffGARBAGE")  # a length far above the limit
        reply = raw.reply()
        assert reply is not None and reply["ok"] is False and reply["error"]["code"] == "remote_protocol"
        assert raw.reply() is None  # then the server hangs up
    finally:
        raw.close()
    with daemon.client() as c:
        assert c.identity()


def test_oversized_frame_is_refused_before_it_is_read(daemon: InProcessDaemon) -> None:
    raw = Raw(daemon.socket)
    try:
        raw.send(struct.pack(">I", MAX_FRAME + 1) + b"x" * 1000)
        reply = raw.reply()
        assert reply is not None and "exceeds" in reply["error"]["message"]
        assert raw.reply() is None
    finally:
        raw.close()


def test_undecodable_and_malformed_requests_keep_the_connection(daemon: InProcessDaemon) -> None:
    raw = Raw(daemon.socket)
    try:
        for body, code in [
            (b"\xc1", "malformed"),  # never valid msgpack
            (msgpack.packb([1, 2, 3]), "malformed"),  # not a map
            (msgpack.packb({"id": 1, "op": "id"}), "protocol"),  # no version
            (msgpack.packb({"v": 3, "id": 1, "op": "id"}), "protocol"),  # a version from the future
            (msgpack.packb({"v": 1, "id": 1, "op": 5}), "protocol"),
            (msgpack.packb({"v": 1, "id": [1], "op": "id"}), "malformed"),
            (msgpack.packb({"v": 1, "id": 3, "op": "offer", "queue": GUARDED, "value": 5}), "malformed"),
        ]:
            raw.send(frame(body))
            reply = raw.reply()
            assert reply is not None and reply["ok"] is False and reply["error"]["code"] == code, body
        raw.send(request("id"))
        reply = raw.reply()
        assert reply is not None and reply["ok"] and reply["id"] == 7
    finally:
        raw.close()


def test_a_connection_cut_mid_frame_is_dropped_quietly(daemon: InProcessDaemon) -> None:
    raw = Raw(daemon.socket)
    raw.send(struct.pack(">I", 100) + b"only part")
    raw.close()
    with daemon.client() as c:
        assert c.identity()


def test_client_reports_a_missing_daemon(tmp_path: Path) -> None:
    with pytest.raises(ConnectionClosedError, match="not running"), Client(tmp_path / "nope.sock") as c:
        c.identity()


# ------------------------------------------------------------------ fuzzing

_ARG_NAMES = FUZZ_ARG_NAMES
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_requests = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, None, 0, 2, "1"]),
        "id": st.one_of(
            st.integers(-5, 5), st.text(max_size=3), st.none(), st.lists(st.integers(0, 9), max_size=2)
        ),
        "op": st.one_of(st.sampled_from([*sorted(build_op_table().handlers), "tail"]), st.text(max_size=12)),
    },
    optional={name: _values for name in _ARG_NAMES},
).map(lambda r: msgpack.packb(r, use_bin_type=True))
_frames = st.one_of(
    _requests.map(frame),
    st.binary(max_size=64),
    st.binary(max_size=64).map(frame),
    _requests.map(lambda body: frame(body)[: max(1, len(body) // 2)]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(_frames, min_size=1, max_size=3))
def test_fuzzed_frames_never_crash_the_server_or_touch_other_data(
    daemon: InProcessDaemon, data: list[bytes]
) -> None:
    before = guarded_snapshot(daemon)
    raw = Raw(daemon.socket, timeout=0.5)
    try:
        raw.send(b"".join(data))
        raw.sock.shutdown(socket.SHUT_WR)
        while True:
            try:
                if raw.reply() is None:
                    break
            except (TimeoutError, ConnectionResetError):
                break
    finally:
        raw.close()
    assert guarded_snapshot(daemon) == before


# -------------------------------------------------------------- what a connection holds


def test_an_oversized_request_is_refused_clearly_and_the_daemon_carries_on(daemon: InProcessDaemon) -> None:
    raw = Raw(daemon.socket)
    try:
        raw.send(struct.pack(">I", 64 * MAX_FRAME) + b"x" * 1000)
        reply = raw.reply()
        assert reply is not None and reply["ok"] is False
        message = reply["error"]["message"]
        assert f"exceeds the limit of {MAX_FRAME} bytes" in message and "max_frame_bytes" in message
        assert raw.reply() is None
    finally:
        raw.close()
    with daemon.client() as c:
        assert c.identity() and c.queue_info(GUARDED)


def test_an_idle_connection_does_not_keep_its_last_large_request(daemon: InProcessDaemon) -> None:
    """A client that sent a large request and then idles (here: with the first byte of the next one)
    must not make the server hold that request for as long as it stays connected."""
    body = b"\xc1" * (MAX_FRAME - 16)  # never valid msgpack: an error reply, then the next request
    data = frame(body) + b"\x00"
    raw = Raw(daemon.socket)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        raw.send(data)
        reply = raw.reply()
        assert reply is not None and reply["error"]["code"] == "malformed"

        async def nothing() -> None:  # runs once the connection's task waits for its next request
            pass

        daemon.call(nothing)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        raw.close()
    assert held < MAX_FRAME // 4, held


def test_requests_naming_missing_queues_leave_nothing_cached(client: Client) -> None:
    """Each entry a burst of hostile requests leaves in a long-lived cache pins the memory allocated
    around it (Python frees an arena only when all of it is free): names that resolve to nothing are
    not cached, and a name that does is cached once."""
    before = queue_id.cache_info().currsize
    for i in range(200):
        with pytest.raises(NotFoundError):
            client.queue_info(f"missing-{i}")
        with pytest.raises(NotFoundError):
            client.peek(f"{'ab' * 32}/missing-{i}", 0)
    assert queue_id.cache_info().currsize == before
    assert client.queue_info(GUARDED)["end_offset"] == 50


def test_a_tail_reader_leaving_mid_send_is_a_disconnect_not_an_error(
    client: Client, daemon: InProcessDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    """The client goes away while the server is blocked sending it a batch: the broken pipe (wrapped in
    the tail's task group) is one INFO line, not an ERROR with a traceback."""
    caplog.set_level(logging.INFO, logger="latticed.api.server.api_server")
    client.queue_create("leaving")
    for _ in range(3):
        client.offer_batch("leaving", [(b"l" * 10_000, None, ())] * 100)  # 3 MB: more than the socket holds
    for _ in range(3):
        raw = Raw(daemon.socket)
        raw.send(request("tail", queue="leaving", follow=True))
        assert raw.wait_sender_blocked() > 0
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
        raw.close()
    assert client.queue_info("leaving")["end_offset"] == 300  # the daemon serves on
    deadline = time.monotonic() + 10
    while sum(r.getMessage() == "api.client_disconnected" for r in caplog.records) < 3:
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.02)
    server = [r for r in caplog.records if r.name == "latticed.api.server.api_server"]
    assert not [r for r in server if r.levelno >= logging.WARNING or r.exc_info]


def test_stalled_tail_readers_get_smaller_batches_as_the_budget_fills(
    client: Client, daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stalled ``tail --follow`` reader holds one encoded batch; together they hold at most about
    the budget: once stalled readers hold most of it, a new reader's batches are small."""
    monkeypatch.setattr(tail_module, "TAIL_BUFFER_BUDGET", 4 << 20)
    client.queue_create("stalled")
    for _ in range(4):
        client.offer_batch("stalled", [(b"s" * 10_000, None, ())] * 100)
    readers = [Raw(daemon.socket) for _ in range(8)]
    try:
        for raw in readers:
            raw.send(request("tail", queue="stalled", follow=True))
            raw.wait_sender_blocked()
        held = daemon.call(_buffered)
        assert held <= (4 << 20) + 8 * MIN_TAIL_BATCH_BYTES  # not 8 full batches of 1 MiB
        late = Raw(daemon.socket)
        late.send(request("tail", queue="stalled", follow=True))
        first = late.reply()
        assert first is not None and first["ok"]
        assert sum(map(len, first["values"])) <= 256 << 10  # a quarter of what the others left, not 1 MiB
        late.close()
    finally:
        for raw in readers:
            raw.close()


async def _buffered() -> int:
    return tail_buffered_bytes()
