"""A sink task's idempotent requests, a few in flight on one connection.

Sent one at a time, a task's next chunk waits for the previous chunk's whole round trip (the daemon's
decode, signature and durable commit) while Spark could be handing it rows, and the daemon waits for the
task in turn. With up to :data:`WINDOW` requests unanswered, the two overlap, and a task's chunks can
share the daemon's group commits. Requests into the daemon's own queue keep their order (the daemon
starts and answers a connection's requests in order); a request into another daemon's queue is a remote
offer forwarded as a task of its own, so it is sent alone, after the requests before it were answered, to
keep a partition's rows in order there too. Exactly once is unchanged: each request carries its own
producer id and sequence, and a retried task sends the same ones whichever of them had been answered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Final, Protocol

import msgpack

from latticed.api.client.blocking_client import CLIENT_MAX_FRAME, Produced
from latticed.api.messages import API_VERSION, Packed, error_from_reply
from latticed.errors import RemoteProtocolError
from latticed.protocol.framing import frame_header

#: Requests a task keeps unanswered into its daemon's own queues.
WINDOW: Final = 3
#: Buffers shorter than this are joined into one before the write; longer ones (the Arrow slices) go
#: to the socket as they are.
_JOIN_BELOW: Final = 1 << 16


class Spliced:
    """A value encoded already, in parts (a bin's header, then slices of Arrow buffers): written to the
    socket part by part, so a request's megabyte of values is not copied into a frame first."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[bytes | memoryview]) -> None:
        self.parts = parts


def frame_buffers(message: dict[str, Any]) -> list[bytes | memoryview]:
    """``message``'s frame (length prefix and msgpack map) as buffers to write in order: byte for byte
    ``encode_frame(pack(message))`` with every :class:`Spliced` value's parts joined, but those parts are
    not copied; runs of small buffers are joined so a write takes few of them."""
    n = len(message)
    pieces: list[bytes | memoryview] = [bytes((0x80 | n,)) if n < 16 else b"\xde" + n.to_bytes(2, "big")]
    for key, value in message.items():
        pieces.append(msgpack.packb(key, use_bin_type=True))
        if type(value) is Spliced:
            pieces += value.parts
        else:
            pieces.append(value if type(value) is Packed else msgpack.packb(value, use_bin_type=True))
    out: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = [frame_header(sum(map(len, pieces)), CLIENT_MAX_FRAME)]
    for piece in pieces:
        if len(piece) < _JOIN_BELOW:
            small.append(piece)
        else:
            out += [b"".join(small), piece] if small else [piece]
            small = []
    if small:
        out.append(b"".join(small))
    return out


class Stream(Protocol):
    """A dedicated connection to the daemon (``Client.open_stream``)."""

    def send_buffers(self, buffers: Sequence[bytes | memoryview]) -> None: ...

    def receive(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class InFlight:
    """Sends ``offer_batch`` requests on ``stream`` keeping up to ``window`` unanswered; answers come back,
    in order, from :meth:`send` (those it had to wait for to make room) and :meth:`drain`."""

    def __init__(self, stream: Stream, window: int = WINDOW) -> None:
        self.stream = stream
        self.window = window
        self._pending: deque[int] = deque()
        self._next_id = 1

    def send(self, request: dict[str, Any], *, alone: bool = False) -> Iterator[Produced]:
        """Send ``request`` (an ``offer_batch``'s arguments); ``alone``: only once every earlier one was
        answered, and answered itself before the next is sent (another daemon's queue)."""
        while self._pending and (alone or len(self._pending) >= self.window):
            yield self._receive()
        rid = self._next_id
        self._next_id += 1
        message = {"v": API_VERSION, "id": rid, "op": "offer_batch", **request}
        self.stream.send_buffers(frame_buffers(message))
        self._pending.append(rid)
        if alone:
            yield self._receive()

    def drain(self) -> Iterator[Produced]:
        """The answers still due."""
        while self._pending:
            yield self._receive()

    def _receive(self) -> Produced:
        rid = self._pending.popleft()
        reply = self.stream.receive()
        if reply.get("id") != rid:
            raise RemoteProtocolError(f"reply for request {reply.get('id')!r} while waiting for {rid}")
        if not reply.get("ok"):
            raise error_from_reply(reply.get("error"))
        return Produced(int(reply["first"]), int(reply["count"]), bool(reply.get("duplicate")))


__all__ = ["WINDOW", "InFlight", "Spliced", "Stream", "frame_buffers"]
