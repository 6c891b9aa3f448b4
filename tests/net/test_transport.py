"""The trio layer: handshake over memory streams and loopback TCP, error mapping, every failure end to end.

No sleeps: tests synchronize on the streams themselves; the timeout test runs on trio's autojump clock.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from support.passthrough_stream import PassThrough
from support.secure_pair import tcp_pair

from latticed.errors import (
    ConnectionClosedError,
    HandshakeError,
    LatticedError,
    LocalProtocolError,
    MalformedError,
    RemoteProtocolError,
)
from latticed.net import transport
from latticed.net.transport import MIN_PROGRESS_RATE, SecureStream, open_peer, secure_accept, secure_connect
from latticed.protocol.handshake import MSG1_SIZE, MSG2_SIZE, ReplayCache, public_key_from_seed

K = bytes(range(32))
OTHER_K = bytes(range(1, 33))
SEED_A, SEED_B, SEED_C = b"\x11" * 32, b"\x22" * 32, b"\x55" * 32
PK_A, PK_B, PK_C = (public_key_from_seed(s) for s in (SEED_A, SEED_B, SEED_C))


def trio_test(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(fn, *args, **kwargs))

    return wrapper


class TapStream(PassThrough):
    """Wraps a stream: records every ``send_all`` and lets a test rewrite outgoing bytes."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        super().__init__(inner)
        self.sent: list[bytes] = []
        self.hook: Callable[[bytes], bytes] | None = None

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        if self.hook is not None:
            data = self.hook(data)
        self.sent.append(data)
        if data:
            await self.inner.send_all(data)


async def connect_pair(
    client_kw: dict[str, Any] | None = None, server_kw: dict[str, Any] | None = None
) -> tuple[SecureStream, SecureStream, TapStream, TapStream]:
    """Handshake over a memory stream pair; both sides' raw writes are tapped."""
    left, right = trio.testing.memory_stream_pair()
    client_tap, server_tap = TapStream(left), TapStream(right)
    results: dict[str, SecureStream] = {}

    async def client() -> None:
        results["client"] = await secure_connect(
            client_tap, **{"seed": SEED_A, "network_key": K, **(client_kw or {})}
        )

    async def server() -> None:
        results["server"] = await secure_accept(
            server_tap, **{"seed": SEED_B, "network_key": K, **(server_kw or {})}
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        nursery.start_soon(server)
    return results["client"], results["server"], client_tap, server_tap


async def both_outcomes(
    client_kw: dict[str, Any], server_kw: dict[str, Any]
) -> tuple[BaseException | SecureStream, BaseException | SecureStream, TapStream, TapStream]:
    """Run the handshake and return each side's stream or exception."""
    left, right = trio.testing.memory_stream_pair()
    client_tap, server_tap = TapStream(left), TapStream(right)
    outcome: dict[str, BaseException | SecureStream] = {}

    async def side(
        name: str, fn: Callable[..., Awaitable[SecureStream]], stream: TapStream, **kw: Any
    ) -> None:
        try:
            outcome[name] = await fn(stream, **kw)
        except LatticedError as error:
            outcome[name] = error

    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(side, "client", secure_connect, client_tap, **client_kw))
        nursery.start_soon(functools.partial(side, "server", secure_accept, server_tap, **server_kw))
    return outcome["client"], outcome["server"], client_tap, server_tap


# -- success -------------------------------------------------------------------------------------------


@trio_test
async def test_roundtrip_both_directions_and_graceful_close() -> None:
    client, server, _, _ = await connect_pair()
    assert client.remote_public_key == PK_B and server.remote_public_key == PK_A
    assert client.handshake.session_id == server.handshake.session_id
    await client.send(b"ping")
    assert await server.receive() == b"ping"
    await server.send(b"pong" * 10_000)
    assert await client.receive() == b"pong" * 10_000
    await client.send_eof()
    assert await server.receive() is None
    assert await server.receive() is None  # stays ended
    await server.send(b"half-closed, still talking")
    assert await client.receive() == b"half-closed, still talking"
    await server.aclose()
    assert await client.receive() is None
    await client.aclose()
    with pytest.raises(ConnectionClosedError, match="closed locally"):
        await client.send(b"late")


@trio_test
async def test_send_many_shares_writes_and_keeps_every_frame_and_the_order() -> None:
    client, server, tap, _ = await connect_pair()
    tap.sent.clear()
    small = [b"m%d" % i for i in range(50)]
    await client.send_many(small)
    assert len(tap.sent) == 1  # a burst of small messages: one write
    big = [b"x" * 700_000, b"y" * 700_000, b"z"]
    tap.sent.clear()
    await client.send_many(big)
    assert len(tap.sent) == 2  # joined only up to about 1 MiB a write
    await client.send_many([])
    got = [await server.receive() for _ in range(len(small) + len(big))]
    assert got == small + big


class _Steps(trio.abc.Instrument):
    """Counts the scheduler passes (task steps) of one task."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task, self.steps = task, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


@trio_test
async def test_messages_already_read_are_received_without_a_scheduler_pass() -> None:
    """Several messages of one read come out one after the other without yielding: a relay's reader
    takes a delta and an ACK that arrived together in one pass (a free lock is no checkpoint)."""
    client, server, _, _ = await connect_pair()
    await client.send_many([b"one", b"two", b"three"])  # one write
    assert await server.receive() == b"one"  # reads the whole write
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        assert [await server.receive(), await server.receive()] == [b"two", b"three"]
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert steps.steps == 0


@trio_test
async def test_a_send_with_the_lock_free_yields_only_in_the_stream_write() -> None:
    client, server, tap, _ = await connect_pair()
    steps = _Steps(trio.lowlevel.current_task())
    in_write: list[int] = []
    inner_send = tap.send_all

    async def counted(data: bytes | bytearray | memoryview) -> None:
        before = steps.steps
        await inner_send(data)
        in_write.append(steps.steps - before)

    tap.send_all = counted  # type: ignore[method-assign]
    trio.lowlevel.add_instrument(steps)
    try:
        await client.send_many([b"a", b"b"])
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert len(in_write) == 1 and steps.steps == in_write[0]
    assert [await server.receive(), await server.receive()] == [b"a", b"b"]


@trio_test
async def test_over_tcp_a_send_and_a_read_that_need_no_wait_take_no_scheduler_pass() -> None:
    """On a TCP link a frame the socket takes at once is written directly, and bytes the socket holds
    already are read directly: no pass of trio's loop each (a relay sends and reads two per record)."""
    client, server, listener = await tcp_pair()
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        await client.send_many([b"delta"])
        sent_in = steps.steps
        await trio.testing.wait_all_tasks_blocked()  # (loopback: the bytes are there already)
        steps.steps = 0
        assert await server.receive() == b"delta"
        read_in = steps.steps
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert sent_in == 0 and read_in == 0
    for stream in (client, server, listener):
        await stream.aclose()


@trio_test
async def test_over_tcp_a_read_that_waits_reads_the_socket_itself_once_woken() -> None:
    """A reader that finds nothing waits for the socket to be readable and reads it directly: not
    through trio's receive_some, which would try the read that just failed again first; and after a
    read that emptied the socket it waits without trying a read that would fail."""
    client, server, listener = await tcp_pair()

    async def not_used(max_bytes: int | None = None) -> bytes:
        raise AssertionError("read through the stream")

    server._stream.receive_some = not_used  # type: ignore[method-assign]
    got: list[bytes | None] = []
    tries: list[bytes | None] = []
    read_now = server._read_now

    def counted() -> bytes | None:
        tries.append(read_now())
        return tries[-1]

    server._read_now = counted  # type: ignore[method-assign]

    async def read() -> None:
        got.append(await server.receive())

    for message in (b"late delta", b"the next one"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()  # waiting: the socket holds nothing yet
            assert got[-1:] != [message]
            await client.send_many([message])
    assert got == [b"late delta", b"the next one"]
    # The first wait tried a read first (nothing was known); after a read that emptied the socket, the
    # next one waited without trying: one read each once woken.
    assert len(tries) == 3 and tries[0] is None and None not in tries[1:]
    await client.aclose()
    assert await server.receive() is None
    for stream in (server, listener):
        await stream.aclose()


@trio_test
async def test_over_tcp_what_the_socket_does_not_take_at_once_follows_and_a_flood_still_yields() -> None:
    """More than the socket's buffers: the part written directly and the rest, sent as the peer reads,
    arrive whole and in order; a reader that finds data at every read still lets the others run."""
    client, server, listener = await tcp_pair()
    bigs = [bytes([i]) * 1_000_000 for i in range(8)]  # more than loopback buffers
    others = 0

    async def other_task() -> None:
        nonlocal others
        while True:
            others += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send_many, [*bigs, b"end"])
        await trio.testing.wait_all_tasks_blocked()  # the socket holds what it takes, the rest waits
        nursery.start_soon(other_task)
        assert await server.receive() == bigs[0]  # 1 MB: more reads than go by without a yield
        assert others > 0
        assert [await server.receive() for _ in bigs[1:]] == bigs[1:]
        assert await server.receive() == b"end"
        nursery.cancel_scope.cancel()
    await client.aclose()
    assert await server.receive() is None
    await server.aclose()
    await listener.aclose()
    with pytest.raises(ConnectionClosedError, match="closed locally"):
        await client.send(b"late")


@trio_test
async def test_concurrent_send_and_receive() -> None:
    client, server, _, _ = await connect_pair()
    count = 200

    async def pump(sender: SecureStream, tag: bytes) -> None:
        for i in range(count):
            await sender.send(tag + i.to_bytes(4, "big"))
        await sender.send_eof()

    async def collect(receiver: SecureStream, tag: bytes) -> None:
        got = []
        while (message := await receiver.receive()) is not None:
            got.append(message)
        assert got == [tag + i.to_bytes(4, "big") for i in range(count)]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, client, b"c")
        nursery.start_soon(pump, server, b"s")
        nursery.start_soon(collect, server, b"c")
        nursery.start_soon(collect, client, b"s")
    await client.aclose()
    await server.aclose()


@trio_test
async def test_allow_lists_accept() -> None:
    client, server, _, _ = await connect_pair({"allowed": {PK_B}}, {"allowed": lambda pk: pk == PK_A})
    await client.send(b"ok")
    assert await server.receive() == b"ok"


@trio_test
async def test_loopback_tcp() -> None:
    received: list[bytes] = []

    async def handler(stream: trio.SocketStream) -> None:
        secure = await secure_accept(stream, seed=SEED_B, network_key=K, allowed={PK_A})
        while (message := await secure.receive()) is not None:
            received.append(message)
            await secure.send(message.upper())
        await secure.send_eof()
        await secure.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        peer = await open_peer("127.0.0.1", port, seed=SEED_A, public_key=PK_A, network_key=K, allowed={PK_B})
        assert peer.remote_public_key == PK_B
        for message in (b"hello", b"x" * 200_000, b""):
            await peer.send(message)
            assert await peer.receive() == message.upper()
        await peer.send_eof()
        assert await peer.receive() is None
        await peer.aclose()
        nursery.cancel_scope.cancel()
    assert received == [b"hello", b"x" * 200_000, b""]


@trio_test
async def test_loopback_tcp_wrong_network_key() -> None:
    server_errors: list[BaseException] = []

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await secure_accept(stream, seed=SEED_B, network_key=K)
        except HandshakeError as error:
            server_errors.append(error)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(HandshakeError, match="hung up during the handshake"):
            await open_peer("127.0.0.1", port, seed=SEED_A, network_key=OTHER_K)
        nursery.cancel_scope.cancel()
    assert len(server_errors) == 1 and "network key" in str(server_errors[0])


@trio_test
async def test_open_peer_connection_refused() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionClosedError, match="cannot connect"):
        await open_peer("127.0.0.1", port, seed=SEED_A, network_key=K)


# -- handshake failures --------------------------------------------------------------------------------


@trio_test
async def test_wrong_network_key_both_fail_and_responder_reveals_nothing() -> None:
    client, server, _, server_tap = await both_outcomes(
        {"seed": SEED_A, "network_key": OTHER_K}, {"seed": SEED_B, "network_key": K}
    )
    assert isinstance(client, HandshakeError)
    assert isinstance(server, HandshakeError) and "network key" in str(server)
    assert b"".join(server_tap.sent) == b""  # not a single byte, let alone an identity


@trio_test
async def test_unlisted_initiator_is_dropped_before_responder_reveals_itself() -> None:
    client, server, client_tap, server_tap = await both_outcomes(
        {"seed": SEED_A, "network_key": K}, {"seed": SEED_B, "network_key": K, "allowed": {PK_C}}
    )
    assert isinstance(server, HandshakeError) and PK_A.hex() in str(server)
    assert isinstance(client, HandshakeError)
    sent = b"".join(server_tap.sent)
    assert len(sent) == MSG2_SIZE and PK_B not in sent
    assert PK_A not in b"".join(client_tap.sent)  # the initiator's identity went encrypted


@trio_test
async def test_initiator_rejects_unlisted_responder() -> None:
    client, server, _, _ = await both_outcomes(
        {"seed": SEED_A, "network_key": K, "allowed": {PK_C}}, {"seed": SEED_B, "network_key": K}
    )
    assert isinstance(client, HandshakeError) and PK_B.hex() in str(client)
    # The responder finished its side; it then sees the initiator vanish without a final frame.
    assert isinstance(server, SecureStream)
    with pytest.raises(ConnectionClosedError, match="cut off"):
        await server.receive()


@pytest.mark.parametrize("offset", [0, 40, 63, 64 + 5, 64 + 111])
@trio_test
async def test_tampered_handshake_in_flight(offset: int) -> None:
    left, right = trio.testing.memory_stream_pair()
    client_tap = TapStream(left)
    position = [0]

    def flip(data: bytes) -> bytes:
        start = position[0]
        position[0] += len(data)
        if start <= offset < start + len(data):
            i = offset - start
            data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1 :]
        return data

    client_tap.hook = flip
    outcome: list[BaseException] = []

    async def side(fn: Callable[[], Awaitable[SecureStream]]) -> None:
        try:
            await fn()
        except LatticedError as error:
            outcome.append(error)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(side, functools.partial(secure_connect, client_tap, seed=SEED_A, network_key=K))
        nursery.start_soon(side, functools.partial(secure_accept, right, seed=SEED_B, network_key=K))
    assert len(outcome) == 2 and all(isinstance(e, HandshakeError) for e in outcome)


@trio_test
async def test_garbage_instead_of_handshake() -> None:
    left, right = trio.testing.memory_stream_pair()

    async def send_garbage() -> None:
        await left.send_all(b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n" * 3)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_garbage)
        with pytest.raises(HandshakeError):
            await secure_accept(right, seed=SEED_B, network_key=K)
    # The stream was closed on failure.
    with pytest.raises(trio.BrokenResourceError):
        await left.send_all(b"more")


@trio_test
async def test_a_recorded_opening_replayed_to_the_same_daemon_gets_no_answer() -> None:
    """An eavesdropper records msg1 of a real connection and replays it: the responder writes nothing
    and hangs up, so the replay does not reveal that it shares the initiator's network key."""
    cache = ReplayCache()
    client, server, client_tap, _ = await connect_pair(server_kw={"replay_cache": cache})
    await client.aclose()
    await server.aclose()
    recorded_msg1 = client_tap.sent[0]
    assert len(recorded_msg1) == MSG1_SIZE
    left, right = trio.testing.memory_stream_pair()
    tap = TapStream(right)
    await left.send_all(recorded_msg1)
    with pytest.raises(HandshakeError, match="seen before"):
        await secure_accept(tap, seed=SEED_B, network_key=K, replay_cache=cache)
    assert tap.sent == []
    with pytest.raises(trio.BrokenResourceError):
        await left.send_all(b"more")


@trio_test
async def test_short_garbage_then_hang_up() -> None:
    left, right = trio.testing.memory_stream_pair()
    await left.send_all(b"hi")
    await left.aclose()
    with pytest.raises(HandshakeError, match="hung up"):
        await secure_accept(right, seed=SEED_B, network_key=K)


def test_handshake_timeout() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        start = trio.current_time()
        with pytest.raises(ConnectionClosedError, match="not completed within 5"):
            await secure_connect(left, seed=SEED_A, network_key=K, timeout=5)
        assert trio.current_time() - start == pytest.approx(5)
        assert await right.receive_some() != b""  # msg1 went out before the silence

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@trio_test
async def test_bad_local_arguments_close_the_stream() -> None:
    left, right = trio.testing.memory_stream_pair()
    with pytest.raises(MalformedError):
        await secure_connect(left, seed=b"short", network_key=K)
    assert await right.receive_some() == b""


# -- failures after the handshake ----------------------------------------------------------------------


@trio_test
async def test_tampered_frame() -> None:
    client, server, client_tap, _ = await connect_pair()
    client_tap.hook = lambda data: data[:-1] + bytes([data[-1] ^ 1])
    await client.send(b"transfer 10 coins")
    with pytest.raises(RemoteProtocolError, match="failed authentication"):
        await server.receive()
    with pytest.raises(RemoteProtocolError, match="already failed"):
        await server.receive()


@trio_test
async def test_replayed_frame() -> None:
    client, server, client_tap, _ = await connect_pair()
    await client.send(b"transfer 10 coins")
    assert await server.receive() == b"transfer 10 coins"
    await client_tap.inner.send_all(client_tap.sent[-1])  # the attacker re-sends the recorded frame
    with pytest.raises(RemoteProtocolError, match="failed authentication"):
        await server.receive()


@trio_test
async def test_reordered_frames() -> None:
    client, server, client_tap, _ = await connect_pair()
    held: list[bytes] = []

    def swap(data: bytes) -> bytes:
        if not held:
            held.append(data)
            return b""
        return data + held.pop()

    client_tap.hook = swap
    await client.send(b"first")
    await client.send(b"second")
    with pytest.raises(RemoteProtocolError):
        await server.receive()


@trio_test
async def test_cut_off_stream_is_not_a_clean_end() -> None:
    client, server, client_tap, _ = await connect_pair()
    await client.send(b"partial work")
    await client_tap.inner.aclose()  # the connection dies: no final frame
    assert await server.receive() == b"partial work"
    with pytest.raises(ConnectionClosedError, match="cut off"):
        await server.receive()


@trio_test
async def test_cut_off_inside_a_frame() -> None:
    client, server, client_tap, _ = await connect_pair()
    client_tap.hook = lambda data: data[: len(data) // 2]
    await client.send(b"x" * 1000)
    await client_tap.inner.aclose()
    with pytest.raises(ConnectionClosedError, match="cut off"):
        await server.receive()


@trio_test
async def test_oversized_frame() -> None:
    client, server, _, _ = await connect_pair({"max_message_size": 5000}, {"max_message_size": 1000})
    with pytest.raises(LocalProtocolError):
        await server.send(b"x" * 1001)
    await client.send(b"x" * 1001)
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        await server.receive()


@trio_test
async def test_garbage_after_handshake() -> None:
    _, server, client_tap, _ = await connect_pair()
    await client_tap.inner.send_all(b"\x00\x00\x00\x20" + bytes(32))
    with pytest.raises(RemoteProtocolError):
        await server.receive()


@trio_test
async def test_peer_gone_on_send() -> None:
    client, _, _, server_tap = await connect_pair()
    await server_tap.inner.aclose()
    with pytest.raises(ConnectionClosedError):
        for _ in range(3):  # memory streams may accept a write before noticing
            await client.send(b"anyone there?")
    with pytest.raises(ConnectionClosedError):
        await client.send(b"still?")


@trio_test
async def test_aclose_sends_final_frame() -> None:
    client, server, _, _ = await connect_pair()
    await client.send(b"last words")
    await client.aclose()
    await client.aclose()  # idempotent
    assert await server.receive() == b"last words"
    assert await server.receive() is None


def test_send_timeout_gives_up_on_a_stalled_peer_not_on_a_slow_one() -> None:
    async def main() -> None:
        left, right = trio.testing.lockstep_stream_pair()  # a send returns once the other side read it
        streams: dict[str, SecureStream] = {}

        async def side(
            name: str, fn: Callable[..., Awaitable[SecureStream]], stream: Any, seed: bytes
        ) -> None:
            streams[name] = await fn(stream, seed=seed, network_key=K)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(side, "client", secure_connect, left, SEED_A)
            nursery.start_soon(side, "server", secure_accept, right, SEED_B)
        client, server = streams["client"], streams["server"]
        client.send_timeout = 5.0
        raw = server.transport_stream

        async def slow_reader(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                while True:
                    await trio.sleep(0.8)  # 5 KiB/s: slow, but above the floor rate
                    await raw.receive_some(4096)

        async with trio.open_nursery() as nursery:
            reader = await nursery.start(slow_reader)
            start = trio.current_time()
            await client.send(b"x" * 300_000)  # ~60 s at 5 KiB/s: slow, never stalled
            assert trio.current_time() - start >= 300_000 / MIN_PROGRESS_RATE / 2
            reader.cancel()
        start = trio.current_time()
        with pytest.raises(ConnectionClosedError, match="stopped reading"):
            await client.send(b"nobody reads this")
        assert trio.current_time() - start == pytest.approx(5)
        assert client.send_stalled
        with pytest.raises(ConnectionClosedError, match="unusable"):
            await client.send(b"more")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@trio_test
async def test_over_tcp_a_final_frame_not_yet_read_still_tells_a_clean_end_and_a_cut_does_not() -> None:
    """A link that ends on a failed send while the peer's final frame waits unread in the socket was
    closed on purpose by the peer (``link-gone`` names only a link that died): ``peer_ended`` reads what
    the socket holds for it, without waiting. A stream cut off without the frame is no clean end."""
    client, server, listener = await tcp_pair()
    await client.send_many([b"unread", b"also unread"])
    await client.aclose()  # its final frame follows them
    await trio.testing.wait_all_tasks_blocked()
    assert server.peer_ended() and server.peer_ended()  # read once, then known
    await server.aclose()
    client, server, _ = await tcp_pair()
    await client.send_many([b"unread"])
    await trio.aclose_forcefully(client.transport_stream)  # the connection dies: no final frame
    await trio.testing.wait_all_tasks_blocked()
    assert not server.peer_ended()
    await server.aclose()
    await listener.aclose()


@trio_test
async def test_a_send_the_peer_does_not_take_says_since_when_it_waits() -> None:
    """``blocked_since`` is set while a send waits for the peer to take it, and cleared once it went:
    a link whose writer waits long is dead on that side when its peer dials again (``link-gone``)."""
    left, right = trio.testing.lockstep_stream_pair()  # a send returns once the other side read it
    streams: dict[str, SecureStream] = {}

    async def side(name: str, fn: Callable[..., Awaitable[SecureStream]], stream: Any, seed: bytes) -> None:
        streams[name] = await fn(stream, seed=seed, network_key=K)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(side, "client", secure_connect, left, SEED_A)
        nursery.start_soon(side, "server", secure_accept, right, SEED_B)
    client, server = streams["client"], streams["server"]
    assert client.blocked_since is None
    async with trio.open_nursery() as nursery:
        before = trio.current_time()
        nursery.start_soon(client.send, b"nobody reads this yet")
        await trio.testing.wait_all_tasks_blocked()
        since = client.blocked_since
        assert since is not None and before <= since <= trio.current_time()
        assert await server.receive() == b"nobody reads this yet"
    assert client.blocked_since is None


@trio_test
async def test_over_tcp_only_the_peers_own_final_frame_tells_a_clean_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``peer_ended`` decrypts what the socket holds: bytes someone in the middle wrote (a forged frame, or
    the final frame of another session of the same two identities) fail authentication, so the link counts
    as lost (it is named on a redial), and nothing is raised into the link's task. What the peer floods is
    read at most ``_MAX_END_READS`` times (no loop held); a stream closed here reads nothing."""
    client, server, listener = await tcp_pair()
    other_client, other_server, other_listener = await tcp_pair()
    await other_client.send(b"x")
    replayed = other_client._channel.close()  # a genuine final frame, of another session
    forged = replayed[:4] + bytes(len(replayed) - 4)
    assert forged != replayed  # the same length prefix: only the cipher text tells them apart
    for injected in (replayed, forged):
        client2, server2, listener2 = await tcp_pair()
        await client2.transport_stream.send_all(injected)  # under the channel: as if on the path
        await trio.testing.wait_all_tasks_blocked()
        assert not server2.peer_ended()
        assert not server2.peer_ended()  # the failed channel raises nothing the second time either
        await server2.aclose()
        await trio.aclose_forcefully(client2.transport_stream)
        await listener2.aclose()
    monkeypatch.setattr(transport, "_MAX_END_READS", 1)
    async with trio.open_nursery() as nursery:  # (the kernel may not take it all while no one reads)

        async def flood() -> None:
            await client.send_many([bytes(40_000), bytes(40_000)])  # two reads of 64 KiB
            await client.send_eof()  # the final frame, past them

        nursery.start_soon(flood)
        await trio.testing.wait_all_tasks_blocked()
        assert not server.peer_ended()  # bounded: anything past its one read is left unread
        nursery.cancel_scope.cancel()
    await server.aclose()
    assert not server.peer_ended()  # closed here: nothing read, nothing raised
    for stream in (other_client, other_server):
        await stream.aclose()
    await listener.aclose()
    await other_listener.aclose()
