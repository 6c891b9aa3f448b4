"""Schema 5 on a store of schema 4: every core-1 queue stays byte for byte what it was (its rows, its
records, its checkpoints, its KV view, its time index), is core 1, and loads and writes on as before."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from support.clocks import TickingClock

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage.jobs import Append
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000
OLD_TABLES = ("settings", "queues", "segments", "checkpoints", "kv", "times")


def rec(i: int) -> Record:
    return make_record(b"v%d" % i + b"." * 300, key=b"k%d" % i, timestamp=NOW + i)


def schema_4_store(path: Path) -> dict[str, core.QueueState]:
    """A store as 0.3.0.dev left it at schema 4: two queues of several heads (checkpoints, a truncation,
    metadata) and a KV namespace with its view."""
    store = Store(path, migrations=MIGRATIONS[:4])
    states = {}
    for q, name in ((1, "orders"), (2, "events")):
        empty = core.empty_state(ALICE.public_key, name)
        state = empty
        for batch in range(5):
            records = [rec(batch * 1500 + i) for i in range(1500)]
            state = core.commit(
                state, ALICE, now_ms=NOW + batch, records=records, meta_updates={"b": str(batch)}
            )
        state = core.commit(state, ALICE, now_ms=NOW + 9, new_start=q * 700)
        store.begin()
        store.insert_queue(q, empty, NOW)
        store.persist(q, store.empty_view(q, empty), state)
        store.commit()
        states[name] = state
    ns_empty = core.empty_state(ALICE.public_key, "kv", KIND_KV)
    ns = core.commit(ns_empty, ALICE, now_ms=NOW, records=[Record(value=b"an op", timestamp=NOW)])
    store.begin()
    store.insert_queue(3, ns_empty, NOW)
    store.persist(3, store.empty_view(3, ns_empty), ns)
    store.put_kv(3, [("key", kv.Entry(kv.PLAIN, (NOW << 16, b"t"), b"value", NOW + 5))])
    store.commit()
    store.close()
    return states


def dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        out = {}
        for table in OLD_TABLES:
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            kept = [c for c in columns if c != "core"]
            out[table] = sorted(conn.execute(f"SELECT {', '.join(kept)} FROM {table}").fetchall(), key=repr)
        return out
    finally:
        conn.close()


def test_schema_5_keeps_every_core_1_queue_byte_for_byte(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    states = schema_4_store(path)
    before = dump(path)
    assert before["segments"] and before["checkpoints"] and before["kv"] and before["times"]

    store = Store(path)
    assert (
        store.migrated_from == 4 and store.kept_copy is not None and store.kept_copy.name.endswith(".pre-4")
    )
    cores = store.connection.execute("SELECT DISTINCT core FROM queues").fetchall()
    store.close()
    assert cores == [(1,)]  # every existing queue is core 1
    after = dump(path)
    after["settings"] = [row for row in after["settings"] if row[0] != "written_by"]
    before["settings"] = [row for row in before["settings"] if row[0] != "written_by"]
    assert after == before
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()

    writer = Writer(path, ALICE, clock=TickingClock(NOW + 100))
    writer.open()
    try:
        loaded = {state.name: state for state in writer.states.values() if state.name in states}
        assert loaded == states and writer.core2.queues() == []
        job = Append(1, [rec(9999)])
        writer.process([job])
        assert job.error is None and job.result == states["orders"].held_end
    finally:
        writer.stop()
