"""Sans-IO encrypted channel over the keys of a completed handshake.

Each direction is one libsodium secretstream (XChaCha20-Poly1305). A message travels as one frame of
:mod:`latticed.protocol.framing`: ``u32 length ‖ secretstream ciphertext`` (plaintext + 17 bytes).
Why this is enough:

* secretstream authenticates every message *and its position* (an internal counter), so a tampered,
  replayed, dropped or reordered frame fails to decrypt; a tampered length prefix shifts frame boundaries
  and fails the same way.
* ``close()`` sends an empty message tagged ``TAG_FINAL``; a stream that ends without one was cut off, which
  we report as :class:`~latticed.errors.ConnectionClosedError` rather than as a clean end.
* The secretstream headers are derived by the handshake rather than sent, so the first frame carries data
  and the test vectors are deterministic. libsodium's ``init_push`` is ``init_pull`` with a random header,
  so the sending state is built with ``init_pull`` on the derived header.

Only ``TAG_MESSAGE`` and an empty ``TAG_FINAL`` are valid; anything else is a protocol error. Any receive-side
error leaves the channel failed: the connection must be dropped.
"""

from __future__ import annotations

import struct
from typing import Any, Final, NoReturn

import nacl.bindings as sodium
from nacl._sodium import ffi as _ffi
from nacl._sodium import lib as _lib

from latticed.errors import ConnectionClosedError, LatticedError, LocalProtocolError, RemoteProtocolError
from latticed.protocol.framing import MAX_FRAME_SIZE_LIMIT, FrameDecoder
from latticed.protocol.handshake import HandshakeResult

__all__ = ["ABYTES", "DEFAULT_MAX_MESSAGE_SIZE", "SecureChannel"]

#: Bytes secretstream adds to each message (1 encrypted tag byte + 16-byte MAC).
ABYTES: Final[int] = sodium.crypto_secretstream_xchacha20poly1305_ABYTES
#: Default limit on one plaintext message (1 MiB).
DEFAULT_MAX_MESSAGE_SIZE: Final = 1 << 20

_TAG_MESSAGE: Final[int] = sodium.crypto_secretstream_xchacha20poly1305_TAG_MESSAGE
_TAG_FINAL: Final[int] = sodium.crypto_secretstream_xchacha20poly1305_TAG_FINAL
_HEADER: Final = struct.Struct(">I")
_push = sodium.crypto_secretstream_xchacha20poly1305_push
_NULL: Final = _ffi.NULL
_c_push = _lib.crypto_secretstream_xchacha20poly1305_push
_c_pull = _lib.crypto_secretstream_xchacha20poly1305_pull
_unpack = _ffi.unpack
#: Smallest buffer kept for one direction's frames (grown to the largest message seen, as PyNaCl's own
#: wrapper grows its state's buffer).
_MIN_BUFFER: Final = 4096


class _Buffer:
    """One direction's C buffer, reused by every message: PyNaCl's own wrappers check each argument in
    Python (a dozen calls a message, two messages each way per relayed record); the libsodium calls
    below get arguments our own checks already hold to (bytes, at most the channel's limit)."""

    __slots__ = ("c", "chars", "size")

    def __init__(self) -> None:
        self.c: Any = _ffi.new("unsigned char[]", _MIN_BUFFER)
        #: The same memory as ``char *``: ``ffi.unpack`` copies it out as bytes in one call.
        self.chars: Any = _ffi.cast("char *", self.c)
        self.size = _MIN_BUFFER

    def at_least(self, size: int) -> Any:
        if size > self.size:
            self.c = _ffi.new("unsigned char[]", size)
            self.chars = _ffi.cast("char *", self.c)
            self.size = size
        return self.c


def _stream_state(key: bytes, header: bytes) -> sodium.crypto_secretstream_xchacha20poly1305_state:
    state = sodium.crypto_secretstream_xchacha20poly1305_state()
    sodium.crypto_secretstream_xchacha20poly1305_init_pull(state, header, key)
    return state


class SecureChannel:
    """Encrypts outgoing messages into frames and decrypts incoming frames into messages.

    Outgoing: :meth:`seal` each message, :meth:`close` once; write what they return, in order.
    Incoming: :meth:`receive_data` every chunk read (``b""`` at end of stream), then call
    :meth:`next_message` until it returns ``None``; :attr:`remote_closed` then tells a clean end from
    "need more data".
    """

    __slots__ = (
        "_decoder",
        "_error",
        "_local_closed",
        "_max",
        "_remote_closed",
        "_rx",
        "_rx_buffer",
        "_tag",
        "_tx",
        "_tx_buffer",
        "handshake",
    )

    def __init__(
        self, handshake: HandshakeResult, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    ) -> None:
        if not 0 <= max_message_size <= MAX_FRAME_SIZE_LIMIT - ABYTES:
            raise LocalProtocolError(f"max_message_size out of range: {max_message_size}")
        #: The handshake this channel runs on (peer identity, session id).
        self.handshake = handshake
        self._max = max_message_size
        self._tx = _stream_state(handshake.send_key, handshake.send_header)
        self._rx = _stream_state(handshake.receive_key, handshake.receive_header)
        self._tx_buffer = _Buffer()
        self._rx_buffer = _Buffer()
        self._tag = _ffi.new("unsigned char *")
        self._decoder = FrameDecoder(max_message_size + ABYTES)
        self._local_closed = False
        self._remote_closed = False
        self._error: LatticedError | None = None

    @property
    def remote_public_key(self) -> bytes:
        """The peer's authenticated Ed25519 public key."""
        return self.handshake.remote_public_key

    @property
    def max_message_size(self) -> int:
        """Largest plaintext sent or accepted."""
        return self._max

    @property
    def local_closed(self) -> bool:
        """Whether we sent the final frame."""
        return self._local_closed

    @property
    def pending(self) -> int:
        """Bytes received but not yet returned as messages (after :meth:`next_message` returned None:
        the part of the frame still arriving)."""
        return self._decoder.buffered

    @property
    def remote_closed(self) -> bool:
        """Whether the peer's final frame arrived: it will send nothing more."""
        return self._remote_closed

    # -- sending ---------------------------------------------------------------------------------------

    def seal(self, plaintext: bytes | bytearray | memoryview) -> bytes:
        """One message as a frame ready to write. Frames must be written in the order they were sealed."""
        if type(plaintext) is not bytes:
            plaintext = bytes(plaintext)  # libsodium via PyNaCl takes bytes only
        if self._local_closed:
            raise LocalProtocolError("seal() after close()")
        if len(plaintext) > self._max:
            raise LocalProtocolError(
                f"message of {len(plaintext)} bytes exceeds the limit of {self._max} bytes"
            )
        size = len(plaintext) + ABYTES
        out = self._tx_buffer.at_least(_HEADER.size + size)
        # The ciphertext goes after room for the length prefix: the frame leaves in one copy.
        if _c_push(
            self._tx.statebuf, out + _HEADER.size, _NULL, plaintext, len(plaintext), _NULL, 0, _TAG_MESSAGE
        ):
            raise LocalProtocolError("libsodium failed to seal a message")
        view = _ffi.buffer(out, _HEADER.size + size)
        _HEADER.pack_into(view, 0, size)
        return view[:]  # type: ignore[no-any-return]

    def close(self) -> bytes:
        """The final frame, telling the peer we end cleanly; ``b""`` if already closed."""
        if self._local_closed:
            return b""
        self._local_closed = True
        ciphertext: bytes = _push(self._tx, b"", None, _TAG_FINAL)
        return _HEADER.pack(len(ciphertext)) + ciphertext

    # -- receiving -------------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes read from the peer; ``b""`` marks end of stream."""
        if self._error is not None:  # _check_usable, inline: this runs for every read
            self._check_usable()
        try:
            self._decoder.receive_data(data)
        except LatticedError as error:
            self._fail(error)

    def next_message(self) -> bytes | None:
        """The next plaintext, or ``None`` when more data is needed or after the peer closed cleanly.

        Raises :class:`RemoteProtocolError` for an oversized, forged, replayed, reordered or otherwise
        invalid frame, and :class:`ConnectionClosedError` when the stream ended before the final frame.

        It runs twice a message (the message, then None), so the checks of :meth:`_check_usable` and
        :meth:`_Buffer.at_least` are inline and the plaintext is copied out in one call: the same checks,
        the same frame pulled, ~6 fewer Python calls a message.
        """
        if self._error is not None:
            self._check_usable()
        decoder = self._decoder
        if self._remote_closed:
            if decoder.buffered:
                self._fail(RemoteProtocolError("data after the peer's final frame"))
            return None
        try:
            frame = decoder.next_frame()
        except ConnectionClosedError as error:
            self._fail(ConnectionClosedError(f"secure stream cut off before its final frame: {error}"))
        except LatticedError as error:
            self._fail(error)
        if frame is None:
            if decoder.at_eof:
                self._fail(
                    ConnectionClosedError(
                        "secure stream cut off: end of stream without the final frame "
                        "(truncated, or the peer crashed)"
                    )
                )
            return None
        length = len(frame)
        if length < ABYTES:
            self._fail(RemoteProtocolError(f"frame of {length} bytes is shorter than its MAC"))
        size = length - ABYTES
        buffer = self._rx_buffer
        out = buffer.c if size <= buffer.size else buffer.at_least(size)
        tag_out = self._tag
        if _c_pull(self._rx.statebuf, out, _NULL, tag_out, frame, length, _NULL, 0):
            self._fail(
                RemoteProtocolError(
                    "frame failed authentication: tampered, replayed, reordered, or from another session"
                )
            )
        plaintext: bytes = _unpack(buffer.chars, size)
        tag: int = tag_out[0]
        if tag == _TAG_MESSAGE:
            return plaintext
        if tag == _TAG_FINAL and not plaintext:
            self._remote_closed = True
            if decoder.buffered:
                self._fail(RemoteProtocolError("data after the peer's final frame"))
            return None
        self._fail(RemoteProtocolError(f"unexpected secretstream tag {tag} ({len(plaintext)} bytes)"))

    def _check_usable(self) -> None:
        if self._error is not None:
            raise type(self._error)(f"secure channel already failed: {self._error}")

    def _fail(self, error: LatticedError) -> NoReturn:
        # No reference cycle through the error's traceback (see FrameDecoder._fail): keep a copy.
        self._error = type(error)(str(error))
        try:
            raise error
        finally:
            del error
