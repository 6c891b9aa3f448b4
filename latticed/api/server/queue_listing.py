"""``queue list`` in time and event-loop turns that stay small however many queues the daemon holds.

A daemon that holds tens of thousands of queues, while a catch-up changes thousands of them a second,
must still answer ``queue list`` within a second, and answering it must not starve the catch-up (both run
on the event loop). So each queue's entry is built and msgpack-encoded once per committed state (the
storage thread publishes a new :class:`QueueState` object per change, so identity says whether it
changed) and kept encoded; a listing joins the encoded entries into the reply, and checks in with trio
every :data:`CHUNK` queues so other requests and the replication links run in between. Queues on fork
core 2 are listed the same way (:class:`Listed`): a catch-up creates them by the thousand too.

The reply on the wire is what it always was: a map with ``queues``, a list of maps (:class:`Packed`
only saves re-encoding).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import trio

from latticed.api.messages import Packed, pack_array
from latticed.crdt.queue import QueueState

#: Queues looked at between two checkpoints (a few ms of work on this box at most).
CHUNK: Final = 2000

#: What is kept per queue: the state it was built from, its sort key and its encoded entry.
_Entry = tuple[object, tuple[bool, str, str], bytes]

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Listed(Generic[S]):
    """Queues to list whose values are of one type (each fork core's): ``state`` gives a queue's
    committed value if at hand (None: ``load`` it; KeyError: gone), ``info`` its entry as a map."""

    queues: Sequence[int]
    state: Callable[[int], S | None]
    load: Callable[[int], Awaitable[S]] | None
    info: Callable[[int, S], dict[str, Any]]


class QueueListing:
    """The encoded ``queue list`` entries of one daemon's queues, rebuilt only for queues that changed."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        #: Entries built since start (tests count them: unchanged queues are not rebuilt).
        self.built = 0

    async def reply(
        self,
        queues: Sequence[int],
        state: Callable[[int], QueueState],
        info: Callable[[int, QueueState], dict[str, Any]],
        more: Sequence[Listed[Any]] = (),
    ) -> Packed:
        """The encoded list of every queue in ``queues`` and in each of ``more``: owned first, then by
        owner and name. ``state`` gives a queue's committed state, ``info`` its entry as a map."""
        rows: list[tuple[tuple[bool, str, str], bytes]] = []
        parts: tuple[Listed[Any], ...] = (Listed(queues, state, None, info), *more)
        looked = 0
        for part in parts:
            looked = await self._add(rows, looked, part)
        entries = self._entries
        if len(entries) > 2 * looked + CHUNK:  # queues removed since: forget their entries
            held = set(queues).union(*(part.queues for part in more))
            for q in [q for q in entries if q not in held]:
                del entries[q]
        rows.sort(key=_sort_key)
        return pack_array([encoded for _, encoded in rows])

    async def _add(
        self, rows: list[tuple[tuple[bool, str, str], bytes]], looked: int, part: Listed[Any]
    ) -> int:
        """Append the rows of ``part`` (entries built for the queues whose state changed); returns how
        many queues were looked at so far (``looked`` before), the count the checkpoints go by."""
        state, load, info = part.state, part.load, part.info
        entries = self._entries
        for q in part.queues:
            if looked and looked % CHUNK == 0:
                await trio.lowlevel.checkpoint()
            looked += 1
            try:
                current = state(q)
                if current is None and load is not None:
                    current = await load(q)
            except KeyError:  # gone while we were away from the loop
                continue
            entry = entries.get(q)
            if entry is None or entry[0] is not current:
                built = info(q, current)
                entry = (current, (not built["owned"], built["owner"], built["name"]), Packed.of(built))
                entries[q] = entry
                self.built += 1
            rows.append((entry[1], entry[2]))
        return looked


def _sort_key(row: tuple[tuple[bool, str, str], bytes]) -> tuple[bool, str, str]:
    return row[0]


__all__ = ["CHUNK", "Listed", "QueueListing"]
