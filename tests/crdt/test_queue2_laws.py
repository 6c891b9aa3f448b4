"""Lattice laws of the v2 queue state (``crdt/queue2``) on whole states, records included, over two and
three histories of a forked owner with truncations and recoveries. ``LATTICE_LAW_EXAMPLES`` raises the
number of examples (1,000 by default)."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from support.queue2_histories import catch_up, empty, extend, states

from latticed.crdt import epochs, queue2
from latticed.crdt.core_errors import GapError
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import chain_extend

EXAMPLES = int(os.environ.get("LATTICE_LAW_EXAMPLES", "1000"))
join = queue2.join


def check(state: QueueState2) -> None:
    """A state's records are what its value says: ``held`` long, folding from the start head's base to a
    body on its log that ends where they end (so it can serve them again)."""
    epochs.verify(state.chains)
    lo, hi = state.held
    assert state.chains.held_end == hi and len(state.entries) == hi - lo
    if hi > lo:
        chain = chain_extend(state.base_hash, lo, state.records())
        assert list(state.entries.chain(i) for i in range(hi - lo)) == chain
        assert any(b.end == hi and b.head_hash == chain[-1] for b in state.bodies)
    assert all(lo < b.end <= hi for b in state.bodies)


@settings(max_examples=EXAMPLES, deadline=None)
@given(states(3))
def test_the_join_of_states_is_a_lattice(values: list[QueueState2]) -> None:
    a, b, c = values
    ab = join(a, b)
    for value in (a, b, c, ab):
        check(value)
    assert ab == join(b, a)
    assert join(ab, c) == join(a, join(b, c)) == join(join(a, c), b)
    assert join(a, a) == a
    assert join(ab, a) == ab == join(b, ab)
    if a.chains.epoch == ab.chains.epoch:
        assert ab.forked >= a.forked and ab.held[0] >= a.held[0]
        lo, hi = ab.held
        for offset in range(max(lo, a.held[0]), min(hi, a.held[1])):
            assert ab.record_at(offset) == a.record_at(offset)
        if a.forked:
            assert ab.held[1] <= a.held[1] or ab.held[1] <= max(lo, a.chains.upper)


def deltas_from(a: QueueState2, b: QueueState2, whole: bool) -> QueueState2:
    """``b`` after chunks of deltas from ``a`` until a delta for its own summary brings nothing (``whole``:
    the first delta is cut for no summary, as for a peer whose log parts from ours). Only such a delta
    ends the exchange: one cut for no summary starts at ``a``'s start, so it may bring nothing to a
    replica that already holds its first chunk but not the rest."""
    got = b
    for index in range(64):
        fresh = not (whole and index == 0)
        d = queue2.delta(a, queue2.summary(got) if fresh else None, max_records=3)
        try:
            nxt = queue2.join_verified(got, queue2.verify_delta(got, d)).state
        except GapError:
            fresh = False
            nxt = queue2.join_verified(got, queue2.verify_delta(got, queue2.delta(a, None, 3))).state
        if fresh and nxt == got and nxt.bodies == got.bodies:
            return got
        got = nxt
    raise AssertionError("no fixpoint")


@settings(max_examples=max(EXAMPLES // 2, 100), deadline=None)
@given(states(2), st.booleans())
def test_a_delta_joins_like_the_state_it_came_from(values: list[QueueState2], whole: bool) -> None:
    """Chunks of deltas from ``a`` bring ``b`` to ``join(b, a)``: the append path and the whole join agree."""
    a, b = values
    got = deltas_from(a, b, whole)
    check(got)
    assert got == join(b, a)


def test_a_first_delta_for_no_summary_that_brings_nothing_does_not_end_the_catch_up() -> None:
    """``b`` holds ``a``'s log and the first 3 of its 4 records: the first chunk cut for no summary is
    exactly what ``b`` holds (a join that changes nothing), and the deltas for ``b``'s summary after it
    bring the last record."""
    shared = extend(empty(), [("offer", 1), ("offer", 2)], b"s")
    a = extend(shared[-1], [("offer", 1)], b"a")[-1]
    b = catch_up(empty(), a, 2, 1)
    assert b.held == (0, 3) and b.chains.tips == a.chains.tips
    first = queue2.join_verified(b, queue2.verify_delta(b, queue2.delta(a, None, 3))).state
    assert first == b and first.bodies == b.bodies
    got = deltas_from(a, b, whole=True)
    check(got)
    assert got == join(b, a) == a
