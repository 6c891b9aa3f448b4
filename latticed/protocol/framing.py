"""Sans-IO length-prefixed framing: ``u32 big-endian length ‖ body``, with a hard size limit.

Shared by the peer transport (:mod:`latticed.protocol.secure`) and the local Unix-socket API, so it
knows nothing about what a body means. It never touches a socket: callers feed received bytes in and take
whole frames out, h11-style.

Why these choices:

* The limit is checked as soon as the 4-byte header is in, *before* any of the body is buffered, so a peer
  cannot make us allocate more than ``max_frame_size`` plus one read.
* A ``bytes`` chunk that arrives while nothing is buffered is kept as is (no copy), and frames are sliced
  straight out of it; only a leftover partial frame moves into a ``bytearray``, which is consumed through an
  offset and compacted lazily. A stream of small frames or one large frame arriving in many reads both cost
  O(n), never O(n^2), and most bytes are copied once.
* ``receive_data(b"")`` means end of stream (as in h11 and as ``trio`` / ``socket.recv`` report it); a stream
  that ends inside a frame is a :class:`~latticed.errors.ConnectionClosedError`, not a short frame.
"""

from __future__ import annotations

import struct
from typing import Final, NoReturn

from latticed.errors import ConnectionClosedError, LatticedError, LocalProtocolError, RemoteProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "HEADER_SIZE",
    "MAX_FRAME_SIZE_LIMIT",
    "FrameDecoder",
    "encode_frame",
    "frame_header",
]

#: Size of the length prefix in bytes.
HEADER_SIZE: Final = 4
#: Largest body a u32 prefix can describe.
MAX_FRAME_SIZE_LIMIT: Final = 0xFFFF_FFFF
#: Default limit on a frame body (1 MiB); callers with other needs pass their own.
DEFAULT_MAX_FRAME_SIZE: Final = 1 << 20

_HEADER: Final = struct.Struct(">I")
# Compact the buffer once this many consumed bytes sit at its front (and they are at least half of it):
# rarely enough to stay cheap, often enough that memory stays bounded.
_COMPACT_AFTER: Final = 1 << 16


def _check_limit(max_frame_size: int) -> int:
    if not 0 <= max_frame_size <= MAX_FRAME_SIZE_LIMIT:
        raise LocalProtocolError(
            f"max_frame_size must be in [0, {MAX_FRAME_SIZE_LIMIT}], got {max_frame_size}"
        )
    return max_frame_size


def frame_header(length: int, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The 4-byte prefix for a body of ``length`` bytes, for callers that write header and body separately."""
    if length > max_frame_size or length < 0:
        raise LocalProtocolError(f"frame of {length} bytes exceeds the limit of {max_frame_size} bytes")
    return _HEADER.pack(length)


def encode_frame(body: bytes | bytearray | memoryview, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """``body`` with its length prefix; refusing oversized bodies here keeps our own bugs off the wire."""
    return frame_header(len(body), max_frame_size) + body


class FrameDecoder:
    """Splits a byte stream into frames; every ``LatticedError`` it raises leaves it permanently failed.

    Feed with :meth:`receive_data` and drain with :meth:`next_frame` until it returns ``None`` (or use
    :meth:`feed`). Drain after every read: the size check runs when a header is parsed, so a caller that
    buffers many reads before draining buffers them all.
    """

    __slots__ = ("_buf", "_eof", "_error", "_max", "_pos")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._max = _check_limit(max_frame_size)
        # Either a received bytes object used in place, or a bytearray accumulating a partial frame.
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self._eof = False
        self._error: LatticedError | None = None

    @property
    def max_frame_size(self) -> int:
        """Largest body accepted."""
        return self._max

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames (a partial frame, or frames not yet drained)."""
        return len(self._buf) - self._pos

    @property
    def missing(self) -> int:
        """Bytes still to come for the frame whose header is here (0 if no header is buffered, or the
        frame is whole), at most the size limit: how much one read can usefully take."""
        available = len(self._buf) - self._pos
        if available < HEADER_SIZE:
            return 0
        length: int = _HEADER.unpack_from(self._buf, self._pos)[0]
        return max(0, min(length, self._max) + HEADER_SIZE - available)

    @property
    def eof(self) -> bool:
        """Whether end of stream was received."""
        return self._eof

    @property
    def at_eof(self) -> bool:
        """End of stream was received and every frame before it was drained: nothing more will come."""
        return self._eof and self._pos == len(self._buf)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer received bytes; empty ``data`` marks end of stream."""
        if self._error is not None:
            raise type(self._error)(f"frame decoder already failed: {self._error}")
        if self._eof:
            raise LocalProtocolError("receive_data() after end of stream")
        if not data:
            self._eof = True
        elif self._pos == len(self._buf):
            self._buf = data if isinstance(data, bytes) else bytes(data)
            self._pos = 0
        else:
            buf = self._buf
            if isinstance(buf, bytes):
                with memoryview(buf) as view:
                    buf = bytearray(view[self._pos :])
                self._pos = 0
            buf += data
            self._buf = buf

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or ``None`` when more data is needed (or the stream ended cleanly).

        Raises :class:`RemoteProtocolError` for a length above the limit (before its body is buffered) and
        :class:`ConnectionClosedError` when the stream ended inside a frame.
        """
        if self._error is not None:
            raise type(self._error)(f"frame decoder already failed: {self._error}")
        buf = self._buf
        pos = self._pos
        total = len(buf)
        available = total - pos
        if available < HEADER_SIZE:
            if self._eof and available:
                self._fail(
                    ConnectionClosedError(
                        f"stream ended inside a frame header ({available} of {HEADER_SIZE} bytes)"
                    )
                )
            return None
        (length,) = _HEADER.unpack_from(buf, pos)
        if length > self._max:
            self._fail(RemoteProtocolError(f"frame of {length} bytes exceeds the limit of {self._max} bytes"))
        start = pos + HEADER_SIZE
        end = start + length
        if end > total:
            if self._eof:
                self._fail(
                    ConnectionClosedError(
                        f"stream ended inside a frame ({total - start} of {length} body bytes)"
                    )
                )
            return None
        if type(buf) is bytes:
            frame = buf[start:end]
        else:
            with memoryview(buf) as view:
                frame = bytes(view[start:end])
        if end == total:
            self._buf = b""
            self._pos = 0
        elif end >= _COMPACT_AFTER and end * 2 >= len(buf) and isinstance(buf, bytearray):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return frame

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Buffer ``data`` and return every frame now complete (convenience for simple callers)."""
        self.receive_data(data)
        frames: list[bytes] = []
        while (frame := self.next_frame()) is not None:
            frames.append(frame)
        return frames

    def _fail(self, error: LatticedError) -> NoReturn:
        # No reference cycle through the error's traceback (which holds this decoder and the caller's
        # frames, a large buffer among their locals): such a cycle lives until the garbage collector, which
        # the daemon runs rarely, gets to it. So keep a copy without a traceback, and let go of ``error``.
        self._error = type(error)(str(error))
        self._buf = b""  # nothing more comes out of it
        self._pos = 0
        try:
            raise error
        finally:
            del error
