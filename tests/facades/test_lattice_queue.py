"""CAD040's queue API on ``LatticeQueue``: producer, consumer, info, metadata, truncation, replicas,
fork/sync and deltas, with the edge cases of each (see /work/shared/seeds/000_*.txt)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from latticed import (
    GapError,
    Identity,
    LatticedError,
    LatticeQueue,
    MalformedError,
    NotOwnerError,
    QueueState,
    Record,
)
from latticed.crdt import queue as core
from latticed.crdt.records import MAX_OFFSET, record_digest

OWNER = Identity.from_seed(bytes(range(32)))
OTHER = Identity.from_seed(bytes([9]) * 32)


def ticking(start: int = 1_000) -> Callable[[], int]:
    """A deterministic clock that advances 1 ms per reading."""
    return itertools.count(start).__next__


def owned(name: str = "events", clock: Callable[[], int] | None = None) -> LatticeQueue:
    return LatticeQueue.create(OWNER, name, clock=clock or ticking())


def filled(n: int, name: str = "events") -> LatticeQueue:
    q = owned(name)
    for i in range(n):
        q.offer(f"v{i}")
    return q


def replica_of(q: LatticeQueue) -> LatticeQueue:
    r = LatticeQueue.empty_replica(q.owner, q.name)
    r.merge(q.state)
    return r


# ------------------------------------------------------------------------------------------- producer


def test_offers_get_consecutive_absolute_offsets_from_zero() -> None:
    q = owned()
    assert [q.offer(f"v{i}") for i in range(5)] == [0, 1, 2, 3, 4]
    assert q.range(0, 4) == [b"v0", b"v1", b"v2", b"v3", b"v4"]


def test_offer_builds_a_full_record_from_value_key_headers_and_clock() -> None:
    q = LatticeQueue.create(OWNER, "events", clock=lambda: 1234)
    offset = q.offer(b"payload", key=b"user-1", headers={"trace": b"abc"})
    assert q.peek_entry(offset) == Record(
        value=b"payload", key=b"user-1", timestamp=1234, headers=(("trace", b"abc"),)
    )
    plain = q.peek_entry(q.offer("just a value"))
    assert plain == Record(value=b"just a value", key=None, timestamp=1234, headers=())


def test_timestamps_come_from_the_injected_clock_at_offer_time() -> None:
    q = owned(clock=ticking(50_000))
    offsets = [q.offer("x") for _ in range(3)]
    stamps = [entry.timestamp for entry in q.range_entries(0, 2)]
    assert offsets == [0, 1, 2]
    assert stamps == [50_000, 50_001, 50_002]
    # Replicas see the producer's timestamps, not their own.
    r = LatticeQueue.empty_replica(OWNER.public_key, "events", clock=lambda: 7)
    r.merge(q.state)
    assert [e.timestamp for e in r.range_entries(0, 2)] == stamps


def test_values_are_stored_as_bytes_whatever_bytes_like_or_text_came_in() -> None:
    q = owned()
    q.offer("text")
    q.offer(b"raw")
    q.offer(bytearray(b"array"))  # type: ignore[arg-type]
    q.offer(memoryview(b"view"))  # type: ignore[arg-type]
    q.offer("")
    assert q.range(0, 4) == [b"text", b"raw", b"array", b"view", b""]
    assert all(type(v) is bytes for v in q.range(0, 4))


def test_keys_none_empty_and_bytes_stay_distinct_through_replication() -> None:
    q = owned()
    q.offer("a")
    q.offer("b", key=b"")
    q.offer("c", key=b"k")
    q.offer("d", key="text-key")
    r = replica_of(q)
    for view in (q, r):
        assert [e.key for e in view.range_entries(0, 3)] == [None, b"", b"k", b"text-key"]
    # The signed encoding tells "no key" from "empty key", so neither can pass for the other.
    assert record_digest(Record(value=b"a"), 0) != record_digest(Record(value=b"a", key=b""), 0)


def test_headers_round_trip_in_dict_and_pair_forms() -> None:
    q = owned()
    mixed: dict[str, str | bytes] = {"content-type": "text/plain", "id": b"\x00\x01"}
    q.offer("dict", headers=mixed)
    q.offer("pairs", headers=[("retry", "1"), ("retry", b"2"), ("trace", b"t")])
    q.offer("pairs-as-lists", headers=[["a", "b"]])  # type: ignore[list-item]
    q.offer("none", headers=None)
    q.offer("empty", headers={})
    r = replica_of(q)
    for view in (q, r):
        first, second, third, fourth, fifth = view.range_entries(0, 4)
        assert first.headers == (("content-type", b"text/plain"), ("id", b"\x00\x01"))
        # Repeated names keep their order (Kafka allows them); header() returns the first.
        assert second.headers == (("retry", b"1"), ("retry", b"2"), ("trace", b"t"))
        assert second.header("retry") == b"1"
        assert second.header("missing") is None
        assert third.headers == (("a", b"b"),)
        assert fourth.headers == () and fifth.headers == ()


@pytest.mark.parametrize(
    "headers",
    [
        5,
        [("only-a-name",)],
        [("a", "b", "c")],
        {b"bytes-name": b"v"},
        [(1, b"v")],
        {"n": 5},
        {"n": None},
    ],
)
def test_malformed_headers_raise_and_append_nothing(headers: object) -> None:
    q = filled(2)
    with pytest.raises(MalformedError):
        q.offer("x", headers=headers)  # type: ignore[arg-type]
    assert q.end_offset == 2
    assert q.peek(2) is None


@pytest.mark.parametrize(("value", "key"), [(5, None), (None, None), ("v", 5), ("v", ["k"])])
def test_malformed_values_and_keys_raise_and_append_nothing(value: object, key: object) -> None:
    q = filled(1)
    with pytest.raises(MalformedError):
        q.offer(value, key=key)  # type: ignore[arg-type]
    assert q.end_offset == 1
    assert q.state.held_end == 1


def test_offer_many_appends_prebuilt_records_in_one_signed_batch() -> None:
    q = filled(2)
    version = q.state.version
    records = [Record(value=b"x", key=b"k", timestamp=5), Record(value=b"y", headers=(("h", b"1"),))]
    assert q.offer_many(records) == range(2, 4)
    assert q.range_entries(2, 3) == records
    assert q.state.version == version + 1
    with pytest.raises(MalformedError):
        q.offer_many([Record(value="not bytes")])  # type: ignore[arg-type]
    assert q.end_offset == 4


#: Things that are not valid records, as a caller might pass them to offer_many.
NOT_RECORDS = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.lists(st.text(max_size=3), max_size=2),
    st.builds(Record, value=st.one_of(st.none(), st.text(max_size=3), st.integers())),
    st.builds(Record, value=st.just(b"v"), key=st.one_of(st.text(max_size=3), st.integers())),
    st.builds(
        Record, value=st.just(b"v"), timestamp=st.one_of(st.none(), st.just(2**63), st.text(max_size=1))
    ),
    st.builds(Record, value=st.just(b"v"), headers=st.one_of(st.just((("h", "text"),)), st.just((("h",),)))),
)
GOOD_RECORDS = st.lists(
    st.builds(Record, value=st.binary(max_size=8), timestamp=st.integers(0, 10)), max_size=3
)


@given(good=GOOD_RECORDS, bad=NOT_RECORDS, where=st.integers(0, 3))
def test_offer_many_refuses_a_batch_with_anything_but_records_and_changes_nothing(
    good: list[Record], bad: object, where: int
) -> None:
    q = filled(2)
    version = q.state.version
    q.offer("pending")
    batch: list[object] = [*good]
    batch.insert(min(where, len(batch)), bad)
    with pytest.raises(MalformedError):
        q.offer_many(batch)  # type: ignore[arg-type]
    assert q.end_offset == 3 and q.range(0, 10) == [b"v0", b"v1", b"pending"]
    assert q.state.version == version + 1  # one head for the pending offer, none for the refused batch


@pytest.mark.parametrize("records", [None, 5, Record(b"not a list")])
def test_offer_many_of_something_not_iterable_is_malformed(records: object) -> None:
    q = filled(1)
    version = q.state.version
    with pytest.raises(MalformedError):
        q.offer_many(records)  # type: ignore[arg-type]
    assert q.state.version == version and q.end_offset == 1


def test_offer_many_of_nothing_signs_nothing() -> None:
    q = filled(2)
    state = q.state
    assert q.offer_many([]) == range(2, 2)
    assert q.offer_many(iter(())) == range(2, 2)
    assert q.state is state and q.state.version == state.version
    q.offer("p")
    assert q.offer_many([]) == range(3, 3)


def test_offers_past_the_last_offset_are_refused_before_they_get_an_offset() -> None:
    q = owned()
    q.truncate(MAX_OFFSET - 2)
    assert q.offer("a") == MAX_OFFSET - 2
    # The last offset a record can take is MAX_OFFSET - 1: offered, shown, and then signed.
    assert q.offer("b") == MAX_OFFSET - 1
    with pytest.raises(MalformedError, match="full"):
        q.offer("c")
    with pytest.raises(MalformedError, match="full"):
        q.offer_many([Record(b"c")])
    assert q.peek(MAX_OFFSET - 1) == b"b" and q.peek(MAX_OFFSET) is None
    assert q.summary().held_end == MAX_OFFSET  # what was acknowledged is signed, nothing lost
    assert q.range(MAX_OFFSET - 2, MAX_OFFSET) == [b"a", b"b"]
    assert replica_of(q).range(MAX_OFFSET - 2, MAX_OFFSET) == [b"a", b"b"]
    with pytest.raises(MalformedError, match="full"):
        q.offer("c")
    assert q.end_offset == MAX_OFFSET


def test_a_commit_that_fails_keeps_the_offers_it_did_not_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    q = filled(2)
    real = core.commit

    def failing(*args: object, **kwargs: object) -> QueueState:
        raise MalformedError("injected")

    monkeypatch.setattr(core, "commit", failing)
    with pytest.raises(MalformedError):
        q.commit()
    assert q.end_offset == 2 and q.range(0, 1) == [b"v0", b"v1"]
    monkeypatch.setattr(core, "commit", real)
    assert q.summary().held_end == 2
    assert replica_of(q).range(0, 1) == [b"v0", b"v1"]


def test_pending_offers_are_visible_to_the_owner_before_they_are_signed() -> None:
    q = owned()
    assert [q.offer(f"p{i}") for i in range(3)] == [0, 1, 2]
    # Nothing signed yet: peeks, ranges and info see the buffered records.
    assert q.peek(1) == b"p1"
    assert q.peek_last() == b"p2"
    assert q.peek_first_entry() is not None and q.peek_first_entry().value == b"p0"  # type: ignore[union-attr]
    assert q.range(0, 10) == [b"p0", b"p1", b"p2"]
    assert (q.end_offset, q.size, q.is_empty) == (3, 3, False)
    # Observing the state signs the whole burst as one head.
    state = q.state
    assert state.version == 1 and state.held_end == 3
    # Pending offers after a commit continue the offsets and are again visible.
    assert q.offer("p3") == 3
    assert q.peek(3) == b"p3"
    assert q.range(2, 3) == [b"p2", b"p3"]


def test_an_owner_restoring_from_a_partial_copy_cannot_offer_until_it_holds_everything() -> None:
    q = owned()
    for batch in range(3):
        for i in range(4):
            q.offer(f"{batch}:{i}")
        q.commit()
    restored = LatticeQueue.create(OWNER, "events", clock=ticking(9_000))
    restored.merge(q.delta(restored.summary(), max_records=4))
    assert restored.end_offset == 4
    # Offset 4 is already assigned in the signed history: handing it out again (and losing the record
    # when the commit fails) would be wrong, so the offer is refused up front.
    with pytest.raises(GapError):
        restored.offer("too early")
    with pytest.raises(GapError):
        restored.truncate(2)
    with pytest.raises(GapError):
        restored.set_meta("k", "v")
    assert restored.end_offset == 4 and restored.peek(4) is None
    restored.merge(q.delta(restored.summary()))
    assert restored.offer("now") == 12
    assert restored.range(11, 12) == [b"2:3", b"now"]
    watcher = replica_of(q)
    watcher.merge(restored.state)
    assert not watcher.forked and watcher.peek(12) == b"now"


# ------------------------------------------------------------------------------------------- consumer


def test_an_empty_queue_reads_as_empty() -> None:
    for q in (owned(), LatticeQueue.empty_replica(OWNER.public_key, "events")):
        assert (q.start_offset, q.end_offset, q.size, q.is_empty) == (0, 0, 0, True)
        assert q.peek(0) is None and q.peek_entry(0) is None
        assert q.peek(-1) is None
        assert q.peek_first() is None and q.peek_last() is None
        assert q.peek_first_entry() is None and q.peek_last_entry() is None
        assert q.range(0, 10) == [] and q.range_entries(0, 0) == []
        assert q.get_meta("name") is None


def test_peek_is_none_outside_start_end() -> None:
    q = filled(5)
    q.truncate(2)
    assert q.peek(1) is None and q.peek_entry(1) is None
    assert q.peek(2) == b"v2"
    assert q.peek(4) == b"v4"
    assert q.peek(5) is None and q.peek_entry(5) is None
    assert q.peek(-1) is None
    assert q.peek(10**12) is None


def test_peek_first_and_last_values_and_entries() -> None:
    q = owned()
    q.offer("first", key=b"k1")
    q.offer("middle")
    q.offer("last", headers={"h": "x"})
    assert q.peek_first() == b"first"
    assert q.peek_last() == b"last"
    assert q.peek_first_entry() == q.peek_entry(0)
    assert q.peek_last_entry() == q.peek_entry(2)
    first, last = q.peek_first_entry(), q.peek_last_entry()
    assert first is not None and first.key == b"k1"
    assert last is not None and last.headers == (("h", b"x"),)
    q.truncate(2)
    assert q.peek_first() == b"last" == q.peek_last()


def test_range_is_inclusive_and_clamped_to_what_is_present() -> None:
    q = filled(10)
    q.truncate(3)
    assert q.range(4, 6) == [b"v4", b"v5", b"v6"]
    assert q.range(5, 5) == [b"v5"]
    assert q.range(0, 4) == [b"v3", b"v4"]  # below start: clamped
    assert q.range(8, 100) == [b"v8", b"v9"]  # past end: clamped
    assert q.range(-50, 50) == [f"v{i}".encode() for i in range(3, 10)]
    assert q.range(10, 20) == []  # wholly past the end
    assert q.range(0, 2) == []  # wholly truncated
    assert [e.value for e in q.range_entries(3, 4)] == [b"v3", b"v4"]


def test_an_inverted_range_is_empty() -> None:
    q = filled(5)
    assert q.range(3, 2) == []
    assert q.range(4, 0) == []
    assert q.range_entries(2, 1) == []


def test_reads_do_not_modify_the_queue() -> None:
    q = filled(3)
    before = q.state
    q.peek(1)
    q.peek_last_entry()
    q.range(0, 5)
    q.get_meta("x")
    assert q.state == before
    assert q.state.version == before.version


# ------------------------------------------------------------------------------------------ truncation


def test_offsets_are_stable_across_truncation() -> None:
    q = filled(6)
    q.truncate(4)
    assert (q.start_offset, q.end_offset, q.size) == (4, 6, 2)
    assert q.range(0, 10) == [b"v4", b"v5"]
    assert q.offer("v6") == 6
    assert q.peek(6) == b"v6" and q.peek(4) == b"v4"
    r = replica_of(q)
    assert (r.start_offset, r.end_offset) == (4, 7)
    assert r.range(0, 10) == [b"v4", b"v5", b"v6"]


def test_truncate_at_or_below_start_is_a_no_op() -> None:
    q = filled(5)
    q.truncate(3)
    before = q.state
    for new_start in (3, 2, 0, -1):
        q.truncate(new_start)
        assert q.start_offset == 3
        assert q.state == before
        assert q.state.version == before.version  # nothing was signed either
    q.truncate(4)
    assert q.start_offset == 4


def test_truncate_to_exactly_the_end_empties_the_queue() -> None:
    q = filled(3)
    q.truncate(3)
    assert (q.start_offset, q.end_offset, q.size, q.is_empty) == (3, 3, 0, True)
    assert q.peek_first() is None and q.peek_last_entry() is None
    assert q.offer("next") == 3
    assert q.range(0, 10) == [b"next"]


def test_truncate_past_the_end_skips_offsets_that_are_never_assigned() -> None:
    q = filled(3)
    q.truncate(10)
    assert (q.start_offset, q.end_offset, q.size, q.is_empty) == (10, 10, 0, True)
    assert q.offer("after") == 10
    assert [q.peek(o) for o in range(0, 10)] == [None] * 10
    assert q.range(0, 20) == [b"after"]
    r = replica_of(q)
    assert (r.start_offset, r.end_offset) == (10, 11)
    assert r.peek(10) == b"after" and r.peek(3) is None
    # A replica that held the old records catches up across the skip with a delta.
    stale = LatticeQueue.empty_replica(OWNER.public_key, "events")
    stale.merge(filled(3).state)
    stale.merge(q.delta(stale.summary()))
    assert stale.state == q.state
    assert stale.range(0, 20) == [b"after"]


def test_truncate_past_the_end_of_an_empty_queue() -> None:
    q = owned()
    q.truncate(5)
    assert (q.start_offset, q.end_offset) == (5, 5)
    assert q.offer("x") == 5


def test_truncate_signs_pending_offers_first() -> None:
    q = owned()
    for i in range(4):
        q.offer(f"v{i}")
    q.truncate(3)
    assert q.range(0, 10) == [b"v3"]
    assert q.offer("v4") == 4


def test_truncate_rejects_non_integer_and_out_of_range_offsets() -> None:
    q = filled(2)
    before = q.state
    with pytest.raises(MalformedError):
        q.truncate("5")  # type: ignore[arg-type]
    with pytest.raises(MalformedError):
        q.truncate(2**64)
    assert q.state == before


# ------------------------------------------------------------------------------------------- metadata


def test_metadata_set_overwrite_delete() -> None:
    q = owned()
    assert q.get_meta("name") is None
    q.set_meta("name", "orders")
    q.set_meta("retention", "7d")
    assert q.get_meta("name") == "orders"
    q.set_meta("name", "orders-v2")
    assert q.get_meta("name") == "orders-v2"
    q.set_meta("retention", None)
    assert q.get_meta("retention") is None
    q.set_meta("never-set", None)  # deleting a missing key is fine
    assert q.get_meta("never-set") is None
    assert q.state.meta == (("name", "orders-v2"),)
    r = replica_of(q)
    assert r.get_meta("name") == "orders-v2" and r.get_meta("retention") is None


def test_metadata_keys_must_be_non_empty_text() -> None:
    q = owned()
    before = q.state
    with pytest.raises(MalformedError):
        q.set_meta("", "x")
    with pytest.raises(MalformedError):
        q.set_meta(5, "x")  # type: ignore[arg-type]
    assert q.state == before


def test_metadata_changes_replicate_as_deltas() -> None:
    q = owned()
    q.set_meta("a", "1")
    q.set_meta("b", "2")
    r = replica_of(q)
    q.set_meta("a", "changed")
    q.set_meta("b", None)
    d = q.delta(r.summary())
    assert d.meta == (("a", "changed"),)
    r.merge(d)
    assert (r.get_meta("a"), r.get_meta("b")) == ("changed", None)
    # An unchanged metadata map is not resent.
    q.offer("x")
    assert q.delta(r.summary()).meta is None


def test_older_metadata_never_wins_over_a_newer_signed_version() -> None:
    q = owned()
    q.set_meta("a", "1")
    q.set_meta("b", "keep?")
    old = q.state
    q.set_meta("a", "2")
    q.set_meta("b", None)
    new = q.state
    for order in ((old, new), (new, old)):
        r = LatticeQueue.empty_replica(OWNER.public_key, "events")
        for state in order:
            r.merge(state)
        # Not CAD040's "map union, own entry wins": the owner's signed version decides, and a deletion
        # is not resurrected by an older copy.
        assert (r.get_meta("a"), r.get_meta("b")) == ("2", None)
        assert r.state == new
    q.merge(old)
    assert q.get_meta("a") == "2" and q.state == new


# ------------------------------------------------------------------------------------ replicas & state


def test_replica_reads_like_the_owner() -> None:
    q = owned()
    q.offer("a", key=b"k", headers={"h": "1"})
    q.offer("b")
    q.set_meta("name", "orders")
    r = LatticeQueue.replica(q.state)
    assert not r.is_owner and q.is_owner
    assert (r.owner, r.name) == (OWNER.public_key, "events")
    assert r.range_entries(0, 1) == q.range_entries(0, 1)
    assert (r.start_offset, r.end_offset, r.size, r.is_empty) == (0, 2, 2, False)
    assert r.get_meta("name") == "orders"
    assert r.state == q.state


def test_replica_refuses_writes() -> None:
    q = filled(3)
    for r in (LatticeQueue.replica(q.state), LatticeQueue.empty_replica(OWNER.public_key, "events")):
        before = r.state
        with pytest.raises(NotOwnerError, match="not the owner"):
            r.offer("x")
        with pytest.raises(NotOwnerError, match="not the owner"):
            r.offer_many([Record(value=b"x")])
        with pytest.raises(NotOwnerError, match="not the owner"):
            r.truncate(1)
        with pytest.raises(NotOwnerError, match="not the owner"):
            r.set_meta("k", "v")
        assert issubclass(NotOwnerError, LatticedError)
        assert r.state == before
        assert r.end_offset == before.held_end


def test_a_queue_built_with_the_wrong_identity_is_a_replica() -> None:
    q = filled(1)
    r = LatticeQueue(q.state, OTHER)
    assert not r.is_owner
    with pytest.raises(NotOwnerError):
        r.offer("x")


def test_state_is_an_immutable_value() -> None:
    q = filled(2)
    snapshot = q.state
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.forked = True  # type: ignore[misc]
    q.offer("more")
    q.truncate(1)
    q.set_meta("k", "v")
    assert (snapshot.start, snapshot.held_end, snapshot.meta) == (0, 2, ())
    old = LatticeQueue.replica(snapshot)
    assert old.range(0, 10) == [b"v0", b"v1"]
    assert q.range(0, 10) == [b"v1", b"more"]


def test_merge_is_order_insensitive_and_idempotent() -> None:
    q = owned()
    states: list[QueueState] = []
    for i in range(4):
        q.offer(f"v{i}")
        if i == 2:
            q.truncate(1)
            q.set_meta("k", str(i))
        states.append(q.state)
    forward = LatticeQueue.empty_replica(OWNER.public_key, "events")
    backward = LatticeQueue.empty_replica(OWNER.public_key, "events")
    for state in states:
        forward.merge(state)
    for state in reversed(states):
        backward.merge(state)
    assert forward.state == backward.state == q.state
    forward.merge(forward.state)
    forward.merge(q.state)
    assert forward.state == q.state
    assert not forward.forked


@pytest.mark.parametrize("name", ["", "a/b", "x" * 256, "é" * 128, 5, None, b"bytes"])
def test_invalid_queue_names_are_rejected(name: object) -> None:
    with pytest.raises(MalformedError):
        LatticeQueue.create(OWNER, name)  # type: ignore[arg-type]
    with pytest.raises(MalformedError):
        LatticeQueue.empty_replica(OWNER.public_key, name)  # type: ignore[arg-type]


def test_valid_names_at_the_limits() -> None:
    for name in ("x", "x" * 255, "é" * 127, "orders.eu-west:1"):
        q = LatticeQueue.create(OWNER, name)
        assert q.name == name
        q.offer("v")
        assert replica_of(q).peek(0) == b"v"


def test_empty_replica_rejects_a_malformed_owner_key() -> None:
    for owner in (b"short", b"\x00" * 33, "00" * 32):
        with pytest.raises(MalformedError):
            LatticeQueue.empty_replica(owner, "events")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- fork/sync


def test_fork_is_independent_of_its_parent_until_sync() -> None:
    q = filled(2)
    child = q.fork()
    child.offer("child")
    child.set_meta("k", "child")
    assert q.end_offset == 2 and q.peek(2) is None and q.get_meta("k") is None
    q.offer("parent")
    assert child.peek(2) == b"child"
    assert q.peek(2) == b"parent"


def test_sync_with_an_unmoved_parent_adopts_the_fork_wholesale() -> None:
    q = filled(3)
    child = q.fork()
    offsets = [child.offer("c0", key=b"k"), child.offer("c1")]
    child.truncate(1)
    child.set_meta("owner", "team-a")
    child.sync()
    assert q.state == child.state
    # Offsets the fork handed out are final: nothing was re-offered.
    assert offsets == [3, 4]
    assert q.range(0, 10) == [b"v1", b"v2", b"c0", b"c1"]
    assert (q.start_offset, q.get_meta("owner")) == (1, "team-a")
    assert q.peek_entry(3) == child.peek_entry(3)


def test_sync_with_a_moved_parent_keeps_both_sides_records() -> None:
    q = owned()
    q.offer("base")
    watcher = replica_of(q)
    child = q.fork()
    child.offer("c0", key=b"ck", headers={"h": "1"})
    child.offer("c1")
    q.offer("p0")
    watcher.merge(q.state)
    child.sync()
    values = q.range(0, 10)
    assert values[:2] == [b"base", b"p0"]  # the parent's offsets are untouched
    assert sorted(values[2:]) == [b"c0", b"c1"]
    moved = q.peek_entry(values.index(b"c0"))
    assert moved is not None and moved.key == b"ck" and moved.headers == (("h", b"1"),)
    assert child.state == q.state
    # Re-offering (instead of signing a second history) keeps the queue honest for everyone who saw it.
    watcher.merge(q.state)
    assert not watcher.forked and watcher.state == q.state


def test_sync_applies_only_the_metadata_the_fork_changed() -> None:
    q = owned()
    q.set_meta("a", "1")
    q.set_meta("gone", "x")
    child = q.fork()
    child.set_meta("gone", None)
    child.set_meta("c", "child")
    q.set_meta("a", "2")  # the parent moved; the fork never touched "a"
    child.sync()
    assert q.get_meta("a") == "2"
    assert q.get_meta("gone") is None
    assert q.get_meta("c") == "child"


def test_sync_after_a_moved_parent_applies_the_forks_truncation_to_shared_records_only() -> None:
    q = filled(5)  # v0..v4 shared
    child = q.fork()
    for i in range(3):
        child.offer(f"c{i}")  # child offsets 5, 6, 7
    child.truncate(7)  # drops v0..v4 and c0, c1 in the child's view
    q.offer("p5")  # the parent moved: its offset 5 is p5
    child.sync()
    assert q.range(0, 20) == [b"p5", b"c2"]
    assert q.start_offset == 5


def test_sync_of_an_unchanged_fork_onto_a_moved_parent_signs_nothing() -> None:
    q = filled(2)
    child = q.fork()
    q.offer("p")
    version = q.state.version
    child.sync()
    assert q.state.version == version
    assert child.state == q.state


def test_sync_includes_pending_offers_on_both_sides() -> None:
    q = filled(1)
    child = q.fork()
    child.offer("child-pending")
    q.offer("parent-pending")
    child.sync()
    assert q.range(0, 5) == [b"v0", b"parent-pending", b"child-pending"]


def test_a_fork_can_keep_working_and_sync_again() -> None:
    q = filled(1)
    child = q.fork()
    child.offer("a")
    child.sync()
    child.offer("b")
    child.sync()
    q.offer("p")
    child.offer("c")
    child.sync()
    assert q.range(0, 10) == [b"v0", b"a", b"b", b"p", b"c"]
    assert child.state == q.state


def test_forks_of_forks_sync_back_up_the_chain() -> None:
    q = filled(1)
    child = q.fork()
    grandchild = child.fork()
    grandchild.offer("g")
    grandchild.sync()
    assert q.peek(1) is None
    child.sync()
    assert q.range(0, 5) == [b"v0", b"g"]


def test_replica_fork_sync_joins_when_the_parent_moved() -> None:
    q = owned()
    for batch in range(3):
        for i in range(4):
            q.offer(f"b{batch}-{i}")
        q.commit()
    r = LatticeQueue.empty_replica(OWNER.public_key, "events")
    r.merge(q.delta(r.summary(), max_records=4))
    assert r.end_offset == 4
    child = r.fork()
    r.merge(q.delta(r.summary(), max_records=4))  # the parent caught up further, same head version
    assert r.end_offset == 8
    child.sync()
    assert r.end_offset == 8  # the fork's older view did not roll the parent back
    child.merge(q.state)
    child.sync()
    assert r.state == q.state


def test_replica_fork_sync_adopts_when_the_parent_did_not_move() -> None:
    q = filled(3)
    r = LatticeQueue.empty_replica(OWNER.public_key, "events")
    child = r.fork()
    child.merge(q.state)
    child.sync()
    assert r.state == q.state
    with pytest.raises(NotOwnerError):
        child.offer("x")


def test_sync_without_fork_is_an_error() -> None:
    q = filled(1)
    with pytest.raises(LatticedError):
        q.sync()


# ---------------------------------------------------------------------------------------------- deltas


def test_delta_since_a_summary_carries_only_what_is_missing() -> None:
    q = filled(5)
    r = replica_of(q)
    for i in range(5, 8):
        q.offer(f"v{i}")
    d = q.delta(r.summary())
    assert d.from_offset == 5
    assert [rec.value for rec in d.records] == [b"v5", b"v6", b"v7"]
    assert d.meta is None
    r.merge(d)
    assert r.state == q.state
    nothing = q.delta(r.summary())
    assert nothing.records == () and nothing.tip is None


def test_delta_to_a_replica_behind_a_truncation_starts_at_the_new_start() -> None:
    q = filled(4)
    r = replica_of(q)
    for i in range(4, 10):
        q.offer(f"v{i}")
    q.truncate(7)
    d = q.delta(r.summary())
    assert d.from_offset == 7 and len(d.records) == 3
    r.merge(d)
    assert r.state == q.state
    assert r.range(0, 20) == [b"v7", b"v8", b"v9"]


def committed_in_batches(batches: int, size: int) -> LatticeQueue:
    """Commit after each batch: every commit leaves a signed checkpoint a chunk can end at."""
    q = owned()
    q.set_meta("name", "big")
    for b in range(batches):
        for i in range(size):
            q.offer(f"{b}:{i}", key=str(i))
        q.commit()
    return q


def test_chunked_deltas_each_verify_on_their_own() -> None:
    q = committed_in_batches(8, 5)
    r = LatticeQueue.empty_replica(OWNER.public_key, "events")
    chunks = []
    while r.end_offset < q.end_offset:
        d = q.delta(r.summary(), max_records=12)
        assert 0 < len(d.records) <= 12
        assert d.from_offset == r.end_offset
        # Each chunk carries its own signed voucher: it verifies against a replica that holds nothing.
        core.verify_delta(core.empty_state(OWNER.public_key, "events"), d)
        r.merge(d)
        chunks.append(d)
    assert len(chunks) == 4
    assert r.state == q.state
    assert r.get_meta("name") == "big"


def test_interrupted_chunked_transfer_resumes_from_the_replica_summary() -> None:
    q = committed_in_batches(6, 5)
    # The sender prepares the whole stream as if every chunk would arrive.
    sim = LatticeQueue.empty_replica(OWNER.public_key, "events")
    chunks = []
    while sim.end_offset < q.end_offset:
        chunks.append(q.delta(sim.summary(), max_records=10))
        sim.merge(chunks[-1])
    assert len(chunks) == 3
    r = LatticeQueue.empty_replica(OWNER.public_key, "events")
    r.merge(chunks[0])  # ... and the connection drops after the first chunk
    assert r.end_offset == 10
    assert r.range(0, 100) == q.range(0, 9)
    assert r.state.known_end == 30  # the newest head is already known and verified
    q.offer("written meanwhile")
    resume = q.delta(r.summary())
    assert resume.from_offset == 10 and len(resume.records) == 21
    r.merge(resume)
    assert r.state == q.state
    # Late chunks of the old stream are harmless replays.
    r.merge(chunks[1])
    r.merge(chunks[2])
    assert r.state == q.state


def test_a_chunk_that_does_not_connect_is_ignored_until_the_gap_is_filled() -> None:
    q = committed_in_batches(3, 5)
    sim = LatticeQueue.empty_replica(OWNER.public_key, "events")
    chunks = []
    while sim.end_offset < q.end_offset:
        chunks.append(q.delta(sim.summary(), max_records=5))
        sim.merge(chunks[-1])
    r = LatticeQueue.empty_replica(OWNER.public_key, "events")
    r.merge(chunks[0])
    r.merge(chunks[2])  # skips [5, 10): verified, but nothing after the gap is held
    assert r.end_offset == 5
    r.merge(chunks[1])
    assert r.end_offset == 10
    r.merge(q.delta(r.summary()))
    assert r.state == q.state
