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
from dataclasses import dataclass, field

from latticed.crdt.records import Record, RecordRun
from latticed.storage.reader import Columns


@dataclass(slots=True)
class VerifiedAhead:
    """Contiguous verified records ``[first, end)`` of one queue, in the deltas they came in."""

    first: int
    end: int
    end_hash: bytes
    chunks: list[tuple[int, Sequence[Record]]] = field(default_factory=list)

    @classmethod
    def of(cls, first: int, records: Sequence[Record], end_hash: bytes) -> VerifiedAhead:
        return cls(first, first + len(records), end_hash, [(first, records)])

    def extended(self, first: int, records: Sequence[Record], end_hash: bytes) -> VerifiedAhead:
        """These records appended (``first`` must be our end)."""
        assert first == self.end
        return VerifiedAhead(self.first, first + len(records), end_hash, [*self.chunks, (first, records)])

    def columns(self, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Records from ``lo`` (which must be held here) below ``hi``: at most ``max_records``, about
        ``max_bytes`` (at least one)."""
        out = Columns()
        hi = min(hi, self.end, lo + max_records)
        for first, records in self.chunks:
            end = first + len(records)
            if end <= lo or first >= hi:
                continue
            a, b = max(lo, first) - first, min(hi, end) - first
            part = records[a:b]
            run = part if type(part) is RecordRun else RecordRun.of(part)
            headers = run.headers
            columns = zip(run.values, run.keys, run.timestamps, strict=True)
            for i, (value, key, timestamp) in enumerate(columns):
                size = len(value) + (len(key) if key else 0) + 16
                if out.offsets and out.nbytes + size > max_bytes:
                    return out
                out.offsets.append(first + a + i)
                out.keys.append(key)
                out.values.append(value)
                out.timestamps.append(timestamp)
                h = headers[i] if headers is not None else ()
                out.headers.append([[k, v] for k, v in h] if h else None)
                out.nbytes += size
        return out
