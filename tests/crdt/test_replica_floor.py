"""A replica that keeps less than the owner (``drop_local``): the suffix it keeps verifies on its own, later
deltas still merge and converge on the owner's records from its floor on, no join brings the dropped
records back, it never serves its suffix as if it were the whole queue, and forks are still caught."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueState, Summary
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import summary_from_wire, summary_to_wire
from latticed.protocol.replication import is_ahead

OWNER = Identity.from_seed(bytes(range(32)))
SETTINGS = settings(max_examples=80, deadline=None)

step = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 6)),
    st.tuples(st.just("truncate"), st.integers(0, 4)),
    st.tuples(st.just("meta"), st.integers(0, 2)),
    st.tuples(st.just("sync"), st.sampled_from([None, 1, 3])),  # the replica catches up (chunk size)
    st.tuples(st.just("drop"), st.integers(0, 12)),  # the replica drops its oldest records
    st.tuples(st.just("full"), st.just(0)),  # a whole-queue delta, as to a stranger (since=None)
)


def offer(state: QueueState, tag: int, count: int) -> QueueState:
    records = [Record(value=b"v%d.%d" % (tag, i), timestamp=tag) for i in range(count)]
    return core.commit(state, OWNER, now_ms=tag, records=records)


def catch_up(replica: QueueState, owner: QueueState, chunk: int | None) -> QueueState:
    for _ in range(1000):
        after = core.merge(replica, core.delta(owner, replica.summary(), max_records=chunk))
        if after.summary() == replica.summary():
            return after
        replica = after
    raise AssertionError("no convergence")


def held(state: QueueState) -> list[Record]:
    return list(state.entries.records())


def records_from(owner: QueueState, start: int) -> list[Record]:
    return held(owner)[start - owner.start :]


def assert_suffix_of_owner(replica: QueueState, owner: QueueState) -> None:
    """The replica holds exactly the owner's records from its own start on, and they verify."""
    assert replica.head == owner.head and replica.meta == owner.meta
    assert replica.held_end == owner.held_end
    assert replica.start >= owner.start
    assert held(replica) == records_from(owner, replica.start)
    # The kept suffix verifies on its own: from the chain value at its start to the signed tip.
    stranger = core.empty_state(OWNER.public_key, "q")
    if len(replica.entries):
        assert replica.tip is not None
        chunk = dataclasses.replace(
            core.delta(owner, None),
            tip=replica.tip,
            from_offset=replica.start,
            from_hash=replica.base_hash,
            records=tuple(held(replica)),
            checkpoints=(),
        )
        core.verify_delta(stranger, chunk)  # raises if it does not


@SETTINGS
@given(st.lists(step, min_size=1, max_size=25))
def test_a_dropped_replica_merges_later_deltas_and_converges_on_the_suffix(
    steps: list[tuple[str, int | None]],
) -> None:
    owner = core.empty_state(OWNER.public_key, "q")
    replica = core.empty_state(OWNER.public_key, "q")
    floor = 0  # the highest floor the replica chose, while the owner's start stayed below it
    for tag, (kind, arg) in enumerate(steps):
        if kind == "offer":
            owner = offer(owner, tag, int(arg or 1))
        elif kind == "truncate":
            owner = core.commit(owner, OWNER, now_ms=tag, new_start=owner.start + int(arg or 0))
        elif kind == "meta":
            owner = core.commit(owner, OWNER, now_ms=tag, meta_updates={"k": str(arg)})
        elif kind == "sync":
            replica = catch_up(replica, owner, arg)
        elif kind == "drop":
            before = replica
            replica = core.drop_local(replica, replica.start + int(arg or 0))
            if replica is not before:
                assert replica.floor > before.start and len(replica.entries) >= 1  # the newest stays
                floor = replica.floor
        else:
            replica = core.merge(replica, core.delta(owner))
        # A drop is never undone: no join takes the replica below its own floor.
        if replica.floor:
            assert replica.start == replica.floor == floor
        assert replica.start >= floor
    replica = catch_up(replica, owner, 2)
    assert_suffix_of_owner(replica, owner)
    if floor > owner.start and floor < owner.held_end:
        assert replica.start == floor  # still dropped, though the owner holds those records
    # Joining again changes nothing, whatever the delta.
    assert core.merge(replica, core.delta(owner)) == replica
    assert core.merge(replica, core.delta(owner, replica.summary())) == replica


@SETTINGS
@given(st.integers(1, 40), st.integers(1, 39), st.sampled_from([None, 1, 4]))
def test_two_replicas_with_the_same_floor_converge(total: int, cut: int, chunk: int | None) -> None:
    owner = offer(core.empty_state(OWNER.public_key, "q"), 1, total)
    a = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, chunk), cut)
    b = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, None), cut)
    owner = offer(owner, 2, 5)
    a, b = catch_up(a, owner, chunk), catch_up(b, owner, 3)
    assert a == b and a.start == min(cut, total - 1)


def test_the_summary_says_where_the_records_start_and_travels() -> None:
    owner = offer(core.empty_state(OWNER.public_key, "q"), 1, 20)
    replica = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, None), 15)
    summary = replica.summary()
    assert (summary.start, summary.floor, summary.held_start, summary.held_end) == (0, 15, 15, 20)
    assert summary_from_wire(summary_to_wire(summary)) == summary
    assert len(summary_to_wire(owner.summary())) == 6  # a peer of an earlier version reads it as before


def test_a_dropped_replica_never_passes_its_suffix_off_as_the_queue() -> None:
    early = offer(core.empty_state(OWNER.public_key, "q"), 1, 10)
    owner = offer(early, 2, 10)
    replica = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, None), 15)
    stranger = core.empty_state(OWNER.public_key, "q")
    lagging = catch_up(stranger, early, None)  # holds 0..9, below the floor
    # A peer that holds nothing, or less than the floor, gets the head and no records...
    for since in (None, stranger.summary(), lagging.summary()):
        d = core.delta(replica, since)
        assert d.head == owner.head and d.records == () and d.tip is None
    lagging = core.merge(lagging, core.delta(replica, lagging.summary()))
    assert (lagging.held_end, lagging.known_end) == (10, 20)  # the newer head, none of the records
    assert not is_ahead(replica.summary(), lagging.summary())
    joined = core.merge(stranger, core.delta(replica, stranger.summary()))
    assert joined.held_end == 0 and joined.known_end == 20  # it knows it lacks them: lag, not a gap
    # ...and the protocol does not ask for them again and again.
    assert not is_ahead(replica.summary(), joined.summary())
    assert is_ahead(owner.summary(), joined.summary())
    # A peer the replica can extend gets what it lacks.
    behind = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, None), 17)
    owner = offer(owner, 2, 3)
    replica = catch_up(replica, owner, None)
    assert is_ahead(replica.summary(), behind.summary())
    extended = core.merge(behind, core.delta(replica, behind.summary()))
    assert extended.held_end == 23 and extended.start == 17
    # A whole replica is not "behind" a dropped one that holds the same end.
    whole = catch_up(core.empty_state(OWNER.public_key, "q"), owner, None)
    assert not is_ahead(replica.summary(), whole.summary())
    assert not is_ahead(whole.summary(), replica.summary())


def test_an_owner_truncation_past_the_floor_takes_over() -> None:
    owner = offer(core.empty_state(OWNER.public_key, "q"), 1, 20)
    replica = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, None), 10)
    owner = core.commit(owner, OWNER, now_ms=2, new_start=14)
    replica = catch_up(replica, owner, None)
    assert replica.floor == 0 and replica.start == 14 and replica == owner


def test_a_floor_below_what_is_held_changes_nothing() -> None:
    owner = core.commit(offer(core.empty_state(OWNER.public_key, "q"), 1, 20), OWNER, now_ms=2, new_start=8)
    replica = catch_up(core.empty_state(OWNER.public_key, "q"), owner, None)
    assert core.drop_local(replica, 5) is replica
    assert core.drop_local(replica, 8) is replica
    assert core.drop_local(replica, 100).start == 19  # the newest record is always kept
    assert core.drop_local(core.empty_state(OWNER.public_key, "q"), 3).start == 0


def test_a_fork_past_the_floor_is_still_caught() -> None:
    base = offer(core.empty_state(OWNER.public_key, "q"), 1, 10)
    honest = offer(base, 2, 5)
    other = offer(base, 3, 5)  # the owner signs a second history from offset 10
    replica = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), honest, None), 12)
    joined = core.merge(replica, core.delta(other))  # from below the floor, through it
    assert joined.forked and joined.fork is not None
    joined.fork.verify()
    assert joined.start == 12 and held(joined) == held(replica)  # the other history is not adopted
    again = core.merge(replica, core.delta(other, Summary(version=1, held_end=10, held_hash=b"")))
    assert again.forked


def test_records_from_below_the_floor_that_agree_only_extend() -> None:
    owner = offer(core.empty_state(OWNER.public_key, "q"), 1, 10)
    replica = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, None), 6)
    owner = offer(owner, 2, 4)
    joined = core.merge(replica, core.delta(owner))  # records 0..13 from a whole peer
    assert joined.start == 6 and joined.held_end == 14 and not joined.forked
    assert held(joined) == records_from(owner, 6)


@pytest.mark.parametrize("chunk", [None, 2])
def test_a_local_drop_keeps_checkpoints_only_above_the_floor(chunk: int | None) -> None:
    owner = core.empty_state(OWNER.public_key, "q")
    for i in range(6):
        owner = offer(owner, i, 3)
    replica = catch_up(core.empty_state(OWNER.public_key, "q"), owner, chunk)
    dropped = core.drop_local(replica, 10)
    assert all(c.end > 10 for c in dropped.checkpoints)
    # Chunked deltas from the dropped replica to a peer it can extend still verify.
    peer = core.drop_local(catch_up(core.empty_state(OWNER.public_key, "q"), owner, None), 16)
    owner = offer(owner, 9, 7)
    dropped = catch_up(dropped, owner, 2)
    assert catch_up(peer, dropped, 2).held_end == owner.held_end
