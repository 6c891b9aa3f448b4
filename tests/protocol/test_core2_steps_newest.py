"""A live push's steps follow the newest body a relay holds: it is found from the newest end, without
reading the bodies of older heads (a queue of single offers holds one per record)."""

from __future__ import annotations

import dataclasses
from typing import Any

from support.queue2_histories import OWNER, empty

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.protocol.core2_steps import outgoing, unpack_steps


class Untouchable:
    """An old body the lookup must not read."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"an old body was read ({name})")


def test_a_live_pushs_steps_are_unpacked_after_the_newest_body_without_reading_older_ones() -> None:
    owner = relay = empty()
    for i in range(3):
        owner = queue2.commit(owner, OWNER, now_ms=i, records=[Record(value=b"r%d" % i)])
        out = outgoing(owner, queue2.summary(relay), 8)
        d = unpack_steps(relay, out.delta, out.steps)
        relay = queue2.join_verified(relay, queue2.verify_delta(relay, d)).state
    owner = queue2.commit(owner, OWNER, now_ms=9, records=[Record(value=b"live")])
    out = outgoing(owner, queue2.summary(relay), 8)
    assert out.steps is not None and out.delta.bodies == ()
    old = (Untouchable(),) * 50
    padded = dataclasses.replace(relay, bodies=(*old, *relay.bodies[-1:]))  # type: ignore[arg-type]
    d = unpack_steps(padded, out.delta, out.steps)
    assert d == unpack_steps(relay, out.delta, out.steps)
    joined = queue2.join_verified(relay, queue2.verify_delta(relay, d)).state
    assert joined == owner
