"""One transaction of records for several owned queues on either fork core (a work-queue group commit, a
bulk offer): core-1 parts are appended as :class:`~latticed.storage.jobs.AppendMany` appends them,
core-2 parts staged as the owner's :class:`~latticed.storage.core2_jobs.Commit2`.

A part that fails after an earlier one was staged fails the whole job: the writer then runs its batch
again without it, so the parts land together or not at all, on both cores.
"""

from __future__ import annotations

from collections.abc import Sequence

from latticed.crdt.records import Record, check_records
from latticed.storage.batch import Batch
from latticed.storage.core2_jobs import Commit2
from latticed.storage.core2_queues import core2_of
from latticed.storage.jobs import Job, WriterView

__all__ = ["AppendManyCores"]


class AppendManyCores(Job):
    """Records for several owned queues, each on fork core 1 or 2, in one transaction; ``result`` is the
    first offset assigned in each part."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> None:
        super().__init__()
        self.parts = parts

    def apply(self, batch: Batch, writer: WriterView) -> None:
        core2 = core2_of(writer)
        firsts: list[int] = []
        for q, records in self.parts:
            if core2.committed_row(q) is not None:
                part = Commit2(q, records)
                part.apply(batch, writer)
                firsts.append(part.result)
            else:
                batch.require_owner(q, "offer")
                check_records(records)
                firsts.append(batch.append(q, records))
        self.result = firsts
