"""The two seams through which services react to the engine and hold it back, built before either.

The composition root (:mod:`latticed.daemon`) makes one :class:`ChangeFanout` and one :class:`OwnerFence`
and passes them to the engine and to the services that use them, so no service reaches into the engine to
wire itself up. A service whose life is shorter than the engine's (replication is restarted under a new
network key on ``join``) subscribes or holds the fence for exactly as long as it runs, in a ``with``
block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from latticed.crdt.queue import QueueState
from latticed.storage.dropped_own import DroppedOwn

ChangeListener = Callable[[QueueState], None]
#: Why our own queue (its committed value given) must not be written right now, or None. It reads only
#: ``owner``, ``name``, ``kind`` and ``held_end`` of the value (core-2 queues pass just those).
FenceReason = Callable[[QueueState], str | None]


class ChangeFanout:
    """Hands each committed queue value to every subscriber, on the event loop, in commit order.

    The engine calls it once per queue changed by a group commit, after the tails of that queue were
    woken; the groups service (new records in a source) and replication (pushes to peers) subscribe."""

    def __init__(self) -> None:
        self._listeners: tuple[ChangeListener, ...] = ()

    def __call__(self, state: QueueState) -> None:
        for listener in self._listeners:
            listener(state)

    @contextmanager
    def subscribed(self, listener: ChangeListener) -> Iterator[None]:
        """``listener`` hears of every commit while the block runs."""
        self._listeners = (*self._listeners, listener)
        try:
            yield
        finally:
            listeners = list(self._listeners)
            listeners.remove(listener)
            self._listeners = tuple(listeners)


class OwnerFence:
    """Whether a write to one of our own queues must wait: checked by the engine before every write to a
    queue or KV namespace we own.

    Replication holds it while it runs: a peer may hold records of our queue that we lack (a store
    restored from a backup), and signing new ones at those offsets would fork our own queue."""

    def __init__(self) -> None:
        self._reason: FenceReason | None = None
        #: Our queues dropped by ``queue repair --drop`` and not back yet: refused whoever holds the fence
        #: (the engine loads them from its data directory when it opens).
        self.dropped = DroppedOwn(None)

    def reason(self, state: QueueState) -> str | None:
        """Why ``state``'s queue must not be written now, or None (also when nobody holds the fence)."""
        if self.dropped:  # a value with no head: a queue of ours about to be created
            held = None if state.head is None else state.held_end
            if (gone := self.dropped.reason(state.name, state.kind, held)) is not None:
                return gone
        reason = self._reason
        return None if reason is None else reason(state)

    def reason_of(self, owner: bytes, name: str, kind: int, held_end: int) -> str | None:
        """:meth:`reason` for a queue given by its address and held end (a core-2 queue, which has no
        core-1 value): the holder's reason is asked with a stand-in carrying only these four fields, so a
        :data:`FenceReason` must read nothing else of the value it is given."""
        if self.dropped and (gone := self.dropped.reason(name, kind, held_end)) is not None:
            return gone
        reason = self._reason
        if reason is None:
            return None
        return reason(cast(QueueState, _FencedQueue(owner, name, kind, held_end)))

    def load_dropped(self, data_dir: Path) -> None:
        """Read the dropped queues of the store in ``data_dir`` (the engine, as it opens)."""
        self.dropped = DroppedOwn.load(data_dir)

    def creating(self, name: str, kind: int) -> str | None:
        """Why our queue ``name`` must not be created now: one we dropped that is not back yet."""
        return self.dropped.reason(name, kind, None) if self.dropped else None

    @contextmanager
    def held_by(self, reason: FenceReason) -> Iterator[None]:
        """``reason`` answers for the fence while the block runs (one holder at a time)."""
        assert self._reason is None, "the owner fence is already held"
        self._reason = reason
        try:
            yield
        finally:
            self._reason = None


@dataclass(frozen=True, slots=True)
class _FencedQueue:
    """What a fence reason reads of a queue: its address and how far we hold it."""

    owner: bytes
    name: str
    kind: int
    held_end: int


__all__ = ["ChangeFanout", "ChangeListener", "FenceReason", "OwnerFence"]
