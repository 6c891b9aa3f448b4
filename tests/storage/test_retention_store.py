"""Retention in the store: a replica's local drop is persisted and still verifies, expired KV keys are
purged (their ops go with the next compaction, and a replica that missed them folds its view again;
a failing purge is a StorageError like any failed write),
free pages are kept for the next writes while writes keep coming, and what retention measures."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clocks import TickingClock

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.crdt.kvplan import KvRequest
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import NotOwnerError, StorageError
from latticed.storage import prune
from latticed.storage.codec import encode_kv_entry
from latticed.storage.jobs import Append, Call, CreateQueue, DropLocal, Job, KvWrite, Merge, Truncate
from latticed.storage.kv_upkeep import compact_step, purge_expired
from latticed.storage.kvcompact import CompactKv
from latticed.storage.reader import StoreReader
from latticed.storage.schema import MIGRATIONS
from latticed.storage.store import Store, db_path
from latticed.storage.writer import RECLAIM_KEEP_PAGES, Writer

ALICE = Identity.from_seed(b"r" * 32)
BOB = Identity.from_seed(b"s" * 32)
NOW = 1_700_000_000_000


class SettableClock(TickingClock):
    def advance(self, ms: int) -> None:
        self.now += ms


def open_writer(path: Path, identity: Identity, clock: TickingClock | None = None) -> Writer:
    path.mkdir(parents=True, exist_ok=True)
    w = Writer(db_path(path), identity, clock=clock or TickingClock(NOW))
    w.open()
    return w


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[Writer]:
    w = open_writer(tmp_path / "alice", ALICE, SettableClock(NOW))
    yield w
    w.stop()


@pytest.fixture
def bob(tmp_path: Path) -> Iterator[Writer]:
    w = open_writer(tmp_path / "bob", BOB)
    yield w
    w.stop()


def ok(w: Writer, job: Job) -> object:
    w.process([job])
    assert job.error is None, job.error
    return job.result


def rec(i: int, size: int = 100) -> Record:
    return make_record(b"%d" % i + b"." * size, timestamp=NOW + i)


def replicate(source: Writer, q: int, target: Writer) -> int:
    """Bring ``target``'s replica of queue ``q`` up to date; returns its queue number there."""
    state = source.states[q]
    found = target.lookup(state.queue_id)
    since = target.states[found].summary() if found is not None else None
    empty = core.empty_state(state.owner, state.name, state.kind)
    job = Merge(core.verify_delta(empty, core.delta(state, since)))
    ok(target, job)
    assert isinstance(job.result, int)
    return job.result


def test_a_local_drop_is_stored_survives_a_restart_and_verifies(
    alice: Writer, bob: Writer, tmp_path: Path
) -> None:
    q = ok(alice, CreateQueue("events"))
    assert isinstance(q, int)
    for batch in range(5):
        ok(alice, Append(q, [rec(batch * 100 + i) for i in range(100)]))
    r = replicate(alice, q, bob)
    assert ok(bob, DropLocal(r, 230)) == 230
    conn = sqlite3.connect(bob.path)
    assert conn.execute("SELECT min(first) FROM segments WHERE q = ?", (r,)).fetchone()[0] == 230
    assert bob.store.verify_queue(r, bob.states[r]) == 270
    refused = DropLocal(q, 100)
    alice.process([refused])
    assert isinstance(refused.error, NotOwnerError)  # the owner truncates, with a signature
    assert alice.states[q].start == 0
    bob.stop()
    again = open_writer(tmp_path / "bob", BOB)
    try:
        state = again.states[r]
        assert (state.start, state.floor, state.held_end) == (230, 230, 500)
        assert state.summary().floor == 230 and state.head == alice.states[q].head
        assert again.store.verify_queue(r, state) == 270
        # Later records still merge onto the kept suffix; a whole-queue delta brings nothing back.
        ok(alice, Append(q, [rec(1000 + i) for i in range(10)]))
        replicate(alice, q, again)
        empty = core.empty_state(ALICE.public_key, "events")
        ok(again, Merge(core.verify_delta(empty, core.delta(alice.states[q]))))
        state = again.states[r]
        assert (state.start, state.held_end) == (230, 510)
        assert again.store.verify_queue(r, state) == 280
        # The owner truncates past the floor: that takes over, and is stored too.
        ok(alice, Truncate(q, 300))
        replicate(alice, q, again)
        assert (again.states[r].start, again.states[r].floor) == (300, 0)
        assert again.store.verify_queue(r, again.states[r]) == 210
    finally:
        again.stop()
    conn.close()


def test_migration_fills_in_the_expiry_of_existing_keys(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    Store(path, migrations=MIGRATIONS[:2]).close()
    conn = sqlite3.connect(path)
    with conn:
        for key, entry in (
            ("ttl", kv.Entry(kv.PLAIN, (1, b"a"), b"v", NOW + 5)),
            ("plain", kv.Entry(kv.PLAIN, (2, b"b"), b"v")),
            ("count", kv.Entry(kv.COUNTER, (3, b"c"), 7)),
        ):
            conn.execute("INSERT INTO kv (ns, key, entry) VALUES (1, ?, ?)", (key, encode_kv_entry(entry)))
    conn.close()
    store = Store(path)
    try:
        assert store.migrated_from == 2
        assert store.purge_expired_kv(1, NOW + 4) == 0
        assert store.purge_expired_kv(1, NOW + 5) == 1
        assert store.kv_entry(1, "ttl") is None and store.kv_entry(1, "plain") is not None
    finally:
        store.close()


def kv_write(w: Writer, op: str, key: str, **fields: object) -> None:
    ok(w, KvWrite(KvRequest(op, key, **fields)))  # type: ignore[arg-type]


def kv_ns(w: Writer, owner: Identity) -> int:
    ns = w.lookup(core.empty_state(owner.public_key, "kv", KIND_KV).queue_id)
    assert ns is not None
    return ns


def keys(w: Writer, ns: int) -> set[str]:
    reader = StoreReader(w.path)
    try:
        return {key for key, _ in reader.kv_scan(ns, "")}
    finally:
        reader.close()


def compact_all(w: Writer, ns: int) -> None:
    end = w.states[ns].held_end
    while w.states[ns].start < end:
        ok(w, CompactKv(ns, step=64))


def test_expired_keys_are_purged_and_a_replica_that_missed_their_ops_follows(
    alice: Writer, bob: Writer
) -> None:
    clock = alice._clock
    assert isinstance(clock, SettableClock)
    kv_write(alice, "put", "session", value=b"old")
    ns = kv_ns(alice, ALICE)
    replica = replicate(alice, ns, bob)  # bob holds the old value
    kv_write(alice, "put", "session", value=b"new", ttl_ms=1000)
    kv_write(alice, "put", "keep", value=b"forever")
    for i in range(50):
        kv_write(alice, "incr", "hits")
        assert i >= 0
    clock.advance(5000)
    assert alice.store.purge_expired_kv(ns, clock.now) == 1
    assert keys(alice, ns) == {"keep", "hits"}
    compact_all(alice, ns)
    ops = [
        kv.decode_op(r.value)
        for r in alice.store.rows.records(ns, alice.states[ns].start, alice.states[ns].held_end)
    ]
    assert {op.key for op in ops} == {"keep", "hits"}  # the expired op went with the compaction
    # Bob never saw the TTL write; the log now starts past his end, so he folds his view again from it
    # and the old value does not come back.
    assert alice.states[ns].start > bob.states[replica].held_end
    replicate(alice, ns, bob)
    assert keys(bob, replica) == {"keep", "hits"}
    assert bob.store.kv_entry(replica, "session") is None


def test_the_storage_thread_steps_purge_and_compact_and_a_full_disk_is_a_storage_error(
    alice: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = alice._clock
    assert isinstance(clock, SettableClock)
    kv_write(alice, "put", "session", value=b"v", ttl_ms=1000)
    for _ in range(100):
        kv_write(alice, "incr", "hits")
    ns = kv_ns(alice, ALICE)
    clock.advance(5000)
    assert ok(alice, Call(functools.partial(purge_expired, ns=ns, now_ms=clock.now))) == 1
    assert keys(alice, ns) == {"hits"}
    dropped = ok(alice, Call(functools.partial(compact_step, ns=ns)))
    assert isinstance(dropped, int) and dropped > 90  # the superseded increments and the expired put

    def full(ns: int, now_ms: int) -> int:
        exc = sqlite3.OperationalError("database or disk is full")
        exc.sqlite_errorcode = 13  # SQLITE_FULL
        raise exc

    monkeypatch.setattr(alice.store, "purge_expired_kv", full)
    job = Call(functools.partial(purge_expired, ns=ns, now_ms=clock.now))
    alice.process([job])
    assert isinstance(job.error, StorageError)  # what the retention service expects, without SQLite
    assert "purge expired keys in" in str(job.error) and "full" in str(job.error)


def test_free_pages_stay_for_the_next_writes_while_writes_keep_coming(alice: Writer) -> None:
    q = ok(alice, CreateQueue("big"))
    assert isinstance(q, int)
    for batch in range(24):
        ok(alice, Append(q, [rec(batch * 1000 + i, size=1000) for i in range(1000)]))
    ok(alice, Truncate(q, 23_000))
    conn = sqlite3.connect(alice.path)
    freed = conn.execute("PRAGMA freelist_count").fetchone()[0]
    for _ in range(10):  # the thread runs a step after every batch while writes come
        assert alice.maintain(idle=False)  # more to give back once idle
    free_busy = conn.execute("PRAGMA freelist_count").fetchone()[0]
    assert freed > RECLAIM_KEEP_PAGES and free_busy == RECLAIM_KEEP_PAGES  # the slack, for the next writes
    while alice.maintain(idle=True):
        pass
    assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
    conn.close()


def test_what_retention_measures(alice: Writer) -> None:
    clock = alice._clock
    assert isinstance(clock, SettableClock)
    q = ok(alice, CreateQueue("m"))
    assert isinstance(q, int)
    for batch in range(4):
        ok(alice, Append(q, [rec(batch * 500 + i, size=200) for i in range(500)]))
    state = alice.states[q]
    reader = StoreReader(alice.path)
    try:
        total = prune.stored_bytes(reader.conn, q)
        assert 2000 * 232 < total < 2000 * 300  # values, keys, timestamps and chain values
        assert sum(e.nbytes for e in prune.extents_newest_first(reader.conn, q)) == total
        plan = prune.plan(reader.conn, q, state.start, state.held_end, max_bytes=total // 2)
        assert plan.reason == "max_bytes" and plan.cut is not None
        assert plan.held_bytes <= total // 2 and plan.held_records == 2000 - plan.cut
        assert prune.plan(reader.conn, q, 0, 2000, max_bytes=total).cut is None
        plan = prune.plan(reader.conn, q, 0, 2000, max_records=100)
        assert plan.cut == 2000 - 95 and plan.reason == "max_records"
        # Record timestamps are NOW + offset here: everything before offset 1234 is "too old".
        assert prune.expired_end(reader.conn, q, 0, 2000, NOW + 1234) == 1234
        assert prune.expired_end(reader.conn, q, 700, 2000, NOW + 10) == 700
        assert prune.plan(reader.conn, q, 0, 2000, cutoff_ms=NOW + 1234).cut == 1234
    finally:
        reader.close()
