"""The work-queue dispatcher: lifecycle, backoff, expiry, dead letters, fencing, caps, crash recovery,
filters, deadlines; then a state machine checking at-least-once delivery against a simple model.

Time is always an explicit ``now``; a tiny harness plays the daemon (persists every ``Changes``, appends
dead letters to a DLQ list and offers them back, rebuilds the dispatcher from the log on a crash).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.paths import ROOT

from latticed.crdt.attempts import (
    CORRELATION_HEADER,
    AttemptEntry,
    AttemptRecord,
    correlation_id,
    decode_history,
    encode_history,
    parse_dead_letter,
)
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.group import (
    GroupProgress,
    apply_progress_ops,
    decode_progress_op,
    encode_progress_op,
    source_id,
)
from latticed.crdt.group_spec import GroupSpec
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import CapacityError, LeaseError, NotFoundError
from latticed.leases import (
    Changes,
    Dispatcher,
    FilterSyntaxError,
    Grant,
    compile_filter,
    parse_filter,
)
from latticed.leases.filters import And, Check, Not, Or

DAEMON = Identity.from_seed(bytes(range(32)))
PRODUCER = Identity.from_seed(bytes(range(1, 33)))
SRC = source_id(PRODUCER.public_key, "jobs")
SRC2 = source_id(PRODUCER.public_key, "more")


def spec(**kw: object) -> GroupSpec:
    fields: dict[str, object] = {
        "name": "workers",
        "sources": (SRC,),
        "max_attempts": 3,
        "visibility_s": 10.0,
        "backoff_base_s": 1.0,
        "backoff_cap_s": 8.0,
        **kw,
    }
    return GroupSpec(**fields)  # type: ignore[arg-type]


def rec(value: str, key: str | None = None, **headers: str) -> Record:
    return Record(
        value=value.encode(),
        key=None if key is None else key.encode(),
        timestamp=1000,
        headers=tuple((k.replace("_", "-"), v.encode()) for k, v in headers.items()),
    )


class Harness:
    """The daemon in miniature: persists changes before "replying", re-offers its dead letters."""

    def __init__(self, group: GroupSpec):
        self.spec = group
        self.records: dict[str, list[Record]] = {s: [] for s in group.sources}
        self.log: list[bytes] = []
        self.history: list[bytes] = []  # the group log's attempt-history records
        self.crashes = 0
        self.d = Dispatcher(group, DAEMON.public_key, token_prefix="e0")
        self.records[self.d.dlq] = []
        self.new_dlq: list[int] = []

    @property
    def dlq(self) -> str:
        return self.d.dlq

    def persist(self, changes: Changes) -> Changes:
        self.log.extend(encode_progress_op(op) for op in changes.ops)  # through bytes, as on disk
        if changes.attempts:
            self.history.append(encode_history(changes.attempts))
        if changes.dead_letters:
            dlq = self.records[self.dlq]
            self.new_dlq = list(range(len(dlq), len(dlq) + len(changes.dead_letters)))
            dlq.extend(changes.dead_letters)
            self.persist(self.d.offer_candidates(self.dlq, [(o, dlq[o]) for o in self.new_dlq]))
        return changes

    def produce(self, *records: Record, source: str = SRC) -> list[int]:
        held = self.records[source]
        offsets = list(range(len(held), len(held) + len(records)))
        held.extend(records)
        self.persist(self.d.offer_candidates(source, zip(offsets, records, strict=True)))
        return offsets

    def progress(self) -> dict[str, GroupProgress]:
        return apply_progress_ops({}, [decode_progress_op(raw) for raw in self.log])

    def crash(self) -> None:
        """Lose everything in memory; rebuild from the durable log and the queues (from each floor on)."""
        self.crashes += 1
        progress = self.progress()
        held = {
            s: [(o, r) for o, r in enumerate(rs) if o >= progress.get(s, GroupProgress()).ack_floor]
            for s, rs in self.records.items()
        }
        history = [entry for raw in self.history for entry in decode_history(raw)]
        self.d = Dispatcher.recover(
            self.spec, DAEMON.public_key, progress, held, token_prefix=f"e{self.crashes}", history=history
        )

    def dequeue(
        self, consumer: str = "c1", now: float = 0.0, visibility: float | None = None
    ) -> Grant | None:
        return self.d.dequeue(consumer, visibility, now)

    def ack(self, token: str, now: float = 0.0) -> Changes:
        return self.persist(self.d.ack(token, now))

    def nack(self, token: str, now: float = 0.0, delay: float | None = None, reason: str = "") -> Changes:
        return self.persist(self.d.nack(token, delay, now, reason))

    def expire(self, now: float) -> Changes:
        return self.persist(self.d.expire(now))

    def release(self, consumer: str, now: float = 0.0, delay: float | None = None) -> Changes:
        return self.persist(self.d.release_consumer(consumer, now, delay))


def lease_of(h: Harness, consumer: str = "c1", now: float = 0.0, visibility: float | None = None) -> Grant:
    lease = h.dequeue(consumer, now, visibility)
    assert lease is not None
    return lease


# ------------------------------------------------------------------------------------------- lifecycle


def test_available_leased_done() -> None:
    h = Harness(spec())
    assert h.produce(rec("a"), rec("b"), rec("c")) == [0, 1, 2]
    lease = lease_of(h, now=100.0)
    assert (lease.queue, lease.offset, lease.attempt, lease.record.value) == (SRC, 0, 1, b"a")
    assert (lease.leased_at, lease.expires_at, lease.consumer) == (100.0, 110.0, "c1")
    stats = h.d.stats(100.0)
    assert (stats.available, stats.leased, stats.done, stats.failed, stats.dead) == (2, 1, 0, 0, 0)
    changes = h.ack(lease.token, 101.0)
    assert changes.done[0].offset == 0 and changes.correlation_id == lease.correlation_id
    stats = h.d.stats(101.0)
    assert (stats.available, stats.leased, stats.done, stats.ack_floor[SRC]) == (2, 0, 1, 1)
    assert h.progress()[SRC] == GroupProgress(ack_floor=1)  # durable before the reply
    assert h.d.inspect(SRC, 0, 101.0).state == "done"
    assert h.d.inspect(SRC, 1, 101.0).state == "available"
    with pytest.raises(NotFoundError):
        h.d.inspect(SRC, 9, 101.0)


def test_delivery_is_in_offset_order_and_acks_may_come_out_of_order() -> None:
    h = Harness(spec())
    h.produce(*(rec(str(i)) for i in range(5)))
    leases = [lease_of(h) for _ in range(4)]
    assert [x.offset for x in leases] == [0, 1, 2, 3]
    h.ack(leases[2].token)
    h.ack(leases[0].token)
    assert h.progress()[SRC] == GroupProgress(ack_floor=1, acked=frozenset({2}))
    h.ack(leases[1].token)
    assert h.progress()[SRC] == GroupProgress(ack_floor=3)
    h.ack(leases[3].token)
    assert h.d.stats(0).ack_floor[SRC] == 4


def test_ack_up_to_settles_a_prefix_and_fences_its_leases() -> None:
    h = Harness(spec())
    h.produce(*(rec(str(i)) for i in range(6)))
    first, second = lease_of(h), lease_of(h)
    changes = h.persist(h.d.ack_up_to(SRC, 4, 1.0))
    assert sorted(d.offset for d in changes.done) == [0, 1, 2, 3]
    assert h.progress()[SRC].ack_floor == 4
    with pytest.raises(LeaseError, match="ack_up_to"):
        h.ack(first.token)
    with pytest.raises(LeaseError):
        h.nack(second.token)
    assert lease_of(h).offset == 4
    with pytest.raises(MalformedError):
        h.d.ack_up_to(SRC, 7, 1.0)  # past what the group has seen
    assert not h.d.ack_up_to(SRC, 2, 1.0)  # nothing left below: no changes


# ----------------------------------------------------------------------------------- retries and expiry


def test_nack_retries_with_exponential_backoff() -> None:
    h = Harness(spec(max_attempts=6, backoff_base_s=2.0, backoff_cap_s=5.0))
    h.produce(rec("a"))
    now, delays = 0.0, []
    for attempt in range(1, 5):
        lease = lease_of(h, now=now)
        assert lease.attempt == attempt
        failure = h.nack(lease.token, now).failed[0]
        assert failure.attempts == attempt and failure.retry_at is not None
        delays.append(failure.retry_at - now)
        assert h.dequeue(now=failure.retry_at - 0.01) is None  # not before its retry time
        assert h.d.next_deadline() == failure.retry_at
        assert h.d.stats(now).failed == 1
        now = failure.retry_at
    assert delays == [2.0, 4.0, 5.0, 5.0]  # base * 2**(attempt-1), capped
    assert h.progress()[SRC].attempts == ((0, 4),)  # attempt counts are durable


def test_nack_with_an_explicit_delay() -> None:
    h = Harness(spec())
    h.produce(rec("a"), rec("b"))
    lease = lease_of(h)
    assert h.nack(lease.token, 5.0, delay=0).failed[0].retry_at == 5.0
    again = lease_of(h, now=5.0)
    assert (again.offset, again.attempt) == (0, 2)  # immediately, and still first in line
    h.nack(again.token, 5.0, delay=7.5)
    assert lease_of(h, now=5.0).offset == 1
    assert h.dequeue(now=12.4) is None
    assert lease_of(h, now=12.5).attempt == 3
    with pytest.raises(MalformedError):
        h.d.nack("x", -1.0, 0.0)


def test_expired_lease_is_redelivered_with_the_next_attempt() -> None:
    h = Harness(spec(backoff_base_s=1.0))
    h.produce(rec("a"))
    lease = lease_of(h, now=0.0, visibility=10.0)
    assert h.d.next_deadline() == 10.0
    assert not h.expire(9.99)
    changes = h.expire(10.0)
    [failure] = changes.failed
    assert (failure.reason, failure.attempts, failure.retry_at, failure.lease) == ("expired", 1, 11.0, lease)
    assert h.d.next_deadline() == 11.0
    again = lease_of(h, consumer="c2", now=11.0)
    assert (again.offset, again.attempt, again.correlation_id) == (0, 2, lease.correlation_id)
    assert [a.outcome for a in h.d.inspect(SRC, 0, 11.0).history] == ["expired"]


def test_extend_moves_the_deadline() -> None:
    h = Harness(spec())
    h.produce(rec("a"))
    lease = lease_of(h, now=0.0, visibility=5.0)
    extended = h.d.extend(lease.token, 20.0, now=4.0)
    assert extended.expires_at == 24.0 and extended.token == lease.token
    assert not h.expire(5.0)  # the old deadline no longer applies
    assert h.d.next_deadline() == 24.0
    with pytest.raises(LeaseError, match="expired"):
        h.d.extend(lease.token, 5.0, now=24.0)
    with pytest.raises(MalformedError):
        h.d.extend(lease.token, 0, now=1.0)
    h.ack(lease.token, 23.0)


# ---------------------------------------------------------------------------------------- dead letters


def test_max_attempts_dead_letters_with_history_and_correlation_id() -> None:
    h = Harness(spec(max_attempts=2))
    h.produce(rec("poison", key="k", correlation_id="order-7"), rec("fine"))
    first = lease_of(h, consumer="alice", now=0.0)
    assert first.correlation_id == "order-7"
    nacked = h.nack(first.token, 1.0)
    assert nacked.correlation_id == "order-7"  # echoed
    h.ack(lease_of(h, now=1.0).token, 1.0)  # "fine"
    second = lease_of(h, consumer="bob", now=2.0)
    assert second.attempt == 2
    changes = h.expire(12.0)
    [failure] = changes.failed
    assert failure.retry_at is None and failure.dead_letter is not None
    assert changes.dead_letters == (failure.dead_letter,)
    info = parse_dead_letter(failure.dead_letter)
    assert (info.source, info.offset, info.attempts, info.reason) == (SRC, 0, 2, "expired")
    assert info.correlation_id == "order-7" and info.dead_at_ms == 12_000
    assert [(a.number, a.consumer, a.outcome) for a in info.history] == [
        (1, "alice", "nack"),
        (2, "bob", "expired"),
    ]
    assert (failure.dead_letter.value, failure.dead_letter.key) == (b"poison", b"k")  # the payload travels
    # Dead letters are settled: the source floor passes over them; the DLQ holds it, parked.
    assert h.progress()[SRC].ack_floor == 2
    [dead] = h.d.dead_letters()
    assert dead.dlq_offset == 0 and dead.info == info
    assert h.d.inspect_dead_letter(0) == dead
    stats = h.d.stats(12.0)
    assert (stats.dead, stats.available, stats.failed) == (1, 0, 0)
    assert h.dequeue(now=100.0) is None  # parked dead letters are not delivered


def test_redrive_makes_dead_letters_available_again() -> None:
    h = Harness(spec(max_attempts=1))
    h.produce(rec("a", correlation_id="c-a"), rec("b"))
    for _ in range(2):
        h.nack(lease_of(h).token)
    assert [d.info.offset for d in h.d.dead_letters()] == [0, 1]
    changes = h.persist(h.d.redrive([1], 5.0))
    assert h.progress()[h.dlq].released == frozenset({1})
    lease = lease_of(h, now=5.0)
    assert (lease.queue, lease.offset, lease.attempt, lease.record.value) == (h.dlq, 1, 1, b"b")
    assert lease.correlation_id == correlation_id(rec("b"), SRC, 1)  # same id as before it died
    h.ack(lease.token, 5.0)
    assert [d.dlq_offset for d in h.d.dead_letters()] == [0]
    assert changes.ops
    with pytest.raises(NotFoundError):
        h.d.redrive([1], 6.0)  # not parked any more
    # A redriven record that dies again keeps its origin and its whole history.
    h.persist(h.d.redrive(None, 6.0))
    again = lease_of(h, now=6.0)
    assert again.correlation_id == "c-a"
    changes = h.nack(again.token, 7.0)
    info = parse_dead_letter(changes.dead_letters[0])
    assert (info.source, info.offset, info.attempts, info.correlation_id) == (SRC, 0, 2, "c-a")
    assert [(a.number, a.outcome) for a in info.history] == [(1, "nack"), (2, "nack")]  # numbered on
    assert [d.dlq_offset for d in h.d.dead_letters()] == [2]


def test_purge_drops_dead_letters_for_good() -> None:
    h = Harness(spec(max_attempts=1))
    h.produce(rec("a"), rec("b"), rec("c"))
    for _ in range(3):
        h.nack(lease_of(h).token)
    h.persist(h.d.purge([1], 0.0))
    assert [d.dlq_offset for d in h.d.dead_letters()] == [0, 2]
    with pytest.raises(NotFoundError):
        h.d.purge([1], 0.0)
    with pytest.raises(NotFoundError):
        h.d.inspect_dead_letter(1)
    h.persist(h.d.purge(None, 0.0))
    assert h.d.dead_letters() == [] and h.d.stats(0).dead == 0
    assert h.progress()[h.dlq].ack_floor == 3
    assert not h.d.purge(None, 0.0)
    h.crash()
    assert h.d.dead_letters() == []


# --------------------------------------------------------------------------------------------- fencing


def test_stale_tokens_are_refused_after_ack_expiry_and_re_lease() -> None:
    h = Harness(spec())
    h.produce(rec("a"), rec("b"))
    acked = lease_of(h)
    h.ack(acked.token)
    with pytest.raises(LeaseError, match="already acked"):
        h.ack(acked.token)
    expired = lease_of(h, now=0.0, visibility=5.0)
    with pytest.raises(LeaseError, match="expired"):  # past its deadline, even before expire() ran
        h.ack(expired.token, 5.0)
    h.expire(5.0)
    relet = lease_of(h, consumer="c2", now=6.0)
    assert relet.offset == expired.offset and relet.token != expired.token
    with pytest.raises(LeaseError, match="stale"):
        h.ack(expired.token, 6.0)
    with pytest.raises(LeaseError, match="stale"):
        h.nack(expired.token, 6.0)
    with pytest.raises(LeaseError, match="stale"):
        h.d.extend(expired.token, 1.0, 6.0)
    with pytest.raises(LeaseError, match="unknown"):
        h.ack("nonsense")
    with pytest.raises(LeaseError):
        h.ack(7)  # type: ignore[arg-type]
    h.ack(relet.token, 6.0)  # the current holder is unaffected


def test_tokens_from_before_a_restart_are_refused() -> None:
    h = Harness(spec())
    h.produce(rec("a"))
    old = lease_of(h)
    h.crash()
    new = lease_of(h)
    assert new.offset == old.offset and new.token != old.token
    with pytest.raises(LeaseError, match="unknown"):
        h.ack(old.token)
    h.ack(new.token)


# ------------------------------------------------------------------------------------------------ caps


def test_consumer_cap() -> None:
    h = Harness(spec(max_consumers=2))
    h.produce(*(rec(str(i)) for i in range(4)))
    lease_of(h, "c1")
    assert h.dequeue("c2") is not None
    with pytest.raises(CapacityError):
        h.dequeue("c3")
    h.release("c1")
    assert h.dequeue("c3") is not None
    assert h.d.stats(0).consumers == 2


def test_in_flight_cap_per_consumer() -> None:
    h = Harness(spec(max_in_flight=2))
    h.produce(*(rec(str(i)) for i in range(4)))
    first, _ = lease_of(h, "c1"), lease_of(h, "c1")
    with pytest.raises(CapacityError):
        h.dequeue("c1")
    assert h.dequeue("c2") is not None  # the cap is per consumer
    h.ack(first.token)
    assert h.dequeue("c1") is not None


def test_release_consumer_nacks_its_leases() -> None:
    h = Harness(spec(backoff_base_s=3.0))
    h.produce(rec("a"), rec("b"), rec("c"))
    mine = [lease_of(h, "gone"), lease_of(h, "gone")]
    other = lease_of(h, "stays")
    changes = h.release("gone", now=1.0)
    assert [(f.lease.offset, f.reason, f.attempts, f.retry_at) for f in changes.failed] == [
        (0, "released", 1, 4.0),
        (1, "released", 1, 4.0),
    ]
    with pytest.raises(LeaseError, match="stale"):
        h.ack(mine[0].token, 1.0)
    assert h.dequeue("stays", now=3.9) is None
    assert lease_of(h, "stays", now=4.0).attempt == 2
    h.ack(other.token, 4.0)
    assert not h.release("gone")  # idempotent
    assert h.release("nobody") == Changes()


# ---------------------------------------------------------------------------------------------- recovery


def test_recover_keeps_acks_and_attempts_and_redelivers_the_rest() -> None:
    h = Harness(spec(max_attempts=2, backoff_base_s=100.0))
    h.produce(*(rec(f"r{i}") for i in range(7)))
    leases = [lease_of(h, now=0.0) for _ in range(5)]
    h.ack(leases[0].token)
    h.ack(leases[2].token)
    h.nack(leases[1].token)  # attempt 1 failed, waiting 100 s
    h.nack(leases[4].token)
    h.nack(lease_of(h, now=200.0).token, 200.0)  # r1 failed twice: dead
    # leases[3] is out at the crash; r5, r6 were never delivered.
    h.crash()
    got = []
    while (lease := h.dequeue(now=201.0)) is not None:
        got.append((lease.offset, lease.attempt))
    assert got == [(3, 1), (4, 2), (5, 1), (6, 1)]  # retry timers were local; attempt counts were not
    assert [d.info.offset for d in h.d.dead_letters()] == [1]
    assert h.d.stats(201.0).ack_floor[SRC] == 3


def test_recover_redrives_released_dead_letters() -> None:
    h = Harness(spec(max_attempts=1))
    h.produce(rec("a"), rec("b"))
    h.nack(lease_of(h).token)
    h.nack(lease_of(h).token)
    h.persist(h.d.redrive([0], 1.0))
    h.crash()
    lease = lease_of(h, now=2.0)
    assert (lease.queue, lease.offset) == (h.dlq, 0)
    assert [d.dlq_offset for d in h.d.dead_letters()] == [1]
    assert h.dequeue(now=2.0) is None


def test_records_offered_twice_or_after_a_gap() -> None:
    h = Harness(spec())
    h.produce(rec("a"), rec("b"))
    h.persist(h.d.offer_candidates(SRC, [(0, rec("a")), (1, rec("b"))]))  # re-offer: ignored
    assert h.d.stats(0).available == 2
    # Offsets 2..4 were truncated before we saw them: the floor passes over them once 0, 1 are done.
    h.persist(h.d.offer_candidates(SRC, [(5, rec("f"))]))
    for _ in range(3):
        h.ack(lease_of(h).token)
    assert h.progress()[SRC].ack_floor == 6
    with pytest.raises(NotFoundError):
        h.d.offer_candidates(SRC2, [])


def test_several_sources() -> None:
    h = Harness(spec(sources=(SRC, SRC2)))
    h.produce(rec("a1"))
    h.produce(rec("b1"), source=SRC2)
    h.produce(rec("a2"))
    got = [lease_of(h) for _ in range(3)]
    assert [(x.queue, x.record.value) for x in got] == [(SRC, b"a1"), (SRC2, b"b1"), (SRC, b"a2")]
    for lease in got:
        h.ack(lease.token)
    assert h.progress() == {SRC: GroupProgress(ack_floor=2), SRC2: GroupProgress(ack_floor=1)}


# ----------------------------------------------------------------------------------------------- filters


def test_group_filter_selects_records_and_the_floor_passes_the_rest() -> None:
    h = Harness(spec(filter="header.type=order && !key^=test"))
    h.produce(
        rec("1", key="a", type="order"),
        rec("2", key="test-1", type="order"),
        rec("3", key="b", type="refund"),
        rec("4", key="c", type="order"),
        rec("5"),
    )
    got = [lease_of(h) for _ in range(2)]
    assert [x.record.value for x in got] == [b"1", b"4"]
    assert h.dequeue() is None
    for lease in got:
        h.ack(lease.token)
    assert h.progress()[SRC].ack_floor == 5
    # Non-members alone still move the durable floor.
    h.produce(rec("6"), rec("7"))
    assert h.progress()[SRC].ack_floor == 7


FILTER_CASES = [
    ("", rec("x"), True),
    ("key", rec("x"), False),
    ("key", rec("x", key="k"), True),
    ("key=abc", rec("x", key="abc"), True),
    ("key=abc", rec("x", key="abcd"), False),
    ("key^=ab", rec("x", key="abcd"), True),
    ("key$=cd", rec("x", key="abcd"), True),
    ("key*=bc", rec("x", key="abcd"), True),
    ("key!=abc", rec("x"), True),
    ("header.type=order", rec("x", type="order"), True),
    ("header.type=order", rec("x", type="orders"), False),
    ("header.x", rec("x", x=""), True),
    ("header.x", rec("x", y="1"), False),
    ("!header.x", rec("x"), True),
    ('header.note="a b \\"c\\""', rec("x", note='a b "c"'), True),
    ("header.a=1 || header.b=2 && header.c=3", rec("x", a="1"), True),
    ("(header.a=1 || header.b=2) && header.c=3", rec("x", a="1"), False),
    ("!(header.a=1 || header.b=2)", rec("x", b="3"), True),
    ("!!header.a", rec("x", a="1"), True),
    ("key=é", rec("x", key="é"), True),
]


@pytest.mark.parametrize(("text", "record", "expected"), FILTER_CASES)
def test_filter_matching(text: str, record: Record, expected: bool) -> None:
    assert compile_filter(text)(record) is expected


def test_filter_repeated_headers_match_any() -> None:
    record = Record(b"", headers=(("tag", b"a"), ("tag", b"b")))
    assert compile_filter("header.tag=b")(record)
    assert not compile_filter("header.tag!=b")(record)


def test_filter_tree() -> None:
    assert parse_filter("header.a=1 || !key && header.b") == Or(
        (Check("a", "=", b"1"), And((Not(Check(None)), Check("b"))))
    )


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("key=", 4),
        ("size=3", 0),
        ("header.=x", 0),
        ("key=a &&", 8),
        ("(key=a", 6),
        ("key=a)", 5),
        ("key=a key=b", 6),
        ('key="abc', 4),
        ('key="a\\n"', 6),
        ("key=a & key=b", 6),
        ("key == a", 5),
        ("||key", 0),
        ("(" * 70 + "key" + ")" * 70, 65),
    ],
)
def test_filter_errors_have_positions(text: str, position: int) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse_filter(text)
    assert info.value.position == position
    assert f"position {position}" in str(info.value)
    assert isinstance(info.value, MalformedError)


def test_bad_group_filter_is_refused_when_the_dispatcher_starts() -> None:
    with pytest.raises(MalformedError):
        Dispatcher(spec(filter="key=="), DAEMON.public_key)
    with pytest.raises(MalformedError):
        parse_filter("x" * 5000)


def test_the_documented_filter_examples_parse_and_mean_what_the_docs_say() -> None:
    """docs/workqueues.md is where users learn the grammar: every example there must parse."""
    doc = (ROOT / "docs" / "workqueues.md").read_text()
    examples = re.findall(r"^--filter '([^']*)'", doc, re.MULTILINE)
    assert len(examples) >= 5
    for text in examples:
        parse_filter(text)
    email = Record(b"v", b"user:1", 0, (("type", b"email"), ("subject", b"the quarterly report")))
    assert compile_filter(examples[0])(email)
    assert compile_filter(examples[1])(email)
    assert compile_filter(examples[4])(email)
    assert not compile_filter(examples[2])(email)


# --------------------------------------------------------------------------- deadlines, stats, validation


def test_next_deadline_is_the_earliest_expiry_or_retry() -> None:
    h = Harness(spec(backoff_base_s=4.0))
    assert h.d.next_deadline() is None
    h.produce(rec("a"), rec("b"))
    a = lease_of(h, now=0.0, visibility=10.0)
    b = lease_of(h, now=0.0, visibility=20.0)
    assert h.d.next_deadline() == 10.0
    h.nack(a.token, 1.0)
    assert h.d.next_deadline() == 5.0  # retry of a at 1 + 4
    lease_of(h, now=5.0, visibility=1.0)
    assert h.d.next_deadline() == 6.0
    h.ack(b.token, 5.5)
    h.expire(6.0)
    assert h.d.next_deadline() == 6.0 + 8.0  # second failure: 4 * 2


def test_stats_and_oldest_age() -> None:
    h = Harness(spec(retention_s=10.0))
    assert h.d.stats(0).oldest_age_s is None
    h.produce(rec("a"), rec("b"))  # producer timestamp: 1000 ms
    stats = h.d.stats(4.0)
    assert stats.oldest_age_s == 3.0 and stats.available == 2
    h.ack(lease_of(h, now=4.0).token, 4.0)
    assert h.d.stats(13.9).done == 1
    assert h.d.stats(14.0).done == 0  # retention over
    with pytest.raises(NotFoundError):
        h.d.inspect(SRC, 0, 14.0)


@pytest.mark.parametrize("consumer", ["", "x" * 300, 5])
def test_bad_consumer_ids(consumer: object) -> None:
    h = Harness(spec())
    with pytest.raises(MalformedError):
        h.d.dequeue(consumer, None, 0.0)  # type: ignore[arg-type]


def test_bad_visibility() -> None:
    h = Harness(spec())
    for bad in (0, -1, float("inf"), True):
        with pytest.raises(MalformedError):
            h.d.dequeue("c", bad, 0.0)


# ------------------------------------------------------------------------------- at-least-once, modelled


@dataclass
class Unit:
    """The model of one deliverable record (a source record, or a dead letter in the DLQ)."""

    origin: int  # the source offset it came from
    state: str  # ready | leased | done | dead | parked | purged
    attempts: int = 0
    ready_at: float = float("-inf")
    token: str = ""
    expires_at: float = 0.0
    consumer: str = ""


MACHINE_SPEC = spec(
    filter="header.keep",
    max_attempts=2,
    visibility_s=4.0,
    backoff_base_s=1.0,
    backoff_cap_s=4.0,
    max_consumers=3,
    max_in_flight=2,
    retention_s=0.0,
)
CONSUMERS = st.sampled_from(["c1", "c2", "c3", "c4"])


class AtLeastOnce(RuleBasedStateMachine):
    """No record is lost, none is leased twice at once, none is done twice; the log always says exactly
    what is settled (acks and dead letters durable before the reply) and how often each record failed."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(MACHINE_SPEC)
        self.now = 0.0
        self.units: dict[tuple[str, int], Unit] = {}
        self.tokens: list[str] = []
        self.consumers: dict[str, set[str]] = {}
        self.done = Counter[int]()

    # ------------------------------------------------------------------ helpers
    def token(self, pick: int, stale: bool) -> str:
        """A token to use: usually one that is live, sometimes any token ever issued (stale ones too)."""
        live = sorted(u.token for u in self.units.values() if u.state == "leased")
        pool = self.tokens if stale or not live else live
        return pool[pick % len(pool)]

    def live(self, token: str) -> tuple[str, int] | None:
        for key, unit in self.units.items():
            if unit.state == "leased" and unit.token == token:
                return key if self.now < unit.expires_at else None
        return None

    def end_lease(self, unit: Unit) -> None:
        self.consumers.get(unit.consumer, set()).discard(unit.token)
        unit.token = ""

    def failed(self, key: tuple[str, int], changes: Changes, delay: float | None) -> None:
        unit = self.units[key]
        [failure] = [f for f in changes.failed if (f.lease.queue, f.lease.offset) == key]
        self.end_lease(unit)
        unit.attempts += 1
        assert failure.attempts == unit.attempts
        if unit.attempts >= MACHINE_SPEC.max_attempts:
            unit.state = "dead"
            assert failure.dead_letter is not None and failure.retry_at is None
            index = changes.dead_letters.index(failure.dead_letter)
            dlq_offset = self.h.new_dlq[index]
            info = parse_dead_letter(failure.dead_letter)
            assert (info.source, info.offset) == (SRC, unit.origin)
            self.units[(self.h.dlq, dlq_offset)] = Unit(unit.origin, "parked")
        else:
            wait = MACHINE_SPEC.backoff(unit.attempts) if delay is None else delay
            unit.state, unit.ready_at = "ready", self.now + wait
            assert failure.retry_at == self.now + wait

    # ------------------------------------------------------------------ rules
    @initialize(keep=st.lists(st.booleans(), min_size=2, max_size=5))
    def start(self, keep: list[bool]) -> None:
        self.produce(keep)

    @rule(keep=st.lists(st.booleans(), min_size=1, max_size=4))
    def produce(self, keep: list[bool]) -> None:
        records = [
            Record(b"v", headers=(("keep", b""),) if k else ((CORRELATION_HEADER, b"x"),)) for k in keep
        ]
        offsets = self.h.produce(*records)
        for offset, k in zip(offsets, keep, strict=True):
            if k:
                self.units[(SRC, offset)] = Unit(offset, "ready")

    @rule(consumer=CONSUMERS, visibility=st.sampled_from([None, 1.0, 6.0]))
    def dequeue(self, consumer: str, visibility: float | None) -> None:
        mine = self.consumers.get(consumer)
        if (mine is None and len(self.consumers) >= 3) or (mine is not None and len(mine) >= 2):
            with pytest.raises(CapacityError):
                self.h.dequeue(consumer, self.now, visibility)
            return
        self.consumers.setdefault(consumer, set())
        eligible = {k for k, u in self.units.items() if u.state == "ready" and u.ready_at <= self.now}
        lease = self.h.dequeue(consumer, self.now, visibility)
        if lease is None:
            assert not eligible
            return
        key = (lease.queue, lease.offset)
        assert key in eligible, f"{key} leased while not available"
        unit = self.units[key]
        assert lease.attempt == unit.attempts + 1
        assert lease.correlation_id == correlation_id(Record(b""), SRC, unit.origin)
        unit.state, unit.token, unit.consumer = "leased", lease.token, consumer
        unit.expires_at = self.now + (visibility or MACHINE_SPEC.visibility_s)
        self.consumers[consumer].add(lease.token)
        self.tokens.append(lease.token)

    @rule(consumer=CONSUMERS)
    def lease_and_fail(self, consumer: str) -> None:
        """A shortcut to dead letters: take the next record and nack it at once."""
        before = len(self.tokens)
        self.dequeue(consumer, None)
        if len(self.tokens) > before:
            token = self.tokens[-1]
            key = self.live(token)
            assert key is not None
            self.failed(key, self.h.nack(token, self.now, 0.0), 0.0)

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 1000), stale=st.booleans())
    def ack(self, pick: int, stale: bool) -> None:
        token = self.token(pick, stale)
        key = self.live(token)
        if key is None:
            with pytest.raises(LeaseError):
                self.h.ack(token, self.now)
            return
        changes = self.h.ack(token, self.now)
        unit = self.units[key]
        assert changes.done[0].offset == key[1]
        self.end_lease(unit)
        unit.state = "done"
        self.done[unit.origin] += 1
        assert self.done[unit.origin] == 1, "a record was done twice"

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 1000), stale=st.booleans(), delay=st.sampled_from([None, 0.0, 2.0]))
    def nack(self, pick: int, stale: bool, delay: float | None) -> None:
        token = self.token(pick, stale)
        key = self.live(token)
        if key is None:
            with pytest.raises(LeaseError):
                self.h.nack(token, self.now, delay)
            return
        self.failed(key, self.h.nack(token, self.now, delay), delay)

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 1000), stale=st.booleans(), visibility=st.sampled_from([1.0, 5.0]))
    def extend(self, pick: int, stale: bool, visibility: float) -> None:
        token = self.token(pick, stale)
        key = self.live(token)
        if key is None:
            with pytest.raises(LeaseError):
                self.h.d.extend(token, visibility, self.now)
            return
        assert self.h.d.extend(token, visibility, self.now).expires_at == self.now + visibility
        self.units[key].expires_at = self.now + visibility

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0, 7.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def expire(self) -> None:
        due = {k for k, u in self.units.items() if u.state == "leased" and u.expires_at <= self.now}
        changes = self.h.expire(self.now)
        assert {(f.lease.queue, f.lease.offset) for f in changes.failed} == due
        for key in sorted(due):
            self.failed(key, changes, None)

    @rule(consumer=CONSUMERS)
    def release(self, consumer: str) -> None:
        mine = {k for k, u in self.units.items() if u.state == "leased" and u.consumer == consumer}
        changes = self.h.release(consumer, self.now)
        assert {(f.lease.queue, f.lease.offset) for f in changes.failed} == mine
        for key in sorted(mine):
            self.failed(key, changes, None)
        self.consumers.pop(consumer, None)

    @rule()
    def crash(self) -> None:
        self.h.crash()
        for unit in self.units.values():
            if unit.state == "leased":
                unit.state, unit.token = "ready", ""  # the lease was local; the attempt is not counted
            if unit.state == "ready":
                unit.ready_at = float("-inf")  # retry timers were local too
        self.consumers.clear()

    @rule()
    def redrive_all(self) -> None:
        self.h.persist(self.h.d.redrive(None, self.now))
        for unit in self.units.values():
            if unit.state == "parked":
                unit.state, unit.ready_at = "ready", float("-inf")

    @rule(pick=st.integers(0, 1000))
    def purge_one(self, pick: int) -> None:
        parked = sorted(k for k, u in self.units.items() if u.state == "parked")
        if not parked:
            return
        key = parked[pick % len(parked)]
        self.h.persist(self.h.d.purge([key[1]], self.now))
        self.units[key].state = "purged"

    # ------------------------------------------------------------------ invariants
    @invariant()
    def dispatcher_agrees_with_the_model(self) -> None:
        d = self.h.d
        for (queue, offset), unit in self.units.items():
            if unit.state == "dead":  # its dead letter answers for it while the DLQ holds one
                try:
                    dead = d.inspect(queue, offset, self.now)
                except NotFoundError:
                    continue
                assert dead.dlq_offset is not None and dead.queue == queue
                continue
            if unit.state in ("done", "purged"):
                with pytest.raises(NotFoundError):
                    d.inspect(queue, offset, self.now)
                continue
            view = d.inspect(queue, offset, self.now)
            assert view.attempts == unit.attempts
            if unit.state == "leased":
                assert view.state == "leased" and view.lease is not None and view.lease.token == unit.token
            elif unit.state == "parked":
                assert view.state == "dead"
            elif unit.ready_at > self.now:
                assert view.state == "failed" and view.retry_at == unit.ready_at
            else:
                assert view.state in ("available", "failed")

    @invariant()
    def the_log_says_what_is_settled(self) -> None:
        progress = self.h.progress()
        for (queue, offset), unit in self.units.items():
            p = progress.get(queue, GroupProgress())
            settled = unit.state in ("done", "dead", "purged")
            assert p.is_settled(offset) == settled, f"{queue}@{offset} {unit.state} but settled={not settled}"
            if not settled:
                assert p.attempts_map().get(offset, 0) == unit.attempts

    @invariant()
    def nothing_is_lost(self) -> None:
        for origin in {u.origin for u in self.units.values()}:
            states = [u.state for u in self.units.values() if u.origin == origin]
            live = [s for s in states if s not in ("dead", "purged")]
            # Each record is exactly one of: pending somewhere, done, parked, or purged on purpose.
            assert len(live) == 1 or states[-1] == "purged", (origin, states)


AtLeastOnce.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
test_at_least_once = AtLeastOnce.TestCase


def test_recovery_preserves_spec_filter_after_replacement() -> None:
    """A dispatcher built from a changed definition keeps the durable settled facts."""
    h = Harness(spec())
    h.produce(rec("a"), rec("b", keep="1"))
    h.ack(lease_of(h).token)
    h.spec = replace(h.spec, filter="header.keep")
    h.crash()
    lease = lease_of(h)
    assert lease.offset == 1 and h.dequeue() is None


# ------------------------------------------------------------------ durable attempt history


def outcomes(view_history: tuple[AttemptRecord, ...]) -> list[tuple[int, str, str, str]]:
    return [(a.number, a.consumer, a.outcome, a.error) for a in view_history]


def test_attempt_history_is_durable_and_done_records_keep_it_for_the_retention() -> None:
    h = Harness(spec(retention_s=60.0, backoff_base_s=0.0))
    h.produce(rec("a"), rec("b"), rec("c"))
    first = lease_of(h, "c1", now=1.0)
    h.nack(first.token, now=2.0, reason="boom: exit 3")
    assert h.d.inspect(SRC, 0, 2.0).history[0].error == "boom: exit 3"
    again = lease_of(h, "c2", now=3.0)
    assert again.offset == 0 and again.attempt == 2
    h.ack(again.token, now=4.0)
    pending = lease_of(h, "c1", now=5.0)
    assert lease_of(h, "c3", now=5.0).offset == 2  # left to expire
    h.nack(pending.token, now=6.0, reason="bad input")
    h.expire(20.0)
    live = h.d.inspect(SRC, 0, 8.0)
    assert live.state == "done" and live.done_at == 4.0
    assert outcomes(live.history) == [(1, "c1", "nack", "boom: exit 3"), (2, "c2", "acked", "")]
    h.crash()
    done = h.d.inspect(SRC, 0, 21.0)
    assert done.state == "done" and outcomes(done.history) == outcomes(live.history)
    assert done.correlation_id == ""  # rebuilt: the daemon derives it from the record
    failed = h.d.inspect(SRC, 1, 21.0)
    assert failed.state == "available" and outcomes(failed.history) == [(1, "c1", "nack", "bad input")]
    expired = h.d.inspect(SRC, 2, 21.0)
    assert [(a.number, a.outcome) for a in expired.history] == [(1, "expired")]
    # the history of a pending record keeps growing after the crash, and is not duplicated
    lease = lease_of(h, "c4", now=22.0)
    assert lease.offset == 1 and lease.attempt == 2
    h.ack(lease.token, now=23.0)
    assert [a.outcome for a in h.d.inspect(SRC, 1, 24.0).history] == ["nack", "acked"]
    # past the retention period a done record is forgotten, in memory and in what a compaction keeps
    with pytest.raises(NotFoundError):
        h.d.inspect(SRC, 0, 65.0)
    kept = {(e.offset, e.attempt.outcome) for e in h.d.live_history(65.0)}
    assert kept == {(1, "nack"), (1, "acked"), (2, "expired")}


def test_a_dead_records_history_comes_from_its_dead_letter_also_after_redrive() -> None:
    h = Harness(spec(max_attempts=2, backoff_base_s=0.0))
    h.produce(rec("poison"))
    h.nack(lease_of(h, "c1").token, now=1.0, reason="first")
    h.nack(lease_of(h, "c2", now=2.0).token, now=3.0, reason="second")
    dead = h.d.inspect(SRC, 0, 4.0)
    assert (dead.state, dead.dlq_offset, dead.attempts) == ("dead", 0, 2)
    assert outcomes(dead.history) == [(1, "c1", "nack", "first"), (2, "c2", "nack", "second")]
    assert [a.error for a in parse_dead_letter(h.records[h.dlq][0]).history] == ["first", "second"]
    h.persist(h.d.redrive(None, 5.0))
    h.nack(lease_of(h, "c3", now=6.0).token, now=7.0, reason="third")
    again = h.d.inspect(SRC, 0, 8.0)
    assert again.state == "available" and again.dlq_offset == 0
    assert [(a.number, a.error) for a in again.history] == [(1, "first"), (2, "second"), (3, "third")]
    h.crash()
    assert [a.error for a in h.d.inspect(SRC, 0, 9.0).history] == ["first", "second", "third"]


def test_history_encoding_round_trips_and_refuses_garbage() -> None:
    entries = [
        AttemptEntry(SRC, 7, AttemptRecord(1, "c1", 1000, 2000, "nack", "why")),
        AttemptEntry(SRC2, 8, AttemptRecord(2, "peer/c2", 3000, 4000, "acked")),
        AttemptEntry(SRC, 9, AttemptRecord(1, "c1", 5000, 6000, "claimed")),
    ]
    assert decode_history(encode_history(entries)) == entries
    for bad in (b"\xc1", b"\x90", encode_history(entries)[:-3]):
        with pytest.raises(MalformedError):
            decode_history(bad)
    with pytest.raises(MalformedError):
        h = Harness(spec())
        h.produce(rec("x"))
        h.d.nack(lease_of(h).token, None, 1.0, "x" * 1025)


# ------------------------------------------------------------------ claim and edits


def test_claim_takes_over_idle_leases_and_counts_the_attempt() -> None:
    h = Harness(spec(max_attempts=3, backoff_base_s=0.0))
    h.produce(rec("a"), rec("b"), rec("c"))
    stuck = lease_of(h, "c1", now=0.0)
    busy = lease_of(h, "c1", now=0.0)
    h.d.extend(busy.token, 30.0, 5.0)  # c1 showed life on this one at t=5
    mine = lease_of(h, "c2", now=1.0)
    leases, changes = h.d.claim("c2", 6.0, 10, None, 8.0)
    h.persist(changes)
    assert [(g.offset, g.attempt, g.consumer) for g in leases] == [(stuck.offset, 2, "c2")]
    assert mine.token not in {g.token for g in leases}  # its own leases are not claimed
    view = h.d.inspect(SRC, stuck.offset, 8.0)
    assert view.lease is not None and view.lease.consumer == "c2" and view.attempts == 1
    assert [(a.outcome, a.consumer, a.error) for a in view.history] == [("claimed", "c1", "claimed by c2")]
    with pytest.raises(LeaseError, match="claimed"):
        h.ack(stuck.token, now=9.0)
    assert h.d.claim("c3", 100.0, 10, None, 9.0) == ([], Changes())
    assert h.progress()[SRC].attempts_map() == {stuck.offset: 1}


def test_a_claim_on_a_last_attempt_dead_letters_the_record_instead() -> None:
    h = Harness(spec(max_attempts=1))
    h.produce(rec("a"))
    lease_of(h, "c1", now=0.0)
    leases, changes = h.d.claim("c2", 1.0, 1, None, 2.0)
    h.persist(changes)
    assert leases == [] and len(changes.dead_letters) == 1
    assert h.d.inspect(SRC, 0, 3.0).state == "dead"


def test_an_edit_applies_from_now_on() -> None:
    h = Harness(spec(visibility_s=10.0, max_attempts=5))
    h.produce(rec("a", key="x"), rec("b", key="x"))
    before = lease_of(h, "c1", now=0.0)
    h.d.update_spec(spec(visibility_s=2.0, max_attempts=1, filter="key=y"))
    assert h.d.inspect(SRC, before.offset, 1.0).lease == before  # its deadline stays
    after = lease_of(h, "c1", now=1.0)
    assert after.offset == 1 and after.expires_at == 3.0  # taken in before the filter changed
    h.produce(rec("c", key="x"), rec("d", key="y"))
    assert lease_of(h, "c1", now=1.0).offset == 3  # the new filter skips offset 2
    assert h.expire(4.0).dead_letters  # offset 1 failed once: the new max_attempts dead-letters it
    with pytest.raises(MalformedError):
        h.d.update_spec(spec(sources=(SRC2,)))
