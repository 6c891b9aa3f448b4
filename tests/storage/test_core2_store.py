"""Core-2 queues in the store: round trips through reopening, group commit, a forked owner's histories
meeting in a third store (frozen at the fork point, evidence kept aside and bounded), the owner's
recovery superseding the fork there, and the same values in memory and through the store."""

from __future__ import annotations

import functools
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.writer_jobs import ok

from latticed.crdt import queue as core
from latticed.crdt import queue2
from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import (
    AlreadyExistsError,
    ForkedQueueError,
    GapError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
    StorageError,
)
from latticed.storage import core2_store, segments
from latticed.storage.core2_jobs import (
    Commit2,
    CreateQueue2,
    DropQueue2,
    Merge2,
    Merged2,
    Recover2,
    Truncate2,
)
from latticed.storage.core2_queues import Core2Queues, core2_of
from latticed.storage.core2_verify import verify_queue2
from latticed.storage.jobs import CreateQueue, Job, Merge
from latticed.storage.store import Store, db_path
from latticed.storage.verify import chain_walk
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def rec(tag: str, i: int) -> Record:
    return make_record(f"{tag}{i}".encode(), key=f"k{i}".encode(), timestamp=NOW + i)


def open_writer(path: Path, identity: Identity = ALICE, clock: Callable[[], int] = lambda: NOW) -> Writer:
    path.mkdir(parents=True, exist_ok=True)
    w = Writer(db_path(path), identity, clock=clock)
    w.open()
    return w


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[Writer]:
    w = open_writer(tmp_path / "alice")
    yield w
    w.stop()


def fails(w: Writer, job: Job) -> Exception:
    w.process([job])
    assert job.error is not None
    return job.error


def value(state: QueueState2) -> tuple[object, ...]:
    """Everything a state holds (records read from the store), bodies included."""
    return (state.chains, state.meta, state.records(), state.bodies)


def reopen(w: Writer, path: Path, identity: Identity = ALICE) -> Writer:
    w.stop()
    return open_writer(path, identity)


def feed(target: Writer, source: Writer, q_source: int, max_records: int | None = None) -> Merged2:
    """One delta of ``source``'s queue for what ``target`` holds, merged in ``target``."""
    state = source.core2.committed(q_source)
    q = target.core2.find(state.queue_id)
    since = None if q is None else queue2.summary(target.core2.committed(q))
    [merged] = ok(target, Merge2(queue2.delta(state, since, max_records)))
    assert isinstance(merged, Merged2)
    return merged


def test_a_core2_queue_round_trips_through_reopen(alice: Writer, tmp_path: Path) -> None:
    [q] = ok(alice, CreateQueue2("orders", {"team": "a"}))
    assert isinstance(q, int)
    firsts = [ok(alice, Commit2(q, [rec("v", i * 10 + j) for j in range(10)]))[0] for i in range(12)]
    assert firsts == list(range(0, 120, 10))
    ok(alice, Commit2(q, [], {"team": None, "owner": "bob"}))
    ok(alice, Truncate2(q, 25))
    state = alice.core2.committed(q)
    assert state.held == (25, 120) and dict(state.meta) == {"owner": "bob"}
    expected = value(state)
    for _ in range(2):  # reopening and reopening again: the same value
        alice = reopen(alice, tmp_path / "alice")
        assert value(alice.core2.committed(q)) == expected
    ok(alice, Commit2(q, [rec("v", 120)]))  # and the owner writes on where it left off
    assert alice.core2.committed(q).held == (25, 121)
    alice.stop()


def test_every_operation_is_durable_one_at_a_time(alice: Writer, tmp_path: Path) -> None:
    """After each operation the store reopens to the value the writer published."""
    [q] = ok(alice, CreateQueue2("q"))
    steps: list[Job] = [
        Commit2(q, [rec("a", 0)]),
        Commit2(q, [rec("a", i) for i in range(1, 40)]),
        Truncate2(q, 10),
        Commit2(q, [], {"k": "v"}),
        Truncate2(q, 40),  # past every record: the queue holds none
        Commit2(q, [rec("b", 0)]),
    ]
    for job in steps:
        ok(alice, job)
        expected = value(alice.core2.committed(q))
        alice = reopen(alice, tmp_path / "alice")
        assert value(alice.core2.committed(q)) == expected
    alice.stop()


def test_appends_in_one_group_commit_share_one_head(alice: Writer) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    version = alice.core2.committed(q).chains.tips[0].head.version
    firsts = ok(alice, *(Commit2(q, [rec("x", i)]) for i in range(5)))
    assert firsts == [0, 1, 2, 3, 4]
    state = alice.core2.committed(q)
    assert state.chains.tips[0].head.version == version + 1 and state.held == (0, 5)
    rows = alice.store.connection.execute("SELECT count(*) FROM leaves2 WHERE q = ?", (q,)).fetchone()[0]
    assert rows == version  # one leaf row per superseded version: appending is one insert


def test_bad_core2_jobs_fail_alone(alice: Writer) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    [core1] = ok(alice, CreateQueue("plain"))
    good = Commit2(q, [rec("g", 0)])
    clash1, clash2 = CreateQueue2("plain"), CreateQueue("q")
    bad = Commit2(q, [Record(value=b"x", timestamp=2**63)])
    alice.process([clash1, good, clash2, bad])
    assert isinstance(clash1.error, AlreadyExistsError) and isinstance(clash2.error, AlreadyExistsError)
    assert isinstance(bad.error, MalformedError)
    assert good.error is None and alice.core2.committed(q).held == (0, 1)
    assert alice.states[core1].held_end == 0  # core 1 untouched, and it does not load core-2 queues
    assert set(alice.states) == {core1} and core2_of(alice).queues() == [q]


def test_drop_deletes_every_row_of_the_queue(alice: Writer) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    ok(alice, Commit2(q, [rec("a", i) for i in range(5)]), Commit2(q, [], {"m": "1"}))
    ok(alice, Commit2(q, [rec("a", 5)]))
    ok(alice, DropQueue2(q))
    conn = alice.store.connection
    for table in ("queues", "queue2", "leaves2", "bodies2", "evidence2", "segments"):
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE q = ?", (q,)).fetchone()[0] == 0, table
    assert alice.core2.queues() == []
    assert isinstance(fails(alice, DropQueue2(q)), NotFoundError)
    [again] = ok(alice, CreateQueue2("q"))  # the name is free again, and the new queue starts empty
    ok(alice, Commit2(again, [rec("b", 0)]))
    assert alice.core2.committed(again).records() == [rec("b", 0)]


# ---------------------------------------------------------------------- a forked owner
@pytest.fixture
def forked(tmp_path: Path) -> Iterator[tuple[Writer, Writer, Writer, int]]:
    """The owner's store, a copy of it (both wrote past the 10 records they share: 5 and 3), and a
    replica that took the owner's history first."""
    owner = open_writer(tmp_path / "owner")
    [q] = ok(owner, CreateQueue2("q"))
    ok(owner, Commit2(q, [rec("s", i) for i in range(10)]))
    owner.stop()
    shutil.copytree(tmp_path / "owner", tmp_path / "copy")
    owner, copy = open_writer(tmp_path / "owner"), open_writer(tmp_path / "copy")
    ok(owner, Commit2(q, [rec("o", i) for i in range(5)]))
    ok(copy, Commit2(q, [rec("c", i) for i in range(3)]))
    replica = open_writer(tmp_path / "replica", BOB)
    feed(replica, owner, q)
    yield owner, copy, replica, q
    for w in (owner, copy, replica):
        w.stop()


def test_a_forked_owner_merged_into_a_third_store_freezes_there(
    forked: tuple[Writer, Writer, Writer, int], tmp_path: Path
) -> None:
    owner, copy, replica, q = forked
    rq = replica.core2.find(owner.core2.committed(q).queue_id)
    assert rq is not None and replica.core2.committed(rq).held == (0, 15)
    merged = feed(replica, copy, q)
    state = replica.core2.committed(rq)
    assert state.forked and state.chains.fork_point == 10 and state.held == (0, 10)
    assert merged.evidence == 5  # the owner's 5 records past the fork point, kept aside
    assert [r.value for r in state.records()] == [b"s%d" % i for i in range(10)]
    kept = core2_store.evidence(replica.store.connection, rq)
    assert kept.pieces[0][:2] == (0, 10) and kept.records(0) == [rec("o", i) for i in range(5)]
    expected = value(state)
    replica = reopen(replica, tmp_path / "replica", BOB)
    assert value(replica.core2.committed(rq)) == expected  # the fork shows after reopening too
    assert core2_store.evidence(replica.store.connection, rq) == kept
    feed(owner, copy, q)  # and the owner, once it learns of the fork, signs nothing more in that epoch
    assert isinstance(fails(owner, Commit2(q, [rec("late", 0)])), ForkedQueueError)
    replica.stop()


def test_recovery_on_the_owner_supersedes_the_fork_in_the_third_store(
    forked: tuple[Writer, Writer, Writer, int], tmp_path: Path
) -> None:
    owner, copy, replica, q = forked
    feed(replica, copy, q)
    feed(owner, copy, q)  # the owner learns of the fork: its own 5 records are set aside
    assert owner.core2.committed(q).forked
    [epoch] = ok(owner, Recover2(q, keep_mine=True))
    assert epoch == 1
    recovered = owner.core2.committed(q)
    assert not recovered.forked and recovered.held == (0, 15)
    assert recovered.records()[10:] == [rec("o", i) for i in range(5)]  # offered again in epoch 1
    ok(owner, Commit2(q, [rec("n", 0)]))
    owner = reopen(owner, tmp_path / "owner")
    feed(replica, owner, q)  # the new epoch's leaves (the replica's records are of epoch 0)
    feed(replica, owner, q)  # and then the records
    rq = replica.core2.find(recovered.queue_id)
    assert rq is not None
    state = replica.core2.committed(rq)
    assert state.chains.epoch == 1 and not state.forked
    assert value(state)[:3] == value(owner.core2.committed(q))[:3]
    ok(owner, Commit2(q, [rec("n", 1)]))  # writable again
    # The copy hears of epoch 1 without having seen the fork: its own records past the fork point
    # are set aside as evidence too, and it holds the new epoch's records once caught up.
    assert feed(copy, owner, q).evidence == 3
    assert core2_store.evidence(copy.store.connection, q).records(0) == [rec("c", i) for i in range(3)]
    feed(copy, owner, q)
    assert value(copy.core2.committed(q))[:3] == value(owner.core2.committed(q))[:3]
    owner.stop()


def test_evidence_is_bounded(
    forked: tuple[Writer, Writer, Writer, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, copy, replica, q = forked
    monkeypatch.setattr(core2_store, "EVIDENCE_MAX_RECORDS", 2)
    feed(replica, copy, q)
    rq = replica.core2.find(owner.core2.committed(q).queue_id)
    assert rq is not None
    kept = core2_store.evidence(replica.store.connection, rq)
    assert kept.records(0) == [rec("o", 0), rec("o", 1)] and kept.dropped == 3  # nearest the fork point


def test_a_v1_delta_naming_a_core2_queue_is_acknowledged_and_not_merged(alice: Writer) -> None:
    """A 0.2.0 peer's history of a queue its owner moved to core 2: nothing of it is merged, and the job
    succeeds (the peer is acknowledged, so the link goes on) without failing its group commit."""
    [q] = ok(alice, CreateQueue2("q"))
    v1 = core.commit(core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=NOW, records=[rec("x", 0)])
    empty = core.empty_state(ALICE.public_key, "q")
    old, good = Merge(core.verify_delta(empty, core.delta(v1, None))), Commit2(q, [rec("g", 0)])
    alice.process([old, good])
    assert old.error is None and not old.changed and good.error is None
    assert alice.core2.committed(q).held == (0, 1)  # only the core-2 commit


def test_a_replica_does_not_sign(forked: tuple[Writer, Writer, Writer, int]) -> None:
    owner, _, replica, q = forked
    rq = replica.core2.find(owner.core2.committed(q).queue_id)
    assert rq is not None
    job = Commit2(rq, [rec("r", 0)])
    replica.process([job])
    assert isinstance(job.error, NotOwnerError)


# ---------------------------------------------------------------------- in memory and through the store
op = st.one_of(
    st.tuples(st.just("commit"), st.integers(1, 4)),  # an empty commit signs nothing, as in core 1
    st.tuples(st.just("truncate"), st.integers(1, 3)),
    st.tuples(st.just("meta"), st.integers(0, 2)),
    st.tuples(st.just("merge"), st.integers(1, 4)),
    st.tuples(st.just("recover"), st.integers(0, 1)),  # keep_mine or not
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=10), copy_ops=st.lists(op, min_size=1, max_size=4))
def test_commits_merges_and_recoveries_give_the_same_value_in_memory_and_through_the_store(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], copy_ops: list[tuple[str, int]]
) -> None:
    """The owner's store runs ``ops``; a merge takes a chunk of a copy of it (forked from the owner's
    start) that ran ``copy_ops``; a recovery offers again (or not) what the merges set aside. The same
    steps on the pure queue2 value give the same value, after each step and after reopening."""
    path = tmp_path_factory.mktemp("owner")
    w = open_writer(path)
    try:
        [q] = ok(w, CreateQueue2("q"))
        memory = queue2.commit(queue2.empty_state(ALICE.public_key, "q", KIND_QUEUE), ALICE, now_ms=NOW)
        other = memory
        aside: list[tuple[int, int, tuple[Record, ...]]] = []  # evidence: (epoch, first offset, records)
        for n, (kind, arg) in enumerate(copy_ops):
            other = _step_memory(other, kind, arg, f"c{n}")
        for n, (kind, arg) in enumerate(ops):
            tag = f"o{n}"
            if kind == "merge":
                d = queue2.delta(other, queue2.summary(memory), max_records=arg)
                try:
                    verified = queue2.verify_delta(memory, d)
                except GapError:  # our histories part below what we summarised: the sender sends all
                    d = queue2.delta(other, None, max_records=arg)
                    verified = queue2.verify_delta(memory, d)
                merged = queue2.join_verified(memory, verified)
                aside.append((memory.chains.epoch, memory.held[1] - len(merged.evidence), merged.evidence))
                memory = merged.state
                job: Job = Merge2(d)
            elif kind == "recover":
                if not memory.forked or memory.held[1] != max(memory.held[0], memory.chains.upper):
                    continue
                epoch = memory.chains.epoch
                mine = [r for e, _, rs in sorted(aside, key=lambda a: a[1]) if e == epoch for r in rs]
                memory = queue2.recover(memory, ALICE, now_ms=NOW, keep_mine=mine if arg else [])
                job = Recover2(q, keep_mine=bool(arg))
                event("recovered" + (" with keep_mine" if arg and mine else ""))
            elif memory.forked or memory.held[1] != memory.chains.tips[0].head.end:
                continue  # a frozen queue, or an owner missing records, signs nothing (tested above)
            else:
                memory = _step_memory(memory, kind, arg, tag)
                job = _step_job(q, kind, arg, tag, memory)
            ok(w, job)
            assert value(w.core2.committed(q))[:3] == value(memory)[:3]
        w = reopen(w, path)
        assert value(w.core2.committed(q))[:3] == value(memory)[:3]
    finally:
        w.stop()


def _step_memory(state: QueueState2, kind: str, arg: int, tag: str) -> QueueState2:
    if kind == "commit":
        return queue2.commit(state, ALICE, now_ms=NOW, records=[rec(tag, i) for i in range(arg)])
    if kind == "truncate":
        return queue2.truncate(state, ALICE, state.held[0] + arg, now_ms=NOW)
    return queue2.commit(state, ALICE, now_ms=NOW, meta_updates={"k": f"{tag}.{arg}"})


def _step_job(q: int, kind: str, arg: int, tag: str, after: QueueState2) -> Job:
    if kind == "commit":
        return Commit2(q, [rec(tag, i) for i in range(arg)])
    if kind == "truncate":
        return Truncate2(q, after.held[0])
    return Commit2(q, [], {"k": f"{tag}.{arg}"})


def test_core2_rows_are_only_in_a_schema_5_store(alice: Writer) -> None:
    conn: sqlite3.Connection = alice.store.connection
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert {"queue2", "leaves2", "bodies2", "evidence2"} <= tables


def test_opening_reads_no_leaf_and_a_queue_loads_on_first_use(alice: Writer, tmp_path: Path) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    for i in range(20):
        ok(alice, Commit2(q, [rec("a", i)]))
    expected = value(alice.core2.committed(q))
    alice.stop()
    store = Store(db_path(tmp_path / "alice"))
    try:
        statements: list[str] = []
        store.connection.set_trace_callback(statements.append)
        queues = Core2Queues()
        queues.open(store)
        assert queues.queues() == [q] and not any("leaves2" in s or "bodies2" in s for s in statements)
        assert value(queues.committed(q)) == expected
        assert any("leaves2" in s for s in statements)
    finally:
        store.close()


def test_a_stored_core2_queue_verifies_and_a_changed_record_is_caught(alice: Writer) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    for i in range(6):
        ok(alice, Commit2(q, [rec("a", i * 5 + j) for j in range(5)]))
    ok(alice, Truncate2(q, 7))
    conn = alice.store.connection
    assert verify_queue2(conn, q, alice.core2.committed(q)) == 23
    segment = segments.containing(conn, q, 12)
    assert segment is not None
    segment.values[12 - segment.first] = b"changed behind our back"
    conn.execute("DELETE FROM segments WHERE q = ? AND first = ?", (q, segment.first))
    segments.insert(conn, q, segment)
    with pytest.raises(StorageError, match="stored chain values"):
        verify_queue2(conn, q, alice.core2.committed(q))


def test_the_chain_walk_checks_every_signed_end_whatever_its_chunk(alice: Writer) -> None:
    """The walk both queue versions' verify share: each head's end is checked (a wrong value there is
    named), across chunk bounds, and the chain value at the end is returned."""
    [q] = ok(alice, CreateQueue2("q"))
    for i in range(6):
        ok(alice, Commit2(q, [rec("a", i * 5 + j) for j in range(5)]))
    state = alice.core2.committed(q)
    ends = {body.end: body.head_hash for body in state.bodies}
    held = (state.base_hash, *state.held)
    assert held[1:] == (0, 30) and set(ends) >= {5, 30}
    for chunk in (1, 4, 30):
        walk = functools.partial(
            chain_walk, alice.store.connection, q, label="q", held=held, chunk=chunk, missed="at {}"
        )
        assert walk(ends=ends) == ends[30]
        for end in ends:
            with pytest.raises(StorageError, match=f"^q: at {end}$"):
                walk(ends={**ends, end: bytes(32)})
