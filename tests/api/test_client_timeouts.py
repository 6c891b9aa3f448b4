"""The blocking client's timeouts, against tiny servers (no daemon): the kernel bounds each wait
(``SO_RCVTIMEO``/``SO_SNDTIMEO`` on a blocking socket, no ``poll`` before every send and receive), a daemon
that never answers or never reads still times out with a one-line typed error, and requests still go out
with increasing ids and come back as before."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest

from latticed.api.client.blocking_client import _FIRST_READ, Client, set_timeout
from latticed.api.messages import API_VERSION, Packed, pack
from latticed.errors import ConnectionClosedError, RemoteProtocolError
from latticed.protocol.framing import FrameDecoder

_TIMEVAL = struct.Struct("@ll")


def _kernel_timeouts(sock: socket.socket) -> tuple[tuple[int, int], tuple[int, int]]:
    size = _TIMEVAL.size
    receive = _TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, size))
    send = _TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, size))
    return receive, send


Handler = Callable[[socket.socket, list[dict[str, object]]], None]


def _silent(conn: socket.socket, seen: list[dict[str, object]]) -> None:
    """Reads every request and never answers (until the client hangs up)."""
    decoder = FrameDecoder(1 << 24)
    while data := conn.recv(1 << 16):
        seen.extend(msgpack.unpackb(frame) for frame in decoder.feed(data))


def _answering(conn: socket.socket, seen: list[dict[str, object]]) -> None:
    """Answers each offer at once with its id and an offset."""
    decoder = FrameDecoder(1 << 24)
    while data := conn.recv(1 << 16):
        for frame in decoder.feed(data):
            request = msgpack.unpackb(frame)
            seen.append(request)
            body = msgpack.packb({"ok": True, "id": request["id"], "offset": 40 + len(seen)})
            conn.sendall(struct.pack(">I", len(body)) + body)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Handler], tuple[Path, list[dict[str, object]]]]]:
    """Starts a one-connection server running ``handler``; joins it at the end."""
    threads: list[threading.Thread] = []
    listeners: list[socket.socket] = []

    def start(handler: Handler) -> tuple[Path, list[dict[str, object]]]:
        path = tmp_path / f"s{len(threads)}.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)
        listeners.append(listener)
        seen: list[dict[str, object]] = []

        def run() -> None:
            conn, _ = listener.accept()
            with conn:
                handler(conn, seen)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return path, seen

    yield start
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    for listener in listeners:
        listener.close()


def test_the_socket_blocks_and_the_kernel_bounds_each_wait(
    serve: Callable[[Handler], tuple[Path, list[dict[str, object]]]],
) -> None:
    path, seen = serve(_answering)
    with Client(path, timeout=3.0) as client:
        assert client.offer("q", b"v") == 41
        assert client.offer("q", b"w", key=b"k") == 42
        conn = client._conn
        assert conn is not None and conn.sock is not None
        assert conn.sock.gettimeout() is None  # no poll before every send and receive
        assert _kernel_timeouts(conn.sock) == ((3, 0), (3, 0))  # whole seconds: exact at any HZ
    assert [r["id"] for r in seen] == [1, 2]
    assert [(r["op"], r["queue"], r["value"], r["key"]) for r in seen] == [
        ("offer", "q", b"v", None),
        ("offer", "q", b"w", b"k"),
    ]


def test_a_daemon_that_never_answers_times_out(
    serve: Callable[[Handler], tuple[Path, list[dict[str, object]]]],
) -> None:
    path, seen = serve(_silent)
    client = Client(path, timeout=0.2)
    started = time.monotonic()
    never = r"^latticed at .* did not answer within 0\.2s$"
    with pytest.raises(ConnectionClosedError, match=never) as caught:
        client.offer("q", b"v")
    elapsed = time.monotonic() - started
    assert 0.19 <= elapsed < 5
    assert "\n" not in str(caught.value)  # one line for the CLI
    assert client._conn is not None and client._conn.sock is None  # the connection is dropped
    client.close()
    assert [r["op"] for r in seen] == ["offer"]


def test_a_waiting_offer_times_out_after_its_wait_and_restores_the_timeout(
    serve: Callable[[Handler], tuple[Path, list[dict[str, object]]]],
) -> None:
    path, _ = serve(_silent)
    client = Client(path, timeout=0.1)
    started = time.monotonic()
    with pytest.raises(ConnectionClosedError, match="did not answer within"):
        client.offer("q", b"v", wait=0.2)
    assert time.monotonic() - started >= 0.29  # the timeout grew by the wait
    client.close()

    path, _ = serve(_answering)
    with Client(path, timeout=1.0) as client:
        assert client.offer("q", b"v", wait=3.0) == 41
        conn = client._conn
        assert conn is not None and conn.sock is not None
        assert _kernel_timeouts(conn.sock) == ((1, 0), (1, 0))  # back to the client's own


def test_a_daemon_that_never_reads_times_out_on_send(
    serve: Callable[[Handler], tuple[Path, list[dict[str, object]]]],
) -> None:
    hung_up = threading.Event()

    def deaf(conn: socket.socket, seen: list[dict[str, object]]) -> None:
        hung_up.wait(10)  # accepts, never reads, until the test is done

    path, _ = serve(deaf)
    client = Client(path, timeout=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionClosedError, match=r"did not take the request within 0\.2s$"):
            client.offer("q", b"x" * (8 << 20))  # far more than the socket buffers hold
        assert 0.19 <= time.monotonic() - started < 5
        assert client._conn is not None and client._conn.sock is None
    finally:
        hung_up.set()
        client.close()


def test_no_timeout_waits_for_ever_and_tiny_ones_are_not_for_ever() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        set_timeout(a, None)
        assert a.gettimeout() is None
        assert _kernel_timeouts(a) == ((0, 0), (0, 0))  # 0: no bound
        set_timeout(a, 1e-9)
        receive, send = _kernel_timeouts(a)
        assert receive == send and receive[0] == 0 and 0 < receive[1] <= 10_000  # a tick, never 0 (for ever)
        set_timeout(a, 0)  # Python's non-blocking meaning is kept
        assert a.gettimeout() == 0.0
        with pytest.raises(BlockingIOError):
            a.recv(1)


class _Scripted:
    """Stands in for the client's socket: ``recv`` hands out the given pieces in turn, then end of stream."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def recv(self, size: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    def close(self) -> None:
        pass


def _reply(rid: int, offset: int) -> bytes:
    body = msgpack.packb({"ok": True, "id": rid, "offset": offset, "pad": b"p" * 300})
    return struct.pack(">I", len(body)) + body


def test_replies_in_pieces_or_with_more_behind_them_are_read_as_before(
    serve: Callable[[Handler], tuple[Path, list[dict[str, object]]]],
) -> None:
    """The client reads a reply that came whole in one read without its frame decoder; every other shape
    still goes through the decoder: a reply cut anywhere, and a reply with bytes behind it."""
    path, _ = serve(_silent)
    with Client(path, timeout=3.0) as client:
        client._conn = conn = client.open_stream(3.0)
        real = conn.sock
        assert real is not None
        pieces = [_reply(1, 41)]  # whole in one read
        pieces += [(r := _reply(2, 42))[:1], r[1:]]  # the header cut
        pieces += [(r := _reply(3, 43))[:100], r[100:200], r[200:]]  # the body cut twice
        pieces += [_reply(4, 44) + _reply(5, 45)[:3], _reply(5, 45)[3:]]  # the next reply begun behind it
        pieces += [_reply(6, 46) + _reply(6, 46)]  # a whole second reply behind it
        conn.sock = fake = _Scripted(pieces)  # type: ignore[assignment]
        assert [client.offer("q", b"v") for _ in range(6)] == [41, 42, 43, 44, 45, 46]
        with pytest.raises(RemoteProtocolError, match="reply for request 6 while waiting for 7"):
            client.offer("q", b"v")  # the second one was kept in the decoder and is taken next
        assert [msgpack.unpackb(frame[4:])["id"] for frame in fake.sent] == [1, 2, 3, 4, 5, 6, 7]
        assert fake.pieces == []
        real.close()


def _recording(raw: list[bytes], answer: Callable[[], dict[str, object]]) -> Handler:
    """A server keeping each request's frame in ``raw`` and answering it ok with ``answer()``'s fields."""

    def handler(conn: socket.socket, seen: list[dict[str, object]]) -> None:
        decoder = FrameDecoder(1 << 24)
        while data := conn.recv(1 << 16):
            for frame in decoder.feed(data):
                raw.append(bytes(frame))
                body = msgpack.packb({"ok": True, "id": msgpack.unpackb(frame)["id"], **answer()})
                conn.sendall(struct.pack(">I", len(body)) + body)

    return handler


def test_a_request_is_packed_as_messages_pack_packs_it(
    serve: Callable[[Handler], tuple[Path, list[dict[str, object]]]],
) -> None:
    raw: list[bytes] = []
    path, _ = serve(_recording(raw, lambda: {"offset": len(raw)}))
    with Client(path, timeout=3.0) as client:
        client.offer("q", b"v")  # opens the connection through ``call``
        client.offer("q", b"w", key=b"k", headers={"h": b"1"})  # the single offer's own path
        client.offer("q", b"x", producer="p", seq=3)
    assert raw == [
        pack(
            {
                "v": API_VERSION,
                "id": 1,
                "op": "offer",
                "queue": "q",
                "value": b"v",
                "key": None,
                "headers": None,
            }
        ),
        pack(
            {
                "v": API_VERSION,
                "id": 2,
                "op": "offer",
                "queue": "q",
                "value": b"w",
                "key": b"k",
                "headers": [["h", b"1"]],
            }
        ),
        pack(
            {
                "v": API_VERSION,
                "id": 3,
                "op": "offer",
                "producer": "p",
                "seq": 3,
                "queue": "q",
                "value": b"x",
                "key": None,
                "headers": None,
            }
        ),
    ]


def test_a_reply_larger_than_the_first_read_and_a_pre_packed_value_go_through_as_before(
    serve: Callable[[Handler], tuple[Path, list[dict[str, object]]]],
) -> None:
    """The first read for a reply is short (its buffer from the heap, not an ``mmap`` a reply): a reply
    several times its size is read whole; a request holding a pre-packed value goes out spliced, as
    ``messages.pack`` sends it, not as the connection's kept ``Packer`` would pack a ``bytes``."""
    raw: list[bytes] = []
    big = b"b" * (3 * _FIRST_READ + 5)
    path, _ = serve(_recording(raw, lambda: {"value": big}))
    spliced = Packed.of([1, 2])
    with Client(path, timeout=3.0) as client:
        assert client.call("echo")["value"] == big
        assert client.call("echo", items=spliced)["value"] == big
    assert raw[1] == pack({"v": API_VERSION, "id": 2, "op": "echo", "items": spliced})
    assert msgpack.unpackb(raw[1])["items"] == [1, 2]  # spliced in as packed, not a bin of its bytes
