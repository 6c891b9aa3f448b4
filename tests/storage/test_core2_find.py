"""``Core2Queues.find``: a queue's number by id, committed or created in the batch being staged, from a
dict index of the staging's new queues (a fresh replica's batch creates thousands: no scan of them a
lookup), kept in step with begin, create, publish and a failed batch."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.writer_jobs import ok

from latticed.crdt import queue2
from latticed.crdt.head import queue_id
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import AlreadyExistsError
from latticed.storage.batch import Batch
from latticed.storage.core2_jobs import CreateQueue2, Merge2, Merged2
from latticed.storage.core2_queues import core2_of
from latticed.storage.jobs import Job, WriterView
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
OWNER = Identity.from_seed(b"o" * 32)
NOW = 1_700_000_000_000


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[Writer]:
    w = Writer(db_path(tmp_path), ALICE, clock=lambda: NOW)
    w.open()
    yield w
    w.stop()


def qid(name: str) -> bytes:
    return queue_id(ALICE.public_key, name)


class Find(Job):
    """What ``find`` answers for ``names`` inside the batch, when this job runs."""

    __slots__ = ("names",)

    def __init__(self, *names: str) -> None:
        super().__init__()
        self.names = names

    def apply(self, batch: Batch, writer: WriterView) -> None:
        self.result = [core2_of(writer).find(qid(name)) for name in self.names]


class _NoScan(dict[int, object]):
    def values(self) -> object:  # type: ignore[override]
        raise AssertionError("find scanned the staged queues")


def test_found_in_the_batch_that_creates_it_and_after_publish(alice: Writer) -> None:
    create, find = CreateQueue2("a"), Find("a", "b")
    ok(alice, Find("a"), create, find)
    assert find.result == [create.result, None]
    assert alice.core2.find(qid("a")) == create.result == alice.core2.committed_q(qid("a"))
    [found] = ok(alice, Find("a"))
    assert found == [create.result]


def test_a_second_create_of_one_name_in_one_batch_is_refused(alice: Writer) -> None:
    first, second = CreateQueue2("a"), CreateQueue2("a")
    alice.process([first, second])
    assert first.error is None and isinstance(second.error, AlreadyExistsError)


def test_a_lookup_does_not_scan_the_staged_queues(alice: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    core2 = alice.core2
    begin = core2.begin

    def no_scan(*args: object) -> None:
        begin(*args)  # type: ignore[arg-type]
        core2._new = _NoScan()  # type: ignore[assignment]
        core2._converting = _NoScan()  # type: ignore[assignment]

    monkeypatch.setattr(core2, "begin", no_scan)
    creates = [CreateQueue2(f"q{i}") for i in range(200)]
    find = Find("q0", "q199", "none")
    alice.process([*creates, find])
    assert find.error is None and find.result == [creates[0].result, creates[-1].result, None]


def test_gone_after_a_failed_batch(alice: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Store.commit

    def failing(store: Store) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Store, "commit", failing)
    create = CreateQueue2("a")
    alice.process([create])
    assert create.error is not None
    assert alice.core2.find(qid("a")) is None and alice.core2.committed_q(qid("a")) is None
    monkeypatch.setattr(Store, "commit", real)
    find = Find("a")
    ok(alice, find)
    assert find.result == [None]
    [q] = ok(alice, CreateQueue2("a"))  # the name is free: created now
    assert alice.core2.find(qid("a")) == q


def test_two_chunks_of_a_fresh_queue_in_one_batch_land_in_one_queue(alice: Writer) -> None:
    state = queue2.commit(queue2.empty_state(OWNER.public_key, "r"), OWNER, now_ms=1)
    for i in range(6):
        state = queue2.commit(state, OWNER, now_ms=2 + i, records=[make_record(b"%d" % i, timestamp=i)])
    first = queue2.delta(state, None, max_records=3)
    empty = queue2.empty_state(OWNER.public_key, "r")
    held = queue2.join_verified(empty, queue2.verify_delta(empty, first)).state
    rest = queue2.delta(state, queue2.summary(held))
    one, two = ok(alice, Merge2(first), Merge2(rest))
    assert isinstance(one, Merged2) and isinstance(two, Merged2) and one.q == two.q
    q = alice.core2.find(state.queue_id)
    assert q is not None and alice.core2.queues() == [q]
    assert alice.core2.committed(q).held == (0, 6)
    assert alice.core2.committed(q).records() == state.records()
