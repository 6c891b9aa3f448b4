"""``queue list`` in time and event-loop turns that stay small however many queues the daemon holds.

A daemon that holds tens of thousands of queues, while a catch-up changes thousands of them a second,
must still answer ``queue list`` within a second, and answering it must not starve the catch-up (both run
on the event loop). So each queue's entry is built and msgpack-encoded once per committed state (the
storage thread publishes a new :class:`QueueState` object per change, so identity says whether it
changed) and kept encoded; a listing joins the encoded entries into the reply, and checks in with trio
every :data:`CHUNK` queues so other requests and the replication links run in between.

The reply on the wire is what it always was: a map with ``queues``, a list of maps (:class:`Packed`
only saves re-encoding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import trio

from latticed.api.messages import Packed, pack_array
from latticed.crdt.queue import QueueState

#: Queues looked at between two checkpoints (a few ms of work on this box at most).
CHUNK: Final = 2000

#: What is kept per queue: the state it was built from, its sort key and its encoded entry.
_Entry = tuple[QueueState, tuple[bool, str, str], bytes]


class QueueListing:
    """The encoded ``queue list`` entries of one daemon's queues, rebuilt only for queues that changed."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        #: Entries built since start (tests count them: unchanged queues are not rebuilt).
        self.built = 0

    async def reply(
        self,
        queues: list[int],
        state: Callable[[int], QueueState],
        info: Callable[[int, QueueState], dict[str, Any]],
        extra: Sequence[dict[str, Any]] = (),
    ) -> Packed:
        """The encoded list of every queue in ``queues``: owned first, then by owner and name.
        ``state`` gives a queue's committed state, ``info`` its entry as a map; ``extra`` are entries
        built elsewhere (queues on fork core 2, few), sorted in with the others."""
        entries = self._entries
        rows: list[tuple[tuple[bool, str, str], bytes]] = [
            ((not e["owned"], e["owner"], e["name"]), Packed.of(e)) for e in extra
        ]
        for i, q in enumerate(queues):
            if i and i % CHUNK == 0:
                await trio.lowlevel.checkpoint()
            try:
                current = state(q)
            except KeyError:  # gone while we were away from the loop
                continue
            entry = entries.get(q)
            if entry is None or entry[0] is not current:
                built = info(q, current)
                entry = (current, (not built["owned"], built["owner"], built["name"]), Packed.of(built))
                entries[q] = entry
                self.built += 1
            rows.append((entry[1], entry[2]))
        if len(entries) > 2 * len(queues) + CHUNK:  # queues removed since: forget their entries
            held = set(queues)
            for q in [q for q in entries if q not in held]:
                del entries[q]
        rows.sort(key=_sort_key)
        return pack_array([encoded for _, encoded in rows])


def _sort_key(row: tuple[tuple[bool, str, str], bytes]) -> tuple[bool, str, str]:
    return row[0]


__all__ = ["CHUNK", "QueueListing"]
