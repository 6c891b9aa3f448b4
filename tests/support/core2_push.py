"""A relay's one-pass check of a core-2 push (``core2_live.next_push``) held against the generic path it
stands in for (``unpack_steps`` → ``verify_delta`` → ``join_verified``): one comparison for the tests of
valid, mutated and hostile pushes, so that each holds the one pass to the same, strictest standard."""

from __future__ import annotations

from typing import Any

import pytest

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2, replica_deltas
from latticed.errors import LatticedError
from latticed.net import core2_ahead
from latticed.net.core2_ahead import AheadPushes
from latticed.protocol.core2_steps import outgoing, unpack_steps
from latticed.protocol.core2_wire import Delta2, link_summary


def push_delta2(before: QueueState2, after: QueueState2, number: int) -> Delta2:
    """The DELTA2 (numbered ``number``) that pushes ``after`` to a replica summarised as ``before``, as a
    live stream's link sends it: the pushes the one pass and the compact forms are tested on."""
    sent = outgoing(after, queue2.summary(before), 4096)
    return Delta2(number, link_summary(after), sent.delta, sent.steps)


#: The one pass's (or ``AheadPushes.check``'s) acceptance: the delta, its verification, the joined value.
Accepted = tuple[queue2.Delta, queue2.Verified, QueueState2]


def generic_push(state: QueueState2, d: queue2.Delta, steps: Any, *, full: bool = False) -> object:
    """The generic path's delta, verification and joined value, or its refusal's type (odd types are
    refused too); ``full``: with ``verify_delta``'s next-version shortcut answering None (its full path
    decides)."""
    with pytest.MonkeyPatch.context() as patch:
        if full:
            patch.setattr(replica_deltas, "_next_version", lambda *_: None)
        try:
            whole = unpack_steps(state, d, steps)
            verified = queue2.verify_delta(state, whole)
            return whole, verified, queue2.join_verified(state, verified).state
        except LatticedError as exc:
            return type(exc)
        except (TypeError, ValueError, AttributeError, IndexError) as exc:
            return type(exc)


def same_value(a: QueueState2, b: QueueState2) -> None:
    """Two joined values alike in all a replica keeps: bodies, metadata, held range, records and the
    chain at every held offset, ``held[1]`` included (``chain_at`` answers for ``start..held_end``)."""
    assert a == b
    assert tuple(a.bodies) == tuple(b.bodies)
    assert a.meta == b.meta and a.held == b.held
    assert a.entries.records() == b.entries.records()
    assert [a.chain_at(o) for o in range(a.held[0], a.held[1] + 1)] == [
        b.chain_at(o) for o in range(b.held[0], b.held[1] + 1)
    ]


def same_push(fast: object, ref: object) -> None:
    """A one-pass acceptance is the reference's, field for field; anything else is no acceptance."""
    if not isinstance(fast, tuple):
        return
    assert isinstance(ref, tuple), ("accepted by the one pass, refused by the generic path", ref)
    (d, v, value), (rd, rv, rvalue) = fast, ref
    assert (d.owner, d.name, d.kind, d.log, d.meta, d.from_offset) == (
        rd.owner,
        rd.name,
        rd.kind,
        rd.log,
        rd.meta,
        rd.from_offset,
    )
    assert tuple(d.records) == tuple(rd.records) and tuple(d.bodies) == tuple(rd.bodies)
    assert (v.chains, v.meta, v.from_offset, v.chain) == (rv.chains, rv.meta, rv.from_offset, rv.chain)
    assert tuple(v.records) == tuple(rv.records) and tuple(v.bodies) == tuple(rv.bodies)
    same_value(value, rvalue)


def ahead_check(state: QueueState2, d: queue2.Delta, steps: Any) -> object:
    """``AheadPushes.check``'s answer: its values, None (the storage thread's), or what it raised."""
    try:
        push = AheadPushes().check(1, state, d, steps)
    except Exception as exc:  # odd types: both paths must raise alike
        return type(exc)
    return None if push is None else (push.delta, push.verified, push.value)


def ahead_alike(state: QueueState2, d: queue2.Delta, steps: Any) -> None:
    """``AheadPushes.check`` answers with the one pass as with the generic path alone (the one pass
    answering None): the same values, None or raise."""
    with pytest.MonkeyPatch.context() as patch:
        both = ahead_check(state, d, steps)
        patch.setattr(core2_ahead, "next_push", lambda *_: None)
        generic = ahead_check(state, d, steps)
    if isinstance(both, tuple):
        same_push(both, generic)
    else:
        assert both == generic
