"""Schema 8: record segments in a rowid table (its key an index), copied from the clustered
``WITHOUT ROWID`` table of every older schema with each row byte for byte, core-1 and core-2 queues'
records read back the same."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support.old_stores import queue_rows

from latticed.crdt import queue as core
from latticed.crdt import queue2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.store import Store, db_path

OWNER = Identity.from_seed(b"s" * 32)
NOW = 1_700_000_000_000
RECORDS = 5000  # several segments


def old_store(path: Path, schema: int) -> tuple[core.QueueState, list[Record]]:
    """A store of ``schema`` with a core-1 queue and, from schema 7, a core-2 queue's records."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store = Store(path, migrations=MIGRATIONS[:schema])
    records = [make_record(b"v%d" % i, key=b"k%d" % i, timestamp=NOW + i) for i in range(RECORDS)]
    one = core.commit(core.empty_state(OWNER.public_key, "one"), OWNER, now_ms=NOW, records=records)
    store.begin()
    store.insert_queue(1, one, NOW)
    store.persist(1, store.empty_view(1, core.empty_state(OWNER.public_key, "one")), one)
    store.commit()
    if schema >= 7:
        two = queue2.commit(queue2.empty_state(OWNER.public_key, "two"), OWNER, now_ms=NOW, records=records)
        queue_rows(store, 2, two, NOW)  # the leaves and bodies are not read here
        store.commit()
    store.close()
    return one, records


def segment_rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT q, first, count, chains, data FROM segments ORDER BY q, first").fetchall()
    finally:
        conn.close()


def segments_sql(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("SELECT sql FROM sqlite_master WHERE name = 'segments'").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("schema", [1, 4, 7])
def test_older_segments_are_copied_into_a_rowid_table_byte_for_byte(tmp_path: Path, schema: int) -> None:
    path = db_path(tmp_path)
    one, records = old_store(path, schema)
    before = segment_rows(path)
    assert len(before) > 2 and "WITHOUT ROWID" in segments_sql(path)
    store = Store(path)
    try:
        assert store.migrated_from == schema
        assert store.connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 8
        [loaded] = store.load()
        assert loaded.state == one
        assert store.rows.records(1, 0, RECORDS) == records
        if schema >= 7:
            assert store.rows.records(2, 0, RECORDS) == records
    finally:
        store.close()
    assert segment_rows(path) == before
    assert "WITHOUT ROWID" not in segments_sql(path)
    conn = sqlite3.connect(path)
    try:  # the key is still unique, and a range of offsets is read through its index
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO segments (q, first, count, chains, data) VALUES (1, 0, 1, x'', x'')")
        plan = " ".join(
            str(row[-1])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT data FROM segments WHERE q = 1 AND first >= 10"
            )
        )
        assert "USING INDEX" in plan
    finally:
        conn.close()


def test_a_new_store_keeps_segments_in_a_rowid_table(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Store(path).close()
    assert "WITHOUT ROWID" not in segments_sql(path)
