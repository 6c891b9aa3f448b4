"""One client connection on the server side: frames in, msgpack messages out, over a trio stream."""

from __future__ import annotations

from typing import Any, Final

import trio

from latticed.api.protocol import error_reply, pack
from latticed.errors import LatticedError, MalformedError
from latticed.framing import FrameDecoder, encode_frame

RECEIVE_SIZE: Final = 1 << 16


class Connection:
    """Frames over a stream. ``receive_frame`` from one task at a time; ``send`` from one task at a time."""

    def __init__(self, stream: trio.abc.Stream, max_frame_bytes: int) -> None:
        self.stream = stream
        self.max_frame_bytes = max_frame_bytes
        self.decoder = FrameDecoder(max_frame_bytes)
        self._pending: list[bytes] = []

    async def receive_frame(self) -> bytes | None:
        """The next frame body, or None at a clean end of stream.

        Raises RemoteProtocolError (oversized frame) or ConnectionClosedError (cut inside a frame)."""
        if self._pending:
            return self._pending.pop(0)
        decoder = self.decoder
        while True:
            frame = decoder.next_frame()
            if frame is not None:
                return frame
            if decoder.eof:
                return None
            decoder.receive_data(await self.stream.receive_some(RECEIVE_SIZE))

    async def watch(self) -> bool:
        """Wait until the client sends a whole frame (kept for :meth:`receive_frame`: True) or ends the
        stream (False). A task uses this to notice a client while the server streams to it."""
        decoder = self.decoder
        while True:
            frame = decoder.next_frame()
            if frame is not None:
                self._pending.append(frame)
                return True
            if decoder.eof:
                return False
            decoder.receive_data(await self.stream.receive_some(RECEIVE_SIZE))

    def encode(self, message: dict[str, Any]) -> bytes:
        """One framed message (an error reply instead if it would exceed the frame limit)."""
        body = pack(message)
        if len(body) > self.max_frame_bytes:
            failure: LatticedError = MalformedError(
                f"reply of {len(body)} bytes exceeds the frame limit of {self.max_frame_bytes}; ask for less"
            )
            body = pack(error_reply(message.get("id"), failure))
        return encode_frame(body, self.max_frame_bytes)

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all(self.encode(message))


__all__ = ["Connection"]
