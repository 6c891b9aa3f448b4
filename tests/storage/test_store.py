"""The SQLite store: schema and migrations, persistence of lattice values, lazy stored entries, group
commit, truncation, and failures (full disk, read-only data directory)."""

from __future__ import annotations

import itertools
import logging
import os
import queue
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from support.clocks import TickingClock

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.forks import fork_point
from latticed.crdt.head import KIND_KV, SignedHead, meta_hash
from latticed.crdt.kvplan import KvRequest, plan, visible
from latticed.crdt.records import MAX_OFFSET, Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import (
    AlreadyExistsError,
    BehindPeersError,
    IntegrityError,
    MalformedError,
    NotOwnerError,
    StorageError,
)
from latticed.facades.kv_namespace import KvNamespace
from latticed.facades.lattice_queue import LatticeQueue
from latticed.process.logs import EVENT_ATTR, record_fields
from latticed.storage import segments
from latticed.storage.batch import MIN_CHECKPOINT_SPACING, thin_checkpoints
from latticed.storage.engine import Engine
from latticed.storage.entries import StoredEntries
from latticed.storage.jobs import Append, Call, CreateQueue, Job, KvWrite, Merge, SetMeta, Truncate
from latticed.storage.reader import StoreReader
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.store import Store, checkpoint_changes, db_path
from latticed.storage.wiring import ChangeFanout, OwnerFence
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def rec(i: int, size: int = 20) -> Record:
    return make_record(f"v{i}".encode().ljust(size, b"."), key=f"k{i}".encode(), timestamp=NOW + i)


def run(w: Writer, *jobs: Job) -> list[Job]:
    w.process(list(jobs))
    return list(jobs)


def ok(w: Writer, job: Job) -> object:
    run(w, job)
    assert job.error is None, job.error
    return job.result


def create(w: Writer, name: str = "q", meta: dict[str, str] | None = None) -> int:
    q = ok(w, CreateQueue(name, meta))
    assert isinstance(q, int)
    return q


def snapshot(state: core.QueueState) -> tuple[object, ...]:
    """Everything a state holds, read out while its store is open."""
    return (
        state.head,
        state.tip,
        state.meta,
        state.checkpoints,
        state.forked,
        state.start,
        state.held_end,
        state.entries.records(),
    )


def reopen(w: Writer, path: Path, identity: Identity = ALICE) -> Writer:
    w.stop()
    fresh = Writer(path, identity, clock=TickingClock(NOW))
    fresh.open()
    return fresh


# ------------------------------------------------------------------ schema


def test_new_store_is_wal_incremental_vacuum_and_current(tmp_path: Path) -> None:
    store = Store(db_path(tmp_path))
    try:
        conn = sqlite3.connect(db_path(tmp_path))
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        conn.close()
        assert store.migrated_from == 0
    finally:
        store.close()


def test_opening_an_old_version_migrates_and_keeps_data(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old = Store(path, migrations=MIGRATIONS[:1])  # a store written by the first release
    state = core.commit(core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=NOW, records=[rec(0)])
    old.begin()
    old.insert_queue(1, state, NOW)
    old.persist(1, old.empty_view(1, core.empty_state(ALICE.public_key, "q")), state)
    old.commit()
    old.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 1

    store = Store(path)
    try:
        assert store.migrated_from == 1
        [loaded] = store.load()
        assert loaded.state == state
        assert store.kv_entry(loaded.q, "missing") is None  # the v2 table exists
    finally:
        store.close()


def test_a_store_from_a_newer_latticed_is_refused(tmp_path: Path) -> None:
    Store(db_path(tmp_path)).close()
    conn = sqlite3.connect(db_path(tmp_path))
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StorageError, match="newer than this latticed"):
        Store(db_path(tmp_path))


# ------------------------------------------------------------------ owner writes and persistence


def test_commits_persist_and_reopen_identically(writer: Writer, tmp_path: Path) -> None:
    q = create(writer, "orders", {"team": "a"})
    firsts = [ok(writer, Append(q, [rec(i * 10 + j) for j in range(10)])) for i in range(30)]
    assert firsts == list(range(0, 300, 10))
    ok(writer, SetMeta(q, {"owner": "bob", "team": None}))
    ok(writer, Truncate(q, 25))
    before = writer.states[q]
    assert (before.start, before.held_end, before.meta_dict) == (25, 300, {"owner": "bob"})
    expected = snapshot(before)

    writer = reopen(writer, db_path(tmp_path))
    after = writer.states[q]
    assert snapshot(after) == expected  # heads, metadata, checkpoints and every record (read lazily)
    assert after.record_at(25) == rec(25) and after.record_at(24) is None
    assert writer.store.verify_queue(q, after) == 275
    ok(writer, Append(q, [rec(300)]))  # and the owner keeps writing where it left off
    assert writer.states[q].held_end == 301
    writer.stop()


def test_verification_catches_records_changed_on_disk(writer: Writer) -> None:
    q = create(writer)
    ok(writer, Append(q, [rec(i) for i in range(100)]))
    assert writer.store.verify_queue(q, writer.states[q]) == 100
    conn = sqlite3.connect(writer.path)
    first, count, chains, data = conn.execute("SELECT first, count, chains, data FROM segments").fetchone()
    segment = segments.Segment.decode(first, count, chains, data)
    segment.values[42] = b"tampered"
    conn.execute("UPDATE segments SET data = ? WHERE q = ? AND first = ?", (segment.encode()[2], q, first))
    conn.commit()
    conn.close()
    with pytest.raises(StorageError, match="do not match"):
        writer.store.verify_queue(q, writer.states[q])


def test_one_signature_per_queue_per_batch(writer: Writer) -> None:
    q = create(writer)
    jobs = run(writer, *(Append(q, [rec(i)]) for i in range(20)))
    assert [j.result for j in jobs] == list(range(20))
    assert writer.states[q].version == 2  # creation, then one head for all twenty appends


def test_a_bad_job_fails_alone(writer: Writer) -> None:
    q = create(writer)
    foreign = core.commit(core.empty_state(BOB.public_key, "theirs"), BOB, now_ms=NOW, records=[rec(0)])
    fq = ok(writer, Merge(core.verify_delta(foreign, core.delta(foreign))))
    assert isinstance(fq, int)
    huge = Record(b"x" * (9 << 20))
    good1, bad, not_owner, good2 = run(
        writer, Append(q, [rec(0)]), Append(q, [huge]), Append(fq, [rec(1)]), Append(q, [rec(2)])
    )
    assert good1.error is None and good2.error is None
    assert bad.error is not None and bad.error.code == "malformed"
    assert isinstance(not_owner.error, NotOwnerError)
    assert writer.states[q].held_end == 2


def test_small_commits_are_compacted_and_bulk_is_split(writer: Writer) -> None:
    q = create(writer)
    for i in range(0, 400, 10):
        run(writer, *(Append(q, [rec(i + j)]) for j in range(10)))  # forty small commits of ten records
    ok(writer, Append(q, [rec(400 + i) for i in range(5000)]))
    conn = sqlite3.connect(writer.path)
    counts = [c for (c,) in conn.execute("SELECT count FROM segments WHERE q = ? ORDER BY first", (q,))]
    assert sum(counts) == 5400
    assert counts[0] == 10 * segments.COMPACT_EVERY  # 32 small rows were merged into one
    assert counts[1:9] == [10] * 8  # the next run is not full yet
    assert max(counts) <= segments.SEGMENT_MAX_RECORDS and len(counts) == 9 + 3
    assert writer.states[q].entries.records(310, 330) == [rec(i) for i in range(310, 330)]
    assert writer.states[q].entries.records(4990, 5010) == [rec(i) for i in range(4990, 5010)]
    conn.close()


# ------------------------------------------------------------------ replicas: StoredEntries under core.merge


def test_merging_deltas_into_a_stored_replica(writer: Writer, tmp_path: Path) -> None:
    source = LatticeQueue.create(BOB, "feed", clock=TickingClock(NOW))
    for batch in range(6):
        for i in range(700):
            source.offer(f"r{batch}-{i}".encode(), key=b"k")
        source.commit()
    source.set_meta("color", "blue")
    empty = core.empty_state(BOB.public_key, "feed")

    # Catch up in verifiable chunks, as a peer would send them.
    q = None
    while q is None or writer.states[q].held_end < source.end_offset:
        since = None if q is None else writer.states[q].summary()
        d = core.delta(source.state, since, max_records=1000)
        assert len(d.records) <= 1400
        q = ok(writer, Merge(core.verify_delta(empty, d)))
        assert isinstance(q, int)
    replica = writer.states[q]
    assert isinstance(replica.entries, StoredEntries)
    assert replica == source.state

    # Live updates and a truncation by the owner arrive as small deltas.
    source.offer(b"late")
    source.truncate(1000)
    ok(writer, Merge(core.verify_delta(empty, core.delta(source.state, writer.states[q].summary()))))
    assert writer.states[q] == source.state

    # Reopen: the replica comes back from disk equal, and can serve deltas to a third replica.
    writer = reopen(writer, db_path(tmp_path))
    stored = writer.states[q]
    assert stored == source.state
    assert writer.store.verify_queue(q, stored) == source.size
    third = LatticeQueue.empty_replica(BOB.public_key, "feed")
    third.merge(core.delta(stored))
    assert third.state == source.state
    writer.stop()


def test_a_stored_replica_that_meets_a_fork_keeps_every_row_and_stops(writer: Writer, tmp_path: Path) -> None:
    """Bob's old copy signs a second history after his first 3 records; a replica holding 6 records of the
    first meets a chunk of the second from 3 on: it flags the fork and keeps its 6 rows (nothing deleted,
    also after a restart), serves none of them and reads none past its visible end."""
    base = core.commit(
        core.empty_state(BOB.public_key, "feed"), BOB, now_ms=NOW, records=[rec(i) for i in range(3)]
    )
    first = core.commit(base, BOB, now_ms=NOW + 1, records=[rec(i) for i in range(10, 13)])
    second = core.commit(base, BOB, now_ms=NOW + 1, records=[rec(i) for i in range(20, 24)])
    empty = core.empty_state(BOB.public_key, "feed")
    q = ok(writer, Merge(core.verify_delta(empty, core.delta(first))))
    assert isinstance(q, int)
    chunk = core.delta(second, base.summary())
    assert chunk.from_offset == 3
    ok(writer, Merge(core.verify_delta(empty, chunk)))
    state = writer.states[q]
    assert state.forked and state.entries.records() == first.entries.records()
    writer = reopen(writer, db_path(tmp_path))
    stored = writer.states[q]
    assert stored.forked and stored.fork == state.fork
    assert stored.entries.records() == first.entries.records()
    assert writer.store.verify_queue(q, stored) == 6
    assert stored.visible_end <= 3 and not core.delta(stored).records
    writer.stop()


def test_a_forked_stored_queue_says_where_it_stops_from_any_thread(writer: Writer) -> None:
    """Reads of a forked queue ask its visible end on the event loop, where the store's rows cannot be
    read: it is found from the chain values the replica keeps in memory (here a head it keeps ends at the
    offset both histories sign alike, their truncated start)."""
    two = core.commit(
        core.empty_state(BOB.public_key, "feed"), BOB, now_ms=NOW, records=[rec(i) for i in range(2)]
    )
    held = core.commit(two, BOB, now_ms=NOW + 1, records=[rec(i) for i in range(2, 4)])  # a head ends at 2
    cut = core.commit(two, BOB, now_ms=NOW + 1, new_start=2)
    a = core.commit(cut, BOB, now_ms=NOW + 2, records=[rec(10)])
    b = core.commit(cut, BOB, now_ms=NOW + 2, records=[rec(20)])
    proof = core.merge(a, b).fork
    assert proof is not None and fork_point(proof) == 2
    empty = core.empty_state(BOB.public_key, "feed")
    q = ok(writer, Merge(core.verify_delta(empty, core.delta(held))))
    ok(writer, Merge(core.verify_delta(empty, core.QueueDelta(BOB.public_key, "feed", 0, None, fork=proof))))
    stored = writer.states[q]
    assert stored.forked and stored.held_end == 4
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(stored.visible_end))
    thread.start()
    thread.join()
    assert seen == [2]


def test_forged_deltas_store_nothing(writer: Writer) -> None:
    source = LatticeQueue.create(BOB, "feed", clock=TickingClock(NOW))
    source.offer(b"a")
    d = core.delta(source.state)
    forged = core.QueueDelta(d.owner, d.name, d.kind, d.head, d.meta, d.tip, 0, d.from_hash, (Record(b"b"),))
    with pytest.raises(IntegrityError):
        core.verify_delta(core.empty_state(BOB.public_key, "feed"), forged)
    assert writer.states == {}


def test_a_ttl_counts_from_the_next_millisecond_so_a_key_never_expires_early() -> None:
    """The store's clock is cut down to the millisecond (up to 1 ms behind the true time): a put at
    ``now_ms`` may really have happened up to 1 ms later, so the key must still read at now_ms + TTL."""
    op, _ = plan(KvRequest("put", "session", value=b"tok", ttl_ms=500), None, now_ms=1_000, hlc=1)
    assert op is not None and op.expires_ms == 1_501
    entry = kv.op_entry(op)
    assert visible(entry, 1_500) == (kv.PLAIN, b"tok")
    assert visible(entry, 1_501) == (None, None)


def test_kv_writes_and_a_merged_foreign_namespace(writer: Writer, tmp_path: Path) -> None:
    def kv(op: str, key: str, **fields: object) -> object:
        return ok(writer, KvWrite(KvRequest(op, key, **fields)))  # type: ignore[arg-type]

    assert kv("incr", "n", by=5) == 5
    jobs = run(writer, *(KvWrite(KvRequest("incr", "n")) for _ in range(3)))  # one batch sees its own writes
    assert [j.result for j in jobs] == [6, 7, 8]
    kv("put", "a", value=b"1")
    kv("hset", "h", member=b"f", value=b"v")
    kv("sadd", "s", member=b"m")
    kv("del", "a")
    ns = writer.lookup(core.empty_state(ALICE.public_key, "kv", KIND_KV).queue_id)
    assert ns is not None
    now = NOW + 10**6
    assert visible(writer.store.kv_entry(ns, "n"), now) == ("counter", 8)
    assert visible(writer.store.kv_entry(ns, "a"), now) == (None, None)
    assert visible(writer.store.kv_entry(ns, "h"), now) == ("hash", {b"f": b"v"})

    bob = KvNamespace.create(BOB, clock=TickingClock(NOW))
    bob.put("x", b"1")
    bob.hset("h", b"f", b"v")
    bob.sadd("s", b"m")
    bob.incr("c", 3)
    empty = core.empty_state(BOB.public_key, "kv", KIND_KV)
    bq = ok(writer, Merge(core.verify_delta(empty, bob.delta())))
    bob.srem("s", b"m")
    bob.put("x", b"2")
    ok(writer, Merge(core.verify_delta(empty, bob.delta(writer.states[bq].summary()))))  # type: ignore[index]
    writer = reopen(writer, db_path(tmp_path))
    reader = StoreReader(writer.path)
    try:
        assert isinstance(bq, int)
        view = {k: visible(e, now)[1] for k, e in reader.kv_scan(bq, "")}
        assert {k: v for k, v in view.items() if v is not None} == bob.items()
        assert writer.kv_hlc > 0  # our own HLC survives a restart
    finally:
        reader.close()
        writer.stop()


def test_a_foreign_kv_log_with_an_entry_that_is_not_an_op_merges_whole(writer: Writer) -> None:
    """The daemon's fold keeps the signed log whole and skips the entry, as the library does: later
    merges go on applying (apply whole or not at all, never a log ahead of its view)."""
    clock = TickingClock(NOW)
    log = LatticeQueue(core.empty_state(BOB.public_key, "kv", KIND_KV), BOB, clock)
    bob = KvNamespace(log, clock)
    bob.put("a", b"1")
    log.offer(b"\xc1 not an op", key=b"junk")
    bob.put("b", b"2")
    empty = core.empty_state(BOB.public_key, "kv", KIND_KV)
    ns = ok(writer, Merge(core.verify_delta(empty, bob.delta())))
    assert isinstance(ns, int)
    bob.put("c", b"3")
    bob.delete("a")
    ok(writer, Merge(core.verify_delta(empty, bob.delta(writer.states[ns].summary()))))
    assert writer.states[ns] == bob.state
    now = NOW + 10**6
    stored = {key: visible(writer.store.kv_entry(ns, key), now)[1] for key in ("a", "b", "c", "junk")}
    assert {k: v for k, v in stored.items() if v is not None} == bob.items() == {"b": b"2", "c": b"3"}


def test_an_empty_append_signs_no_head(writer: Writer) -> None:
    q = create(writer)
    version = writer.states[q].version
    assert ok(writer, Append(q, [])) == 0
    assert writer.states[q].version == version


def test_an_offer_past_the_last_offset_fails_alone_not_its_group_commit(writer: Writer) -> None:
    full, other = create(writer, "full"), create(writer, "other")
    ok(writer, Truncate(full, MAX_OFFSET - 1))
    fits, too_many, bystander = Append(full, [rec(0)]), Append(full, [rec(1)]), Append(other, [rec(2)])
    run(writer, fits, too_many, bystander)
    assert (fits.error, fits.result) == (None, MAX_OFFSET - 1)
    assert isinstance(too_many.error, MalformedError) and "full" in str(too_many.error)
    assert (bystander.error, bystander.result) == (None, 0)
    assert writer.states[full].held_end == MAX_OFFSET and writer.states[other].held_end == 1


def past_the_end_delta() -> core.QueueDelta:
    """A head BOB really signed, but with offsets his own commit would refuse."""
    empty = core.empty_state(BOB.public_key, "feed")
    past = MAX_OFFSET + 6
    head = SignedHead.sign(
        BOB,
        queue_id=empty.queue_id,
        version=1,
        start=past,
        end=past,
        base_hash=b"\1" * 32,
        head_hash=b"\1" * 32,
        meta_version=0,
        meta_hash=meta_hash({}),
        timestamp=NOW,
    )
    return core.QueueDelta(BOB.public_key, "feed", empty.kind, head, meta=())


async def test_a_head_past_the_last_offset_is_refused_before_storage(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        with pytest.raises(MalformedError, match="offsets stop at"):
            await engine.merge_delta(past_the_end_delta())
        assert engine.find(BOB.public_key, "feed") is None and engine.queues() == []


def test_a_store_that_took_such_a_head_before_still_opens_and_verify_flags_it(
    writer: Writer, tmp_path: Path
) -> None:
    d = past_the_end_delta()
    ok(writer, Merge(core.VerifiedDelta(d, ())))  # as an older latticed stored it, unverified today
    q = create(writer)
    ok(writer, Append(q, [rec(0)]))
    writer = reopen(writer, db_path(tmp_path))
    try:
        bad = writer.lookup(core.empty_state(BOB.public_key, "feed").queue_id)
        assert bad is not None and writer.states[bad].start == MAX_OFFSET + 6
        with pytest.raises(MalformedError, match="offsets stop at"):
            writer.store.verify_queue(bad, writer.states[bad])
        assert writer.store.verify_queue(q, writer.states[q]) == 1
    finally:
        writer.stop()


# ------------------------------------------------------------------ truncation and checkpoints


def test_truncation_deletes_rows_and_reclaims_pages(writer: Writer) -> None:
    q = create(writer)
    for i in range(10):
        ok(writer, Append(q, [rec(i * 1000 + j, size=1000) for j in range(1000)]))
    conn = sqlite3.connect(writer.path)
    pages_before = conn.execute("PRAGMA page_count").fetchone()[0]
    ok(writer, Truncate(q, 6500))
    while writer.maintain():  # the storage thread runs these steps after batches and when idle
        pass
    rows = conn.execute("SELECT first, count FROM segments WHERE q = ? ORDER BY first", (q,)).fetchall()
    assert rows[0][0] == 6500 and sum(c for _, c in rows) == 3500  # the cut segment was rewritten
    assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
    assert conn.execute("PRAGMA page_count").fetchone()[0] < pages_before * 0.5
    assert writer.states[q].record_at(6500) == rec(6500, size=1000)
    ok(writer, Truncate(q, 20_000))  # past the end: nothing left, the next offer gets 20000
    assert conn.execute("SELECT count(*) FROM segments WHERE q = ?", (q,)).fetchone()[0] == 0
    assert ok(writer, Append(q, [rec(1)])) == 20_000
    conn.close()


def test_checkpoints_are_thinned_and_stay_on_disk_in_step(writer: Writer, tmp_path: Path) -> None:
    q = create(writer)
    for i in range(300):
        ok(writer, Append(q, [rec(i * 10 + j) for j in range(10)]))  # a checkpoint per commit
    cps = writer.states[q].checkpoints
    ends = [c.end for c in cps]
    assert ends[-1] == 3000 and len(cps) <= 5
    assert all(b - a >= MIN_CHECKPOINT_SPACING for a, b in itertools.pairwise(ends[:-1]))
    conn = sqlite3.connect(writer.path)
    stored = [
        e for (e,) in conn.execute("SELECT end_off FROM checkpoints WHERE q = ? ORDER BY end_off", (q,))
    ]
    assert stored == ends[:-1]  # the latest is the tip, kept in the queue row
    conn.close()
    writer = reopen(writer, db_path(tmp_path))
    assert writer.states[q].checkpoints == cps
    writer.stop()


def test_thinning_and_checkpoint_diff_helpers() -> None:
    state = core.empty_state(ALICE.public_key, "t")
    heads = []
    for i in range(2500):
        state = core.commit(state, ALICE, now_ms=NOW, records=[rec(i)])
        heads.append(state.head)
    thinned = thin_checkpoints(tuple(heads), 2500)  # a dense list from a peer: full pass
    assert thinned[-1] is heads[-1] and [c.end for c in thinned] == [1, 1001, 2001, 2500]
    old = thinned
    new = (*old[1:-1], heads[-2], heads[-1])
    gone, added = checkpoint_changes(old, new)
    assert gone == [old[0]] and added == [heads[-2]]


# ------------------------------------------------------------------ failures


def test_full_disk_fails_writes_with_storage_error_and_reads_go_on(tmp_path: Path) -> None:
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW), max_page_count=64)
    w.open()
    try:
        q = create(w)
        last_ok = 0
        error = None
        for i in range(200):
            job = run(w, Append(q, [rec(i * 100 + j, size=2000) for j in range(100)]))[0]
            if job.error is not None:
                error = job.error
                break
            last_ok = w.states[q].held_end
        assert isinstance(error, StorageError) and "full" in str(error)
        assert w.states[q].held_end == last_ok  # nothing of the failed batch is visible
        reader = StoreReader(w.path)
        try:
            columns = reader.columns(q, 0, last_ok, 10**6, 1 << 30)
            assert columns.offsets == list(range(last_ok))
        finally:
            reader.close()
        ok(w, Call(lambda _b, writer: writer.store.set_max_page_count(100_000)))
        assert ok(w, Append(q, [rec(0)])) == last_ok  # space came back: writes resume
    finally:
        w.stop()


def _make_read_only(path: Path) -> None:
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("running as root without chattr: cannot make a directory read-only")
        result = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
        if result.returncode != 0:
            pytest.skip(f"chattr +i unsupported here: {result.stderr.decode().strip()}")
    else:
        path.chmod(0o500)


def _make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=False)
    path.chmod(0o700)


def test_read_only_data_dir_is_a_clear_storage_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _make_read_only(data)
    try:
        with pytest.raises(
            StorageError, match=r"cannot open the store .*latticed\.db.*(read-only|unwritable)"
        ):
            Store(db_path(data))
    finally:
        _make_writable(data)


def test_existing_store_in_a_read_only_dir_is_a_clear_storage_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    Store(db_path(data)).close()  # clean close removes the WAL: reopening must create it again
    _make_read_only(data)
    try:
        with pytest.raises(StorageError, match=r"latticed\.db.*(read-only|unwritable)"):
            Store(db_path(data))
    finally:
        _make_writable(data)


async def test_start_up_logs_count_as_status_does_and_name_only_real_migrations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``store.opened`` counted every stored log (queues, KV namespace, groups) as "queues", so it
    disagreed with ``daemon.ready``; and every start logged ``migrated_from`` though nothing migrated."""
    caplog.set_level(logging.INFO, logger="latticed")

    def events(name: str) -> list[dict[str, object]]:
        return [record_fields(r) for r in caplog.records if getattr(r, EVENT_ATTR, None) == name]

    async with Engine.open(tmp_path, ALICE) as engine:
        await engine.create_queue("q")
        await engine.kv_write(KvRequest("put", "k", value=b"v"))
    caplog.clear()
    async with Engine.open(tmp_path, ALICE) as engine:
        assert len(engine.queues()) == 1
    [opened] = events("store.opened")
    assert (opened["queues"], opened["kv_namespaces"], opened["groups"]) == (1, 1, 0)
    assert opened["schema_version"] == SCHEMA_VERSION and "migrated_from" not in opened
    assert events("store.migrated") == []


async def test_an_upgraded_store_logs_its_migration(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    Store(db_path(tmp_path), migrations=MIGRATIONS[:1]).close()
    caplog.set_level(logging.INFO, logger="latticed")
    async with Engine.open(tmp_path, ALICE):
        pass
    [migrated] = [
        record_fields(r) for r in caplog.records if getattr(r, EVENT_ATTR, None) == "store.migrated"
    ]
    assert (migrated["from_version"], migrated["to_version"]) == (1, SCHEMA_VERSION)


# ------------------------------------------------------------------ group commit (trio + storage thread)


async def test_the_owner_fence_holds_back_every_kind_of_write_to_our_own_data(tmp_path: Path) -> None:
    """Replication holds the fence while a peer holds records of our queue that we lack (a restored
    store): offers, batches, truncation, metadata, KV writes and re-creating a queue all wait for it."""
    fence = OwnerFence()
    fenced: set[str] = {"kv"}
    async with Engine.open(tmp_path, ALICE, fence=fence) as engine:
        with fence.held_by(lambda state: "a peer holds more" if state.name in fenced else None):
            # Our first KV write would create the namespace a peer holds.
            with pytest.raises(BehindPeersError):
                await engine.kv_write(KvRequest("put", "k", value=b"v"))
            fenced.clear()
            q = await engine.create_queue("q")
            await engine.kv_write(KvRequest("put", "k", value=b"v"))
            fenced.update({"q", "kv", "gone"})
            for attempt in (
                engine.append(q, [rec(0)]),
                engine.append_many([(q, [rec(1)])]),
                engine.truncate(q, 0),
                engine.set_meta(q, {"a": "b"}),
                engine.kv_write(KvRequest("put", "k", value=b"w")),
                engine.create_queue("gone"),
            ):
                with pytest.raises(BehindPeersError, match="a peer holds more"):
                    await attempt
            assert engine.state(q).held_end == 0  # nothing was written
            # Re-creating a queue we hold is "already exists", whatever the fence says of new queues.
            with pytest.raises(AlreadyExistsError, match="already exists"):
                await engine.create_queue("q")
        # Replication stopped (the fence is let go): writes go through again.
        assert await engine.append(q, [rec(0)]) == 0
        assert await engine.kv_write(KvRequest("put", "k", value=b"w")) is None
        assert await engine.create_queue("gone") > q


def test_the_owner_fence_is_held_by_one_service_at_a_time() -> None:
    fence = OwnerFence()
    state = core.empty_state(ALICE.public_key, "q")
    assert fence.reason(state) is None  # nobody holds it: never fenced
    with fence.held_by(lambda s: "behind"):
        assert fence.reason(state) == "behind"
        with pytest.raises(AssertionError), fence.held_by(lambda s: None):
            pass
    assert fence.reason(state) is None


async def test_the_change_fanout_reaches_each_subscriber_while_subscribed(tmp_path: Path) -> None:
    changes = ChangeFanout()
    first: list[int] = []
    second: list[int] = []
    async with Engine.open(tmp_path, ALICE, changes=changes) as engine:
        q = await engine.create_queue("q")
        with changes.subscribed(lambda s: first.append(s.held_end)):
            await engine.append(q, [rec(0)])
            with changes.subscribed(lambda s: second.append(s.held_end)):
                await engine.append(q, [rec(1)])
        await engine.append(q, [rec(2)])
    assert first == [1, 2] and second == [2]


async def test_concurrent_writers_share_transactions(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        q = await engine.create_queue("q")
        gate = threading.Event()
        blocked = threading.Event()

        def hold(_batch: object, _writer: object) -> None:
            blocked.set()
            gate.wait(10)

        transactions = engine.transactions
        offsets: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.call_in_writer, hold)
            await trio.to_thread.run_sync(blocked.wait)

            async def offer(i: int) -> None:
                offsets.append(await engine.append(q, [rec(i)]))

            for i in range(50):
                nursery.start_soon(offer, i)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert sorted(offsets) == list(range(50))
        assert engine.transactions - transactions <= 2  # 50 acknowledged writes, one fsync'd commit
        assert engine.state(q).version == 2


async def test_engine_reads_tails_and_merge_delta(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        q = await engine.create_queue("q")
        woke = trio.Event()

        async def waiter() -> None:
            await engine.wait_past(q, 2)
            woke.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            await engine.append(q, [rec(0), rec(1)])
            assert not woke.is_set()
            await engine.append(q, [rec(2)])
        assert woke.is_set()
        columns = await engine.read(q, 0, 10, 10, 1 << 20)
        assert columns.offsets == [0, 1, 2] and columns.values[2] == rec(2).value
        assert (await engine.row(q, 1)) == (rec(1).key, rec(1).value, rec(1).timestamp, None)

        source = LatticeQueue.create(BOB, "feed", clock=TickingClock(NOW))
        source.offer(b"x")
        state = await engine.merge_delta(source.delta())
        # A published state reads its rows on the storage thread only; compare what it holds in memory.
        assert (state.head, state.held_end) == (source.state.head, 1)
        assert await engine.verify(engine.resolve(f"{BOB.public_hex}/feed")) == 1
        assert await engine.verify(q) == 3
        again = await engine.delta_for(BOB.public_key, "feed", None)
        assert again.records == source.delta().records
        with pytest.raises(NotOwnerError):
            await engine.append(engine.resolve(f"{BOB.public_hex}/feed"), [rec(0)])


def test_group_commit_waits_for_other_writers_not_for_one_that_pipelines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("latticed.storage.writer._RECENT_S", 60.0)  # the estimate stays put during the test
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW), linger_ms=1000)

    def collect_after(jobs: list[Job]) -> tuple[int, float]:
        for job in jobs:
            w._queue.put(job)
        t0 = time.monotonic()
        return len(w._collect()), time.monotonic() - t0

    pipelining = object()
    burst = [Call(lambda b, wr: None) for _ in range(10)]
    for job in burst:
        job.origin = pipelining
    assert collect_after(burst)[0] == 10
    count, waited = collect_after([Call(lambda b, wr: None)])
    assert count == 1 and waited < 0.5  # one writer was busy: a lone commit does not wait for company
    assert collect_after([Call(lambda b, wr: None) for _ in range(10)])[0] == 10  # ten writers
    count, waited = collect_after([Call(lambda b, wr: None)])
    assert count == 1 and waited >= 0.9  # now it waits (up to the linger) for the others


def test_pushes_served_ahead_wait_for_company_and_nothing_else_waits_on_them(tmp_path: Path) -> None:
    """A batch of nothing but merges already served ahead (only a peer's ACK waits for them) lingers for
    more, up to a bound on time and on count; any other job ends the wait at once."""
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW), merge_linger_s=60.0)

    def lingering() -> Job:
        job = Call(lambda b, wr: None)
        job.may_linger = True
        return job

    def collect(jobs: list[Job], later: Job | None = None) -> tuple[int, float]:
        for job in jobs:
            w._queue.put(job)
        if later is not None:
            threading.Timer(0.05, w.submit, args=(later,)).start()
        t0 = time.monotonic()
        return len(w._collect()), time.monotonic() - t0

    count, waited = collect([lingering() for _ in range(4)])
    assert count == 4 and waited < 5  # as many as the sender's window allows: commit now
    count, waited = collect([lingering()], later=Call(lambda b, wr: None))
    assert count == 2 and waited < 5  # a job someone waits on ends the linger
    count, waited = collect([Call(lambda b, wr: None)])
    assert count == 1 and waited < 5  # other jobs never linger on this account
    w._merge_linger = 0.2
    count, waited = collect([lingering()], later=lingering())
    assert count == 2 and 0.15 <= waited < 5  # lingered for the second, then until the deadline


def test_a_lingering_batch_goes_as_soon_as_the_writers_it_waits_for_are_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The storage thread is woken once, when the jobs it lingers for are all queued, not by each one (a
    context switch per offer) and not only at the end of the linger."""
    monkeypatch.setattr("latticed.storage.writer._RECENT_S", 60.0)
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW), linger_ms=30_000)
    for _ in range(10):
        w._queue.put(Call(lambda b, wr: None))
    assert len(w._collect()) == 10  # ten writers were seen together: the next batch waits for ten

    def nine_more() -> None:
        for _ in range(9):
            w.submit(Call(lambda b, wr: None))

    w.submit(Call(lambda b, wr: None))
    threading.Timer(0.05, nine_more).start()
    t0 = time.monotonic()
    assert len(w._collect()) == 10
    assert time.monotonic() - t0 < 10  # far less than the 30 s linger: the last submit woke it


class _CountingQueue(queue.SimpleQueue[object]):
    """The writer's job queue, counting its blocking gets (each one a wake-up at the next job)."""

    def __init__(self) -> None:
        self.blocking_gets = 0

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        if block:
            self.blocking_gets += 1
        return super().get(block, timeout)


def test_a_cohort_of_writers_seen_lately_is_waited_for_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a batch of ten writers the storage thread waits for the next ten in one wait: it is not
    also woken by the first of them (a blocking ``get``, a turn of the GIL while the event loop reads the
    cohort's requests), and a job that comes alone still waits at most the linger."""
    monkeypatch.setattr("latticed.storage.writer._RECENT_S", 60.0)
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW), linger_ms=30_000)
    jobs = w._queue = _CountingQueue()
    for _ in range(10):
        jobs.put(Call(lambda b, wr: None))
    assert len(w._collect()) == 10
    gets = jobs.blocking_gets  # the first batch: no writers seen before it, so it waited for its first

    def one_then_nine() -> None:
        w.submit(Call(lambda b, wr: None))
        time.sleep(0.05)  # a cohort's requests arrive spread out; the thread must not wake in between
        for _ in range(9):
            w.submit(Call(lambda b, wr: None))

    threading.Timer(0.05, one_then_nine).start()
    t0 = time.monotonic()
    assert len(w._collect()) == 10
    assert time.monotonic() - t0 < 10  # woken by the tenth job, not at the end of the 30 s linger
    assert jobs.blocking_gets == gets  # and not by the first one

    w._linger = 0.2
    threading.Timer(0.05, w.submit, args=(Call(lambda b, wr: None),)).start()
    t0 = time.monotonic()
    assert len(w._collect()) == 1
    assert 0.15 <= time.monotonic() - t0 < 5  # alone: committed once the linger ran out


def test_a_batchs_jobs_are_told_before_its_commit_and_a_failing_hook_fails_nothing(tmp_path: Path) -> None:
    """``on_committing`` hears each batch's jobs inside its open transaction (the written rows not yet
    committed: another connection does not see them), with the results the jobs will be answered with;
    a hook that raises (the event loop gone at shutdown) costs the batch nothing."""
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW))
    w.open()
    try:
        q = create(w)
        heard: list[tuple[list[Job], list[object], bool, bool]] = []

        def hook(jobs: list[Job]) -> None:
            reader = StoreReader(w.path)
            try:  # what another connection sees right now
                visible = reader.row(q, 0) is not None
            finally:
                reader.close()
            heard.append((jobs, [job.result for job in jobs], w.store.connection.in_transaction, visible))

        w.on_committing = hook
        a, b = Append(q, [rec(1)]), Append(q, [rec(2)])
        run(w, a, b)
        assert [(jobs, results, open_) for jobs, results, open_, _ in heard] == [([a, b], [0, 1], True)]
        assert heard[0][3] is False and w.states[q].held_end == 2  # not visible before the commit, then both

        def broken(jobs: list[Job]) -> None:
            raise RuntimeError("the event loop is gone")

        w.on_committing = broken
        assert ok(w, Append(q, [rec(3)])) == 2 and w.states[q].held_end == 3
    finally:
        w.stop()
