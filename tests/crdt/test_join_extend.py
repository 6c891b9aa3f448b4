"""The join's shortcut for a delta that only extends what a replica holds gives, field by field, the
state the general join gives: on states and deltas cut from an owner's real history (offers, truncations,
metadata), chunked, relayed, with a local floor, and from a second history the owner signed (a fork)."""

from __future__ import annotations

from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueState
from latticed.crdt.queue.lattice_join import _extended, _join_general
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import LatticedError

OWNER = Identity.from_seed(bytes(range(32)))

step = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 5)),
    st.tuples(st.just("offer"), st.just(1)),
    st.tuples(st.just("truncate"), st.integers(0, 3)),
    st.tuples(st.just("meta"), st.sampled_from(["a", "b"])),
)


def history(state: QueueState, steps: list[tuple[str, Any]], tag: bytes, t0: int) -> list[QueueState]:
    states = [state]
    for index, (kind, arg) in enumerate(steps):
        now = t0 + index
        if kind == "offer":
            records = [Record(value=tag + b"%d.%d" % (index, i), timestamp=now) for i in range(arg)]
            state = core.commit(state, OWNER, now_ms=now, records=records)
        elif kind == "truncate":
            state = core.commit(state, OWNER, now_ms=now, new_start=state.start + arg)
        else:
            state = core.commit(state, OWNER, now_ms=now, meta_updates={arg: tag.decode() + str(index)})
        states.append(state)
    return states


def replica_of(state: QueueState, chunk: int | None, limit: int) -> QueueState:
    replica = core.empty_state(state.owner, state.name)
    for _ in range(limit):
        after = core.merge(replica, core.delta(state, replica.summary(), max_records=chunk))
        if after.summary() == replica.summary():
            break
        replica = after
    return replica


def fields(state: QueueState) -> tuple[object, ...]:
    entries = state.entries
    return (
        state.owner,
        state.name,
        state.kind,
        state.head,
        state.tip,
        entries.records(),
        [entries.chain(i) for i in range(len(entries))],
        state.meta,
        state.checkpoints,
        state.forked,
        state.fork,
        state.floor,
        state.floor_hash,
    )


@st.composite
def state_and_source(draw: st.DrawFn) -> tuple[QueueState, QueueState]:
    owned = history(
        core.empty_state(OWNER.public_key, "q"), draw(st.lists(step, min_size=2, max_size=10)), b"v", 0
    )
    at = draw(st.integers(0, len(owned) - 1))
    ours = owned[at]
    if draw(st.booleans()):  # the owner's next states: mostly offers that extend ours
        return ours, owned[min(at + draw(st.integers(1, 2)), len(owned) - 1)]
    if draw(st.booleans()):
        ours = replica_of(ours, draw(st.sampled_from([None, 1, 2])), draw(st.integers(1, 6)))
    if draw(st.booleans()) and ours.held_end - ours.start > 1:
        ours = core.drop_local(ours, ours.start + draw(st.integers(1, ours.held_end - ours.start - 1)))
    later = [s for s in owned if s.version >= ours.version] or owned
    source = draw(st.sampled_from(later))
    if draw(st.integers(0, 4)) == 0:  # a second history from an older copy of the owner's state
        fork_from = draw(st.sampled_from(owned))
        source = history(fork_from, draw(st.lists(step, min_size=1, max_size=4)), b"w", 1000)[-1]
    return ours, source


def check_same(state: QueueState, d: core.QueueDelta) -> bool:
    """Whether the shortcut was taken; asserts it agrees with the general join either way."""
    try:
        verified = core.verify_delta(state, d)
    except LatticedError:
        return False
    try:
        general: object = fields(_join_general(state, verified))
    except LatticedError as error:
        general = type(error)
    shortcut = _extended(state, verified)
    if shortcut is not None:
        assert fields(shortcut) == general
    try:
        joined: object = fields(core.join_verified(state, verified))
    except LatticedError as error:
        joined = type(error)
    assert joined == general
    return shortcut is not None


@settings(max_examples=1500, deadline=None)
@given(state_and_source(), st.sampled_from([None, 1, 2, 3]), st.sampled_from([True, True, True, False]))
def test_extend_shortcut_equals_general_join(
    pair: tuple[QueueState, QueueState], chunk: int | None, from_summary: bool
) -> None:
    ours, source = pair
    since = ours.summary() if from_summary else None
    event("shortcut" if check_same(ours, core.delta(source, since, max_records=chunk)) else "general join")


def test_live_pushes_take_the_shortcut() -> None:
    """A replica following single offers: every push extends it, and each join takes the shortcut."""
    owner = core.empty_state(OWNER.public_key, "q")
    replica = core.empty_state(OWNER.public_key, "q")
    taken = 0
    for i in range(6):
        owner = core.commit(owner, OWNER, now_ms=i, records=[Record(value=b"%d" % i, timestamp=i)])
        d = core.delta(owner, replica.summary())
        taken += check_same(replica, d)
        replica = core.join_verified(replica, core.verify_delta(replica, d))
        assert replica == owner
    assert taken == 5  # all but the first, which finds nothing held to extend
