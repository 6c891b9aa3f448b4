"""A link's summary of a core-2 value is computed once per value object (a relay asks for it up to three
times a push), and a value built from it, by ``replace`` or a join, is summarised afresh."""

from __future__ import annotations

import dataclasses

from support.queue2_histories import OWNER, empty

from latticed.crdt import queue2
from latticed.crdt.records import Record
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
