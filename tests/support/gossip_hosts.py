"""Pieces of the in-memory replica hosts the gossip tests build (tests/net/)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from latticed.crdt import queue as core
from latticed.crdt.head import SignedHead
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.protocol.replication import QueueKey


@dataclasses.dataclass
class Applied:
    """A merge that already landed, as the gossip's host answers ``apply``: its summary and whether it
    changed anything (``ahead``: a verified live push kept ahead of the commit)."""

    summary: Summary
    changed: bool
    ahead: Summary | None = None

    async def result(self) -> tuple[Summary, bool]:
        return self.summary, self.changed

    def settled(self) -> tuple[Summary, bool] | None:
        return self.summary, self.changed


class MemoryReplicaHost:
    """A replica host in memory: deltas from its states, and joins that flag forks as the store does."""

    def __init__(self, states: Mapping[QueueKey, QueueState] | None = None) -> None:
        self.states: dict[QueueKey, QueueState] = dict(states or {})

    def summaries(self) -> Mapping[QueueKey, Summary]:
        return {k: s.summary() for k, s in self.states.items()}

    async def delta_for(
        self, key: QueueKey, since: Summary | None, max_records: int, max_bytes: int
    ) -> QueueDelta | None:
        state = self.states.get(key)
        return None if state is None else core.delta(state, since, max_records, max_bytes)

    async def verify_delta(self, delta: QueueDelta) -> core.VerifiedDelta:
        return core.verify_delta(core.empty_state(delta.owner, delta.name, delta.kind), delta)

    def submit_merge(self, verified: core.VerifiedDelta, peer: bytes) -> Applied:
        delta = verified.delta
        key = (delta.owner, delta.name, delta.kind)
        before = self.states.get(key) or core.empty_state(*key)
        after = core.join_verified(before, verified)
        self.states[key] = after
        self.merged()
        return Applied(after.summary(), after.summary() != before.summary())

    def merged(self) -> None:
        """Called after each merge (a subclass wakes its waiters here)."""

    def head(self, key: QueueKey) -> SignedHead | None:
        state = self.states.get(key)
        return state.head if state is not None else None
