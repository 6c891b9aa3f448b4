"""How a compact link names a queue: in full the first time, by its per-link number after that.

Core 1's and core 2's compact forms (:mod:`.compact`, :mod:`.core2_compact`) number queues the same way,
so they read a peer's naming by one strict rule: a number the link never gave, or anything but a number
or a well-formed ``[owner, name, kind]``, is the peer's protocol error.
"""

from __future__ import annotations

from typing import Any, Protocol

from latticed.crdt.head import MAX_NAME_BYTES
from latticed.errors import RemoteProtocolError
from latticed.protocol.replication_messages import QueueKey, check_key

__all__ = ["Numbering", "name_queue", "named_queue"]


class Numbering(Protocol):
    """One direction of a link's memory: the numbers it gave, in order, bounded by ``learn``."""

    numbers: dict[QueueKey, int]
    keys: list[QueueKey]

    def learn(self, key: QueueKey) -> None: ...


def name_queue(side: Numbering, key: QueueKey) -> Any:
    """``key`` as the next message names it (and numbered from then on, while the memory has room)."""
    number = side.numbers.get(key)
    if number is not None:
        return number
    side.learn(key)
    return [key[0], key[1], key[2]]


def named_queue(side: Numbering, raw: Any) -> QueueKey:
    """The queue a received message names, learnt as the sender learnt it when it named it in full."""
    if type(raw) is int:
        if not 0 <= raw < len(side.keys):
            raise RemoteProtocolError(f"a compact message names queue {raw}, which this link never numbered")
        return side.keys[raw]
    if type(raw) is not list or len(raw) != 3:
        raise RemoteProtocolError("a compact queue is a number or [owner, name, kind]")
    key = check_key(raw[0], raw[1], raw[2])
    if len(key[1].encode()) > MAX_NAME_BYTES or not 0 <= key[2] <= 255:
        raise RemoteProtocolError(f"a queue name is at most {MAX_NAME_BYTES} bytes, a kind 0-255")
    side.learn(key)
    return key
