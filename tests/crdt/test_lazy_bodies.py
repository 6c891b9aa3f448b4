"""A catch-up's bodies kept as the compiled decode's compact run (:mod:`latticed.crdt.lazy_bodies`) read
as the bodies the full decode builds, by every reader: the run's items (fields, leaf, identity on a
second read), verification, the join, the next chunk's steps, a served delta, the fork-point cut, the
store's rows of steps and their rebuild."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.single_offers import chunk, single_offers

from latticed.crdt import leaf_codec, leaf_compiled, queue2, steps_memo
from latticed.crdt.head2 import HeadV2, next_log
from latticed.crdt.lazy_bodies import LazyDecoded, Runs, StepRun, appended, extends
from latticed.crdt.queue2 import replica_deltas
from latticed.crdt.queue2.chain_state import bodies_between, keep_bodies
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.protocol import core2_steps
from latticed.storage import core2_bodies

OWNER = Identity.from_seed(b"l" * 32)


def catch_up(owner: queue2.QueueState2, size: int) -> tuple[queue2.QueueState2, list[queue2.Delta]]:
    replica = queue2.empty_state(OWNER.public_key, "q")
    deltas = []
    while replica.held != owner.held:
        d = chunk(owner, replica, size)
        deltas.append(d)
        replica = queue2.join_verified(replica, queue2.verify_delta(replica, d)).state
    return replica, deltas


def both(
    stamps: list[int], size: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[queue2.QueueState2, queue2.QueueState2, queue2.QueueState2]:
    """The owner, a replica caught up with runs not built, one caught up with bodies built."""
    owner = single_offers(OWNER, stamps)
    lazy, deltas = catch_up(owner, size)
    assert all(type(d.bodies) is LazyDecoded for d in deltas)
    with monkeypatch.context() as m:
        m.setattr(core2_steps, "_lazy", lambda *a, **k: None)
        built, deltas = catch_up(owner, size)
    assert not any(type(d.bodies) is LazyDecoded for d in deltas)
    return owner, lazy, built


def same(a: HeadV2, b: HeadV2) -> bool:
    return dataclasses.astuple(a) == dataclasses.astuple(b) and a.leaf() == b.leaf()


stamps_st = st.lists(st.integers(min_value=2, max_value=2**40), min_size=3, max_size=60)
settings_ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@settings_
@given(stamps=stamps_st, size=st.integers(min_value=2, max_value=25))
def test_every_reader_sees_the_bodies_the_full_decode_builds(
    monkeypatch: pytest.MonkeyPatch, stamps: list[int], size: int
) -> None:
    owner, lazy, built = both(stamps, size, monkeypatch)
    assert type(lazy.bodies) is Runs and not any(type(p) is Runs for p in lazy.bodies.parts)
    assert lazy.held == built.held == owner.held and lazy.records() == built.records()
    # items, order, ends and leaves; a second read is the same object
    assert len(lazy.bodies) == len(built.bodies)
    assert all(map(same, lazy.bodies, built.bodies))
    assert lazy.bodies == tuple(built.bodies) and tuple(lazy.bodies) == tuple(built.bodies)
    assert all(x is y for x, y in zip(lazy.bodies, lazy.bodies, strict=True))
    assert list(reversed(lazy.bodies)) == list(reversed(tuple(built.bodies)))
    for i in (0, len(built.bodies) // 2, -1):
        assert same(lazy.bodies[i], built.bodies[i])
    # the readers by offset: a bisect and slice, a served chunk, the newest body of a version
    for lo, hi in ((0, owner.held[1]), (1, 3), (len(stamps) // 2, len(stamps))):
        assert bodies_between(lazy.bodies, lo, hi) == bodies_between(built.bodies, lo, hi)
    for version in (2, len(stamps) // 2 + 1, len(stamps)):
        a, b = core2_steps._trusted(lazy, version), core2_steps._trusted(built, version)
        assert (a is None) == (b is None) and (a is None or b is None or same(a, b))
    peer = queue2.empty_state(OWNER.public_key, "q")
    served = (queue2.delta(s, None, 7, 1 << 20) for s in (lazy, built))
    assert next(served) == next(served)
    # the join with another replica, and the value's own checks of its bodies
    assert keep_bodies(lazy.chains, lazy.bodies) == keep_bodies(built.chains, built.bodies)
    assert queue2.join(lazy, peer).bodies == queue2.join(built, peer).bodies
    assert queue2.join(peer, lazy).records() == owner.records()


def test_the_next_chunk_after_a_lazy_one_follows_its_newest_body(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = single_offers(OWNER, range(10, 50))
    replica, deltas = catch_up(owner, 15)
    assert len(deltas) == 3
    prev = core2_steps._trusted(replica, replica.bodies[-1].version)
    assert prev is replica.bodies[-1]
    # a live push after the catch-up appends a plain body to the runs
    owner = queue2.commit(owner, OWNER, now_ms=99, records=[make_record(b"late", timestamp=99)])
    d = chunk(owner, replica, 100)
    joined = queue2.join_verified(replica, queue2.verify_delta(replica, d)).state
    assert joined.held == owner.held and joined.records() == owner.records()
    assert extends(replica.bodies, joined.bodies)
    assert tuple(joined.bodies[: len(replica.bodies)]) == tuple(replica.bodies)


def test_a_changed_record_under_a_lazy_run_is_refused() -> None:
    owner = single_offers(OWNER, range(10, 40))
    replica = queue2.empty_state(OWNER.public_key, "q")
    d = chunk(owner, replica, 100)
    assert type(d.bodies) is LazyDecoded
    records = list(d.records)
    records[7] = make_record(b"another", timestamp=7)
    with pytest.raises(replica_deltas.TamperedError):
        queue2.verify_delta(replica, dataclasses.replace(d, records=tuple(records)))


def test_steps_the_compact_decode_does_not_read_go_to_the_full_one() -> None:
    """A step moving the start (a truncation) or sending a leaf: None, its lists emptied."""
    compiled = leaf_compiled.load()
    assert compiled is not None
    owner = single_offers(OWNER, range(10, 30))
    prev = owner.bodies[3]
    moved = dataclasses.replace(prev, start=prev.start + 1)
    window = (
        prev.end,
        owner.chain_at(prev.end) or b"",
        [owner.chain_at(o) or b"" for o in range(prev.end + 1, 30)],
    )
    for versions in ([moved], [owner.bodies[4].leaf()]):
        raw = leaf_codec.encode(prev, versions)  # type: ignore[arg-type]
        out: tuple[list, list] = ([], [])  # type: ignore[type-arg]
        assert leaf_compiled.decode_compact(compiled, prev, next_log(prev), raw, window, out=out) is None
        assert out == ([], [])


def test_the_store_keeps_a_lazy_run_as_its_steps_and_rebuilds_the_same_bodies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, _, built = both(list(range(10, 70)), 25, monkeypatch)
    steps_memo._slot[0] = ()
    state, _ = catch_up(owner, 25)  # its runs remembered for the store, as a replica's commit finds them
    used: core2_bodies.Used = []
    rows = core2_bodies.runs(state.bodies, state.chain_at, used)
    assert len(used) == 3 and all(type(entry.bodies) is StepRun for entry, _ in used)
    assert any(row[4] is not None for row in rows)  # stored as steps
    out: list[HeadV2] = []
    for _, _, last_end, _, steps_from, raw in rows:
        lo = steps_from if steps_from is not None else 0

        def window(lo: int = lo, hi: int = last_end) -> core2_bodies.Window:
            return lo, state.chain_at(lo) or b"", [state.chain_at(o) or b"" for o in range(lo + 1, hi + 1)]

        out += core2_bodies.read_run(raw, window)
    assert len(out) == len(built.bodies) and all(map(same, out, built.bodies))


@settings_
@given(cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=5), data=st.data())
def test_runs_read_as_the_tuple_of_their_parts(cuts: list[int], data: st.DataObject) -> None:
    owner = single_offers(OWNER, range(10, 50))
    replica, _ = catch_up(owner, 9)
    full = tuple(replica.bodies)
    edges = sorted({0, len(full), *(min(c, len(full)) for c in cuts)})
    parts = [full[a:b] for a, b in itertools.pairwise(edges)]
    runs = Runs(parts)
    assert runs == full and len(runs) == len(full) and hash(runs) == hash(full)
    lo = data.draw(st.integers(min_value=-45, max_value=45))
    hi = data.draw(st.integers(min_value=-45, max_value=45))
    assert tuple(runs[lo:hi]) == full[lo:hi] and runs[lo:hi:2] == full[lo:hi:2]
    if -len(full) <= lo < len(full):
        assert runs[lo] is full[lo]
    grown = appended(runs, full[:0])
    assert tuple(grown) == full and extends(runs, grown)


def test_a_slice_of_runs_keeps_a_run_covered_whole() -> None:
    owner = single_offers(OWNER, range(10, 50))
    replica, _ = catch_up(owner, 15)
    runs = replica.bodies
    assert type(runs) is Runs
    lazy = [p for p in runs.parts if type(p) is StepRun]
    assert lazy
    at = runs.start_of(lazy[-1])
    cut = runs[at:]
    assert type(cut) is Runs and cut.parts[0] is lazy[-1] and cut.start_of(lazy[-1]) == 0
    assert runs.start_of(tuple(lazy[-1])) == -1
    with pytest.raises(IndexError):
        runs[len(runs)]
    with pytest.raises(ValueError, match="lengths"):
        StepRun(lazy[0].prev, lazy[0].leaves, (), b"", (0, b"", []))


def test_a_fork_met_after_a_lazy_catch_up_cuts_and_keeps_evidence_as_with_bodies_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner's copy signs another history from version 21 on: a replica caught up on the first one
    (runs not built, or bodies built) freezes at the fork point with the same records, bodies and
    evidence."""
    shared = single_offers(OWNER, range(10, 30))
    mine = shared
    for i in range(15):
        mine = queue2.commit(mine, OWNER, now_ms=100 + i, records=[make_record(b"m%d" % i, timestamp=i)])
    other = queue2.commit(shared, OWNER, now_ms=500, records=[make_record(b"copy", timestamp=1)])
    lazy, _ = catch_up(mine, 8)
    with monkeypatch.context() as m:
        m.setattr(core2_steps, "_lazy", lambda *a, **k: None)
        built, _ = catch_up(mine, 8)
    assert type(lazy.bodies) is Runs and type(built.bodies) is not Runs
    assert lazy.records() == mine.records()
    merged = []
    for state in (lazy, built):
        d = queue2.delta(other, queue2.summary(state))
        merged.append(queue2.join_verified(state, queue2.verify_delta(state, d)))
    (a, b) = merged
    assert a.state.forked and b.state.forked and a.state.held == b.state.held
    assert a.state.records() == b.state.records() and a.evidence == b.evidence and a.evidence
    assert len(a.state.bodies) == len(b.state.bodies) and all(map(same, a.state.bodies, b.state.bodies))


def one_run(prev: HeadV2, n: int) -> StepRun:
    """A run of ``n`` plain bodies after ``prev`` (one record each), as a live push's steps rebuild."""
    leaves = tuple((bytes([n, i]) * 16, prev.end + i + 1) for i in range(n))
    logs = [bytes([i]) * 32 for i in range(n)]
    chain = [bytes([i, n]) * 16 for i in range(n)]
    return StepRun(prev, leaves, logs, bytes(8 * n), (prev.end, prev.head_hash, chain))


def as_runs(bodies: Sequence[HeadV2]) -> Runs:
    assert type(bodies) is Runs
    return bodies


def test_live_pushes_extend_one_list_of_parts_and_every_earlier_value_stays_as_it_was() -> None:
    """A relay appends a one-body run a push: the parts are appended to in place (a push's append does
    not grow with the queue), each earlier value keeps reading its own bodies, and a value extended a
    second time (two joins of one value) copies instead of overwriting what the first one added."""
    owner = single_offers(OWNER, range(10, 30))
    replica, _ = catch_up(owner, 7)
    values: list[Sequence[HeadV2]] = [replica.bodies]
    runs: list[StepRun] = []
    for k in range(60):
        prev = values[-1][-1]
        run = one_run(prev, 1 + k % 3)
        runs.append(run)
        values.append(appended(values[-1], run))
    last = as_runs(values[-1])
    assert all(as_runs(v)._parts is last._parts for v in values[1:])
    for before, after, run in zip(values[:-1], values[1:], runs, strict=True):
        assert len(after) == len(before) + len(run)
        assert tuple(after) == (*before, *run) and tuple(reversed(after)) == tuple(reversed((*before, *run)))
        assert extends(before, after) and not extends(after, before)
        assert as_runs(after).start_of(run) == len(before)
        assert type(before) is not Runs or before.start_of(run) == -1
    assert tuple(last[len(values[30]) :]) == tuple(itertools.chain(*runs[30:]))
    assert as_runs(last[len(values[30]) :]).parts[0] is runs[30]
    # A second append to a value already extended: a copy, and the first extension is untouched.
    other = one_run(values[30][-1], 2)
    forked = as_runs(appended(values[30], other))
    assert forked._parts is not last._parts
    assert tuple(forked) == (*values[30], *other) and forked.start_of(other) == len(values[30])
    assert last.start_of(other) == -1 and tuple(last) == (*values[30], *itertools.chain(*runs[30:]))
    assert not extends(last, forked) and extends(values[30], forked)


def test_plain_bodies_after_plain_ones_are_grown_into_them_without_touching_the_earlier_value() -> None:
    owner = single_offers(OWNER, range(10, 30))
    replica, _ = catch_up(owner, 7)
    runs = appended(replica.bodies, one_run(replica.bodies[-1], 2))
    plain = tuple(one_run(runs[-1], 2))
    once = appended(runs, plain)
    twice = as_runs(appended(once, tuple(one_run(once[-1], 1))))
    assert type(twice.parts[-1]) is not StepRun
    assert len(twice.parts) == len(as_runs(once).parts)  # grown into the plain part, not a new one
    assert tuple(once) == (*runs, *plain) and len(twice) == len(once) + 1
    assert extends(runs, once) and tuple(twice)[: len(once)] == tuple(once)
