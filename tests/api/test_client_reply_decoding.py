"""The blocking client's reply decoding and request packing, sized around its shortcuts: a whole reply in
one read is decoded from a copy of its body when small and in place when larger (``_SLICE_MAX``), the same
either way; :func:`holds_packed`'s set test answers as the per-value test it replaced, and what it picks
packs to the bytes of the plain values."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest

from latticed.api.client.blocking_client import _FIRST_READ, _SLICE_MAX, _Connection
from latticed.api.messages import Packed, PackedArray, holds_packed, pack, pack_array, pack_parts


def _frame(reply: dict[str, Any]) -> bytes:
    body = msgpack.packb(reply, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def _padded(rid: int, frame_size: int) -> dict[str, Any]:
    """An offer reply whose frame is ``frame_size`` bytes long (header included)."""
    reply: dict[str, Any] = {"ok": True, "id": rid, "offset": rid, "pad": b""}
    reply["pad"] = b"p" * (frame_size - len(_frame(reply)))
    if len(_frame(reply)) != frame_size:  # the bin's length prefix grew by a byte or two
        reply["pad"] = b"p" * (len(reply["pad"]) - (len(_frame(reply)) - frame_size))
    assert len(_frame(reply)) == frame_size
    return reply


@pytest.mark.parametrize(
    "frame_size",
    [40, _SLICE_MAX - 1, _SLICE_MAX, _SLICE_MAX + 1, _FIRST_READ // 2, _FIRST_READ - 1, _FIRST_READ],
)
def test_a_whole_reply_in_one_read_decodes_the_same_copied_or_in_place(
    tmp_path: Path, frame_size: int
) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        conn = _Connection(path, 5.0)
        server, _ = listener.accept()
        with server:
            replies = [_padded(rid, frame_size) for rid in (1, 2, 3)]
            got = []
            for reply in replies:
                server.sendall(_frame(reply))  # one reply at a time: each comes whole in one read
                got.append(conn.receive())
            assert got == replies
            assert not conn.decoder.buffered
            # two replies in one read: the first goes through the decoder, the second is kept for later
            server.sendall(_frame(replies[0]) + _frame(replies[1]))
            assert [conn.receive(), conn.receive()] == replies[:2]
        conn.close()


def _old_holds_packed(obj: Any) -> bool:
    """The per-value test :func:`holds_packed` replaced."""
    return type(obj) is dict and any(type(v) in (Packed, PackedArray) for v in obj.values())


def _plain(value: Any) -> Any:
    if type(value) is Packed:
        return msgpack.unpackb(value)
    if type(value) is PackedArray:
        return msgpack.unpackb(b"".join([value.header, *value.items]))
    return value


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"v": 1, "id": 7, "op": "offer", "queue": "q", "value": b"x", "key": None, "headers": None},
        {"ok": True, "listing": Packed.of([1, 2])},
        {"ok": True, "queues": pack_array([Packed.of("a"), Packed.of("b")])},
        {"value": b"plain bytes", "nested": {"inner": Packed.of(1)}},  # only top-level values are spliced
        [Packed.of(1)],
        Packed.of({"a": 1}),
        None,
    ],
)
def test_holds_packed_answers_as_before_and_packs_to_the_plain_bytes(obj: Any) -> None:
    assert holds_packed(obj) is _old_holds_packed(obj)
    if type(obj) is dict and not isinstance(obj.get("nested"), dict):
        plain = {k: _plain(v) for k, v in obj.items()}
        expected = msgpack.packb(plain, use_bin_type=True)
        assert pack(obj) == expected
        assert b"".join(pack_parts(obj)) == expected
