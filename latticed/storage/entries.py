"""``StoredEntries``: the lattice's :class:`~latticed.crdt.queue.Entries` read lazily from the store.

A queue's rows stay on disk; a view holds only its bounds, the cached chain value at its end, and an
in-memory *overlay* of rows appended by ``extend`` that are not written yet. ``core.commit`` and
``core.join_verified`` therefore run unchanged on stored queues: they extend and drop views, and the
store later writes the difference (overlay rows in, rows below the new start out) in the group commit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol

from latticed.crdt.records import MIXED, Record, RecordRun, join_records, uniform
from latticed.errors import GapError
from latticed.storage import segments


class RowSource(Protocol):
    """Reads committed rows of one store through one connection (so: from that connection's thread)."""

    def record(self, q: int, off: int) -> Record | None: ...
    def chain(self, q: int, off: int) -> bytes | None: ...
    def records(self, q: int, lo: int, hi: int) -> list[Record]: ...
    def run(self, q: int, lo: int, hi: int) -> RecordRun: ...


class SqlRows:
    """A :class:`RowSource` over one SQLite connection (records stored in segments)."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def record(self, q: int, off: int) -> Record | None:
        segment = segments.containing(self.conn, q, off)
        return None if segment is None else segment.record(off)

    def chain(self, q: int, off: int) -> bytes | None:
        return segments.chain_at(self.conn, q, off)

    def records(self, q: int, lo: int, hi: int) -> list[Record]:
        out: list[Record] = []
        for segment in segments.scan(self.conn, q, lo, hi):
            out.extend(segment.records(lo, hi))
        return out

    def run(self, q: int, lo: int, hi: int) -> RecordRun:
        """Rows ``[lo, hi)`` as a run: the segments' columns, no Record built (a delta sends them)."""
        keys: list[bytes | None] = []
        values: list[bytes] = []
        timestamps: list[int] = []
        headers: list[Any] = []
        for segment in segments.scan(self.conn, q, lo, hi):
            part = segment if lo <= segment.first and segment.end <= hi else segment.slice(lo, hi)
            keys += part.keys
            values += part.values
            timestamps += part.timestamps
            headers += part.headers
        column = None
        if headers.count(None) != len(headers):
            same = uniform(headers)  # a producer's stamp on each: converted once
            if same is not MIXED:
                column = [tuple((k, v) for k, v in same)] * len(headers)
            else:
                column = [tuple((k, v) for k, v in h) if h else () for h in headers]
        return RecordRun(values, keys, timestamps, column)


def _missing(q: int, off: int) -> GapError:
    # Only a reader racing a truncation can see this: the rows it was promised are gone.
    return GapError(f"offset {off} of queue #{q} is no longer stored (truncated meanwhile); retry")


class StoredEntries:
    """Rows ``[lo, lo + stored)`` on disk followed by ``overlay`` rows in memory; immutable."""

    __slots__ = ("_last_chain", "_lo", "_overlay_chains", "_overlay_records", "_source", "_stored", "q")

    def __init__(
        self,
        source: RowSource,
        q: int,
        lo: int,
        stored: int,
        last_chain: bytes | None = None,
        *,
        overlay_records: Sequence[Record] = (),
        overlay_chains: tuple[bytes, ...] = (),
    ) -> None:
        self._source = source
        self.q = q
        self._lo = lo
        self._stored = stored
        #: The chain value of the last stored row, so signing a new head never reads the disk.
        self._last_chain = last_chain if stored else None
        self._overlay_records = overlay_records
        self._overlay_chains = overlay_chains

    # ------------------------------------------------------------------ what the store needs
    @property
    def lo(self) -> int:
        """Absolute offset of index 0."""
        return self._lo

    @property
    def stored(self) -> int:
        """How many leading entries are already rows on disk."""
        return self._stored

    @property
    def source(self) -> RowSource:
        return self._source

    @property
    def overlay(self) -> tuple[Sequence[Record], tuple[bytes, ...]]:
        """Appended entries not written yet (records, chains); the records are immutable (a tuple or a
        :class:`~latticed.crdt.records.RecordRun`)."""
        return self._overlay_records, self._overlay_chains

    def rebind(self, source: RowSource) -> StoredEntries:
        """The same view reading through another connection (a reader thread's)."""
        return StoredEntries(
            source,
            self.q,
            self._lo,
            self._stored,
            self._last_chain,
            overlay_records=self._overlay_records,
            overlay_chains=self._overlay_chains,
        )

    def flushed(self) -> StoredEntries:
        """This view once its overlay is on disk: everything stored, nothing held in memory."""
        n = len(self)
        return StoredEntries(self._source, self.q, self._lo, n, self.chain(n - 1) if n else None)

    # ------------------------------------------------------------------ the Entries protocol
    def __len__(self) -> int:
        return self._stored + len(self._overlay_records)

    def record(self, index: int) -> Record:
        if index >= self._stored:
            return self._overlay_records[index - self._stored]
        if index < 0:
            raise IndexError(index)
        record = self._source.record(self.q, self._lo + index)
        if record is None:
            raise _missing(self.q, self._lo + index)
        return record

    def chain(self, index: int) -> bytes:
        if index >= self._stored:
            return self._overlay_chains[index - self._stored]
        if index < 0:
            raise IndexError(index)
        if index == self._stored - 1 and self._last_chain is not None:
            return self._last_chain
        value = self._source.chain(self.q, self._lo + index)
        if value is None:
            raise _missing(self.q, self._lo + index)
        return value

    def records(self, lo: int = 0, hi: int | None = None) -> list[Record]:
        n = len(self)
        hi = n if hi is None else min(hi, n)
        lo = max(lo, 0)
        if lo >= hi:
            return []
        out: list[Record] = []
        if lo < self._stored:
            stop = min(hi, self._stored)
            out = self._source.records(self.q, self._lo + lo, self._lo + stop)
            if len(out) != stop - lo:
                raise _missing(self.q, self._lo + lo + len(out))
        if hi > self._stored:
            out.extend(self._overlay_records[max(lo - self._stored, 0) : hi - self._stored])
        return out

    def run(self, lo: int = 0, hi: int | None = None) -> Sequence[Record]:
        """:meth:`records` as a run where the rows are stored (read a column at a time: what a delta
        sends needs no Record per row), joined with the overlay's."""
        n = len(self)
        hi = n if hi is None else min(hi, n)
        lo = max(lo, 0)
        if lo >= hi:
            return ()
        out: Sequence[Record] = ()
        if lo < self._stored:
            stop = min(hi, self._stored)
            out = self._source.run(self.q, self._lo + lo, self._lo + stop)
            if len(out) != stop - lo:
                raise _missing(self.q, self._lo + lo + len(out))
        if hi > self._stored:
            out = join_records(out, self._overlay_records[max(lo - self._stored, 0) : hi - self._stored])
        return out

    def extend(self, records: Sequence[Record], chains: Sequence[bytes]) -> StoredEntries:
        return StoredEntries(
            self._source,
            self.q,
            self._lo,
            self._stored,
            self._last_chain,
            overlay_records=join_records(self._overlay_records, records),
            overlay_chains=self._overlay_chains + tuple(chains),
        )

    def drop(self, count: int) -> StoredEntries:
        count = min(max(count, 0), len(self))
        if count <= self._stored:
            return StoredEntries(
                self._source,
                self.q,
                self._lo + count,
                self._stored - count,
                self._last_chain,
                overlay_records=self._overlay_records,
                overlay_chains=self._overlay_chains,
            )
        skip = count - self._stored
        return StoredEntries(
            self._source,
            self.q,
            self._lo + count,
            0,
            None,
            overlay_records=self._overlay_records[skip:],
            overlay_chains=self._overlay_chains[skip:],
        )

    def take(self, count: int) -> StoredEntries:
        """The first ``count`` entries (a join that keeps ours up to where another history's run takes
        over); the store deletes the rows past them when it writes the state."""
        count = min(max(count, 0), len(self))
        if count >= self._stored:
            keep = count - self._stored
            return StoredEntries(
                self._source,
                self.q,
                self._lo,
                self._stored,
                self._last_chain,
                overlay_records=self._overlay_records[:keep],
                overlay_chains=self._overlay_chains[:keep],
            )
        return StoredEntries(self._source, self.q, self._lo, count)

    def __eq__(self, other: object) -> bool:
        if not hasattr(other, "records") or not hasattr(other, "__len__"):
            return NotImplemented
        if other is self:
            return True
        return len(self) == len(other) and self.records() == other.records()

    def __hash__(self) -> int:
        n = len(self)
        return hash((n, self.chain(n - 1) if n else b""))

    def __repr__(self) -> str:
        unwritten = len(self._overlay_records)
        return f"StoredEntries(q={self.q}, [{self._lo}, {self._lo + len(self)}), {unwritten} unwritten)"


__all__ = ["RowSource", "SqlRows", "StoredEntries"]
