"""Retention of the owner's queues on fork core 2: the same policy (``retention.*`` metadata: max records,
max bytes, max age, keep unsettled) and the same plan read from the segments as core 1, cut by the owner's
signed truncation (``Core2View.truncate_queue``: ``Core2Engine.truncate``, fenced like any write).

Only the owner's queues: a replica cap (a local floor, ``drop_local`` on core 1) is not supported on core
2, whose replicas hold what their owner's heads say. A frozen queue (forked) is not cut: its owner
recovers it first. Core-2 commits do not pass the core-1 change listener, so these are checked at each
round of the retention timer (``retention_interval_s``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from latticed.crdt.queue2 import QueueState2
from latticed.host.retention_policy import policy_from_meta
from latticed.storage import prune
from latticed.storage.reader import StoreReader

T = TypeVar("T")


class Core2Retention(Protocol):
    """What retention uses of the engine's core-2 queues (:class:`~latticed.storage.core2_view.Core2View`)."""

    def owned(self, q: int) -> bool: ...

    def address(self, q: int) -> str: ...

    async def value(self, q: int) -> QueueState2: ...

    async def truncate_queue(self, q: int, new_start: int) -> int: ...


class Core2RetentionStore(Protocol):
    """The store's reads a cut needs (what the service's ``RetentionStore`` has)."""

    @property
    def clock(self) -> Callable[[], int]: ...

    async def inspect(self, fn: Callable[[StoreReader], T]) -> T: ...


@dataclass(frozen=True, slots=True)
class Cut2:
    """One checked core-2 queue: the records and bytes its truncation dropped (0: none), and why."""

    dropped: int
    freed: int
    reason: str
    start: int


async def enforce_core2(
    store: Core2RetentionStore,
    core2: Core2Retention,
    q: int,
    unsettled_floor: Callable[[str], int | None] | None = None,
) -> Cut2 | None:
    """Check our core-2 queue ``q`` against its policy and truncate what it asks for; None: nothing to
    check (not ours, no limit, or frozen)."""
    if not core2.owned(q):
        return None
    state = await core2.value(q)
    policy = policy_from_meta(dict(state.meta))[0]
    if not policy.limited or state.forked:
        return None
    start, end = state.held
    cutoff = None if policy.max_age_ms is None else store.clock() - policy.max_age_ms
    plan = await store.inspect(
        lambda reader: prune.plan(
            reader.conn,
            q,
            start,
            end,
            max_bytes=policy.max_bytes,
            max_records=policy.max_records,
            cutoff_ms=cutoff,
        )
    )
    cut = plan.cut
    if cut is not None and policy.keep_unsettled and unsettled_floor is not None:
        floor = unsettled_floor(core2.address(q))
        if floor is not None and floor < cut:
            cut = floor if floor > start else None
    if cut is None or cut <= start:
        return Cut2(0, 0, plan.reason, start)
    upto: int = cut
    freed = await store.inspect(lambda reader: prune.bytes_between(reader.conn, q, start, upto))
    new_start = await core2.truncate_queue(q, upto)
    dropped = max(min(new_start, end) - start, 0)
    return Cut2(dropped, freed if dropped else 0, plan.reason, new_start)


__all__ = ["Core2Retention", "Core2RetentionStore", "Cut2", "enforce_core2"]
