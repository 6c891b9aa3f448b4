"""Replicated records that are verified but not yet committed here, for live tails only.

A peer's delta is checked against its owner's signatures before it goes to the storage thread, and
everything in it is fixed by those signatures: whatever this replica stores at those offsets, now or
after a crash and a fresh catch-up, is the same bytes. So a ``tail`` on a replica can stream them while
the group commit is still under way, which takes one durable commit (~1 ms, more under disk load) out
of the writer-to-reader path. Nothing else reads from here: ``read``, ``range``, ``peek``, summaries,
acknowledgements and forwarding to other peers all wait until the records are durable here.

Only a delta that extends exactly what the replica holds (or what is already ahead) is kept; a commit
that reaches its end, a failed merge, or a fork drops it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from latticed.crdt.records import Record, RecordRun
from latticed.storage.reader import Columns, columns_of

#: Only live pushes are shown ahead (a catch-up chunk is not latency-bound and would cost a copy).
AHEAD_DELTA_RECORDS: Final = 64
#: At most this many records per queue wait ahead of their commit; past it, tails wait for the commit.
AHEAD_MAX_RECORDS: Final = 1024


@dataclass(frozen=True, slots=True)
class VerifiedAhead:
    """Contiguous verified records ``[first, end)`` of one queue; ``end_hash`` is the chain value at
    ``end``, which the next delta must start from."""

    first: int
    records: RecordRun
    end_hash: bytes

    @property
    def end(self) -> int:
        return self.first + len(self.records)

    @classmethod
    def of(cls, first: int, records: Sequence[Record], end_hash: bytes) -> VerifiedAhead:
        return cls(first, RecordRun.of(records), end_hash)

    def extended(self, first: int, records: Sequence[Record], end_hash: bytes) -> VerifiedAhead:
        """These records appended (``first`` must be our end)."""
        assert first == self.end
        return VerifiedAhead(self.first, RecordRun.join([self.records, RecordRun.of(records)]), end_hash)

    def columns(self, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Records from ``lo`` (which must be held here) below ``hi``, bounded like any read."""
        return columns_of(self.first, self.records, lo, hi, max_records=max_records, max_bytes=max_bytes)
