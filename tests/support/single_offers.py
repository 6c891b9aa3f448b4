"""A v2 queue of single offers (one record a head, as a live stream writes them) and the chunks its owner
sends a replica through the wire: the compact decode's input, shared by the tests of its runs, so that
each builds the same history and the same wire round trip."""

from __future__ import annotations

from collections.abc import Iterable

from latticed.crdt import queue2, wire
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.protocol import core2_wire
from latticed.protocol.core2_steps import outgoing, unpack_steps


def single_offers(owner: Identity, stamps: Iterable[int]) -> queue2.QueueState2:
    """``owner``'s queue "q": a first empty head, then one commit a record, the i-th at ``stamps``' i-th
    time (its record's timestamp i)."""
    state = queue2.commit(queue2.empty_state(owner.public_key, "q"), owner, now_ms=1)
    for i, at in enumerate(stamps):
        state = queue2.commit(state, owner, now_ms=at, records=[make_record(b"v%d" % i, timestamp=i)])
    return state


def chunk(owner: queue2.QueueState2, replica: queue2.QueueState2, size: int) -> queue2.Delta:
    """The next chunk of ``size`` records the owner sends the replica, through the wire, unpacked."""
    since = queue2.summary(replica) if replica.held[1] else None
    out = outgoing(owner, since, size, 1 << 20)
    assert out.steps is not None
    d, steps = core2_wire.delta_from_wire(
        wire.unpack(wire.pack(core2_wire.delta_to_wire(out.delta, out.steps)))
    )
    return unpack_steps(replica, d, steps)
