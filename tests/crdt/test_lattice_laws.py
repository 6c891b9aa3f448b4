"""Lattice laws of the signed queue and KV lattices, with real signatures in the loop.

States come from an owner's real history (offers, truncations, metadata changes), snapshotted at random
points and relayed through chunked deltas, so the laws are checked on every shape a replica can hold.
A forked owner's queue is a lattice on fork core 2 (the laws with two and three histories run there;
``LATTICE_LAW_EXAMPLES`` sets their number of examples, 300 by default). On core 1 a fork stops the
queue where each replica stands, checked by ordinary properties at the end.
"""

from __future__ import annotations

import itertools
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from support.queue2_histories import empty, extend, snapshot
from support.queue2_histories import step as step2

from latticed.crdt import kv as kvcore
from latticed.crdt import queue as core
from latticed.crdt import queue2
from latticed.crdt.forks import better_proof, fork_point
from latticed.crdt.queue import QueueState
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(bytes(range(32)))
SETTINGS = settings(max_examples=60, deadline=None)
FORKED = settings(max_examples=int(os.environ.get("LATTICE_LAW_EXAMPLES", "300")), deadline=None)

step = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 6)),
    st.tuples(st.just("truncate"), st.integers(0, 4)),
    st.tuples(st.just("meta"), st.sampled_from(["a", "b"])),
)


def history(steps: list[tuple[str, int | str]]) -> list[QueueState]:
    """The owner's states after each step (the first is the empty queue)."""
    state = core.empty_state(OWNER.public_key, "q")
    states = [state]
    for index, (kind, arg) in enumerate(steps):
        if kind == "offer":
            assert isinstance(arg, int)
            records = [Record(value=b"v%d.%d" % (index, i), timestamp=index) for i in range(arg)]
            state = core.commit(state, OWNER, now_ms=index, records=records)
        elif kind == "truncate":
            assert isinstance(arg, int)
            state = core.commit(state, OWNER, now_ms=index, new_start=state.start + arg)
        else:
            state = core.commit(state, OWNER, now_ms=index, meta_updates={str(arg): str(index)})
        states.append(state)
    return states


def replica_of(state: QueueState, chunk: int | None) -> QueueState:
    """A replica that received ``state`` through (possibly chunked) deltas, possibly only partly."""
    replica = core.empty_state(state.owner, state.name)
    for _ in range(1000):
        d = core.delta(state, replica.summary(), max_records=chunk)
        after = core.merge(replica, d)
        if after.summary() == replica.summary():
            break
        replica = after
    return replica


def merged(a: QueueState, b: QueueState) -> QueueState:
    return core.merge(a, b)


@st.composite
def three_states(draw: st.DrawFn) -> tuple[QueueState, QueueState, QueueState]:
    states = history(draw(st.lists(step, min_size=1, max_size=12)))
    picks = []
    for _ in range(3):
        state = draw(st.sampled_from(states))
        chunk = draw(st.sampled_from([None, 1, 3]))
        picks.append(replica_of(state, chunk) if draw(st.booleans()) else state)
    return picks[0], picks[1], picks[2]


@SETTINGS
@given(three_states())
def test_merge_is_commutative(states: tuple[QueueState, QueueState, QueueState]) -> None:
    a, b, _ = states
    assert merged(a, b) == merged(b, a)


@SETTINGS
@given(three_states())
def test_merge_is_associative(states: tuple[QueueState, QueueState, QueueState]) -> None:
    a, b, c = states
    assert merged(merged(a, b), c) == merged(a, merged(b, c))


@SETTINGS
@given(three_states())
def test_merge_is_idempotent(states: tuple[QueueState, QueueState, QueueState]) -> None:
    a, _, _ = states
    assert merged(a, a) == a


@SETTINGS
@given(three_states())
def test_merge_is_monotone_upper_bound(states: tuple[QueueState, QueueState, QueueState]) -> None:
    a, b, _ = states
    joined = merged(a, b)
    assert merged(joined, a) == joined
    assert merged(joined, b) == joined
    assert joined.version >= max(a.version, b.version)
    assert joined.held_end >= min(a.held_end, b.held_end)


@SETTINGS
@given(three_states())
def test_delta_join_equals_full_join(states: tuple[QueueState, QueueState, QueueState]) -> None:
    a, b, _ = states
    assert core.merge(a, core.delta(b, a.summary())) == merged(a, b)


@SETTINGS
@given(st.lists(step, min_size=1, max_size=12), st.sampled_from([1, 2, 5]))
def test_chunked_catch_up_converges_to_the_owner(steps: list[tuple[str, int | str]], chunk: int) -> None:
    owner_state = history(steps)[-1]
    assert replica_of(owner_state, chunk) == owner_state


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.binary(max_size=3), min_size=1, max_size=4),
    st.lists(st.binary(max_size=3), min_size=1, max_size=4),
    st.integers(0, 3),
)
def test_equivocation_is_detected_symmetrically(left: list[bytes], right: list[bytes], common: int) -> None:
    """Two histories signed by one key: every join order flags the fork with a proof that verifies, and
    each side stops where it stands (its own head and records), showing nothing past the fork point."""
    shared = [Record(value=b"c%d" % i) for i in range(common)]
    base = core.commit(core.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, records=shared)
    a = core.commit(base, OWNER, now_ms=2, records=[Record(value=b"a" + v) for v in left])
    b = core.commit(base, OWNER, now_ms=2, records=[Record(value=b"b" + v) for v in right])
    ab, ba = merged(a, b), merged(b, a)
    assert ab.forked and ba.forked
    for joined, own in ((ab, a), (ba, b)):
        assert joined.fork is not None
        joined.fork.verify()
        assert (joined.head, joined.entries) == (own.head, own.entries)
        assert joined.visible_end <= common
        assert not core.delta(joined).records


# -------------------------------------------------------------------------------------------- KV lattice

kv_op = st.builds(
    lambda op, hlc, key, member, value: kvcore.Op(
        op,
        hlc,
        key,
        value if op in ("put", "hset") else (len(value) if op == "incr" else None),
        member if op in ("hset", "hdel", "sadd", "srem") else None,
        None,
        op in ("hset", "sadd") and hlc % 2 == 0,
    ),
    st.sampled_from(kvcore.OPS),
    st.integers(0, 6),  # small range: HLC ties are common, and must not break commutativity
    st.sampled_from(["k1", "k2"]),
    st.sampled_from([b"f1", b"f2"]),
    st.binary(max_size=2),
)


def fold(ops: list[kvcore.Op]) -> kvcore.View:
    return kvcore.apply_ops({}, ops)


@settings(max_examples=150, deadline=None)
@given(st.lists(kv_op, max_size=8), st.randoms(use_true_random=False))
def test_kv_fold_is_order_independent(ops: list[kvcore.Op], rnd: object) -> None:
    shuffled = list(ops)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert fold(ops) == fold(shuffled)


@settings(max_examples=150, deadline=None)
@given(st.lists(kv_op, max_size=5), st.lists(kv_op, max_size=5), st.lists(kv_op, max_size=5))
def test_kv_view_join_laws(a_ops: list[kvcore.Op], b_ops: list[kvcore.Op], c_ops: list[kvcore.Op]) -> None:
    a, b, c = fold(a_ops), fold(b_ops), fold(c_ops)
    assert kvcore.join_views(a, b) == kvcore.join_views(b, a)
    assert kvcore.join_views(kvcore.join_views(a, b), c) == kvcore.join_views(a, kvcore.join_views(b, c))
    assert kvcore.join_views(a, a) == a
    assert kvcore.join_views(a, b) == fold(a_ops + b_ops)


def test_kv_hlc_never_goes_back() -> None:
    values = list(itertools.accumulate([5, 3, 3, 9], kvcore.hlc_next, initial=0))
    assert values == sorted(values) and len(set(values)) == len(values)


def test_big_batches_get_intermediate_heads_and_byte_bounded_chunks() -> None:
    big = [Record(value=bytes(1000)) for _ in range(50)]
    state = core.commit(
        core.empty_state(OWNER.public_key, "big"), OWNER, now_ms=1, records=big, checkpoint_bytes=10_000
    )
    assert len(state.checkpoints) == 5
    replica = core.empty_state(OWNER.public_key, "big")
    chunks = 0
    while replica.held_end < state.held_end:
        d = core.delta(state, replica.summary(), max_bytes=25_000)
        assert sum(len(r.value) for r in d.records) <= 25_000
        replica = core.merge(replica, d)
        chunks += 1
    assert replica == state and chunks == 3


# ------------------------------------------------------------------------- forked owner, fork core 2


@st.composite
def forked_states(draw: st.DrawFn, histories: int) -> list[QueueState2]:
    """Three replicas of an owner whose store was copied ``histories - 1`` times past a shared prefix,
    each copy writing on (records named apart, truncations, metadata and timestamp-only heads); a
    replica holds any copy at any version, in part or whole, or a join of such."""
    shared = extend(empty(), draw(st.lists(step2, min_size=1, max_size=4)), b"s")
    lines = [
        extend(shared[-1], draw(st.lists(step2, min_size=1, max_size=4)), b"%d" % n) for n in range(histories)
    ]
    lines.append(shared)
    picked = []
    for _ in range(3):
        value = snapshot(draw, lines)
        for _ in range(draw(st.integers(0, 2))):
            value = queue2.join(value, snapshot(draw, lines))
        picked.append(value)
    return picked


def _forked_laws(a: QueueState2, b: QueueState2, c: QueueState2) -> None:
    ab = queue2.join(a, b)
    assert ab == queue2.join(b, a)
    assert queue2.join(ab, c) == queue2.join(a, queue2.join(b, c)) == queue2.join(queue2.join(a, c), b)
    assert queue2.join(a, a) == a
    assert queue2.join(ab, a) == ab == queue2.join(b, ab)
    assert ab.forked >= a.forked
    lo, hi = ab.held
    for offset in range(max(lo, a.held[0]), min(hi, a.held[1])):
        assert ab.record_at(offset) == a.record_at(offset)  # a join never changes a record held


@FORKED
@given(forked_states(2))
def test_two_histories_of_a_forked_owner_join_as_a_lattice(values: list[QueueState2]) -> None:
    _forked_laws(*values)


@FORKED
@given(forked_states(3))
def test_three_histories_of_a_forked_owner_join_as_a_lattice(values: list[QueueState2]) -> None:
    _forked_laws(*values)


# ------------------------------------------------------------------- forked owner, fork core 1: stopped


def shared_records(count: int) -> list[Record]:
    return [Record(b"s%d" % i) for i in range(count)]


def _continue(state: QueueState, steps: list[tuple[str, int | str]], tag: bytes) -> QueueState:
    """The owner's old copy at ``state`` signs ``steps`` again, with other records: another history."""
    for index, (kind, arg) in enumerate(steps):
        now = 1000 + index
        if kind == "offer":
            assert isinstance(arg, int)
            records = [Record(value=tag + b"%d.%d" % (index, i), timestamp=now) for i in range(arg)]
            state = core.commit(state, OWNER, now_ms=now, records=records)
        elif kind == "truncate":
            assert isinstance(arg, int)
            state = core.commit(state, OWNER, now_ms=now, new_start=state.start + arg)
        else:
            state = core.commit(state, OWNER, now_ms=now, meta_updates={str(arg): tag.decode()})
    return state


def _records(state: QueueState) -> dict[int, Record]:
    return {o: r for o in range(state.start, state.held_end) if (r := state.record_at(o)) is not None}


def _shown(state: QueueState) -> dict[int, Record]:
    """What a replica reads and serves: its records up to its visible end."""
    return {o: r for o, r in _records(state).items() if o < state.visible_end}


def gossip(replicas: list[QueueState], chunk: int, lines: list[dict[int, Record]]) -> list[QueueState]:
    """Every replica takes deltas cut from its summary by every other, ``chunk`` records at most, until
    a whole round changes nothing; after every join, a forked replica shows only records that every
    history in ``lines`` holds at that offset, and what it held it still holds."""
    replicas = list(replicas)
    for _ in range(200):
        moved = False
        for i, j in itertools.permutations(range(len(replicas)), 2):
            before = replicas[j]
            after = core.merge(before, core.delta(replicas[i], before.summary(), max_records=chunk))
            if after.forked:
                assert after.fork is not None
                after.fork.verify()
                assert not core.delta(after).records  # only the proof is served
                for offset, record in _shown(after).items():
                    assert all(line.get(offset) == record for line in lines)
                if before.forked:  # stopped: nothing merged, nothing dropped
                    assert (after.head, after.entries) == (before.head, before.entries)
            if after != before or after.summary() != before.summary() or after.fork != before.fork:
                replicas[j], moved = after, True
        if not moved:
            return replicas
    raise AssertionError("no fixpoint")


def check_stopped(replicas: list[QueueState]) -> None:
    """Once its replicas met, a core-1 fork is flagged by every one of them (or by none, when no head or
    record they hold contradicts another and they all hold one value), every one keeps the same proof
    (the one with the lowest fork point), and two replicas show the same record at every offset both
    show."""
    if not any(r.forked for r in replicas):
        assert all(r == replicas[0] for r in replicas)
        return
    assert all(r.forked for r in replicas)
    assert len({r.fork for r in replicas}) == 1
    shown = [_shown(r) for r in replicas]
    for x, y in itertools.combinations(shown, 2):
        assert all(x[o] == y[o] for o in x.keys() & y.keys())


@settings(max_examples=int(os.environ.get("LATTICE_LAW_EXAMPLES", "300")) // 3, deadline=None)
@given(
    st.lists(step, min_size=1, max_size=6),
    st.lists(st.lists(step, min_size=1, max_size=4), min_size=1, max_size=2),
    st.integers(0, 6),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 8), st.sampled_from([None, 1, 3])), min_size=2, max_size=4
    ),
    st.sampled_from([1, 2, 5]),
)
def test_a_core1_fork_flags_everywhere_and_stops_where_each_replica_stands(
    first: list[tuple[str, int | str]],
    copies: list[list[tuple[str, int | str]]],
    fork_at: int,
    picks: list[tuple[int, int, int | None]],
    chunk: int,
) -> None:
    """An owner's store copied once or twice at one version, each copy signing on (two or three
    histories); replicas of any (owner states, followers caught up in chunks) meet through chunked
    deltas."""
    states = history(first)
    base = states[fork_at % (len(states) - 1)]
    lines = [states]
    for n, steps in enumerate(copies):
        lines.append([base, *(_continue(base, steps[:k], b"c%d" % n) for k in range(1, len(steps) + 1))])
    replicas = [line[-1] for line in lines]
    for which, upto, part in picks:
        line = lines[which % len(lines)]
        state = line[upto % len(line)]
        replicas.append(state if part is None else replica_of(state, part))
    check_stopped(gossip(replicas, chunk, [_records(line[-1]) | _records(base) for line in lines]))


def test_a_join_of_forked_states_is_the_better_proof_and_each_sides_own_run() -> None:
    """Two forked replicas holding different runs: each keeps its own, both keep the same proof (the
    union of what they hold, as a lattice: the one with the lowest fork point), in either order."""
    base = core.commit(core.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, records=shared_records(4))
    a = _continue(base, [("offer", 3)], b"a")
    b = _continue(base, [("offer", 2), ("truncate", 2)], b"b")
    c = _continue(base, [("meta", "x")], b"c")
    fa, fb = merged(a, b), merged(b, c)
    assert fa.forked and fb.forked and fa.fork != fb.fork
    for x, y in ((fa, fb), (fb, fa)):
        joined = merged(x, y)
        assert joined.forked and (joined.head, joined.entries) == (x.head, x.entries)
        assert joined.fork == better_proof(fa.fork, fb.fork)
        assert merged(joined, y) == joined  # idempotent on what it took
    assert merged(fa, fb).fork == merged(fb, fa).fork


def test_a_copied_store_stops_everywhere_with_the_same_records_shown() -> None:
    """The common case: a data directory copied after 10 records, both copies write (5 and 3), and a
    relay that followed the first meets the copy in 2-record chunks: every replica flags the fork, holds
    what it held, and none shows a record past what the proof shows both histories share."""
    base = core.commit(core.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, records=shared_records(10))
    owner = _continue(base, [("offer", 5)], b"owner")
    copy = _continue(base, [("offer", 3)], b"copy")
    relay = replica_of(owner, 2)
    replicas = gossip([owner, relay, copy], 2, [_records(owner), _records(copy)])
    check_stopped(replicas)
    assert [r.held_end for r in replicas] == [15, 15, 13]
    proof = replicas[0].fork
    assert proof is not None
    point = fork_point(proof)
    assert point <= 10
    assert all(r.visible_end == point for r in replicas)
    for r in replicas:
        assert core.delta(r, core.empty_state(r.owner, r.name).summary()).records == ()


def test_a_third_history_below_the_proofs_shared_point_is_not_shown() -> None:
    """A replica whose records leave the two histories a proof shows below the point both share shows
    none of them: its chain value there is not the shared one."""
    first = core.commit(core.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, records=[Record(b"s0")])
    base = core.commit(first, OWNER, now_ms=2, records=[Record(b"s1")])
    shared = core.commit(base, OWNER, now_ms=3, new_start=2)  # both copies below start from offset 2
    a = _continue(shared, [("offer", 3)], b"a")
    b = _continue(shared, [("offer", 2)], b"b")
    third = _continue(first, [("offer", 4)], b"t")  # left the others at offset 1
    frozen = merged(a, b)
    assert frozen.fork is not None and fork_point(frozen.fork) == 2
    assert frozen.visible_end == 2
    stopped = core.merge(third, core.delta(frozen))
    assert stopped.forked and stopped.visible_end == third.start and _shown(stopped) == {}


def test_a_chunk_for_a_replica_of_another_history_reaches_where_its_records_end() -> None:
    """A case hypothesis found: a replica holds 2 records of one history under the other history's newer
    head (version 3, 3 records, no head of either contradicting the other). A chunk of 1 record from the
    start agrees with it and ends before the histories part, for ever; the chunk cut for its summary
    reaches its end, where the join finds the fork."""
    first = core.commit(core.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, records=shared_records(1))
    ours = core.commit(first, OWNER, now_ms=2, records=[Record(b"ours")])
    theirs = _continue(first, [("offer", 1), ("offer", 1)], b"theirs")
    behind = merged(ours, core.delta(theirs, None, max_records=1))  # the first chunk of a catch-up
    assert not behind.forked and behind.head == theirs.head and behind.held_end == 2
    chunk = core.delta(theirs, behind.summary(), max_records=1)
    assert chunk.from_offset == 1 and chunk.end_offset == 2
    assert merged(behind, chunk).forked
