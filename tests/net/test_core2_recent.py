"""``RecentRows.note`` keeps a merge's appended rows as slices of the staged value's overlay (no Record
built a row): it must keep, and serve, exactly what building the rows again did, on any history of
merges (stored/overlay boundaries, runs joined, the caps, truncations, forks), and a kept slice must
not keep the rest of a large overlay alive."""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, RecordRun, make_record
from latticed.net import core2_recent
from latticed.net.core2_ahead import Miss
from latticed.net.core2_recent import RecentRows
from latticed.storage.entries import StoredEntries


class _Before(RecentRows):
    """``note`` as it was before it sliced the overlay: every row built and read again (the reference)."""

    def note(self, q: int, state: QueueState2, count: int) -> None:
        hi = state.held[1]
        lo = max(hi - count, state.held[0])
        if lo >= hi:
            return
        records = tuple(state.entries.records(lo - state.held[0], hi - state.held[0]))
        chains = tuple(state.entries.chain(o - state.held[0]) for o in range(lo, hi))
        old = self._runs.get(q)
        if old is not None and old.hi == lo and old.chains and old.chains[-1] == state.chain_at(lo):
            keep = max(0, len(old.records) + len(records) - core2_recent.RECENT_RECORDS)
            records, chains = tuple(old.records[keep:]) + records, old.chains[keep:] + chains
            lo = old.lo + keep
        runs = self._runs
        runs.pop(q, None)
        while len(runs) >= core2_recent.RECENT_QUEUES:
            runs.pop(next(iter(runs)))
        runs[q] = core2_recent._Recent(lo, records, chains)


class _Disk:
    """A row source over each queue's history from offset 0 (the rows a store holds)."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[Record, bytes]]] = {}

    def record(self, q: int, off: int) -> Record | None:
        return self.rows[q][off][0]

    def chain(self, q: int, off: int) -> bytes | None:
        return self.rows[q][off][1]

    def records(self, q: int, lo: int, hi: int) -> list[Record]:
        return [r for r, _ in self.rows[q][lo:hi]]

    def run(self, q: int, lo: int, hi: int) -> RecordRun:
        return RecordRun.of(self.records(q, lo, hi))


@dataclass
class _State:
    """What ``note`` and ``matches`` read of a :class:`QueueState2`."""

    held: tuple[int, int]
    entries: StoredEntries
    base_hash: bytes

    def chain_at(self, offset: int) -> bytes | None:
        lo, hi = self.held
        if offset == lo:
            return self.base_hash
        return self.entries.chain(offset - lo - 1) if lo < offset <= hi else None


def _state(disk: _Disk, q: int, start: int, stored: int, as_run: bool) -> QueueState2:
    """Queue ``q``'s rows from ``start``, the first ``stored`` of them on disk, the rest an overlay."""
    rows = disk.rows[q]
    over = rows[start + stored :]
    records: Sequence[Record] = tuple(r for r, _ in over)
    if as_run:
        records = RecordRun.of(records)
    chains = tuple(c for _, c in over)
    last = rows[start + stored - 1][1] if stored else None
    entries = StoredEntries(disk, q, start, stored, last, overlay_records=records, overlay_chains=chains)
    base = rows[start - 1][1] if start else b"\0" * 32
    return cast(QueueState2, _State((start, len(rows)), entries, base))


def _grow(rows: list[tuple[Record, bytes]], k: int, tag: str) -> None:
    for _ in range(k):
        prev = rows[-1][1] if rows else b"\0" * 32
        record = make_record(
            f"{tag}{len(rows)}".encode(), key=b"k" if len(rows) % 3 else None, timestamp=len(rows)
        )
        rows.append((record, hashlib.sha256(prev + record.value).digest()))


def _served(rows: RecentRows, q: int, span: int) -> list[object]:
    """Everything ``rows`` answers about queue ``q``'s offsets up to ``span``: Miss or the value."""
    out: list[object] = []

    def ask(f: object, *args: int) -> None:
        try:
            got = f(q, *args)  # type: ignore[operator]
        except Miss:
            out.append(Miss)
            return
        out.append(list(got) if isinstance(got, Sequence) and not isinstance(got, bytes) else got)

    for off in range(span + 1):
        ask(rows.record, off)
        ask(rows.chain, off)
        for hi in (off, off + 1, off + 5, span):
            ask(rows.records, off, hi)
            ask(rows.run, off, hi)
    return out


_ops = st.lists(
    st.tuples(
        st.sampled_from(["merge", "merge", "merge", "truncate", "fork"]),
        st.integers(0, 4),  # the queue
        st.integers(0, 12),  # records appended / dropped / cut back
        st.integers(0, 12),  # where the disk ends: 6 = where the appended rows start
        st.booleans(),  # the overlay a RecordRun (a merged delta's) or a tuple of Records
        st.integers(-2, 6),  # the count noted, past what was appended (more than held: capped at held)
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_note_keeps_and_serves_what_building_the_rows_kept(
    ops: list[tuple[str, int, int, int, bool, int]],
) -> None:
    disk = _Disk()
    before, after = _Before(), RecentRows()
    starts: dict[int, int] = {}
    with (
        mock.patch.object(core2_recent, "RECENT_RECORDS", 4),
        mock.patch.object(core2_recent, "RECENT_QUEUES", 3),
    ):
        for kind, q, n, stored, as_run, extra in ops:
            rows = disk.rows.setdefault(q, [])
            start = starts.setdefault(q, 0)
            if kind == "truncate":
                starts[q] = start = min(len(rows), start + n)
                continue
            if kind == "fork":  # another history past a point: other records, other chains
                del rows[max(start, len(rows) - n) :]
                _grow(rows, n, "fork")
            else:
                _grow(rows, n, "r")
            held = len(rows) - start
            on_disk = min(held, max(0, held - n + stored - 6))  # below, at or into what was appended
            state = _state(disk, q, start, on_disk, as_run)
            count = max(0, n + extra)
            before.note(q, state, count)
            after.note(q, state, count)
            assert before._runs.keys() == after._runs.keys()
            for p, run in before._runs.items():
                new = after._runs[p]
                assert (new.lo, list(new.records), new.chains) == (run.lo, list(run.records), run.chains)
                assert _served(after, p, len(disk.rows[p]) + 1) == _served(before, p, len(disk.rows[p]) + 1)
            for since in range(start - 1, len(rows) + 2):
                assert after.matches(q, state, since) == before.matches(q, state, since)


def test_note_keeps_a_merged_run_as_columns() -> None:
    """A merge's overlay that is a run is kept as a run (a live push's few rows as Records)."""
    disk = _Disk()
    rows = disk.rows.setdefault(0, [])
    _grow(rows, 300, "r")
    recent = RecentRows()
    recent.note(0, _state(disk, 0, 0, 100, as_run=True), 200)
    kept = recent._runs[0].records
    assert type(kept) is RecordRun
    assert kept.values == tuple(r.value for r, _ in rows[100:])
    assert type(recent.run(0, 132, 300)) is RecordRun


def test_a_kept_slice_does_not_keep_a_large_overlay_alive() -> None:
    """The last merge's rows of a 50k overlay are kept; the overlay's other rows are freed with it."""
    n, count = 50_000, 2_048
    tracemalloc.start()
    try:
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        values = [i.to_bytes(4, "big") * 25 for i in range(n)]  # 100-byte values
        run = RecordRun(values, [None] * n, range(n))
        chains = tuple(hashlib.sha256(v).digest() for v in values)
        del values
        disk = _Disk()
        disk.rows[0] = []
        state = cast(
            QueueState2,
            _State(
                (0, n), StoredEntries(disk, 0, 0, 0, overlay_records=run, overlay_chains=chains), b"\0" * 32
            ),
        )
        whole = tracemalloc.get_traced_memory()[0] - base
        recent = RecentRows()
        recent.note(0, state, count)
        del state, run, chains
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(recent._runs[0].records) == count
    assert kept < whole * 2 * count / n, (kept, whole)  # about count / n of it, not the whole overlay
