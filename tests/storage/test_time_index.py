"""The time index: "the first offset whose timestamp is at or after T" on owners and replicas, whatever
the timestamps do (rising, stepping back), through appends, compaction, truncation, a replica's own
floor, a join that replaces the records, and the upgrade that adds the index to an older store."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from latticed.crdt import queue as core
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage import segments, timeindex
from latticed.storage.jobs import Append, CreateQueue, DropLocal, Job, Merge, Truncate
from latticed.storage.schema import MIGRATIONS
from latticed.storage.store import Store, db_path
from latticed.storage.timeseek import offset_for_time
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def ok(w: Writer, job: Job) -> object:
    w.process([job])
    assert job.error is None, job.error
    return job.result


def records(timestamps: Sequence[int], tag: str = "v") -> list[Record]:
    return [make_record(f"{tag}{i}".encode(), timestamp=ts) for i, ts in enumerate(timestamps)]


def expected(held: dict[int, int], t: int) -> tuple[int, int] | None:
    """By definition: the first held offset whose timestamp is at or after ``t``."""
    return next(((o, held[o]) for o in sorted(held) if held[o] >= t), None)


def stored_timestamps(conn: sqlite3.Connection, q: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for seg in segments.scan(conn, q, 0, 2**62):
        out.update({seg.first + i: ts for i, ts in enumerate(seg.timestamps)})
    return out


def check(conn: sqlite3.Connection, q: int) -> None:
    """Every answer agrees with the definition, for every timestamp held and around it."""
    held = stored_timestamps(conn, q)
    stamps = sorted(set(held.values()))
    picks = stamps if len(stamps) <= 40 else random.Random(len(held)).sample(stamps, 40)
    probes = {t + d for t in picks for d in (-1, 0, 1)} | {0, 2**62}
    for t in sorted(probes):
        assert offset_for_time(conn, q, t) == expected(held, t), t


def test_rising_timestamps_on_the_owner(writer: Writer) -> None:
    q = ok(writer, CreateQueue("q"))
    assert isinstance(q, int)
    for i in range(40):  # small commits: compaction merges them
        ok(writer, Append(q, records([NOW + 10 * (5 * i + j) for j in range(5)])))
    conn = writer.store.connection
    assert offset_for_time(conn, q, NOW) == (0, NOW)
    assert offset_for_time(conn, q, NOW + 15) == (2, NOW + 20)
    assert offset_for_time(conn, q, NOW + 1990) == (199, NOW + 1990)
    assert offset_for_time(conn, q, NOW + 1991) is None
    check(conn, q)


def test_timestamps_that_step_back_answer_the_first_offset_at_or_after(writer: Writer) -> None:
    q = ok(writer, CreateQueue("q"))
    assert isinstance(q, int)
    # The clock steps back by a minute after offset 2.
    ok(writer, Append(q, records([NOW, NOW + 60_000, NOW + 120_000])))
    ok(writer, Append(q, records([NOW + 61_000, NOW + 62_000, NOW + 130_000])))
    conn = writer.store.connection
    assert offset_for_time(conn, q, NOW + 61_000) == (2, NOW + 120_000)  # not 3: 2 comes first
    assert offset_for_time(conn, q, NOW + 125_000) == (5, NOW + 130_000)
    check(conn, q)


def test_random_histories_truncations_and_big_segments(writer: Writer) -> None:
    rng = random.Random(7)
    q = ok(writer, CreateQueue("q"))
    assert isinstance(q, int)
    clock = NOW
    for step in range(24):
        n = rng.choice((1, 3, 300, 2500))  # small ones get compacted, big ones split in segments
        stamps = []
        for _ in range(n):
            clock += rng.randint(-50, 100)  # mostly forward, sometimes back
            stamps.append(clock)
        ok(writer, Append(q, records(stamps, f"s{step}-")))
        if step % 6 == 5:
            state = writer.states[q]
            ok(writer, Truncate(q, rng.randint(state.start, state.held_end - 1)))
        if step % 3 == 2:
            check(writer.store.connection, q)


def test_a_replica_answers_the_same_and_after_dropping_its_oldest_records(writer: Writer) -> None:
    source = core.empty_state(BOB.public_key, "feed")
    big = records([NOW + 100_000 - i for i in range(3)] + [NOW + i for i in range(3000)])
    source = core.commit(source, BOB, now_ms=NOW, records=big)
    empty = core.empty_state(BOB.public_key, "feed")
    q = None
    while q is None or writer.states[q].held_end < source.held_end:
        since = None if q is None else writer.states[q].summary()
        q = ok(writer, Merge(core.verify_delta(empty, core.delta(source, since, max_records=700))))
    assert isinstance(q, int)
    conn = writer.store.connection
    assert offset_for_time(conn, q, NOW + 50) == (0, NOW + 100_000)  # the early outlier comes first
    check(conn, q)
    # Its own floor drops the outliers: the answer is now the record that has that timestamp.
    ok(writer, DropLocal(q, 2500))
    assert offset_for_time(conn, q, NOW + 50) == (2500, NOW + 2497)
    check(conn, q)


def test_the_answer_is_one_statement_bisecting_the_key(writer: Writer) -> None:
    """Since schema 10 no index on ``(q, top)``: one statement, whose every read of ``times`` is a seek
    of its key (no scan, no sort), answers as the definition does."""
    q = ok(writer, CreateQueue("q"))
    assert isinstance(q, int)
    for i in range(40):  # 40 segments of 256 records (too big to be compacted), rising by 10 ms
        ok(writer, Append(q, records([NOW + 10 * (256 * i + j) for j in range(256)])))
    conn = writer.store.connection
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'times_top'").fetchone() is None
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        assert offset_for_time(conn, q, NOW + 10 * 7777 + 1) == (7778, NOW + 77780)
    finally:
        conn.set_trace_callback(None)
    looked_up = [sql for sql in statements if "FROM times" in sql]
    assert len(looked_up) == 1, statements
    plan = conn.execute(f"EXPLAIN QUERY PLAN {looked_up[0]}").fetchall()
    reads = [str(row[-1]) for row in plan if " times" in str(row[-1])]
    assert reads and all(r.startswith("SEARCH times USING PRIMARY KEY") for r in reads), plan
    assert not [row for row in plan if "TEMP B-TREE" in str(row[-1])], plan
    check(conn, q)


@pytest.mark.parametrize("first", [0, 2**62, 2**63 - 300])
def test_the_bisection_holds_at_any_offset(writer: Writer, first: int) -> None:
    """Rows far apart and offsets near the largest (the midpoint must not leave SQLite's integers)."""
    conn = writer.store.connection
    writer.store.begin()
    stamps = [NOW + 3, NOW + 1, NOW + 8, NOW + 8, NOW + 20]
    parts = [(first + 50 * i, [ts]) for i, ts in enumerate(stamps)]
    timeindex.added(conn, 7, parts)
    writer.store.commit()
    tops = [max(stamps[: i + 1]) for i in range(len(stamps))]
    for t in range(NOW, NOW + 22):
        want = next((first + 50 * i for i, top in enumerate(tops) if top >= t), None)
        assert timeindex.segment_reaching(conn, 7, t) == want, t
    assert timeindex.segment_reaching(conn, 8, NOW) is None  # no rows at all


def test_writes_keep_the_index_without_looking_up_the_schema(writer: Writer) -> None:
    """The store knows from when it opened whether it has the index: a write asks the schema nothing."""
    q = ok(writer, CreateQueue("q"))
    assert isinstance(q, int)
    statements: list[str] = []
    writer.store.connection.set_trace_callback(statements.append)
    try:
        for i in range(12):  # appends, and the compaction of the small segments they leave
            ok(writer, Append(q, records([NOW + 10 * (3 * i + j) for j in range(3)])))
        ok(writer, Truncate(q, 5))
    finally:
        writer.store.connection.set_trace_callback(None)
    assert any("INTO times" in sql for sql in statements)
    assert not [sql for sql in statements if "sqlite_master" in sql]
    check(writer.store.connection, q)


def test_the_upgrade_indexes_a_store_written_without_the_index(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old = Store(path, migrations=MIGRATIONS[:3])
    stamps = [NOW + 5 * i for i in range(3000)]
    stamps[1500] = NOW  # one that went back
    state = core.commit(core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=NOW, records=records(stamps))
    old.begin()
    old.insert_queue(1, state, NOW)
    old.persist(1, old.empty_view(1, core.empty_state(ALICE.public_key, "q")), state)
    old.commit()
    old.close()
    store = Store(path)
    try:
        assert store.migrated_from == 3
        assert offset_for_time(store.connection, 1, NOW + 7500) == (1501, NOW + 7505)
        check(store.connection, 1)
    finally:
        store.close()
