"""A link's summary of a core-2 value is computed once per value object (a relay asks for it up to three
times a push), and a value built from it, by ``replace`` or a join, is summarised afresh; what a delta
implies likewise, for the last delta asked of."""

from __future__ import annotations

import dataclasses

from support.queue2_histories import OWNER, empty

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.protocol import core2_compact
from latticed.protocol.core2_wire import _link_summary, link_summary


def test_a_values_link_summary_is_kept_on_it_and_not_on_values_built_from_it() -> None:
    one = queue2.commit(empty(), OWNER, now_ms=1, records=[Record(value=b"a")])
    first = link_summary(one)
    assert link_summary(one) is first and first == _link_summary(one)
    two = queue2.commit(one, OWNER, now_ms=2, records=[Record(value=b"b")])
    assert two.memo is None and link_summary(two) == _link_summary(two) != first
    cut = dataclasses.replace(two, chains=dataclasses.replace(two.chains, held_end=one.held[1]))
    assert cut.memo is None and link_summary(cut).core.held_end == one.held[1]
    # The memo is no part of the value: equal values compare equal whatever each has computed.
    again = queue2.commit(empty(), OWNER, now_ms=1, records=[Record(value=b"a")])
    assert again.memo is None and again == one and repr(again) == repr(one)
    replica = queue2.join_verified(
        one, queue2.verify_delta(one, queue2.delta(two, queue2.summary(one)))
    ).state
    assert replica.memo is None and link_summary(replica) == link_summary(two)


def test_what_a_delta_implies_is_kept_for_that_delta_only() -> None:
    """``core2_compact._implied`` answers the last delta it was asked of from its one slot: the same
    answer as computed afresh, and never another delta's (an equal delta built anew is computed)."""
    one = queue2.commit(empty(), OWNER, now_ms=1, records=[Record(value=b"a")])
    two = queue2.commit(one, OWNER, now_ms=2, records=[Record(value=b"b")])
    first, second = queue2.delta(one, None), queue2.delta(two, queue2.summary(one))
    fresh = core2_compact._implied(first)
    assert fresh is not None and fresh.core == queue2.summary(one)
    assert core2_compact._implied(first) is fresh  # kept
    other = core2_compact._implied(second)
    assert other is not None and other.core == queue2.summary(two) and other != fresh
    assert core2_compact._implied(first) == fresh and core2_compact._last_implied[0][0] is first
    copy = dataclasses.replace(second)
    assert core2_compact._implied(copy) == other and core2_compact._last_implied[0][0] is copy
    no_log = dataclasses.replace(second, log=None)
    assert core2_compact._implied(no_log) is None and core2_compact._implied(copy) == other
