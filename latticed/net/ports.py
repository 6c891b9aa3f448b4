"""What the replication service needs from the store, as a narrow Protocol (the daemon passes its
:class:`~latticed.storage.engine.Engine`, whose replica side is
:class:`~latticed.storage.replica.ReplicaView`); a name appears here only if replication uses it."""

from __future__ import annotations

from typing import Protocol

from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.queue import QueueDelta, QueueState, Summary, VerifiedDelta
from latticed.storage.ahead import VerifiedAhead
from latticed.storage.bridge import StorageBridge
from latticed.storage.core2_view import Core2View
from latticed.storage.jobs import Merge


class ReplicaStore(Protocol):
    """The queues we hold, the deltas peers lack, and the verify-then-merge path for theirs."""

    def queues(self, kind: int = KIND_QUEUE) -> list[int]: ...

    def state(self, q: int) -> QueueState: ...

    def find(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> int | None: ...

    async def delta_for(
        self,
        owner: bytes,
        name: str,
        since: Summary | None,
        max_records: int | None = None,
        kind: int = KIND_QUEUE,
        *,
        max_bytes: int | None = None,
    ) -> QueueDelta: ...

    def ahead_for(
        self, owner: bytes, name: str, kind: int, since: Summary | None
    ) -> VerifiedAhead | None: ...

    async def verify_delta(self, delta: QueueDelta) -> VerifiedDelta: ...

    def verify_now(self, delta: QueueDelta) -> VerifiedDelta | None: ...

    def submit_merge(self, verified: VerifiedDelta, origin: object = None) -> Merge: ...

    async def merged(self, job: Merge) -> Merge: ...

    @property
    def bridge(self) -> StorageBridge:
        """The storage thread (core-2 merges and reads: :mod:`latticed.net.core2_engine_host`)."""
        ...

    @property
    def core2(self) -> Core2View:
        """Queues on the v2 fork core."""
        ...


__all__ = ["ReplicaStore"]
