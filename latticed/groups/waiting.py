"""Bounds on the remote calls that wait for records at a group's owner (``dequeue``/``take`` with a
wait): per peer and group, and all peers together per group. A waiting call holding no lease takes no
consumer slot (:meth:`~latticed.groups.service.GroupService.dequeue`), so these bounds are what keeps
one peer's waiting calls from costing the owner without limit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final, TypeVar

from latticed.errors import CapacityError

K = TypeVar("K")

#: Calls one peer may have waiting on one group at once, and all peers together on one group.
MAX_WAITING_PER_PEER: Final = 256
MAX_WAITING_PER_GROUP: Final = 1024


class WaitingCalls:
    """Counts waiting calls per (group, peer) and per group; more than the bounds are refused."""

    def __init__(self, per_peer: int = MAX_WAITING_PER_PEER, per_group: int = MAX_WAITING_PER_GROUP) -> None:
        self.per_peer, self.per_group = per_peer, per_group
        self._by_peer: dict[tuple[int, bytes], int] = {}
        self._by_group: dict[int, int] = {}

    @contextlib.contextmanager
    def slot(self, group: int, name: str, peer: bytes, wait: float | None) -> Iterator[None]:
        """Hold a waiting slot of ``peer`` on group log ``group`` (named ``name``) while a call that may
        wait runs (``wait`` 0 or None: it does not wait, nothing is counted); CapacityError past a bound."""
        if not wait:
            yield
            return
        key = (group, peer)
        mine, everyone = self._by_peer.get(key, 0), self._by_group.get(group, 0)
        if mine >= self.per_peer:
            raise CapacityError(
                f"{peer.hex()} already has {self.per_peer} calls waiting on group {name} (the cap)"
            )
        if everyone >= self.per_group:
            raise CapacityError(f"group {name} already has {self.per_group} remote calls waiting (the cap)")
        self._by_peer[key], self._by_group[group] = mine + 1, everyone + 1
        try:
            yield
        finally:
            _down(self._by_peer, key)
            _down(self._by_group, group)

    def waiting(self, group: int) -> int:
        """Remote calls waiting on group log ``group`` now."""
        return self._by_group.get(group, 0)


def _down(counts: dict[K, int], key: K) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


__all__ = ["MAX_WAITING_PER_GROUP", "MAX_WAITING_PER_PEER", "WaitingCalls"]
