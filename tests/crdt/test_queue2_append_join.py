"""``join_verified``'s plain-append path (a live push extending the one tip past all we hold) builds the
same value as its general path, on every delta of the histories the lattice-law tests draw: the value,
its bodies, records and chain values, and no evidence."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from support.queue2_histories import OWNER, empty, extend, states

from latticed.crdt import queue2
from latticed.crdt.core_errors import GapError
from latticed.crdt.queue2 import QueueState2, replica_deltas
from latticed.crdt.records import Record

EXAMPLES = int(os.environ.get("LATTICE_LAW_EXAMPLES", "1000"))


def same_join(state: QueueState2, v: queue2.Verified) -> bool:
    """Whether the append path took ``v`` (else it leaves it to the general path), checking that what it
    built is the general path's value."""
    appended = replica_deltas._appended(state, v)
    general = replica_deltas._joined(state, v)
    if appended is None:
        return False
    assert general.evidence == ()
    assert appended == general.state and appended.chains == general.state.chains
    assert appended.bodies == general.state.bodies and appended.meta == general.state.meta
    lo, hi = appended.held
    assert appended.records() == general.state.records()
    assert [appended.chain_at(o) for o in range(lo, hi + 1)] == [
        general.state.chain_at(o) for o in range(lo, hi + 1)
    ]
    return True


@settings(max_examples=max(EXAMPLES // 2, 100), deadline=None)
@given(states(2), st.integers(1, 4), st.booleans())
def test_the_append_path_joins_as_the_general_path(values: list[QueueState2], size: int, whole: bool) -> None:
    """Chunks of deltas from ``a`` to ``b`` (for ``b``'s summary, or for none: a whole value), each
    verified and joined both ways."""
    a, b = values
    got = b
    for index in range(32):
        d = queue2.delta(a, None if whole and index == 0 else queue2.summary(got), max_records=size)
        try:
            v = queue2.verify_delta(got, d)
        except GapError:
            v = queue2.verify_delta(got, queue2.delta(a, None, size))
        same_join(got, v)
        nxt = queue2.join_verified(got, v).state
        if nxt == got and nxt.bodies == got.bodies and index:
            break
        got = nxt


def test_a_live_push_takes_the_append_path() -> None:
    """Single-record commits sent one by one, and a chunk of several heads, each append to what the
    replica holds: the path a relay's event loop takes per push."""
    owner = empty()
    replica = empty()
    for i in range(6):
        owner = queue2.commit(owner, OWNER, now_ms=i, records=[Record(value=b"r%d" % i)])
        v = queue2.verify_delta(replica, queue2.delta(owner, queue2.summary(replica), max_records=8))
        assert same_join(replica, v)
        replica = queue2.join_verified(replica, v).state
    for line in (extend(owner, [("offer", 2), ("meta", 1), ("offer", 3)], b"x"),):
        v = queue2.verify_delta(replica, queue2.delta(line[-1], queue2.summary(replica), max_records=100))
        assert same_join(replica, v)
        replica = queue2.join_verified(replica, v).state
        assert replica == line[-1]
