"""What replication of queues on the v2 fork core needs from the daemon's store, beside
:class:`~latticed.net.gossip.ReplicaHost` (core 1): the link part is
:class:`~latticed.protocol.core2_session.Core2Link`, which asks for these through its events.

Unlike core 1, a core-2 delta is verified against the state it is joined into
(``queue2.verify_delta(state, delta)`` merges its leaves into that state's chains), so verifying and
joining are one step of the store's writer: :meth:`Core2Host.submit_merge2`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from latticed.crdt import queue2
from latticed.crdt.core_errors import GapError
from latticed.errors import NotFoundError
from latticed.protocol.core2_steps import Outgoing2
from latticed.protocol.core2_wire import Steps, Summary2
from latticed.protocol.replication_messages import QueueKey

__all__ = ["OWN_RACES", "Core2Host", "PendingMerge2"]

#: What a read of our own store raises when a commit of ours took its rows (``GapError``) or its queue
#: (``NotFoundError``) meanwhile: no fault of the peer's, so the reader reads again. A peer's deltas never
#: raise these here (they fail verification or the protocol instead).
OWN_RACES = (GapError, NotFoundError)


class PendingMerge2(Protocol):
    async def result(self) -> tuple[Summary2 | None, bool]:
        """Wait until it is durably stored: (what we hold now, whether it changed anything). A delta that
        no longer fits the state (``GapError``) is (what we hold, None if nothing; False) and stores
        nothing; a forged or malformed one raises its IntegrityError or MalformedError (the link
        closes). Then ``Core2Link.delta_applied``."""
        ...


class Core2Host(Protocol):
    def summaries2(self) -> Mapping[QueueKey, Summary2]:
        """Every core-2 queue held: ``core2_wire.link_summary`` of each state."""
        ...

    async def delta2_for(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        """``core2_steps.outgoing(state, since, max_records, max_bytes)`` (None: the queue is not held).
        Rows or a queue a commit of ours took between the value's load and the read raise ``GapError`` or
        ``NotFoundError``: the link driver reads again (``Gossip._read_again``), the host does not."""
        ...

    def submit_merge2(self, delta: queue2.Delta, steps: Steps | None, peer: bytes) -> PendingMerge2:
        """Against the state it joins: ``core2_steps.unpack_steps``, ``queue2.verify_delta``,
        ``join_verified``; store the joined state and keep ``Merged.evidence`` aside (bounded, never
        merged). Merges submitted one after the other are applied in that order."""
        ...
