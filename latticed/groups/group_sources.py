"""A group's source queues on either fork core.

Its owner may move a source from core 1 to core 2 (``queue upgrade``) under a running group: the queue
keeps its number and its offsets, so floors, cursors and attempt history go on as they were. Only where
the group finds the queue, its bounds and its commits differ: core-2 commits do not pass through the
change fanout (it carries core-1 values), so :func:`watch_sources` wakes the feeder on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import trio

from latticed.crdt.head import KIND_QUEUE
from latticed.storage.catalog import QueueCatalog
from latticed.storage.core2_view import Core2View

__all__ = ["SourceStore", "find_source", "held", "watch_sources"]


class SourceStore(QueueCatalog, Protocol):
    """The catalog, and the core-2 queues beside it."""

    @property
    def core2(self) -> Core2View: ...


def find_source(engine: SourceStore, owner: bytes, name: str) -> int | None:
    """The stored queue ``owner/name`` on either core (None: not here yet)."""
    q = engine.find(owner, name, KIND_QUEUE)
    return q if q is not None else engine.core2.lookup(owner, name, KIND_QUEUE)


def held(engine: SourceStore, q: int) -> tuple[int, int]:
    """The offsets ``[start, end)`` this daemon holds of queue ``q`` (either core; a core-2 value not
    loaded yet holds nothing as far as a group knows: every one is loaded at start and on commit)."""
    if engine.core2.holds(q):
        state = engine.core2.loaded(q)
        return (0, 0) if state is None else state.held
    state1 = engine.state(q)
    return state1.start, state1.held_end


async def watch_sources(
    engine: SourceStore,
    sources: Callable[[], Iterable[tuple[str, int]]],
    rewatch: Callable[[], trio.Event],
    dirty: Callable[[list[str]], None],
) -> None:
    """Forever: wait for a commit of any queue ``sources()`` names (source id, queue), or for ``rewatch()``
    (the set changed), then hand ``dirty`` the sources now on core 2. Core-1 queues are watched too, so
    the commit that converts one is seen; their records reach the feeder through the change fanout."""
    while True:
        watched = list(sources())
        events = [rewatch(), *(engine.core2.changed(q) for q in {q for _, q in watched})]
        async with trio.open_nursery() as nursery:

            async def woken(event: trio.Event, scope: trio.CancelScope = nursery.cancel_scope) -> None:
                await event.wait()
                scope.cancel()

            for event in events:
                nursery.start_soon(woken, event)
        on_core2 = [sid for sid, q in watched if engine.core2.holds(q)]
        if on_core2:
            dirty(on_core2)
