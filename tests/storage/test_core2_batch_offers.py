"""Many single offers to one core-2 queue in one group commit: the owner's checks and the queue's end are
worked out once for the batch's value, not at each offer, and a change of that value (a truncation, a
metadata change) between them is still seen."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from support.writer_jobs import ok

from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage import core2_queues
from latticed.storage.core2_jobs import Commit2, CreateQueue2, Truncate2
from latticed.storage.core2_queues import Core2Queues
from latticed.storage.jobs import Job
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(f"v{i}".encode(), timestamp=NOW + i)


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[Writer]:
    (tmp_path / "alice").mkdir()
    w = Writer(db_path(tmp_path / "alice"), ALICE, clock=lambda: NOW)
    w.open()
    yield w
    w.stop()


def test_a_batch_of_single_offers_checks_the_owner_once(
    alice: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    assert isinstance(q, int)
    peeked: list[int] = []
    peek = Core2Queues.peek

    def counted(self: Core2Queues, q: int) -> QueueState2:
        peeked.append(q)
        return peek(self, q)

    monkeypatch.setattr(Core2Queues, "peek", counted)
    assert ok(alice, *(Commit2(q, [rec(i)], checked=True) for i in range(16))) == list(range(16))
    assert peeked == [q]  # the 15 offers after the first find the same value vouched for
    assert ok(alice, *(Commit2(q, [rec(i)], checked=True) for i in range(16, 20))) == [16, 17, 18, 19]
    assert peeked == [q, q]  # a new batch checks again
    assert alice.core2.committed(q).held == (0, 20)


def test_offers_around_a_truncation_in_one_batch_see_its_value(alice: Writer) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    assert isinstance(q, int)
    jobs: list[Job] = [
        Commit2(q, [rec(0)]),
        Commit2(q, [rec(1), rec(2)]),
        Truncate2(q, 2),
        Commit2(q, [rec(3)]),
        Commit2(q, [], {"k": "v"}),
        Commit2(q, [rec(4)]),
    ]
    assert ok(alice, *jobs) == [0, 1, 2, 3, 4, 4]  # a truncation answers its start, a metadata change the end
    state = alice.core2.committed(q)
    assert state.held == (2, 5) and dict(state.meta) == {"k": "v"}
    assert [r.value for r in state.records()] == [b"v2", b"v3", b"v4"]


def test_checked_single_offers_take_the_vouched_path_and_leave_it_when_the_value_changes(
    alice: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    assert isinstance(q, int)
    taken: list[int | None] = []
    append_vouched = Core2Queues.append_vouched

    def counted(self: Core2Queues, q: int, records: Sequence[Record]) -> int | None:
        first = append_vouched(self, q, records)
        taken.append(first)
        return first

    monkeypatch.setattr(Core2Queues, "append_vouched", counted)
    jobs: list[Job] = [
        Commit2(q, [rec(0)], checked=True),  # not vouched yet: the full path, which vouches
        Commit2(q, [rec(1)], checked=True),  # vouched: 1
        Truncate2(q, 1),  # a new staged value: no longer vouched
        Commit2(q, [rec(2)], checked=True),  # the full path again
        Commit2(q, [rec(3)], checked=True),  # vouched: 3
        Commit2(q, [], {"k": "v"}, checked=True),  # metadata: the full path, never the vouched one
        Commit2(q, [rec(4)], checked=True),  # vouched (metadata stays pending on the same value): 4
    ]
    assert ok(alice, *jobs) == [0, 1, 1, 2, 3, 4, 4]
    assert taken == [None, 1, None, 3, 4]
    state = alice.core2.committed(q)
    assert state.held == (1, 5) and dict(state.meta) == {"k": "v"}
    assert [r.value for r in state.records()] == [b"v1", b"v2", b"v3", b"v4"]


def test_the_vouched_path_leaves_a_full_queue_to_the_checks(
    alice: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    [q] = ok(alice, CreateQueue2("q"))
    monkeypatch.setattr(core2_queues, "MAX_OFFSET", 2)
    assert isinstance(q, int)
    core2 = alice.core2
    core2.begin(ALICE, NOW, lambda: 99)
    assert core2.append_vouched(q, [rec(0)]) is None  # nothing staged yet
    state = core2.peek(q)
    core2.vouch(q, state)
    assert core2.append_vouched(q, [rec(0)]) == 0
    assert core2.append_vouched(q, [rec(1), rec(2)]) is None  # past the last offset: not staged
    assert core2.end(q) == 1
    assert core2.append_vouched(q, [rec(1)]) == 1  # up to it: staged
    assert core2.end(q) == 2
