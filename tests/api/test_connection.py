"""The server side of one API connection on a real socket pair: frames through the descriptor fast path,
partial writes to a slow reader, pipelined requests, and a peer that goes away."""

from __future__ import annotations

import socket

import msgpack
import pytest
import trio
import trio.testing

from latticed.api.messages import pack_array
from latticed.api.server.connection import LARGE_FRAME_BYTES, PACKER_KEEP_BYTES, Connection
from latticed.errors import ConnectionClosedError
from latticed.protocol.framing import FrameDecoder, encode_frame

LIMIT = 1 << 24


async def pair() -> tuple[Connection, trio.SocketStream]:
    a, b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = Connection(trio.SocketStream(a), LIMIT)
    assert server._fd is not None  # the descriptor fast path is in use
    return server, trio.SocketStream(b)


async def test_a_large_reply_reaches_a_slow_reader_whole() -> None:
    server, peer = await pair()
    message = {"id": 1, "ok": True, "blob": bytes(range(256)) * 16_000}  # ~4 MB, far over the socket buffer
    received = bytearray()

    async def slow_reader() -> None:
        decoder = FrameDecoder(LIMIT)
        while True:
            chunk = await peer.receive_some(50_000)
            received.extend(chunk)
            decoder.receive_data(chunk)
            frame = decoder.next_frame()
            if frame is not None:
                assert msgpack.unpackb(frame) == message
                return
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_reader)
        await server.send(message)
    assert bytes(received) == encode_frame(msgpack.packb(message, use_bin_type=True), LIMIT)


async def test_pipelined_frames_are_read_in_order_then_end_of_stream() -> None:
    server, peer = await pair()
    frames = [msgpack.packb({"id": i, "op": "id"}) for i in range(50)]
    await peer.send_all(b"".join(encode_frame(f, LIMIT) for f in frames))
    await peer.send_eof()
    got = []
    while (frame := await server.receive_frame()) is not None:
        got.append(frame)
    assert got == frames


async def test_a_peer_that_went_away_breaks_the_connection() -> None:
    server, peer = await pair()
    await peer.aclose()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the first writes may still land in the socket buffer
            await server.send({"id": 1, "ok": True, "blob": b"x" * 100_000})


async def test_several_replies_go_out_as_consecutive_frames_in_one_write() -> None:
    server, peer = await pair()
    replies = [{"id": i, "ok": True, "offset": i} for i in range(5)]
    await server.send_many(replies)
    data = await peer.receive_some(1 << 16)  # one write: everything is there at once
    decoder = FrameDecoder(LIMIT)
    decoder.receive_data(data)
    got = []
    while (frame := decoder.next_frame()) is not None:
        got.append(msgpack.unpackb(frame))
    assert got == replies


async def test_frames_are_reported_and_large_ones_remembered() -> None:
    """The server gives memory back after bursts of requests: a connection reports each frame's size, and
    remembers having held a large one even if it was cut off."""
    a, b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reports: list[int] = []
    server = Connection(trio.SocketStream(a), LIMIT, on_frame=reports.append)
    peer = trio.SocketStream(b)
    small, large = b"s" * 100, b"L" * LARGE_FRAME_BYTES
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.send_all, encode_frame(small, LIMIT) + encode_frame(large, LIMIT))
        assert await server.receive_frame() == small
        assert reports == [len(small)] and not server.held_large_frame
        assert await server.receive_frame() == large
    assert reports == [len(small), len(large)] and server.held_large_frame
    cut_a, cut_b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    cut = Connection(trio.SocketStream(cut_a), LIMIT)
    cut_peer = trio.SocketStream(cut_b)

    async def send_part_and_hang_up() -> None:
        await cut_peer.send_all(encode_frame(large, LIMIT)[: LARGE_FRAME_BYTES + 2])
        await cut_peer.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_part_and_hang_up)
        with pytest.raises(ConnectionClosedError):
            await cut.receive_frame()
    assert cut.held_large_frame


async def test_the_rest_of_a_large_frame_is_taken_in_one_read() -> None:
    server, peer = await pair()
    body = msgpack.packb({"id": 1, "blob": b"b" * 180_000})  # three reads of RECEIVE_SIZE, fits the buffer
    await peer.send_all(encode_frame(body, LIMIT))
    reads: list[int] = []
    receive_some = server._receive_some

    async def counted() -> bytes | bytearray:
        data = await receive_some()
        reads.append(len(data))
        return data

    server._receive_some = counted  # type: ignore[method-assign]
    assert await server.receive_frame() == body
    assert len(reads) == 2  # the first read's header told how much more to take


def test_the_decoder_tells_how_much_of_a_frame_is_missing() -> None:
    decoder = FrameDecoder(LIMIT)
    assert decoder.missing == 0
    frame = encode_frame(b"x" * 1_000, LIMIT)
    decoder.receive_data(frame[:2])
    assert decoder.missing == 0  # no whole header yet
    decoder.receive_data(frame[2:300])
    assert decoder.missing == 1_004 - 300
    decoder.receive_data(frame[300:])
    assert decoder.missing == 0
    assert decoder.next_frame() == b"x" * 1_000


async def test_a_reply_with_a_spliced_array_is_framed_as_the_plain_map_or_refused_past_the_limit() -> None:
    # ``queue list`` replies with its entries encoded already (pack_array): joined once with the map and
    # the frame header, the frame must be byte for byte the plain map's, and still refused when too big.
    server, _peer = await pair()
    items = [msgpack.packb({"name": f"q{i:06d}", "size": i}) for i in range(40_000)]
    message = {"id": 3, "ok": True, "queues": pack_array(items)}
    plain = {"id": 3, "ok": True, "queues": [msgpack.unpackb(item) for item in items]}
    assert server.encode(message) == encode_frame(msgpack.packb(plain), LIMIT)
    a, _b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    small = Connection(trio.SocketStream(a), 100_000)
    decoder = FrameDecoder(100_000)
    decoder.receive_data(small.encode(message))
    frame = decoder.next_frame()
    assert frame is not None
    reply = msgpack.unpackb(frame)
    assert reply["id"] == 3 and reply["ok"] is False and "frame limit" in reply["error"]["message"]


async def test_the_kept_packer_gives_packb_bytes_and_is_renewed_after_a_reply_past_its_cap() -> None:
    """Replies without pre-packed values go through the connection's kept Packer: the same bytes as
    ``packb`` for small, mid-sized and large replies and after one that failed to pack; the Packer is
    kept after replies up to half its cap and replaced (its grown buffer freed) after a larger one."""
    server, _peer = await pair()
    kept = server._pack
    small = {"id": 7, "ok": True, "offset": 123_456}
    mid = {"id": 8, "ok": True, "names": ["q" * 100] * ((PACKER_KEEP_BYTES // 2 - 64) // 102)}
    big = {"id": 9, "ok": True, "blob": b"x" * PACKER_KEEP_BYTES}
    for message in (small, mid):
        assert server.encode(message) == encode_frame(msgpack.packb(message, use_bin_type=True), LIMIT)
    assert server._pack is kept  # at most half the cap: kept
    assert len(msgpack.packb(mid, use_bin_type=True)) <= PACKER_KEEP_BYTES // 2
    assert server.encode(big) == encode_frame(msgpack.packb(big, use_bin_type=True), LIMIT)
    assert server._pack is not kept  # past it: a fresh Packer, the grown buffer dropped
    with pytest.raises(TypeError):
        server.encode({"id": 10, "ok": True, "bad": object()})
    assert server.encode(small) == encode_frame(msgpack.packb(small, use_bin_type=True), LIMIT)


async def test_after_frame_ready_says_no_the_next_frame_is_read_without_looking_again() -> None:
    """``receive_frame(nothing_buffered=True)`` (the pipeline's wait, right after ``frame_ready`` said
    False) goes straight to the read: a frame sent whole, and one whose first part was already buffered,
    both come out once and whole."""
    server, peer = await pair()
    first, second = encode_frame(b"first", LIMIT), encode_frame(b"second" * 10, LIMIT)
    await peer.send_all(first + first)
    assert not server.frame_ready()  # no I/O: nothing read yet
    assert await server.receive_frame() == b"first"  # one read brought both
    assert server.frame_ready()  # kept for receive_frame
    assert await server.receive_frame() == b"first"
    assert not server.frame_ready()
    await peer.send_all(second)
    assert await server.receive_frame(nothing_buffered=True) == b"second" * 10
    got: list[bytes | None] = []

    async def receive() -> None:
        got.append(await server.receive_frame(nothing_buffered=True))

    async with trio.open_nursery() as nursery:
        await peer.send_all(second[:7])  # a header and part of the body
        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and server.decoder.buffered == 7  # read, kept, waiting for the rest
        await peer.send_all(second[7:] + first)
    assert got == [b"second" * 10]
    assert server.frame_ready() and await server.receive_frame() == b"first"
    await peer.send_eof()
    assert not server.frame_ready()
    assert await server.receive_frame(nothing_buffered=True) is None
