"""Schema 6 keeps a core-2 queue's leaves and bodies in runs (latticed/storage/core2_runs.py): a store
of schema 5 (one row per leaf and per body, as the release before wrote it) opens to the very same
values, and writes on; a catch-up's chunk is one row of leaves and one of bodies; any change of leaves
or bodies (an append, a cut inside a run, bodies dropped from the middle of a run) reads back as the
value written."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.old_stores import queue_rows

from latticed.crdt import queue2
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.storage import core2_runs, core2_store
from latticed.storage.core2_jobs import Commit2, Truncate2
from latticed.storage.core2_queues import Core2Queues
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def singles(n: int, name: str = "q") -> QueueState2:
    """The owner's queue of ``n`` single offers, a metadata change and a truncation among them."""
    state = queue2.empty_state(ALICE.public_key, name)
    for i in range(n):
        records = [make_record(b"r%d" % i, timestamp=NOW + i)]
        state = queue2.commit(state, ALICE, now_ms=NOW + i, records=records)
        if i == 5:
            state = queue2.commit(state, ALICE, now_ms=NOW + i, meta_updates={"m": "1"})
    return queue2.truncate(state, ALICE, 3, now_ms=NOW + n)


def value(state: QueueState2) -> tuple[object, ...]:
    return (state.chains, state.meta, state.records(), state.bodies)


def _v5_leaves(conn: sqlite3.Connection, q: int, a: object, b: QueueState2) -> None:
    """Schema 5's rows, as the release before writes them: one per leaf."""
    conn.executemany(
        "INSERT INTO leaves2 (q, idx, digest, end_off) VALUES (?, ?, ?, ?)",
        [(q, i, d, e) for i, (d, e) in enumerate(b.chains.shared)],
    )
    conn.executemany(
        "INSERT INTO bodies2 (q, end_off, version, body) VALUES (?, ?, ?, ?)",
        [(q, b.end, b.version, b.to_bytes()) for b in b.bodies],
    )


def schema_5_store(path: Path, states: dict[int, QueueState2]) -> None:
    """A store of schema 5 holding ``states`` (q: state) as core-2 queues, rows as schema 5 lays them."""
    store = Store(path, migrations=MIGRATIONS[:5])
    conn = store.connection
    for q, state in states.items():
        queue_rows(store, q, state, NOW)
        _v5_leaves(conn, q, None, state)
        store.commit()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 5
    store.close()


@pytest.fixture(scope="module")
def big() -> QueueState2:
    return singles(core2_runs.RUN_MAX + 100)


def test_a_schema_5_store_reads_the_same_values_and_writes_on(big: QueueState2, tmp_path: Path) -> None:
    small = singles(12, "small")
    path = db_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema_5_store(path, {1: big, 2: small})

    store = Store(path)
    assert store.migrated_from == 5
    conn = store.connection
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    runs = conn.execute("SELECT q, count(*) FROM leaves2 GROUP BY q ORDER BY q").fetchall()
    assert runs == [(1, 2), (2, 1)]  # 4,195 leaves in two runs, 12 in one
    assert conn.execute("SELECT count(*) FROM bodies2 WHERE q = 1").fetchone()[0] == 2
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert not {"leaves2_v5", "bodies2_v5"} & tables
    queues = Core2Queues()
    queues.open(store)
    assert value(queues.committed(1)) == value(big) and value(queues.committed(2)) == value(small)
    store.close()

    writer = Writer(path, ALICE, clock=lambda: NOW + 10**6)
    writer.open()
    try:
        for job in (Commit2(1, [make_record(b"more", timestamp=NOW)]), Truncate2(1, 2000)):
            writer.process([job])
            assert job.error is None, job.error
        expected = value(writer.core2.committed(1))
    finally:
        writer.stop()
    store = Store(path)
    queues = Core2Queues()
    queues.open(store)
    assert value(queues.committed(1)) == expected
    assert expected[3] and all(b.end >= 2000 for b in expected[3])  # type: ignore[attr-defined]
    store.close()


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    store = Store(db_path(tmp_path_factory.mktemp("runs")))
    yield store.connection
    store.close()


def stored_bodies(conn: sqlite3.Connection) -> tuple[HeadV2, ...]:
    rows = conn.execute("SELECT bodies FROM bodies2 WHERE q = 1 ORDER BY end_off, version")
    return tuple(
        sorted(
            map(core2_store.decode_body, (b for (raw,) in rows for b in core2_runs.read_bodies(raw))),
            key=core2_store._key,
        )
    )


def stored_leaves(conn: sqlite3.Connection) -> tuple[tuple[bytes, int], ...]:
    return core2_runs.read_leaves(conn.execute("SELECT idx, leaves FROM leaves2 WHERE q = 1 ORDER BY idx"))


SMALL = singles(40)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_any_change_of_bodies_and_leaves_reads_back_as_written(
    conn: sqlite3.Connection, data: st.DataObject
) -> None:
    saved = core2_runs.RUN_MAX
    core2_runs.RUN_MAX = data.draw(st.integers(1, 6))  # type: ignore[misc]  # many runs of a few
    try:
        changes(conn, data)
    finally:
        core2_runs.RUN_MAX = saved  # type: ignore[misc]


def changes(conn: sqlite3.Connection, data: st.DataObject) -> None:
    conn.execute("DELETE FROM bodies2")
    conn.execute("DELETE FROM leaves2")
    bodies = SMALL.bodies
    old = tuple(b for b in bodies if data.draw(st.booleans()))
    new = tuple(b for b in bodies if data.draw(st.booleans()))
    core2_store._persist_bodies(conn, 1, (), old)
    assert stored_bodies(conn) == old
    core2_store._persist_bodies(conn, 1, old, new)
    assert stored_bodies(conn) == new

    chains = SMALL.chains
    shared = chains.shared
    a = replace(chains, shared=shared[: data.draw(st.integers(0, len(shared)))])
    b = replace(chains, shared=shared[: data.draw(st.integers(0, len(shared)))])
    core2_store._persist_leaves(conn, 1, replace(chains, shared=()), a)
    core2_store._persist_leaves(conn, 1, a, b)
    assert stored_leaves(conn) == b.shared


def test_a_catch_up_chunk_is_one_row_of_leaves_and_one_of_bodies(
    big: QueueState2, conn: sqlite3.Connection
) -> None:
    conn.execute("DELETE FROM bodies2")
    conn.execute("DELETE FROM leaves2")
    empty = queue2.empty_state(ALICE.public_key, "q")
    chunk = queue2.delta(big, None, core2_runs.RUN_MAX)
    joined = queue2.join_verified(empty, queue2.verify_delta(empty, chunk)).state
    assert len(joined.bodies) > 1000 and len(joined.chains.shared) > 1000
    core2_store._persist_leaves(conn, 1, empty.chains, joined.chains)
    core2_store._persist_bodies(conn, 1, empty.bodies, joined.bodies)
    runs = -(-len(joined.bodies) // core2_runs.RUN_MAX)  # 4,096 a run at most
    assert conn.execute("SELECT count(*) FROM bodies2").fetchone()[0] == runs <= 2
    assert conn.execute("SELECT count(*) FROM leaves2").fetchone()[0] == 2
    assert stored_leaves(conn) == joined.chains.shared and stored_bodies(conn) == joined.bodies


def test_stored_runs_with_a_gap_are_refused() -> None:
    rows = core2_runs.leaf_runs(0, SMALL.chains.shared[:5])
    with pytest.raises(Exception, match="do not follow"):
        core2_runs.read_leaves([(1, rows[0][1])])
    with pytest.raises(Exception, match="not a list of bytes"):
        core2_runs.read_bodies(b"\x01")
