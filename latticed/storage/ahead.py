"""Replicated records that are verified but not yet committed here: for live tails and for relaying.

A peer's delta is checked against its owner's signatures before it goes to the storage thread, and
everything in it is fixed by those signatures: whatever this replica stores at those offsets, now or
after a crash and a fresh catch-up, is the same bytes. So while the group commit is under way, a ``tail``
on this replica can stream them, and the same delta can be relayed, as it came, to peers that hold exactly
what it extends (each of them verifies it again). That takes this replica's durable commit (~1 ms, more
under disk load) out of the writer-to-reader path, at every hop. What stays behind the commit: the
acknowledgement to the sender (an ACK says "I hold it"), every other read (``read``, ``range``, ``peek``,
Spark), and summaries for new links.

Only a live push (a small delta) that extends exactly what the replica holds, or what is already ahead,
is kept; a commit that reaches its end, a failed merge, or a fork drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from latticed.crdt.queue import QueueDelta, Summary
from latticed.crdt.records import RecordRun
from latticed.storage.reader import Columns, columns_of

#: Only live pushes are shown ahead (a catch-up chunk is not latency-bound and would cost a copy).
AHEAD_DELTA_RECORDS: Final = 64
#: At most this many records per queue wait ahead of their commit; past it, tails wait for the commit.
AHEAD_MAX_RECORDS: Final = 1024


@dataclass(frozen=True, slots=True)
class VerifiedAhead:
    """Contiguous verified records ``[first, end)`` of one queue, the deltas that brought them, and
    ``summary``: what the replica will hold once they are committed (its chain value at the end is
    where the next delta must start)."""

    first: int
    records: RecordRun
    deltas: tuple[QueueDelta, ...]
    summary: Summary

    @property
    def end(self) -> int:
        return self.first + len(self.records)

    @classmethod
    def of(cls, delta: QueueDelta, summary: Summary) -> VerifiedAhead:
        return cls(delta.from_offset, RecordRun.of(delta.records), (delta,), summary)

    def extended(self, delta: QueueDelta, summary: Summary) -> VerifiedAhead:
        """``delta`` appended (it must start at our end)."""
        assert delta.from_offset == self.end
        records = RecordRun.join([self.records, RecordRun.of(delta.records)])
        return VerifiedAhead(self.first, records, (*self.deltas, delta), summary)

    def columns(self, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Records from ``lo`` (which must be held here) below ``hi``, bounded like any read."""
        return columns_of(self.first, self.records, lo, hi, max_records=max_records, max_bytes=max_bytes)

    def delta_from(self, since: Summary) -> QueueDelta | None:
        """The delta, as it came, that extends exactly what a peer summarised by ``since`` holds (None:
        none does; the peer gets what it lacks from the store once the commit is done)."""
        for delta in self.deltas:
            if delta.from_offset == since.held_end and delta.from_hash == since.held_hash:
                assert delta.head is not None
                if delta.meta is None and since.meta_version != delta.head.meta_version:
                    return None  # the peer also lacks metadata this delta does not carry
                return delta
        return None


def summary_after(base: Summary, delta: QueueDelta, end_hash: bytes) -> Summary | None:
    """What a replica summarised by ``base`` holds after joining ``delta``, a live push that extends it
    (None if the delta could change more than that: a truncation, or metadata it lacks)."""
    head = delta.head
    if head is None or head.start > delta.from_offset:
        return None
    if delta.meta is None and head.meta_version != base.meta_version:
        return None
    start = max(base.start, head.start)
    return Summary(
        version=max(base.version, head.version),
        start=start,
        held_end=delta.from_offset + len(delta.records),
        held_hash=end_hash,
        meta_version=max(base.meta_version, head.meta_version),
        forked=False,
        floor=base.floor if base.floor > start else 0,
    )
