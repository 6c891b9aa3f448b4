"""A slow honest link (a laptop on thin Wi-Fi catching up) is not dropped as silent while a large
message's bytes arrive, and a trickle of bytes that never makes a message still is. Virtual time
(trio's autojump clock), memory streams paced by the clock: no test here sleeps for real."""

from __future__ import annotations

import logging
import struct

import pytest
import trio
import trio.testing
from support.passthrough_stream import PassThrough
from test_gossip import ALICE, MemoryHost, make

from latticed.crdt import queue as core
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack
from latticed.errors import ConnectionClosedError
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.gossip import PEER_TIMEOUT_S, PING_INTERVAL_S, SEND_TIMEOUT_S
from latticed.net.transport import MIN_PROGRESS_RATE, SecureStream, secure_accept, secure_connect
from latticed.process.logs import FIELDS_ATTR
from latticed.protocol.replication import HELLO, PROTOCOL_VERSION
from latticed.protocol.secure import ABYTES, DEFAULT_MAX_MESSAGE_SIZE

#: Below the ~17 KB/s at which a 512 KiB message fits in the 30 s silence bound.
SLOW_RATE = 8 * 1024
#: One record's value: the delta carrying them is far larger than SLOW_RATE * PEER_TIMEOUT_S.
VALUE = 48 * 1024


class Paced(PassThrough):
    """A stream whose sends go out at ``rate`` bytes a second, a piece a tenth of a second."""

    def __init__(self, inner: trio.abc.HalfCloseableStream, rate: int) -> None:
        super().__init__(inner)
        self.rate = rate

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        step = max(1, self.rate // 10)
        for start in range(0, len(view), step):
            await self.inner.send_all(view[start : start + step])
            await trio.sleep(0.1)


def _write_big(host: MemoryHost, records: int) -> None:
    key = (ALICE.public_key, "q", 0)
    state = core.empty_state(ALICE.public_key, "q")
    values = [bytes([i]) * VALUE for i in range(records)]
    state = core.commit(state, ALICE, now_ms=1, records=[Record(value=v) for v in values])
    host.states[key] = state
    assert host.gossip is not None
    host.gossip.local_change(key, state.summary())


async def test_a_large_delta_over_a_slow_link_arrives_and_the_link_is_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """~430 KiB of records at 8 KiB/s: each end hears no whole message from the other for far longer
    than PEER_TIMEOUT_S while the delta's bytes arrive; the link stays up and the records arrive."""
    a, b = make(b"1" * 32), make(b"2" * 32)
    _write_big(a[1], 9)
    key = (ALICE.public_key, "q", 0)
    left, right = trio.testing.memory_stream_pair()
    ended: list[str] = []

    async def dial() -> None:
        stream = await secure_connect(Paced(left, SLOW_RATE), seed=a[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await a[2].run_peer(stream, "mem", "static")
        ended.append("dialler")

    async def accept() -> None:
        stream = await secure_accept(right, seed=b[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await b[2].run_peer(stream, "mem", "incoming")
        ended.append("acceptor")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dial)
        nursery.start_soon(accept)
        with trio.move_on_after(600):
            while key not in b[1].states or b[1].states[key].held_end < 9:
                await b[1].changed.wait()
        took = trio.current_time() - start
        links = (set(a[2].links), set(b[2].links))
        nursery.cancel_scope.cancel()
    assert ended == []  # neither end gave the link up
    assert links == ({b[0].public_key}, {a[0].public_key})
    assert b[1].states[key] == a[1].states[key]
    assert took > PEER_TIMEOUT_S + PING_INTERVAL_S  # silence this long would have ended the link


async def _trickle(rate: int, declared: int, caplog: pytest.LogCaptureFixture) -> tuple[float, str]:
    """A peer (or someone on its path) that says HELLO, then writes a frame header declaring ``declared``
    bytes and garbage after it at ``rate`` bytes a second, forever: how long the daemon kept the link
    after the header, and why it ended the link."""
    caplog.set_level(logging.INFO, logger="latticed")
    identity, _, daemon = make(b"1" * 32)
    peer = Identity.from_seed(b"8" * 32)
    ours, theirs = trio.testing.memory_stream_pair()
    began: list[float] = []

    async def attacker() -> None:
        stream = await secure_accept(theirs, seed=peer.seed, network_key=DEFAULT_NETWORK_KEY)
        await stream.send(pack([HELLO, PROTOCOL_VERSION, None]))
        await trio.sleep(1.0)
        began.append(trio.current_time())
        await theirs.send_all(struct.pack(">I", declared))
        while True:
            await theirs.send_all(b"\x00" * (rate // 10))
            await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(attacker)
        stream = await secure_connect(ours, seed=identity.seed, network_key=DEFAULT_NETWORK_KEY)
        await daemon.run_peer(stream, "mem", "static")  # until given up
        nursery.cancel_scope.cancel()
    assert not daemon.links
    [record] = [r for r in caplog.records if r.getMessage() == "peer.disconnected"]
    return trio.current_time() - began[0], str(getattr(record, FIELDS_ATTR)["reason"])


async def test_a_trickle_below_the_floor_rate_is_given_up_as_silent(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage at a quarter of MIN_PROGRESS_RATE: each byte buys 1/MIN_PROGRESS_RATE s, so the credit
    falls behind the clock and the silence bound ends the link (here within 40 s plus a tick),
    long before the frame could complete."""
    kept, reason = await _trickle(MIN_PROGRESS_RATE // 4, 1 << 20, caplog)
    assert "silent" in reason
    assert kept <= PEER_TIMEOUT_S / (1 - 1 / 4) + PING_INTERVAL_S + 1.0


async def test_a_trickle_at_the_floor_rate_ends_when_its_frame_fails_authentication(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage fast enough to count as heard holds the link only until the frame's declared length,
    at most the message-size bound, has arrived: then it fails authentication."""
    declared = 256 * 1024
    kept, reason = await _trickle(2 * MIN_PROGRESS_RATE, declared, caplog)
    assert "authentication" in reason
    assert declared / (2 * MIN_PROGRESS_RATE) - 1.0 <= kept <= declared / (2 * MIN_PROGRESS_RATE) + 1.0


async def test_a_frame_declared_past_the_message_size_bound_is_refused_at_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An endless frame cannot be declared: a length past max_message_size ends the link at its header."""
    kept, reason = await _trickle(MIN_PROGRESS_RATE, (1 << 20) + ABYTES + 1, caplog)
    assert "exceeds the limit" in reason
    assert kept <= 0.2


async def test_progress_is_credited_at_most_at_the_floor_rate(autojump_clock: trio.testing.MockClock) -> None:
    """SecureStream.progress_at follows a frame arriving at twice the floor rate to its last read, lags
    one arriving at a quarter of it by all but the bytes' worth at the floor rate, and a whole message
    ends the frame's credit (the next frame's counts from its own first bytes)."""
    a, b = Identity.from_seed(b"1" * 32), Identity.from_seed(b"2" * 32)
    left, right = trio.testing.memory_stream_pair()
    paced = Paced(left, 2 * MIN_PROGRESS_RATE)
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:
        dialled: list[SecureStream] = []
        done = trio.Event()

        async def dial() -> None:
            dialled.append(await secure_connect(paced, seed=a.seed, network_key=DEFAULT_NETWORK_KEY))
            done.set()

        nursery.start_soon(dial)
        ours = await secure_accept(right, seed=b.seed, network_key=DEFAULT_NETWORK_KEY)
        await done.wait()
        theirs = dialled[0]
        assert ours.progress_at == float("-inf")

        async def receive() -> None:
            while (message := await ours.receive()) is not None:
                received.append(message)

        nursery.start_soon(receive)
        start = trio.current_time()
        nursery.start_soon(theirs.send, b"x" * 64 * 1024)  # 8 s at twice the floor rate
        await trio.sleep(4.05)
        assert trio.current_time() - 0.2 <= ours.progress_at <= trio.current_time()
        await trio.sleep(5.0)
        assert received == [b"x" * 64 * 1024]
        assert ours.progress_at <= start + 8.2
        paced.rate = MIN_PROGRESS_RATE // 4
        begun = trio.current_time()
        nursery.start_soon(theirs.send, b"y" * 64 * 1024)  # 64 s at a quarter of the floor rate
        await trio.sleep(40.0)
        credit = ours.progress_at - begun
        assert 40.0 / 4 - 0.5 <= credit <= 40.0 / 4 + 0.1  # 10 KiB's worth: 2.5 s at the floor rate each KiB
        nursery.cancel_scope.cancel()


async def _one_message(rate: int, dialler_sends: bool, send_timeout: float | None) -> tuple[bool, float]:
    """One message of ``max_message_size`` bytes sent over a link whose sender's stream takes ``rate``
    bytes a second: whether the send went through (``send_timeout`` on the sender), and how far the
    receiver's ``progress_at`` fell behind the clock while the bytes arrived (the silence check's
    measure: past PEER_TIMEOUT_S it gives the link up)."""
    a, b = Identity.from_seed(b"1" * 32), Identity.from_seed(b"2" * 32)
    left, right = trio.testing.memory_stream_pair()
    ends: dict[str, SecureStream] = {}
    lags: list[float] = []
    arrived = trio.Event()

    async def dial() -> None:
        stream = Paced(left, rate) if dialler_sends else left
        ends["dialler"] = await secure_connect(stream, seed=a.seed, network_key=DEFAULT_NETWORK_KEY)

    async def accept() -> None:
        stream = right if dialler_sends else Paced(right, rate)
        ends["acceptor"] = await secure_accept(stream, seed=b.seed, network_key=DEFAULT_NETWORK_KEY)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dial)
        nursery.start_soon(accept)
    sender, receiver = (
        (ends["dialler"], ends["acceptor"]) if dialler_sends else (ends["acceptor"], ends["dialler"])
    )
    sender.send_timeout = send_timeout
    sender.slow_timeout = PEER_TIMEOUT_S  # as the gossip layer sets it: the receiver's silence bound
    message = b"m" * DEFAULT_MAX_MESSAGE_SIZE

    async def receive() -> None:
        assert await receiver.receive() == message
        arrived.set()

    async def watch() -> None:
        while not arrived.is_set():
            await trio.sleep(0.5)
            if receiver.progress_at > float("-inf"):
                lags.append(trio.current_time() - receiver.progress_at)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        nursery.start_soon(watch)
        try:
            await sender.send(message)
        except ConnectionClosedError:
            assert sender.send_stalled
            nursery.cancel_scope.cancel()
            return False, max(lags)
    return True, max(lags)


@pytest.mark.parametrize("dialler_sends", [True, False], ids=["dialler sends", "acceptor sends"])
@pytest.mark.parametrize(
    ("rate", "kept"),
    [
        (MIN_PROGRESS_RATE * 21 // 20, True),
        (MIN_PROGRESS_RATE * 19 // 20, True),
        (MIN_PROGRESS_RATE * 17 // 20, False),
    ],
)
async def test_a_link_either_end_keeps_the_other_end_keeps_too(
    autojump_clock: trio.testing.MockClock, rate: int, kept: bool, dialler_sends: bool
) -> None:
    """One floor and one bound for both ends: a message moving 5 % above MIN_PROGRESS_RATE is kept by the
    sender's stalled-send rule and by the receiver's silence check; one 5 % below it is kept by both too
    (a 1 MiB message ends before either end falls PEER_TIMEOUT_S behind the floor); one 15 % below it
    (above the ~3.2 KiB/s a 64 KiB piece in 20 s once kept) is given up by both: the sender's send fails
    as stalled, and, with no send timeout, the receiver's credit falls more than PEER_TIMEOUT_S behind
    the clock."""
    sent, _ = await _one_message(rate, dialler_sends, SEND_TIMEOUT_S)
    whole, lag = await _one_message(rate, dialler_sends, None)
    assert whole  # without a send timeout the message arrives whatever the rate
    assert sent is kept
    assert (lag <= PEER_TIMEOUT_S) is kept
    if rate >= MIN_PROGRESS_RATE:
        assert lag <= 1.0  # the receiver hears it all along
