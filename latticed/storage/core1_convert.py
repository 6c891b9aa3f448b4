"""Converting a queue of fork core 1 to core 2 in the store, by its owner (:class:`UpgradeQueue`: ``queue
upgrade``, and ``queue recover`` of a forked core-1 queue) or by a replica that receives the owner's
converted queue (:func:`stage_conversion`, from replication's merge job,
:class:`latticed.net.core2_engine_host.ConvertMerge2`).

The queue keeps its number and its records (both cores chain records alike, :mod:`latticed.crdt.queue2.
from_core1`); its ``queues`` row turns to core 2, its core-1 heads and checkpoints go and its core-2 rows
are written, all in the group commit's one transaction: a crash anywhere leaves the core-1 queue or the
core-2 one, never neither. Jobs of the same group commit that come after a conversion cannot touch the
queue on core 1 (:attr:`Batch.converted`); the writer forgets it as a core-1 queue once committed.
"""

from __future__ import annotations

from latticed.crdt import epochs
from latticed.crdt.group import DLQ_META_KEY
from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.queue.state import QueueState
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.queue2.from_core1 import converted, fork_point
from latticed.errors import (
    BehindPeersError,
    ForkedQueueError,
    LatticedError,
    MalformedError,
    NotOwnerError,
    OtherCoreError,
)
from latticed.privacy.meta import EPOCH_KEY as SEALED_KEY
from latticed.storage.batch import Batch
from latticed.storage.core2_queues import Core2Queues, core2_of
from latticed.storage.core2_store import Queue2Row
from latticed.storage.jobs import Job, WriterView

__all__ = ["ConversionBusyError", "UpgradeQueue", "committed_core1", "stage_conversion"]


class ConversionBusyError(LatticedError):
    """The queue has core-1 changes staged in the same group commit: convert it in the next one."""

    code = "busy"


def stage_conversion(batch: Batch, core2: Core2Queues, q: int, state: QueueState, value: QueueState2) -> None:
    """Stage core-1 queue ``q`` (committed as ``state``) as the core-2 ``value``."""
    conn = core2.store.connection
    row = conn.execute("SELECT created_ms FROM queues WHERE q = ?", (q,)).fetchone()
    created = int(row[0]) if row is not None else core2.now_ms
    before = QueueState2(
        state.owner,
        state.name,
        state.kind,
        epochs.empty(state.owner, state.queue_id),
        (),
        state.entries,  # type: ignore[arg-type]
    )
    batch.mutations += 1
    batch.converted.add(q)
    core2.convert(Queue2Row(q, state.queue_id, state.owner, state.name, state.kind, created), before, value)


def committed_core1(batch: Batch, q: int) -> QueueState:
    """Core-1 queue ``q`` as committed, if no job of this group commit changed it (else a retry)."""
    if q in batch.staged or q in batch.converted:
        raise ConversionBusyError(f"queue #{q} has changes in this group commit; convert it in the next")
    return batch.state(q)


class UpgradeQueue(Job):
    """The owner's core-1 queue ``q`` continued on core 2: version 1 of epoch 1 over its records from
    its signed start to its end, or with ``recover`` (a forked queue) to its fork point, the records past
    it kept aside as evidence or, with ``keep_mine``, offered again in the new epoch. ``result``: the
    queue's new ``(start, end)``."""

    __slots__ = ("keep_mine", "q", "recover")

    def __init__(self, q: int, *, recover: bool = False, keep_mine: bool = False) -> None:
        super().__init__()
        self.q, self.recover, self.keep_mine = q, recover, keep_mine

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        state = committed_core1(batch, self.q)
        address = f"{state.owner.hex()}/{state.name}"
        if state.kind != KIND_QUEUE:
            raise OtherCoreError(f"{address} is not a queue: only queues convert to fork core 2")
        meta = state.meta_dict
        if SEALED_KEY in meta:  # core 2 seals nothing yet: its records and offers would be plaintext
            raise OtherCoreError(f"{address} is sealed: sealed queues stay on fork core 1 for now")
        if DLQ_META_KEY in meta:  # the group reads it as core 1; it moves with its group, not alone
            raise OtherCoreError(
                f"{address} is the dead-letter queue of group {meta[DLQ_META_KEY]}: it stays on core 1"
            )
        if state.owner != batch.identity.public_key:
            raise NotOwnerError(f"cannot convert {address}: only its owner's daemon can")
        point = fork_point(state)
        if point is None and self.recover:
            raise MalformedError(f"{address} is not forked: there is nothing to recover")
        if point is not None and not self.recover:
            raise ForkedQueueError(
                f"{address} is forked at offset {point}: `latticectl queue recover {state.name}` "
                "converts it from there"
            )
        if point is None and not state.complete:
            raise BehindPeersError(
                f"cannot convert {address} yet: the records of its newest head from offset "
                f"{state.held_end} to {state.known_end} are not here; retry once the catch-up has landed"
            )
        value, rest = converted(state, batch.identity, batch.now_ms, upto=point)
        stage_conversion(batch, core2, self.q, state, value)
        if rest and self.keep_mine:
            core2.append(self.q, rest, {})
        elif rest:
            assert point is not None
            core2.keep_evidence(self.q, 0, point, rest)  # core 1's history is epoch 0
        lo, hi = value.held
        self.result = lo, hi + (len(rest) if self.keep_mine else 0)
