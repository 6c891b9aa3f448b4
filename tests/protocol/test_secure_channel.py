"""The sans-IO secure channel: round trips; tampering, replay, reordering, truncation, oversize, garbage."""

from __future__ import annotations

import nacl.bindings as sodium
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.errors import ConnectionClosedError, LatticedError, LocalProtocolError, RemoteProtocolError
from latticed.protocol.handshake import HandshakeResult, Initiator, Responder
from latticed.protocol.secure import ABYTES, DEFAULT_MAX_MESSAGE_SIZE, SecureChannel

K = bytes(range(32))
NOW = 1_700_000_000_000


def handshake() -> tuple[HandshakeResult, HandshakeResult]:
    initiator = Initiator(seed=b"\x11" * 32, network_key=K, now_ms=NOW)
    responder = Responder(seed=b"\x22" * 32, network_key=K, now_ms=NOW)
    initiator.receive_data(
        responder.receive_data(initiator.receive_data(responder.receive_data(initiator.initiate())))
    )
    return initiator.result, responder.result


RESULTS = handshake()  # one handshake for the module: channels are cheap, handshakes are not


def pair(max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> tuple[SecureChannel, SecureChannel]:
    return (
        SecureChannel(RESULTS[0], max_message_size=max_message_size),
        SecureChannel(RESULTS[1], max_message_size=max_message_size),
    )


def drain(channel: SecureChannel) -> list[bytes]:
    out = []
    while (message := channel.next_message()) is not None:
        out.append(message)
    return out


def test_roundtrip_both_directions() -> None:
    a, b = pair()
    assert a.remote_public_key == RESULTS[1].local_public_key
    for sender, receiver in ((a, b), (b, a)):
        frames = [sender.seal(m) for m in (b"one", b"", b"three" * 1000)]
        receiver.receive_data(b"".join(frames))
        assert drain(receiver) == [b"one", b"", b"three" * 1000]


def test_frame_layout() -> None:
    a, _ = pair()
    frame = a.seal(b"abc")
    assert len(frame) == 4 + 3 + ABYTES
    assert int.from_bytes(frame[:4], "big") == 3 + ABYTES
    assert b"abc" not in frame


def test_sealing_state_equals_libsodium_init_push() -> None:
    """The design relies on init_push == init_pull with that header; check it against libsodium itself."""
    key = sodium.crypto_secretstream_xchacha20poly1305_keygen()
    pusher = sodium.crypto_secretstream_xchacha20poly1305_state()
    header = sodium.crypto_secretstream_xchacha20poly1305_init_push(pusher, key)
    ours = sodium.crypto_secretstream_xchacha20poly1305_state()
    sodium.crypto_secretstream_xchacha20poly1305_init_pull(ours, header, key)
    for message in (b"first", b"", b"x" * 5000):
        assert sodium.crypto_secretstream_xchacha20poly1305_push(
            pusher, message
        ) == sodium.crypto_secretstream_xchacha20poly1305_push(ours, message)


def test_clean_close_then_eof() -> None:
    a, b = pair()
    b.receive_data(a.seal(b"bye") + a.close())
    assert b.next_message() == b"bye"
    assert b.next_message() is None
    assert b.remote_closed
    b.receive_data(b"")  # EOF after the final frame is the expected end
    assert b.next_message() is None
    assert a.close() == b""  # idempotent
    with pytest.raises(LocalProtocolError, match="after close"):
        a.seal(b"late")
    # Half-close: b can still talk to a.
    a.receive_data(b.seal(b"still here"))
    assert a.next_message() == b"still here"


def test_truncation_eof_without_final_frame() -> None:
    a, b = pair()
    b.receive_data(a.seal(b"one"))
    b.receive_data(b"")
    assert b.next_message() == b"one"
    with pytest.raises(ConnectionClosedError, match="cut off"):
        b.next_message()
    with pytest.raises(ConnectionClosedError, match="already failed"):
        b.next_message()


def test_truncation_inside_a_frame() -> None:
    a, b = pair()
    frame = a.seal(b"x" * 100)
    b.receive_data(frame[:50])
    assert b.next_message() is None
    b.receive_data(b"")
    with pytest.raises(ConnectionClosedError, match="cut off"):
        b.next_message()


def test_dropping_the_final_frame_is_detected() -> None:
    """An attacker who drops only the final frame (keeping earlier ones) still causes a truncation error."""
    a, b = pair()
    data = a.seal(b"x")
    a.close()
    b.receive_data(data)
    b.receive_data(b"")
    assert b.next_message() == b"x"
    with pytest.raises(ConnectionClosedError):
        b.next_message()


@pytest.mark.parametrize("position", [0, 3, 4, 5, 10, 20, -1])
def test_tampered_frame(position: int) -> None:
    a, b = pair()
    frame = bytearray(a.seal(b"some payload"))
    frame[position] ^= 0x80
    b.receive_data(bytes(frame))
    b.receive_data(b"")  # so that a tampered length (waiting for more bytes) also ends
    with pytest.raises((RemoteProtocolError, ConnectionClosedError)):
        b.next_message()


def test_tampered_body_is_remote_protocol_error() -> None:
    a, b = pair()
    frame = bytearray(a.seal(b"some payload"))
    frame[10] ^= 1
    b.receive_data(bytes(frame))
    with pytest.raises(RemoteProtocolError, match="failed authentication"):
        b.next_message()
    with pytest.raises(RemoteProtocolError, match="already failed"):
        b.receive_data(a.seal(b"next"))


def test_replayed_frame() -> None:
    a, b = pair()
    frame = a.seal(b"pay me")
    b.receive_data(frame)
    assert b.next_message() == b"pay me"
    b.receive_data(frame)
    with pytest.raises(RemoteProtocolError, match="failed authentication"):
        b.next_message()


def test_reordered_frames() -> None:
    a, b = pair()
    first, second = a.seal(b"first"), a.seal(b"second")
    b.receive_data(second + first)
    with pytest.raises(RemoteProtocolError, match="failed authentication"):
        b.next_message()


def test_dropped_frame() -> None:
    a, b = pair()
    a.seal(b"lost")
    b.receive_data(a.seal(b"after the gap"))
    with pytest.raises(RemoteProtocolError):
        b.next_message()


def test_frame_from_another_session() -> None:
    _, b = pair()
    b.receive_data(SecureChannel(handshake()[0]).seal(b"wrong session"))
    with pytest.raises(RemoteProtocolError):
        b.next_message()


def test_reflected_frame() -> None:
    a, _ = pair()
    a.receive_data(pair()[0].seal(b"reflected"))  # a frame of a's own sending direction, sent back to a
    with pytest.raises(RemoteProtocolError):
        a.next_message()


def test_oversized_frame_rejected_from_header_alone() -> None:
    a, b = pair(max_message_size=100)
    b.receive_data((100 + ABYTES + 1).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        b.next_message()
    with pytest.raises(LocalProtocolError, match="exceeds the limit"):
        a.seal(b"x" * 101)
    assert len(a.seal(b"x" * 100)) == 4 + 100 + ABYTES


def test_peer_with_larger_limit_is_rejected() -> None:
    a = SecureChannel(RESULTS[0], max_message_size=1000)
    b = SecureChannel(RESULTS[1], max_message_size=100)
    b.receive_data(a.seal(b"x" * 101))
    with pytest.raises(RemoteProtocolError):
        b.next_message()


def test_short_frame() -> None:
    _, b = pair()
    b.receive_data(b"\x00\x00\x00\x05hello")
    with pytest.raises(RemoteProtocolError, match="shorter than its MAC"):
        b.next_message()


@pytest.mark.parametrize("length", [0, ABYTES - 1, ABYTES])
def test_a_frame_at_the_macs_length(length: int) -> None:
    """next_message's own length check (inlined) refuses a frame one byte short of the MAC, before
    libsodium sees it; a frame of exactly the MAC's length reaches libsodium, which refuses a forgery."""
    _, b = pair()
    b.receive_data(length.to_bytes(4, "big") + b"\x01" * length)
    expected = "shorter than its MAC" if length < ABYTES else "failed authentication"
    with pytest.raises(RemoteProtocolError, match=expected):
        b.next_message()


def test_data_after_final_frame() -> None:
    a, b = pair()
    b.receive_data(a.close() + b"\x00")
    with pytest.raises(RemoteProtocolError, match="after the peer's final frame"):
        b.next_message()


def test_final_frame_with_payload_or_other_tags_rejected() -> None:
    tags = (
        sodium.crypto_secretstream_xchacha20poly1305_TAG_PUSH,
        sodium.crypto_secretstream_xchacha20poly1305_TAG_REKEY,
    )
    for tag, payload in [
        (sodium.crypto_secretstream_xchacha20poly1305_TAG_FINAL, b"x"),
        *((t, b"") for t in tags),
    ]:
        a, b = pair()
        ciphertext = sodium.crypto_secretstream_xchacha20poly1305_push(a._tx, payload, None, tag)
        b.receive_data(len(ciphertext).to_bytes(4, "big") + ciphertext)
        with pytest.raises(RemoteProtocolError, match="unexpected secretstream tag"):
            b.next_message()


def test_garbage() -> None:
    _, b = pair()
    b.receive_data(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
    with pytest.raises(RemoteProtocolError):
        b.next_message()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=64), st.booleans())
def test_fuzz_only_our_errors(data: bytes, chunk: int, valid_prefix: bool) -> None:
    a, b = pair(max_message_size=200)
    if valid_prefix:
        data = a.seal(b"valid") + data
    try:
        for i in range(0, len(data), chunk):
            b.receive_data(data[i : i + chunk])
            drain(b)
        b.receive_data(b"")
        drain(b)
    except LatticedError as error:
        assert isinstance(error, RemoteProtocolError | ConnectionClosedError)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=2000), max_size=10), st.integers(min_value=1, max_value=300))
def test_roundtrip_any_chunking(messages: list[bytes], chunk: int) -> None:
    a, b = pair()
    wire = b"".join(a.seal(m) for m in messages) + a.close()
    got: list[bytes] = []
    for i in range(0, len(wire), chunk):
        b.receive_data(wire[i : i + chunk])
        got += drain(b)
    assert got == messages and b.remote_closed


def test_seal_accepts_buffers() -> None:
    a, b = pair()
    b.receive_data(a.seal(bytearray(b"ba")) + a.seal(memoryview(b"mv")))
    assert drain(b) == [b"ba", b"mv"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=9000), min_size=1, max_size=8))
def test_frames_equal_pynacl_secretstream(messages: list[bytes]) -> None:
    """The channel calls libsodium directly (reusing its buffers): each frame is what PyNaCl's own
    secretstream gives for the same state, and PyNaCl's frames open the same, in both directions."""
    a, b = pair()
    shadow_tx = sodium.crypto_secretstream_xchacha20poly1305_state()
    sodium.crypto_secretstream_xchacha20poly1305_init_pull(
        shadow_tx, RESULTS[0].send_header, RESULTS[0].send_key
    )
    shadow_rx = sodium.crypto_secretstream_xchacha20poly1305_state()
    sodium.crypto_secretstream_xchacha20poly1305_init_pull(
        shadow_rx, RESULTS[0].send_header, RESULTS[0].send_key
    )
    frames = []
    for message in messages:
        frame = a.seal(message)
        frames.append(frame)
        expected = sodium.crypto_secretstream_xchacha20poly1305_push(shadow_tx, message)
        assert frame == len(expected).to_bytes(4, "big") + expected
        assert sodium.crypto_secretstream_xchacha20poly1305_pull(shadow_rx, expected) == (message, 0)
    b2 = pair()[1]
    pusher = sodium.crypto_secretstream_xchacha20poly1305_state()
    sodium.crypto_secretstream_xchacha20poly1305_init_pull(
        pusher, RESULTS[0].send_header, RESULTS[0].send_key
    )
    for message in messages:
        ciphertext = sodium.crypto_secretstream_xchacha20poly1305_push(pusher, message)
        b2.receive_data(len(ciphertext).to_bytes(4, "big") + ciphertext)
        assert b2.next_message() == message
    b.receive_data(b"".join(frames))
    assert drain(b) == messages


class _Chunk(bytes):
    pass


def test_messages_after_the_buffer_grew_and_from_a_bytes_subclass() -> None:
    """The receive buffer grows past its first size and its ``char *`` view with it: every message after
    is whole; a read that is a subclass of bytes is cut into the same frames."""
    a, b = pair()
    messages = [b"a" * 100, bytes(range(256)) * 40, b"b" * 3, b"", b"c" * 70_000, b"d" * 5]
    for message in messages:
        b.receive_data(_Chunk(a.seal(message)))
        got = drain(b)
        assert got == [message] and type(got[0]) is bytes
    b.receive_data(_Chunk(a.seal(b"x") + a.seal(b"y" * 5000) + a.close()))
    assert drain(b) == [b"x", b"y" * 5000] and b.remote_closed
