"""The rows the latest merges appended to each core-2 queue, kept so a relay answers the next link's
``NeedDelta2`` for a push it just merged on the event loop, without a reader thread's read transaction
per relayed record (used by :mod:`latticed.net.core2_engine_host`)."""

from __future__ import annotations

from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, RecordRun
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
    ``lo + i``'s chain value (which binds every record up to it). Immutable."""

    __slots__ = ("chains", "lo", "records")

    def __init__(self, lo: int, records: tuple[Record, ...], chains: tuple[bytes, ...]) -> None:
        self.lo, self.records, self.chains = lo, records, chains

    @property
    def hi(self) -> int:
        return self.lo + len(self.records)


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
        records = tuple(state.entries.records(lo - state.held[0], hi - state.held[0]))
        chains = tuple(state.entries.chain(o - state.held[0]) for o in range(lo, hi))
        old = self._runs.get(q)
        if old is not None and old.hi == lo and old.chains and old.chains[-1] == state.chain_at(lo):
            keep = max(0, len(old.records) + len(records) - RECENT_RECORDS)
            records, chains = old.records[keep:] + records, old.chains[keep:] + chains
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
    def _run(self, q: int, lo: int, hi: int) -> tuple[Record, ...]:
        run = self._runs.get(q)
        if run is None or lo < run.lo or hi > run.hi or lo > hi:
            raise _Miss
        return run.records[lo - run.lo : hi - run.lo]

    def record(self, q: int, off: int) -> Record | None:
        return self._run(q, off, off + 1)[0]

    def chain(self, q: int, off: int) -> bytes | None:
        run = self._runs.get(q)
        if run is None or not run.lo <= off < run.hi:
            raise _Miss
        return run.chains[off - run.lo]

    def records(self, q: int, lo: int, hi: int) -> list[Record]:
        return list(self._run(q, lo, hi))

    def run(self, q: int, lo: int, hi: int) -> RecordRun:
        return RecordRun.of(self._run(q, lo, hi))
