"""review22d: ack22's after-commit handling attacked at each step of publishing a commit (a core-1
state, a new queue's registration, core-2's publish), for a queue create, a truncate, a KV namespace
write, a core-2 merge from a peer, and a failure again on the batch after a read-back. What must hold:
each job's ack is what its COMMIT did, memory equals the store before anything is signed again (no
offset or version signed twice: a fork of our own queue), and the change listeners still hear of it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.clocks import TickingClock

from latticed.crdt import kv, queue2
from latticed.crdt.head import KIND_KV
from latticed.crdt.kvplan import KvRequest
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import AlreadyExistsError, NotFoundError, StorageError
from latticed.process.logs import EVENT_ATTR
from latticed.storage import core2_store
from latticed.storage.core1_convert import UpgradeQueue
from latticed.storage.core2_jobs import Commit2, CreateQueue2, DropQueue2, Merge2, Merged2, Truncate2
from latticed.storage.core2_queues import Change2
from latticed.storage.engine import Engine
from latticed.storage.jobs import KV_NAMESPACE, Append, CreateQueue, Job, KvWrite, Truncate
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Change, Writer

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(f"v{i}".encode(), timestamp=NOW + i)


class _Flaky(dict[Any, Any]):
    """A dict of the writer's whose next ``times`` stores raise (a bug halfway through publishing)."""

    def __init__(self, data: dict[Any, Any], times: int = 1) -> None:
        super().__init__(data)
        self.left = times

    def __setitem__(self, key: Any, value: Any) -> None:
        if self.left:
            self.left -= 1
            raise RuntimeError("publish bug")
        super().__setitem__(key, value)


def _publish_then_raise(real: Callable[[], list[Change2]], times: int = 1) -> Callable[[], list[Change2]]:
    """Core-2's publish does all its work, then raises (so its changes are never handed back)."""
    left = [times]

    def call() -> list[Change2]:
        changes = real()
        if left[0]:
            left[0] -= 1
            raise RuntimeError("publish bug after the work")
        return changes

    return call


def _open(path: Path, who: Identity, heard: list[tuple[list[Change], list[Change2]]]) -> Writer:
    def on_done(jobs: list[Job], changes: list[Change], changes2: list[Change2]) -> None:
        heard.append((list(changes), list(changes2)))

    path.mkdir(parents=True, exist_ok=True)
    w = Writer(db_path(path), who, clock=TickingClock(NOW), on_done=on_done)
    w.open()
    return w


@pytest.fixture
def heard() -> list[tuple[list[Change], list[Change2]]]:
    return []


@pytest.fixture
def w(tmp_path: Path, heard: list[tuple[list[Change], list[Change2]]]) -> Iterator[Writer]:
    writer = _open(tmp_path / "alice", ALICE, heard)
    yield writer
    writer.stop()


def run(w: Writer, *jobs: Job) -> list[Any]:
    w.process(list(jobs))
    for job in jobs:
        assert job.error is None, job.error
    return [job.result for job in jobs]


def _load_fails(w: Writer, monkeypatch: pytest.MonkeyPatch, times: int | None) -> list[int | None]:
    """The store's read-back raises its first ``times`` calls (every call where None), then reads; the
    list returned holds the failures still to come."""
    real_load = w.store.load
    left = [times]

    def load() -> Any:
        if left[0] is None or left[0] > 0:
            if left[0] is not None:
                left[0] -= 1
            raise OSError("read failed")
        return real_load()

    monkeypatch.setattr(w.store, "load", load)
    return left


def _events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, EVENT_ATTR, "")) for r in caplog.records]


def _stored(path: Path) -> dict[int, tuple[int, int, object]]:
    store = Store(path)
    try:
        return {x.q: (x.state.start, x.state.held_end, x.state.head) for x in store.load()}
    finally:
        store.close()


def _facts2(value: queue2.QueueState2) -> tuple[int, int, int, bool]:
    """(start, end, newest signed version, forked): a version signed twice forks the queue."""
    return (*value.held, max(tip.head.version for tip in value.chains.tips), value.chains.forked)


def _stored2(path: Path) -> dict[int, tuple[int, int, int, bool]]:
    """Each core-2 queue's :func:`_facts2` as the store holds it."""
    store = Store(path)
    try:
        out = {}
        for row in core2_store.index(store):
            out[row.q] = _facts2(core2_store.load(store, row))
        return out
    finally:
        store.close()


def _memory_is_the_store(w: Writer) -> None:
    assert {q: (s.start, s.held_end, s.head) for q, s in w.states.items()} == _stored(w.path)
    assert {q: _facts2(w.core2.committed(q)) for q in w.core2.queues()} == _stored2(w.path)
    assert w._by_qid == {s.queue_id: q for q, s in w.states.items()}


def test_a_create_whose_registration_fails_is_acked_and_its_name_and_number_stay_taken(
    w: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    """Publishing a new queue fails between its state and its id lookup (``created_ms`` raises): the
    create is acked with its number, the name is taken (a second create of it is refused, not a second
    queue), the next create gets a new number and the queue takes appends from offset 0."""
    caplog.set_level(logging.INFO, logger="latticed")
    w.created_ms = _Flaky(w.created_ms)
    (q,) = run(w, CreateQueue("q", None))
    assert "storage.reloaded" in _events(caplog)
    again = CreateQueue("q", None)
    w.process([again])
    assert isinstance(again.error, AlreadyExistsError)
    (r,) = run(w, CreateQueue("r", None))
    assert r != q
    assert run(w, Append(q, [rec(0)]), Append(r, [rec(1)])) == [0, 0]
    _memory_is_the_store(w)


def test_a_truncate_whose_publish_fails_is_acked_and_the_next_append_follows_it(w: Writer) -> None:
    """The truncate's state is not published (the states dict raises): it is acked, memory is read
    back (start 3), and the next append is offset 5, not a second offset 3 or 5 signed from the old head."""
    (q,) = run(w, CreateQueue("q", None))
    run(w, Append(q, [rec(i) for i in range(5)]))
    states = w.states = _Flaky(w.states)
    truncate = Truncate(q, 3)
    w.process([truncate])
    assert truncate.error is None
    assert states.left == 0 and (w.states[q].start, w.states[q].held_end) == (3, 5)
    assert run(w, Append(q, [rec(5)])) == [5]
    assert _stored(w.path)[q][:2] == (3, 6)
    _memory_is_the_store(w)


def test_a_kv_write_whose_publish_fails_is_acked_and_the_log_goes_on(w: Writer) -> None:
    """Our KV namespace: the second write's state is not published; it is acked with its result, and
    the third write appends after it (three ops, increasing HLCs, one head each), never over it."""
    run(w, KvWrite(KvRequest("put", "a", value=b"1")))
    w.states = _Flaky(w.states)
    (total,) = run(w, KvWrite(KvRequest("incr", "n", by=2)))
    assert total == 2
    (total,) = run(w, KvWrite(KvRequest("incr", "n", by=3)))
    assert total == 5
    ns = w.lookup(queue2.empty_state(ALICE.public_key, KV_NAMESPACE, KIND_KV).queue_id)
    assert ns is not None
    state = w.states[ns]
    ops = [kv.decode_op(r.value) for r in w.store.rows.records(ns, state.start, state.held_end)]
    assert [op.key for op in ops] == ["a", "n", "n"]
    assert [op.hlc for op in ops] == sorted({op.hlc for op in ops})
    _memory_is_the_store(w)


@pytest.mark.parametrize("failing", [True, False])
def test_a_peers_core2_merge_whose_publish_fails_is_acked_heard_and_merged_on(
    tmp_path: Path, w: Writer, heard: list[tuple[list[Change], list[Change2]]], failing: bool
) -> None:
    """A core-2 merge of Bob's queue: publish does its work and raises. The merge is acked with its
    queue, the listeners hear of the queue's new value (else nobody replicates it on, and no tail
    wakes, until the queue's next commit), and Bob's next delta merges on from what is stored."""
    bob = _open(tmp_path / "bob", BOB, [])
    try:
        (b,) = run(bob, CreateQueue2("b"))
        run(bob, Commit2(b, [rec(i) for i in range(3)]))
        if failing:
            w.core2.publish = _publish_then_raise(w.core2.publish)  # type: ignore[method-assign]
        first = Merge2(queue2.delta(bob.core2.committed(b), None))
        w.process([first])
        assert first.error is None and isinstance(first.result, Merged2) and first.result.changed
        q = first.result.q
        assert [(c.q, c.state.held if c.state else None) for c in heard[-1][1]] == [(q, (0, 3))]
        run(bob, Commit2(b, [rec(i) for i in range(3, 5)]))
        second = Merge2(queue2.delta(bob.core2.committed(b), queue2.summary(w.core2.committed(q))))
        w.process([second])
        assert second.error is None
        assert w.core2.committed(q).held == (0, 5) == _stored2(w.path)[q][:2]
        _memory_is_the_store(w)
    finally:
        bob.stop()


def test_a_core2_commit_failing_again_on_the_batch_after_a_read_back_signs_no_version_twice(
    w: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our core-2 queue: publish fails on one batch (read back), then again on the very next batch (read
    back again, from the values the first read-back loaded), then works: offsets 0, 1, 2, one version each."""
    (q,) = run(w, CreateQueue2("c"))
    version = _facts2(w.core2.committed(q))[2]
    w.core2.publish = _publish_then_raise(w.core2.publish, times=2)  # type: ignore[method-assign]
    assert run(w, Commit2(q, [rec(0)])) == [0]
    assert run(w, Commit2(q, [rec(1)])) == [1]
    assert run(w, Commit2(q, [rec(2)])) == [2]
    assert _stored2(w.path)[q] == (0, 3, version + 3, False)
    _memory_is_the_store(w)


def test_a_read_back_that_fails_then_a_publish_failing_on_the_repaired_batch(
    w: Writer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Publish and read-back fail (batch refused after), the next batch reads back, commits, and its
    own publish fails too (read back again): every acked offset is stored once, nothing signed twice."""
    caplog.set_level(logging.INFO, logger="latticed")
    (q,) = run(w, CreateQueue("q", None))
    w.states = _Flaky(w.states, times=2)
    _load_fails(w, monkeypatch, 1)
    assert run(w, Append(q, [rec(0)])) == [0]  # publish fails, the read-back too: stale
    assert w._stale
    assert run(w, Append(q, [rec(1)])) == [1]  # read back first, then its own publish fails: read back
    assert not w._stale and _events(caplog).count("storage.reloaded") == 2
    assert run(w, Append(q, [rec(2)])) == [2]
    assert _stored(w.path)[q][:2] == (0, 3)
    _memory_is_the_store(w)


def test_a_refused_batch_while_stale_changes_nothing_and_tells_no_change(
    w: Writer, heard: list[tuple[list[Change], list[Change2]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the read-back keeps failing, every batch is refused with a StorageError and hands on no
    change; the store is as the last committed batch left it."""
    (q,) = run(w, CreateQueue("q", None))
    w.states = _Flaky(w.states)
    _load_fails(w, monkeypatch, None)
    assert run(w, Append(q, [rec(0)])) == [0]
    for i in (1, 2):
        job = Append(q, [rec(i)])
        w.process([job])
        assert isinstance(job.error, StorageError) and heard[-1] == ([], [])
    assert _stored(w.path)[q][:2] == (0, 1)


def test_a_read_back_never_hands_out_the_number_of_a_queue_dropped_while_running(w: Writer) -> None:
    """A dropped core-2 queue's number must not come back while the daemon runs: the event loop keys
    caches by it (an address's number, live tails, pushes ahead), so an offer to the dropped queue's
    cached address would land in the new one. The store's ``max(q) + 1`` forgets a dropped last queue:
    the read-back after a failed publish must not take the number back to it."""
    (a,) = run(w, CreateQueue2("a"))
    (x,) = run(w, CreateQueue2("x"))
    run(w, DropQueue2(x))
    w.core2.publish = _publish_then_raise(w.core2.publish)  # type: ignore[method-assign]
    assert run(w, Commit2(a, [rec(0)])) == [0]
    (y,) = run(w, CreateQueue2("y"))
    (z,) = run(w, CreateQueue("z", None))
    assert x not in (y, z) and y != z
    _memory_is_the_store(w)


async def test_after_a_read_back_the_dropped_queues_address_does_not_reach_a_new_queue(
    tmp_path: Path,
) -> None:
    """Through the engine: the address of a dropped queue, resolved (and cached) before its drop, must
    not resolve to the queue created after a read-back (an offer to "x" would be written into "y")."""
    async with Engine.open(tmp_path, ALICE) as e:
        a = await e.create_queue("a", core=2)
        x = await e.create_queue("x", core=2)
        assert e.resolve("x") == x
        await e.core2.drop(x)
        e._writer.core2.publish = _publish_then_raise(e._writer.core2.publish)  # type: ignore[method-assign]
        assert await e.outcome(e.core2.start_commit(a, [rec(0)])) == 0
        y = await e.create_queue("y", core=2)
        with pytest.raises(NotFoundError):  # the drop took its cached number out (fix22)
            e.resolve("x")
        assert e.resolve("y") == y
        assert await e.outcome(e.core2.start_commit(y, [rec(1)])) == 0


def test_a_conversion_to_core2_whose_publish_fails_leaves_no_core1_queue_behind(w: Writer) -> None:
    """Our core-1 queue converted to core 2; core-2's publish raises before the writer forgets the
    core-1 value. After the read-back the queue is core-2 only (the old core-1 value, were it kept, would
    take appends again from its old head: a second history), and it goes on at offset 3."""
    (q,) = run(w, CreateQueue("q", None))
    run(w, Append(q, [rec(i) for i in range(3)]))
    qid = w.states[q].queue_id
    w.core2.publish = _publish_then_raise(w.core2.publish)  # type: ignore[method-assign]
    assert run(w, UpgradeQueue(q)) == [(0, 3)]
    assert q not in w.states and w.lookup(qid) is None and w.core2.committed_q(qid) == q
    assert run(w, Commit2(q, [rec(3)])) == [3]
    stale = Append(q, [rec(4)])
    w.process([stale])
    assert stale.error is not None
    _memory_is_the_store(w)


def test_a_failed_read_back_is_retried_while_idle(w: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A create whose registration and read-back both fail is acked, but its name finds nothing until
    memory is read back; a client that only resolves that name (an offer to it) starts no batch, so the
    idle thread must retry the read-back itself, and not block waiting for jobs meanwhile."""
    w.created_ms = _Flaky(w.created_ms)
    fails = _load_fails(w, monkeypatch, 2)
    (q,) = run(w, CreateQueue("q", None))
    qid = w.states[q].queue_id
    assert w._stale and w.lookup(qid) is None
    assert w._collect() == []  # returns while idle (a bounded wait), no job needed
    assert w.maintain(idle=True)  # the retry fails: still stale, come back
    assert w.maintain(idle=True)  # within the retry interval: not tried again
    assert fails == [0]
    w._repair_at = 0.0
    assert not w.maintain(idle=True)
    assert not w._stale and w.lookup(qid) == q
    _memory_is_the_store(w)


def test_a_core2_truncate_whose_publish_fails_is_acked_and_the_next_commit_follows_it(w: Writer) -> None:
    """Our core-2 queue truncated, its publish raising after the work: acked with the new start, read
    back, and the next commit is offset 4 at the next version (one version each, not forked)."""
    (q,) = run(w, CreateQueue2("t"))
    run(w, Commit2(q, [rec(i) for i in range(4)]))
    version = _facts2(w.core2.committed(q))[2]
    w.core2.publish = _publish_then_raise(w.core2.publish)  # type: ignore[method-assign]
    truncate = Truncate2(q, 2)
    w.process([truncate])
    assert truncate.error is None
    assert run(w, Commit2(q, [rec(4)])) == [4]
    assert _stored2(w.path)[q] == (2, 5, version + 2, False)
    _memory_is_the_store(w)
