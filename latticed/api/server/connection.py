"""One client connection on the server side: frames in, msgpack messages out, over a trio stream.

On a socket (the API's Unix socket) frames are read and written with plain ``os.read``/``os.write`` on the
non-blocking descriptor, around trio's :func:`~trio.lowlevel.wait_readable` and
:func:`~trio.lowlevel.wait_writable`: that is what ``SocketStream`` does too, minus a failed ``recv``
(and its exception) before every wait and two scheduler round trips per reply, which cost more than the
handling of a small request. A reply that fits the socket buffer is written without yielding; a reader
that does not keep up makes ``send`` wait, as ``send_all`` would.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

import msgpack
import trio

from latticed.api.messages import error_reply, holds_packed, pack, pack_parts
from latticed.errors import LatticedError, MalformedError
from latticed.protocol.framing import FrameDecoder, encode_frame, frame_header

RECEIVE_SIZE: Final = 1 << 16
#: The most one read asks for while the rest of a large frame is due (a frame's declared size is only
#: a claim; the read returns what the socket holds).
READ_AT_MOST: Final = 1 << 20
#: A frame this large being buffered is remembered (``held_large_frame``): the server gives memory back
#: once such requests are over (latticed/process/malloc.py).
LARGE_FRAME_BYTES: Final = 1 << 20
#: A connection's kept ``msgpack.Packer`` starts with a buffer this large (msgpack's default, 256 KiB, a
#: connection is too much to keep for replies of ~40 bytes)...
PACKER_START_BYTES: Final = 4096
#: ... and keeps it while it is at most this large: msgpack grows its buffer to twice what it needed, so
#: after a reply longer than half of it the Packer is dropped (its buffer with it) for a fresh one.
PACKER_KEEP_BYTES: Final = 64 << 10


def _packer() -> Callable[[Any], bytes]:
    return msgpack.Packer(use_bin_type=True, buf_size=PACKER_START_BYTES).pack  # type: ignore[no-any-return]


class Connection:
    """Frames over a stream. ``receive_frame`` from one task at a time; ``send`` from one task at a time."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        max_frame_bytes: int,
        *,
        on_frame: Callable[[int], None] | None = None,
    ) -> None:
        self.stream = stream
        self.max_frame_bytes = max_frame_bytes
        self.decoder = FrameDecoder(max_frame_bytes)
        #: Told the size of every frame received (the server's memory give-back counts them).
        self.on_frame = on_frame
        #: Whether a frame of LARGE_FRAME_BYTES or more was buffered here (complete or not).
        self.held_large_frame = False
        self._pending: list[bytes] = []
        #: A write is waiting for room in the socket (part of it sent): nothing else may write meanwhile.
        self.writing = False
        #: The socket's descriptor when ``stream`` is a trio SocketStream (else the stream's own methods).
        self._fd: int | None = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
        #: Packs replies without pre-packed values: kept, a reply costs ~0.3 us less than ``packb``'s
        #: Packer made and freed each time (one task sends at a time: it is never used concurrently).
        self._pack = _packer()

    async def receive_frame(self, *, nothing_buffered: bool = False) -> bytes | None:
        """The next frame body, or None at a clean end of stream. Safe to cancel: it only ever waits before
        a read, and whatever a read brought stays in the decoder for the next call. ``nothing_buffered``:
        the caller's :meth:`frame_ready` just said False (nothing ran since), so the buffer is not
        looked at again before the read.

        Raises RemoteProtocolError (oversized frame) or ConnectionClosedError (cut inside a frame)."""
        decoder = self.decoder
        if not nothing_buffered:
            if self._pending:
                return self._pending.pop(0)
            frame = self._next_frame()
            if frame is not None:
                # Pipelined requests come out of the buffer without a scheduler round each: at most one
                # read's worth (RECEIVE_SIZE) is taken this way before the next real wait, and yielding per
                # frame would split the burst (a group of acks, of offers) over many group commits.
                return frame
        while not decoder.eof:
            decoder.receive_data(await self._receive_some())
            frame = self._next_frame()
            if frame is not None:
                return frame
        return None

    def _next_frame(self) -> bytes | None:
        decoder = self.decoder
        if decoder.buffered >= LARGE_FRAME_BYTES:
            self.held_large_frame = True
        frame = decoder.next_frame()
        if frame is not None and self.on_frame is not None:
            self.on_frame(len(frame))
        return frame

    def frame_ready(self) -> bool:
        """Whether a whole frame is already here (no I/O): :meth:`receive_frame` then returns at once."""
        if self._pending:
            return True
        frame = self._next_frame()
        if frame is None:
            return False
        self._pending.append(frame)
        return True

    async def watch(self) -> bool:
        """Wait until the client sends a whole frame (kept for :meth:`receive_frame`: True) or ends the
        stream (False). A task uses this to notice a client while the server streams to it."""
        decoder = self.decoder
        while True:
            frame = self._next_frame()
            if frame is not None:
                self._pending.append(frame)
                return True
            if decoder.eof:
                return False
            decoder.receive_data(await self._receive_some())

    async def _receive_some(self) -> bytes | bytearray:
        fd = self._fd
        if fd is None:
            return await self.stream.receive_some(RECEIVE_SIZE)
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                # The rest of a large frame in as few reads (and waits) as the socket's buffer allows.
                return os.read(fd, min(max(RECEIVE_SIZE, self.decoder.missing), READ_AT_MOST))
            except BlockingIOError:
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"connection lost: {exc}") from exc

    def encode(self, message: dict[str, Any]) -> bytes:
        """One framed message (an error reply instead if it would exceed the frame limit), joined from
        its parts once (a large reply's spliced values are not copied on the way)."""
        if not holds_packed(message):
            body = self._pack(message)
            if len(body) > PACKER_KEEP_BYTES // 2:  # its buffer grew past the cap: not kept
                self._pack = _packer()
            parts = [body]
        else:
            parts = pack_parts(message)
        size = sum(map(len, parts)) if len(parts) > 1 else len(parts[0])
        if size > self.max_frame_bytes:
            failure: LatticedError = MalformedError(
                f"reply of {size} bytes exceeds the frame limit of {self.max_frame_bytes}; ask for less"
            )
            return encode_frame(pack(error_reply(message.get("id"), failure)), self.max_frame_bytes)
        if len(parts) == 1:
            return encode_frame(parts[0], self.max_frame_bytes)
        parts.insert(0, frame_header(size, self.max_frame_bytes))
        return b"".join(parts)

    async def send(self, message: dict[str, Any]) -> None:
        await self._write(self.encode(message))

    async def send_encoded(self, data: bytes) -> None:
        """Send what :meth:`encode` made (a caller that accounts for its size while it waits)."""
        await self._write(data)

    async def send_many(self, messages: list[dict[str, Any]]) -> None:
        """Several replies in one write (what one group commit answers at once)."""
        await self._write(b"".join(map(self.encode, messages)))

    def write_now(self, data: bytes) -> bytes:
        """Write what the socket takes now, without waiting; returns the rest (all of it when the
        stream is not a socket, another write is waiting for room, or the socket failed: the caller
        hands the rest to :meth:`send_encoded`, which waits or raises as a write does). Lets a commit's
        callback answer a client on the spot instead of waking the client's task to do it."""
        fd = self._fd
        if fd is None or self.writing:
            return data
        try:
            sent = os.write(fd, data)
        except OSError:  # BlockingIOError included: the task's own write waits, or reports the loss
            return data
        return data[sent:]

    async def _write(self, data: bytes) -> None:
        fd = self._fd
        if fd is None:
            await self.stream.send_all(data)
            return
        with memoryview(data) as view:
            sent = 0
            while True:
                try:
                    sent += os.write(fd, view[sent:] if sent else view)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise trio.BrokenResourceError(f"connection lost: {exc}") from exc
                if sent >= len(view):
                    return
                self.writing = True
                try:
                    await trio.lowlevel.wait_writable(fd)
                finally:
                    self.writing = False


__all__ = ["LARGE_FRAME_BYTES", "Connection"]
