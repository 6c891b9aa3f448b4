"""The rows the latest merges appended to each core-2 queue, kept so a relay answers the next link's
``NeedDelta2`` for a push it just merged on the event loop, without a reader thread's read transaction
per relayed record (used by :mod:`latticed.net.core2_engine_host`)."""

from __future__ import annotations

from collections.abc import Sequence

from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, RecordRun, join_records
from latticed.net.core2_ahead import NO_ROWS as _NO_ROWS
from latticed.net.core2_ahead import Miss as _Miss
from latticed.storage.entries import StoredEntries

__all__ = ["RECENT_QUEUES", "RECENT_RECORDS", "RecentRows"]


#: How many of a queue's latest merged records :class:`RecentRows` keeps (a live relay needs the last few),
#: and for how many queues (the ones merged into last).
RECENT_RECORDS = 64
RECENT_QUEUES = 256


class _Recent:
    """Rows ``[lo, lo + len(records))`` of one queue as a merge staged them; ``chains[i]`` is row
    ``lo + i``'s chain value (which binds every record up to it). Immutable: ``records`` is a tuple, or a
    :class:`RecordRun` (a large merge's slice of its overlay, kept as columns: no Record built a row)."""

    __slots__ = ("chains", "lo", "records")

    def __init__(self, lo: int, records: Sequence[Record], chains: tuple[bytes, ...]) -> None:
        self.lo, self.records, self.chains = lo, records, chains

    @property
    def hi(self) -> int:
        return self.lo + len(self.records)


def _appended(state: QueueState2, a: int, b: int) -> tuple[Sequence[Record], tuple[bytes, ...]]:
    """Entries ``[a, b)`` of ``state`` and their chain values. The rows a merge just appended are its
    staged value's overlay, not written yet: their slices are taken as they are (a run's columns, the
    chain tuple), since building a Record and reading a chain value a row was most of a relay's CPU
    before its COMMIT. Slices copy references only, so the rest of the overlay is not kept alive. Rows
    already stored (or another view of the entries) are read as before."""
    entries = state.entries
    if isinstance(entries, StoredEntries) and a >= entries.stored:
        overlay_records, overlay_chains = entries.overlay
        s = entries.stored
        return overlay_records[a - s : b - s], overlay_chains[a - s : b - s]
    return tuple(entries.records(a, b)), tuple(entries.chain(i) for i in range(a, b))


class RecentRows:
    """The records the latest merges appended to each core-2 queue, as a row source (raising :class:`_Miss`
    for any other row). Written by the storage thread (one immutable entry swapped per queue), read on the
    event loop. An entry is used for a value only while that value's chain at its end is the entry's
    there (see :meth:`matches`), so a rolled-back, truncated or superseded run is never served."""

    def __init__(self) -> None:
        self._runs: dict[int, _Recent] = {}

    def note(self, q: int, state: QueueState2, count: int) -> None:
        """``state`` (staged on the storage thread) just appended its last ``count`` records."""
        hi = state.held[1]
        lo = max(hi - count, state.held[0])
        if lo >= hi:
            return
        records, chains = _appended(state, lo - state.held[0], hi - state.held[0])
        if len(records) < RECENT_RECORDS:
            # a live push's few rows: their Records cost less than a run's slice and join (columns pay
            # for a merge's thousands of rows, whose older run the cap drops anyway)
            records = tuple(records)
        old = self._runs.get(q)
        if old is not None and old.hi == lo and old.chains and old.chains[-1] == state.chain_at(lo):
            keep = max(0, len(old.records) + len(records) - RECENT_RECORDS)
            records, chains = join_records(old.records[keep:], records), old.chains[keep:] + chains
            lo = old.lo + keep
        runs = self._runs
        runs.pop(q, None)
        while len(runs) >= RECENT_QUEUES:
            runs.pop(next(iter(runs)))
        runs[q] = _Recent(lo, records, chains)

    def matches(self, q: int, state: QueueState2, since_end: int) -> bool:
        """Whether the rows a peer holding up to ``since_end`` lacks of ``state`` are all held here, and
        are ``state``'s: its chain at its end, known without a read, is the one held for that row."""
        run = self._runs.get(q)
        lo, hi = state.held
        if run is None or lo >= hi or not run.lo <= since_end or not run.lo < hi <= run.hi:
            return False
        entries = state.entries
        if not isinstance(entries, StoredEntries):
            return False
        try:
            end_chain = entries.rebind(_NO_ROWS).chain(hi - lo - 1)
        except _Miss:
            return False
        return end_chain == run.chains[hi - run.lo - 1]

    # ------------------------------------------------------------------ the RowSource protocol
    def _run(self, q: int, lo: int, hi: int) -> Sequence[Record]:
        run = self._runs.get(q)
        if run is None or lo < run.lo or hi > run.hi or lo > hi:
            raise _Miss
        return run.records[lo - run.lo : hi - run.lo]

    def record(self, q: int, off: int) -> Record | None:
        run = self._runs.get(q)
        if run is None or not run.lo <= off < run.hi:
            raise _Miss
        return run.records[off - run.lo]

    def chain(self, q: int, off: int) -> bytes | None:
        run = self._runs.get(q)
        if run is None or not run.lo <= off < run.hi:
            raise _Miss
        return run.chains[off - run.lo]

    def records(self, q: int, lo: int, hi: int) -> list[Record]:
        return list(self._run(q, lo, hi))

    def run(self, q: int, lo: int, hi: int) -> RecordRun:
        return RecordRun.of(self._run(q, lo, hi))
