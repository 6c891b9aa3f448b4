"""A live core-2 push verified and joined on the event loop (:class:`~latticed.net.core2_ahead.AheadPushes`)
is written by the storage thread without a second join when the queue there is the very value it was
joined into, in one group commit or across several; a hand-off against a value that moved meanwhile is
verified or joined again, and one whose joined value is not the join of what was verified stores only
what was verified."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.writer_jobs import ok

from latticed.crdt import queue2
from latticed.crdt.queue2 import Delta, QueueState2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.net.core2_ahead import AheadPush, AheadPushes
from latticed.protocol.core2_wire import link_summary
from latticed.storage.core2_jobs import Commit2, CreateQueue2, Merge2
from latticed.storage.core2_verify import verify_queue2
from latticed.storage.jobs import Job
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE, BOB = Identity.from_seed(b"a" * 32), Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def writer(path: Path, identity: Identity) -> Writer:
    path.mkdir(parents=True, exist_ok=True)
    w = Writer(db_path(path), identity, clock=lambda: NOW)
    w.open()
    return w


class Calls:
    """How often the relay verified and joined a push, counted while the storage thread works."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.verified = self.joined = 0
        verify, join = queue2.verify_delta, queue2.join_verified

        def counted_verify(state: QueueState2, d: Delta) -> queue2.Verified:
            self.verified += 1
            return verify(state, d)

        def counted_join(state: QueueState2, v: queue2.Verified) -> queue2.Merged:
            self.joined += 1
            return join(state, v)

        monkeypatch.setattr(queue2, "verify_delta", counted_verify)
        monkeypatch.setattr(queue2, "join_verified", counted_join)

    def stored(self, w: Writer, *jobs: Job) -> tuple[int, int]:
        """(verifications, joins) ``jobs`` cost the storage thread."""
        self.verified = self.joined = 0
        ok(w, *jobs)
        return self.verified, self.joined


class Chain:
    """Alice owns the queue, Bob relays it (caught up with its first records)."""

    def __init__(self, tmp_path: Path) -> None:
        self.alice, self.bob = writer(tmp_path / "a", ALICE), writer(tmp_path / "b", BOB)
        [self.qa] = ok(self.alice, CreateQueue2("two"))
        ok(self.alice, Commit2(self.qa, [rec(0), rec(1)]))
        [merged] = ok(self.bob, Merge2(queue2.delta(self.alice.core2.committed(self.qa), None)))
        self.qb = merged.q  # type: ignore[attr-defined]
        self.since = queue2.summary(self.bob.core2.committed(self.qb))
        self.ahead = AheadPushes()

    def push(self, i: int) -> Delta:
        """Alice's next single-record commit, as the live push Bob receives."""
        ok(self.alice, Commit2(self.qa, [rec(i)]))
        state = self.alice.core2.committed(self.qa)
        d = queue2.delta(state, self.since)
        self.since = queue2.summary(state)
        return d

    def check(self, d: Delta) -> AheadPush:
        """Bob's event loop: ``d`` verified and joined against the loaded value or the value ahead."""
        loaded = self.bob.core2.loaded(self.qb)
        assert loaded is not None
        push = self.ahead.check(self.qb, loaded, d, None)
        assert push is not None
        return push

    def handed(self, push: AheadPush) -> Merge2:
        job = Merge2(push.delta, push.verified, push.against, push.value)
        job.done = threading.Event()  # pending until the test sets it
        self.ahead.note(self.qb, push.value, job)
        return job

    def same(self) -> None:
        """Bob holds what Alice holds, and its stored rows verify."""
        mine, theirs = self.bob.core2.committed(self.qb), self.alice.core2.committed(self.qa)
        assert link_summary(mine) == link_summary(theirs)
        assert mine.records() == theirs.records()
        assert verify_queue2(self.bob.store.connection, self.qb, mine) == theirs.held[1]

    def close(self) -> None:
        self.alice.stop()
        self.bob.stop()


def rec(i: int) -> Record:
    return make_record(b"v-%d" % i, timestamp=NOW + i)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[Chain]:
    c = Chain(tmp_path)
    yield c
    c.close()


def test_a_push_joined_on_the_event_loop_is_not_joined_again(
    chain: Chain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pushes checked back to back (each against the value ahead) are written as joined there: in one
    group commit, and across commits (the committed value keeps the log the event loop extended)."""
    calls = Calls(monkeypatch)
    first, second = chain.handed(chain.check(chain.push(2))), chain.handed(chain.check(chain.push(3)))
    assert second.against is first.joined
    assert calls.stored(chain.bob, first) == (0, 0)
    third = chain.handed(chain.check(chain.push(4)))  # against the value ahead: second's is pending
    assert third.against is second.joined
    assert calls.stored(chain.bob, second) == (0, 0)  # the committed value is the first's, as joined
    assert calls.stored(chain.bob, third) == (0, 0)
    fourth = chain.handed(chain.check(chain.push(5)))  # against the committed value: it is as far
    assert calls.stored(chain.bob, fourth, chain.handed(chain.check(chain.push(6)))) == (0, 0)
    assert chain.bob.core2.committed(chain.qb).held[1] == 7
    chain.same()


def test_a_stale_hand_off_is_verified_or_joined_again(chain: Chain, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge in between (the same push from another link): the hand-off's verification no longer
    fits and is done again (nothing new). A predecessor that was joined again here: the verification
    still fits the value (same log and chain), the join is done again."""
    calls = Calls(monkeypatch)
    d = chain.push(2)
    handed = chain.handed(chain.check(d))
    assert calls.stored(chain.bob, Merge2(d)) == (1, 1)  # another link's copy, the full path
    assert calls.stored(chain.bob, handed) == (1, 1)
    assert not handed.result.changed
    chain.same()

    first = chain.check(chain.push(3))
    chain.handed(first)
    second = chain.handed(chain.check(chain.push(4)))  # against the first's value ahead
    assert calls.stored(chain.bob, Merge2(first.delta, first.verified, first.against)) == (0, 1)
    assert calls.stored(chain.bob, second) == (0, 1)
    chain.same()


def test_a_joined_value_that_is_not_the_join_of_what_was_verified_is_not_taken(
    chain: Chain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another push's joined value, or a verification against another value, is joined or verified
    again; records swapped in the joined value are never stored: the rows come from what was verified."""
    calls = Calls(monkeypatch)
    first = chain.check(chain.push(2))
    chain.handed(first)
    second = chain.check(chain.push(3))
    wrong = Merge2(first.delta, first.verified, first.against, second.value)
    assert calls.stored(chain.bob, wrong) == (0, 1)

    moved = Merge2(second.delta, second.verified, first.against, second.value)  # not the value here
    assert calls.stored(chain.bob, moved) == (1, 1)
    chain.same()

    push = chain.check(chain.push(4))
    forged = [Record(value=b"forged")]
    entries = push.against.entries.extend(forged, push.verified.chain)
    swapped = dataclasses.replace(push.value, entries=entries)
    assert calls.stored(chain.bob, Merge2(push.delta, push.verified, push.against, swapped)) == (0, 0)
    assert chain.bob.core2.committed(chain.qb).records()[-1].value == b"v-4"
    chain.same()
