"""Both compact forms read a peer's queue naming by one rule: what it named in full it may name by number
after, and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from latticed.errors import RemoteProtocolError
from latticed.protocol.queue_numbers import name_queue, named_queue
from latticed.protocol.replication_messages import QueueKey

KEY: QueueKey = (b"\x01" * 32, "jobs", 0)


@dataclass
class Side:
    limit: int = 2
    numbers: dict[QueueKey, int] = field(default_factory=dict)
    keys: list[QueueKey] = field(default_factory=list)

    def learn(self, key: QueueKey) -> None:
        if key not in self.numbers and len(self.keys) < self.limit:
            self.numbers[key] = len(self.keys)
            self.keys.append(key)


def test_a_queue_is_named_in_full_once_then_by_its_number_on_both_ends() -> None:
    sender, receiver = Side(), Side()
    first = name_queue(sender, KEY)
    assert first == [KEY[0], KEY[1], KEY[2]]
    assert named_queue(receiver, first) == KEY
    second = name_queue(sender, KEY)
    assert second == 0
    assert named_queue(receiver, second) == KEY


def test_past_the_memory_queues_travel_in_full() -> None:
    sender = Side(limit=1)
    other: QueueKey = (b"\x02" * 32, "more", 0)
    name_queue(sender, KEY)
    assert name_queue(sender, other) == [other[0], other[1], other[2]]
    assert name_queue(sender, other) == [other[0], other[1], other[2]]


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (0, "never numbered"),
        (-1, "never numbered"),
        ("jobs", "number or"),
        ([b"\x01" * 32, "jobs"], "number or"),
        ([b"\x01" * 32, "x" * 300, 0], "at most"),
        ([b"\x01" * 32, "jobs", 256], "kind 0-255"),
    ],
)
def test_anything_else_is_the_peers_protocol_error(raw: object, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        named_queue(Side(), raw)
