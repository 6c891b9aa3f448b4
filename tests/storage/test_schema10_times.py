"""Schema 10: the time index's index on ``(q, top)`` is dropped (one page fewer every commit writes).

A schema-9 store keeps every row of every table through the upgrade (records, heads and their
signatures, core-2 bodies and leaves, KV values) and answers every lookup by time as before; a kill
inside the step leaves schema 9 whole; a build of schema 9 refuses a schema-10 store and leaves it as
it was."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from latticed.crdt.kvplan import KvRequest
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import StorageError
from latticed.storage import segments
from latticed.storage import writer as writer_module
from latticed.storage.core2_jobs import Commit2, CreateQueue2
from latticed.storage.jobs import Append, CreateQueue, Job, KvWrite
from latticed.storage.precopy import copy_path
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.store import Store, db_path
from latticed.storage.timeseek import offset_for_time
from latticed.storage.writer import Writer

OWNER = Identity.from_seed(b"t" * 32)
NOW = 1_700_000_000_000
#: Offer timestamps that mostly rise and step back now and then (a clock set back).
STAMPS = [NOW + 7 * i - (500 if i % 97 == 0 else 0) for i in range(1200)]


def ok(w: Writer, job: Job) -> Any:
    w.process([job])
    assert job.error is None, job.error
    return job.result


def rec(i: int) -> Record:
    return make_record(b"v%d" % i, key=b"k%d" % (i % 50), timestamp=STAMPS[i])


def schema_9_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """A store the way a schema-9 build writes one: a core-1 and a core-2 queue of signed records
    (single offers and batches, so small segments, compacted ones and big ones), and KV values."""

    def store_9(store_path: Path, **options: Any) -> Store:
        return Store(store_path, migrations=MIGRATIONS[:9], **options)

    with monkeypatch.context() as patch:
        patch.setattr(writer_module, "Store", store_9)
        w = Writer(path, OWNER, clock=lambda: NOW)
        w.open()
        try:
            one = ok(w, CreateQueue("one"))
            two = ok(w, CreateQueue2("two"))
            for i in range(0, 600, 300):
                ok(w, Append(one, [rec(j) for j in range(i, i + 300)]))
                ok(w, Commit2(two, [rec(j) for j in range(i, i + 300)]))
            for i in range(600, 1200, 4):  # single offers, batched four at a time as the thread takes them
                w.process([Commit2(two, (rec(i + k),), checked=True) for k in range(4)])
                ok(w, Append(one, [rec(i), rec(i + 1), rec(i + 2), rec(i + 3)]))
            for i in range(20):
                ok(w, KvWrite(KvRequest("put", f"key{i}", value=b"value %d" % i)))
            ok(w, KvWrite(KvRequest("incr", "n", by=5)))
        finally:
            w.stop()
    assert schema_of(path) == 9 and has_times_top(path)
    return one, two


def schema_of(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def has_times_top(path: Path) -> bool:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'times_top'").fetchone() is not None
    finally:
        conn.close()


def every_row(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in key order (the content a migration must keep)."""
    conn = sqlite3.connect(path)
    try:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master "
                "WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
    finally:
        conn.close()


#: Timestamps to look up: around every stamp held, before the first and past the last.
PROBES = sorted({t + d for t in STAMPS[::13] for d in (-1, 0, 1)} | {NOW - 1000, NOW + 4000, NOW + 9000})


def by_definition(conn: sqlite3.Connection, q: int, t: int) -> tuple[int, int] | None:
    """The first held offset whose timestamp is at or after ``t``, from every record's timestamp."""
    held = {s.first + i: ts for s in segments.scan(conn, q, 0, 2**62) for i, ts in enumerate(s.timestamps)}
    return next(((o, held[o]) for o in sorted(held) if held[o] >= t), None)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_schema_9_store_upgrades_with_every_row_kept_and_the_same_answers_by_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert SCHEMA_VERSION == 10
    path = db_path(tmp_path)
    one, two = schema_9_store(path, monkeypatch)
    before = every_row(path)
    assert len(before["segments"]) > 10 and before["kv"] and before["bodies2"] and before["leaves2"]
    conn = sqlite3.connect(path)
    answers = {(q, t): by_definition(conn, q, t) for q in (one, two) for t in PROBES}
    conn.close()
    assert answers[(one, NOW + 4000)] is not None and answers[(two, NOW + 9000)] is None

    w = Writer(path, OWNER, clock=lambda: NOW)
    w.open()  # the upgrade, then every queue loaded (heads checked against their signatures)
    try:
        assert w.store.migrated_from == 9 and schema_of(path) == 10 and not has_times_top(path)
        assert every_row(path) == before  # records, chains, heads, signatures, bodies, leaves, KV
        conn = w.store.connection
        assert {(q, t): offset_for_time(conn, q, t) for q, t in answers} == answers
        # And it goes on: both queues take offers at their ends.
        assert ok(w, Append(one, [rec(5)])) is not None
        ok(w, Commit2(two, [rec(6)]))
    finally:
        w.stop()
    assert copy_path(path, 9).exists()
    assert has_times_top(copy_path(path, 9)) and schema_of(copy_path(path, 9)) == 9


def test_a_build_of_schema_9_refuses_a_schema_10_store_and_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = db_path(tmp_path)
    schema_9_store(path, monkeypatch)
    Store(path).close()  # upgraded to 10
    assert schema_of(path) == 10
    before = digest(path)
    with pytest.raises(StorageError) as refused:
        Store(path, migrations=MIGRATIONS[:9])
    message = str(refused.value)
    assert "schema version 10" in message and "schema 9 and older" in message, message
    assert str(copy_path(path, 9)) in message  # what the operator restores to roll back
    assert digest(path) == before


#: Run in a child: upgrade the store with schema 10's step, killed (SIGKILL) after the step ran and
#: before its transaction commits, with the version bump written or not.
KILLED = """
import os, signal, sys
from pathlib import Path
from latticed.storage import schema
from latticed.storage.store import Store

def step_then_kill(conn):
    schema._v10_time_index_keyed(conn)
    if sys.argv[2] == "bumped":
        conn.execute("PRAGMA user_version = 10")
    os.kill(os.getpid(), signal.SIGKILL)

Store(Path(sys.argv[1]), migrations=(*schema.MIGRATIONS[:9], step_then_kill))
"""


@pytest.mark.parametrize("where", ["stepped", "bumped"])
def test_a_kill_inside_the_step_leaves_schema_9_whole_and_the_next_start_upgrades(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    path = db_path(tmp_path)
    one, _ = schema_9_store(path, monkeypatch)
    before = every_row(path)
    child = subprocess.run(
        [sys.executable, "-c", KILLED, str(path), where], check=False, capture_output=True, timeout=120
    )
    assert child.returncode == -9, child.stderr.decode()
    assert schema_of(path) == 9 and has_times_top(path)  # the step's transaction never committed
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert every_row(path) == before
    store = Store(path)
    try:
        assert store.migrated_from == 9 and not has_times_top(path)
        assert offset_for_time(store.connection, one, NOW + 4000) is not None
    finally:
        store.close()
    assert every_row(path) == before
