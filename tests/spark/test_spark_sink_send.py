"""A sink task's requests, a few in flight on one connection (latticed/spark/sink_send.py), against a real
daemon in process: answers in order with their offsets, at most ``window`` unanswered (one for another
daemon's queue, to keep a partition's rows in order there), a retry answered as duplicates, a refusal
raised as the daemon's error."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.inprocess import InProcessDaemon, start_in_process

from latticed.api.messages import Packed, pack
from latticed.errors import MalformedError
from latticed.host.config import DaemonConfig
from latticed.protocol.framing import encode_frame
from latticed.spark.sink_send import InFlight, Spliced, frame_buffers


@pytest.fixture
def daemon() -> Iterator[InProcessDaemon]:
    root = Path(tempfile.mkdtemp(prefix="ld-sink-send-"))
    d = start_in_process(DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"))
    yield d
    d.stop()


class Counting:
    """The daemon's stream, counting the requests sent and not yet answered."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.unanswered = 0
        self.most = 0

    def send_buffers(self, buffers: Any) -> None:
        self.inner.send_buffers(buffers)
        self.unanswered += 1
        self.most = max(self.most, self.unanswered)

    def receive(self) -> dict[str, Any]:
        reply: dict[str, Any] = self.inner.receive()
        self.unanswered -= 1
        return reply

    def close(self) -> None:
        self.inner.close()


def requests(queue: str, chunks: int, size: int = 5) -> list[dict[str, Any]]:
    return [
        {
            "queue": queue,
            "records": [[b"r%d-%d" % (c, i), None, [], None] for i in range(size)],
            "producer": "spark/test",
            "seq": c,
            "shared": True,
        }
        for c in range(chunks)
    ]


@pytest.mark.parametrize(("alone", "most"), [(False, 3), (True, 1)])
def test_requests_go_a_few_at_a_time_and_are_answered_in_order(
    daemon: InProcessDaemon, alone: bool, most: int
) -> None:
    with daemon.client() as c:
        queue = c.queue_create("sink")
        stream = Counting(c.open_stream(10.0))
        flight = InFlight(stream, window=3)
        answers = [a for r in requests(queue, 7) for a in flight.send(r, alone=alone)]
        answers += flight.drain()
        assert [(a.first, a.count, a.duplicate) for a in answers] == [(5 * i, 5, False) for i in range(7)]
        assert stream.most == most
        again = [a for r in requests(queue, 7) for a in flight.send(r)] + list(flight.drain())
        assert [(a.first, a.duplicate) for a in again] == [(5 * i, True) for i in range(7)]
        stream.close()
        assert int(c.queue_info(queue)["end_offset"]) == 35


def test_a_refused_request_raises_the_daemons_error(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        queue = c.queue_create("sink")
        flight = InFlight(c.open_stream(10.0))
        list(flight.send(requests(queue, 1)[0]))
        list(flight.drain())
        changed = requests(queue, 1, size=3)[0]  # the same sequence with other records
        with pytest.raises(MalformedError, match="same records"):
            list(flight.send(changed))
            list(flight.drain())


def test_a_frame_in_buffers_is_the_packed_frame_and_keeps_the_arrow_slices_uncopied() -> None:
    values = pa.array([b"v" * 70_000, b"w" * 3, b"x" * 90_000], pa.binary())
    data = memoryview(values.buffers()[2])
    big, small = data[:70_000], data[70_000:70_003]
    message = {
        "v": 2,
        "id": 7,
        "values": Spliced([b"\xc6" + (70_003).to_bytes(4, "big"), big, small]),
        "keys": Packed(b"\xc4\x01k"),
        "count": 2,
    }
    buffers = frame_buffers(message)
    joined = {**message, "values": Packed(b"".join(message["values"].parts))}  # type: ignore[union-attr]
    assert b"".join(buffers) == encode_frame(pack(joined), 1 << 30)
    assert any(b is big for b in buffers)  # written from the Arrow buffer itself
    assert len(buffers) == 3  # the small parts around it joined


def test_requests_written_in_parts_reach_the_daemon_whole(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        queue = c.queue_create("sink")
        flight = InFlight(c.open_stream(10.0))
        value = memoryview(b"y" * 200_000)
        request = {
            "queue": queue,
            "records": Spliced([b"\x91\x94\xc6" + (200_000).to_bytes(4, "big"), value, b"\xc0\x90\xc0"]),
            "producer": "spark/test",
            "seq": 0,
            "shared": True,
        }
        answers = list(flight.send(request)) + list(flight.drain())
        assert [(a.first, a.count) for a in answers] == [(0, 1)]
        assert c.read(queue, 0, 1).values == [b"y" * 200_000]
