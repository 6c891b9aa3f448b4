"""Length-prefixed framing: round trips under any chunking, limits enforced early, clean vs cut-off ends."""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.errors import ConnectionClosedError, LatticedError, LocalProtocolError, RemoteProtocolError
from latticed.protocol.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    FrameDecoder,
    encode_frame,
    frame_header,
)


def test_encode_layout() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert encode_frame(b"") == b"\x00\x00\x00\x00"
    assert encode_frame(bytearray(b"x")) == b"\x00\x00\x00\x01x"
    assert encode_frame(memoryview(b"xy")) == b"\x00\x00\x00\x02xy"
    assert frame_header(0x01020304, max_frame_size=1 << 30) == b"\x01\x02\x03\x04"


def test_encode_refuses_oversized_body() -> None:
    with pytest.raises(LocalProtocolError, match="exceeds"):
        encode_frame(b"12345", max_frame_size=4)
    with pytest.raises(LocalProtocolError):
        FrameDecoder(max_frame_size=-1)
    with pytest.raises(LocalProtocolError):
        FrameDecoder(max_frame_size=1 << 32)


def test_several_frames_in_one_chunk_and_partial_tail() -> None:
    decoder = FrameDecoder()
    data = encode_frame(b"one") + encode_frame(b"") + encode_frame(b"three")
    assert decoder.feed(data + b"\x00\x00") == [b"one", b"", b"three"]
    assert decoder.buffered == 2
    assert decoder.feed(b"\x00\x01") == []
    assert decoder.feed(b"!") == [b"!"]
    assert decoder.buffered == 0


def test_byte_at_a_time() -> None:
    decoder = FrameDecoder()
    data = encode_frame(b"hello") + encode_frame(b"world")
    frames = [frame for i in range(len(data)) for frame in decoder.feed(data[i : i + 1])]
    assert frames == [b"hello", b"world"]


def test_receive_data_next_frame_style() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame(b"a"))
    decoder.receive_data(encode_frame(b"b"))
    assert decoder.next_frame() == b"a"
    assert decoder.next_frame() == b"b"
    assert decoder.next_frame() is None


def test_oversized_length_rejected_before_body_is_buffered() -> None:
    decoder = FrameDecoder(max_frame_size=10)
    decoder.receive_data(struct.pack(">I", 11))  # header only: no body has arrived yet
    with pytest.raises(RemoteProtocolError, match="11 bytes exceeds the limit of 10"):
        decoder.next_frame()
    # The decoder stays failed.
    with pytest.raises(RemoteProtocolError, match="already failed"):
        decoder.receive_data(b"more")
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()


def test_huge_announced_length_does_not_allocate() -> None:
    decoder = FrameDecoder()
    with pytest.raises(RemoteProtocolError):
        decoder.feed(b"\xff\xff\xff\xff" + b"x" * 100)
    assert decoder.buffered <= 104


def test_exactly_max_size_is_accepted() -> None:
    decoder = FrameDecoder(max_frame_size=1000)
    assert decoder.feed(encode_frame(b"x" * 1000, max_frame_size=1000)) == [b"x" * 1000]


def test_clean_eof_between_frames() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(b"last")) == [b"last"]
    assert not decoder.at_eof
    assert decoder.feed(b"") == []
    assert decoder.eof and decoder.at_eof
    with pytest.raises(LocalProtocolError):
        decoder.receive_data(b"after eof")


def test_eof_keeps_frames_received_before_it() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame(b"a"))
    decoder.receive_data(b"")
    assert decoder.next_frame() == b"a"
    assert decoder.next_frame() is None and decoder.at_eof


@pytest.mark.parametrize("tail", [b"\x00", b"\x00\x00\x00", b"\x00\x00\x00\x05ab"])
def test_eof_inside_a_frame_is_connection_closed(tail: bytes) -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(b"ok") + tail) == [b"ok"]
    with pytest.raises(ConnectionClosedError, match="stream ended inside a frame"):
        decoder.feed(b"")


def test_large_frame_in_many_chunks_and_compaction() -> None:
    decoder = FrameDecoder(max_frame_size=1 << 22)
    body = bytes(range(256)) * 4096  # 1 MiB
    stream = b"".join(encode_frame(body, 1 << 22) + encode_frame(b"small", 1 << 22) for _ in range(3))
    got: list[bytes] = []
    for i in range(0, len(stream), 65536 + 7):
        got += decoder.feed(stream[i : i + 65536 + 7])
    assert got == [body, b"small"] * 3
    assert decoder.buffered == 0
    assert len(decoder._buf) == 0


def test_many_small_frames_keep_buffer_bounded() -> None:
    decoder = FrameDecoder()
    one = encode_frame(b"x" * 10)
    chunk = one * 1000 + one[:5]  # always leaves a partial frame behind
    for _ in range(50):
        assert len(decoder.feed(chunk)) >= 999
        chunk = one[5:] + one * 999 + one[:5]
        assert len(decoder._buf) < (1 << 16) + 2 * len(chunk)


def test_default_limit() -> None:
    assert FrameDecoder().max_frame_size == DEFAULT_MAX_FRAME_SIZE == 1 << 20


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=20),
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=10),
)
def test_roundtrip_any_chunking(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(frame) for frame in frames)
    decoder = FrameDecoder(max_frame_size=300)
    got: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(stream):
        size = cuts[i % len(cuts)]
        got += decoder.feed(stream[pos : pos + size])
        pos += size
        i += 1
    got += decoder.feed(b"")
    assert got == frames
    assert decoder.at_eof


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=200), st.integers(min_value=0, max_value=64), st.integers(min_value=1, max_value=40)
)
def test_fuzz_only_our_errors(data: bytes, limit: int, chunk: int) -> None:
    decoder = FrameDecoder(max_frame_size=limit)
    try:
        for i in range(0, len(data), chunk):
            for frame in decoder.feed(data[i : i + chunk]):
                assert len(frame) <= limit
        decoder.feed(b"")
    except LatticedError as error:
        assert isinstance(error, RemoteProtocolError | ConnectionClosedError)
    assert HEADER_SIZE == 4


def test_accepts_bytearray_and_memoryview_chunks() -> None:
    decoder = FrameDecoder()
    data = encode_frame(b"first") + encode_frame(b"second")
    assert decoder.feed(bytearray(data[:7])) == []
    assert decoder.feed(memoryview(data)[7:12]) == [b"first"]
    assert decoder.feed(memoryview(data)[12:]) == [b"second"]
    assert decoder.feed(memoryview(data)) == [b"first", b"second"]


def test_a_large_frame_leaves_no_large_buffer_behind() -> None:
    """An idle connection that once received a large frame (and the start of the next) holds only what it
    still needs, not the large frame's room (CPython reallocates a bytearray whose
    front is deleted once less than half of it remains, which the lazy compaction relies on)."""
    decoder = FrameDecoder(8 << 20)
    big = encode_frame(b"x" * (4 << 20), 8 << 20)
    tail = b"\x00\x00"  # the first half of the next frame's header
    data = big + tail
    for i in range(0, len(data), 1 << 16):  # as reads deliver it
        decoder.receive_data(data[i : i + (1 << 16)])
    assert sys.getsizeof(decoder._buf) > 4 << 20
    assert decoder.next_frame() == b"x" * (4 << 20)
    assert decoder.next_frame() is None and decoder.buffered == len(tail)
    assert sys.getsizeof(decoder._buf) < 1024
    decoder.receive_data(b"\x00\x02ok")
    assert decoder.next_frame() == b"ok"


def test_a_failed_decoder_lets_go_of_its_buffer_at_once() -> None:
    """A stream cut inside a large frame: the buffer goes with the failure, and the error leaves no
    reference cycle through its traceback (which would keep the decoder, and the buffer in its callers'
    frames, until the garbage collector runs; the daemon runs it rarely)."""
    decoder = FrameDecoder(8 << 20)
    decoder.receive_data(frame_header(4 << 20, 8 << 20) + b"x" * (1 << 20))
    decoder.receive_data(b"")
    references = sys.getrefcount(decoder)
    try:
        decoder.next_frame()
    except ConnectionClosedError:
        pass
    else:  # pragma: no cover - would be a bug
        pytest.fail("a cut frame must raise")
    assert sys.getrefcount(decoder) == references  # nothing holds it from a traceback
    assert decoder.buffered == 0 and sys.getsizeof(decoder._buf) < 1024
    with pytest.raises(ConnectionClosedError, match="already failed"):
        decoder.next_frame()
