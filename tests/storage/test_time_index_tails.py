"""The time index's last rows kept in memory (:class:`latticed.storage.timeindex.Tails`): an append at a
queue's end reads nothing of the index, and the index holds exactly what the reading path writes after
any sequence of appends, truncations, failed commits and restarts."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.clocks import TickingClock

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage import segments, timeindex
from latticed.storage.core2_jobs import Commit2, CreateQueue2
from latticed.storage.jobs import Append, CreateQueue, Job, Truncate
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


class _Blind(timeindex.Tails):
    """Knows no queue: every write takes the reading path (what the index did before ``Tails``)."""

    def __contains__(self, q: object) -> bool:
        return False


def _open(path: Path, blind: bool) -> Writer:
    w = Writer(path, ALICE, clock=TickingClock(NOW))
    w.open()
    if blind:
        w.store._tails = _Blind()
    return w


def _ok(w: Writer, job: Job) -> object:
    w.process([job])
    assert job.error is None, job.error
    return job.result


def _rows(conn: sqlite3.Connection) -> list[tuple[int, int, int, int]]:
    return [tuple(r) for r in conn.execute("SELECT q, first, peak, top FROM times ORDER BY q, first")]


def _defined(conn: sqlite3.Connection, q: int) -> list[tuple[int, int, int, int]]:
    """The rows by definition: each segment's peak, and the running maximum of the peaks."""
    out, top = [], None
    for seg in segments.scan(conn, q, 0, 2**62):
        peak = max(seg.timestamps)
        top = peak if top is None else max(top, peak)
        out.append((q, seg.first, peak, top))
    return out


class _Failing:
    """The store's COMMIT fails once (as on an I/O error): the writer rolls the batch back."""

    def __init__(self, w: Writer) -> None:
        self.commit = w.store.commit
        self.w = w

    def __call__(self) -> None:
        self.w.store.commit = self.commit  # type: ignore[method-assign]
        raise sqlite3.OperationalError("disk I/O error")


def _step(
    w: Writer, path: Path, blind: bool, q: int, kind: str, arg: object, n: int, stamps: list[int]
) -> Writer:
    """One step of a history on ``w``; returns the writer (a new one after a restart)."""
    if kind == "restart":
        w.stop()
        return _open(db_path(path), blind)
    if kind == "truncate":
        assert isinstance(arg, float)
        state = w.states[q]
        if state.held_end > state.start:
            _ok(w, Truncate(q, state.start + int(arg * (state.held_end - state.start))))
        return w
    records = [make_record(f"{n}-{j}".encode(), timestamp=t) for j, t in enumerate(stamps)]
    if kind == "fail":
        end = w.states[q].held_end
        w.store.commit = _Failing(w)  # type: ignore[method-assign]
        job = Append(q, records)
        w.process([job])
        assert job.error is not None and w.states[q].held_end == end
    else:
        _ok(w, Append(q, records))
    return w


STEP = st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(-60, 120), min_size=1, max_size=40)),
    st.tuples(st.just("big"), st.integers(-60, 120)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("fail"), st.lists(st.integers(-60, 120), min_size=1, max_size=5)),
    st.tuples(st.just("restart"), st.none()),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=24))
def test_the_index_equals_the_reading_paths_after_any_history(steps: list[tuple[str, object]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp, "fast"), Path(tmp, "read")]
        for path in paths:
            path.mkdir()
        writers = [_open(db_path(paths[0]), False), _open(db_path(paths[1]), True)]
        try:
            qs = {_ok(w, CreateQueue("q")) for w in writers}
            assert len(qs) == 1
            q = qs.pop()
            assert isinstance(q, int)
            clock = NOW
            for n, (kind, arg) in enumerate(steps):
                stamps: list[int] = []
                if kind in ("append", "fail"):
                    assert isinstance(arg, list)
                    for d in arg:
                        clock += d
                        stamps.append(clock)
                elif kind == "big":  # split into several segments by one insert
                    assert isinstance(arg, int)
                    clock += arg
                    stamps = [clock + (i % 7) * 3 for i in range(2500)]
                for i in range(2):
                    writers[i] = _step(writers[i], paths[i], i == 1, q, kind, arg, n, stamps)
                fast, read = (w.store.connection for w in writers)
                assert _rows(fast) == _rows(read)
                assert _rows(fast) == _defined(fast, q)
        finally:
            for w in writers:
                w.stop()


def test_single_offers_read_nothing_of_the_index_after_the_first(writer: Writer) -> None:
    """A group commit of single offers to a core-2 queue writes its index row without a SELECT of the
    index (the first commit after opening reads the last row once)."""
    q = _ok(writer, CreateQueue2("single"))
    assert isinstance(q, int)

    def commit() -> None:
        jobs: list[Job] = [Commit2(q, (Record(b"x" * 100, None, NOW, ()),), checked=True) for _ in range(16)]
        writer.process(jobs)
        assert all(job.error is None for job in jobs)

    commit()
    statements: list[str] = []
    writer.store.connection.set_trace_callback(statements.append)
    try:
        for _ in range(3):  # COMPACT_EVERY is larger: no compaction in between
            commit()
    finally:
        writer.store.connection.set_trace_callback(None)
    assert sum("INTO times" in sql for sql in statements) == 3
    assert not [sql for sql in statements if "FROM times" in sql]
    assert len(statements) == 3 * 7, statements


def _segment(first: int, stamps: list[int]) -> segments.Segment:
    records = [make_record(b"v", timestamp=t) for t in stamps]
    return segments.Segment.from_records(first, records, [bytes(32)] * len(records))


@pytest.mark.parametrize("cut", ["all", "from", "below"])
def test_every_removal_forgets_the_last_row(tmp_path: Path, cut: str) -> None:
    """After rows go, a later append past the old last row reads the index again: what it remembered
    (a top of 9,000) would be wrong for the rows left."""
    w = _open(db_path(tmp_path), False)
    try:
        conn, tails = w.store.connection, timeindex.Tails()
        conn.execute("BEGIN IMMEDIATE")
        segments.insert(conn, 1, _segment(0, [100, 200]), tails=tails)
        segments.insert(conn, 1, _segment(2, [9_000]), tails=tails)
        assert tails.last(1) == (2, 9_000)
        if cut == "all":
            segments.delete_all(conn, 1, tails=tails)
        elif cut == "from":
            segments.delete_from(conn, 1, 2, tails=tails)
        else:
            segments.delete_below(conn, 1, 3, tails=tails)
        assert 1 not in tails
        segments.insert(conn, 1, _segment(5, [300]), tails=tails)
        conn.execute("COMMIT")
        assert _rows(conn) == _defined(conn, 1)
        assert tails.last(1) == (5, _defined(conn, 1)[-1][3])
    finally:
        w.stop()
