"""``core2_live.next_push`` attacked with signed pushes (review25b): a hostile owner's histories (forks,
a second version at one height, metadata and truncations signed with records, records past the limits)
and structured mutations of valid pushes (another branch's log, records, steps or metadata spliced in),
checked against replicas of any of the branches. The one-pass path accepts only what the generic path
(``unpack_steps`` → ``verify_delta`` → ``join_verified``) accepts, with its results, and what the full
path (without ``verify_delta``'s own next-version shortcut) accepts too."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core2_push import ahead_alike, ahead_check, generic_push, push_delta2, same_push
from support.queue2_histories import OWNER, catch_up, empty

from latticed.crdt import core_errors as queue2_errors
from latticed.crdt import queue2, steps_memo
from latticed.crdt.epochs import Tip
from latticed.crdt.queue2 import QueueState2, owner_changes
from latticed.crdt.records import MAX_HEADER_VALUE_BYTES, MAX_KEY_BYTES, Record, RecordRun
from latticed.errors import LatticedError, MalformedError
from latticed.net.core2_ahead import AheadPushes
from latticed.protocol import core2_live
from latticed.protocol.core2_compact import Compact2Link
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import Delta2, link_summary
from latticed.protocol.replication_messages import unpack_message

Push = tuple[queue2.Delta, Any]


def _push(before: QueueState2, after: QueueState2) -> Push:
    """``after``'s push to a replica summarised as ``before``, as a relay decodes it on a compact link."""
    message = push_delta2(before, after, 7)
    decoded = Compact2Link().decode(unpack_message(Compact2Link().encode(message)))
    assert isinstance(decoded, Delta2)
    return decoded.delta, decoded.steps


def _fast(state: QueueState2, d: queue2.Delta, steps: Any) -> object:
    try:
        return core2_live.next_push(state, d, steps)
    except Exception as exc:  # the caller's cue for the generic path
        return type(exc)


def _check(state: QueueState2, d: queue2.Delta, steps: Any) -> bool:
    """Both paths compared on one input, and ``AheadPushes.check`` with and without the one pass;
    whether the one pass accepted it."""
    fast = _fast(state, d, steps)
    same_push(fast, generic_push(state, d, steps))
    same_push(fast, generic_push(state, d, steps, full=True))
    ahead_alike(state, d, steps)
    return isinstance(fast, tuple)


# ---------------------------------------------------------------- a hostile owner's histories

#: One signed change: records (how many), with new metadata, with a new start, or a timestamp only.
change = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 3)),
    st.tuples(st.just("offer+meta"), st.integers(1, 2)),
    st.tuples(st.just("offer+truncate"), st.integers(1, 2)),
    st.tuples(st.just("meta"), st.just(0)),
    st.tuples(st.just("truncate"), st.integers(0, 2)),
    st.tuples(st.just("touch"), st.just(0)),
)


def _signed(state: QueueState2, kind: str, n: int, tag: bytes, at: int) -> QueueState2:
    now = 1_700_000_000_000 + at
    records = [Record(tag + b"%d.%d" % (at, i), timestamp=now) for i in range(n)]
    if kind == "offer":
        return queue2.commit(state, OWNER, now_ms=now, records=records)
    if kind == "offer+meta":
        return queue2.commit(state, OWNER, now_ms=now, records=records, meta_updates={"k": tag.hex()})
    if kind == "offer+truncate":
        start = min(state.held[1], state.held[0] + 1)
        return queue2.commit(state, OWNER, now_ms=now, records=records, new_start=start)
    if kind == "meta":
        return queue2.commit(state, OWNER, now_ms=now, meta_updates={"m": tag.hex() + str(at)})
    if kind == "truncate":
        return queue2.truncate(
            state, OWNER, state.held[0] + min(n, state.held[1] - state.held[0]), now_ms=now
        )
    return queue2.commit(state, OWNER, now_ms=now)


@st.composite
def branches(draw: st.DrawFn) -> list[list[QueueState2]]:
    """An owner's shared prefix and two or three branches signed past it (the same tag and timestamps:
    equal heads with the same records, or a second version at one height with other records)."""
    state = empty()
    for at in range(draw(st.integers(1, 3))):
        state = _signed(state, "offer", 2, b"s", at)
    lines = []
    for _ in range(draw(st.integers(2, 3))):
        tag = draw(st.sampled_from([b"a", b"b", b"c"]))
        line, value = [state], state
        for at, (kind, n) in enumerate(draw(st.lists(change, min_size=1, max_size=4))):
            value = _signed(value, kind, n, tag, 10 + at)
            line.append(value)
        lines.append(line)
    return lines


def _before(draw: st.DrawFn, value: QueueState2) -> QueueState2:
    """The replica a push was made for: the owner's value, or a copy of it caught up in chunks."""
    if draw(st.booleans()):
        return value
    return catch_up(empty(), value, 3, draw(st.integers(1, 4)))


def _replica(draw: st.DrawFn, lines: list[list[QueueState2]]) -> QueueState2:
    """A replica of some branch at some version, caught up whole or in chunks, sometimes joined with
    another branch (forked)."""
    line = draw(st.sampled_from(lines))
    value = line[draw(st.integers(0, len(line) - 1))]
    if draw(st.booleans()):
        d = queue2.delta(value, None, max_records=draw(st.integers(1, 4)))
        value = queue2.join_verified(empty(), queue2.verify_delta(empty(), d)).state
    if draw(st.integers(0, 3)) == 0:
        other = draw(st.sampled_from(lines))
        value = queue2.join(value, other[draw(st.integers(0, len(other) - 1))])
    return value


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_hostile_owners_pushes_to_any_replica_are_accepted_only_as_the_generic_path_accepts(
    data: st.DataObject,
) -> None:
    lines = data.draw(branches())
    line = data.draw(st.sampled_from(lines))
    i = data.draw(st.integers(0, len(line) - 2))
    d, steps = _push(line[i], line[i + 1])
    state = _before(data.draw, line[i]) if data.draw(st.booleans()) else _replica(data.draw, lines)
    if _check(state, d, steps):
        assert state.chains.tips[0].head.version + 1 == d.log.value.tips[0].head.version


# ---------------------------------------------------------------- structured mutations of valid pushes

#: A valid push with one part taken from another push of the same owner (a valid signed part, wrong
#: together): ``(mine, other) -> (delta, steps)``.
SPLICE: dict[str, Any] = {
    "log": lambda m, o: (dataclasses.replace(m[0], log=o[0].log), m[1]),
    "records": lambda m, o: (dataclasses.replace(m[0], records=o[0].records), m[1]),
    "steps": lambda m, o: (m[0], o[1]),
    "meta": lambda m, o: (dataclasses.replace(m[0], meta=o[0].meta), m[1]),
    "offset": lambda m, o: (dataclasses.replace(m[0], from_offset=o[0].from_offset), m[1]),
    "log and records": lambda m, o: (dataclasses.replace(m[0], log=o[0].log, records=o[0].records), m[1]),
    "log and steps": lambda m, o: (dataclasses.replace(m[0], log=o[0].log), o[1]),
    "records and steps": lambda m, o: (dataclasses.replace(m[0], records=o[0].records), o[1]),
    "steps version": lambda m, o: (m[0], None if m[1] is None or o[1] is None else (o[1][0], m[1][1])),
}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_push_with_a_part_of_another_signed_push_is_accepted_only_as_the_generic_path_accepts(
    data: st.DataObject,
) -> None:
    lines = data.draw(branches())
    made = [(line[i], _push(line[i], line[i + 1])) for line in lines for i in range(len(line) - 1)]
    (before, mine), (_, other) = data.draw(st.sampled_from(made)), data.draw(st.sampled_from(made))
    splice = data.draw(st.sampled_from(sorted(SPLICE)))
    try:
        d, steps = SPLICE[splice](mine, other)
    except (TypeError, ValueError, LatticedError):
        return  # not a delta that can be built
    state = _before(data.draw, before) if data.draw(st.booleans()) else _replica(data.draw, lines)
    _check(state, d, steps)


# ---------------------------------------------------------------- records past the limits, signed


@pytest.mark.parametrize(
    "record",
    [
        Record(b"v", key=b"k" * (MAX_KEY_BYTES + 1), timestamp=5),
        Record(b"v", timestamp=5, headers=(("h", b"x" * (MAX_HEADER_VALUE_BYTES + 1)),)),
    ],
    ids=["key", "header"],
)
def test_a_signed_record_past_the_limits_reaches_check_records_and_is_refused(record: Record) -> None:
    """The compact link refuses such a record before it (RemoteProtocolError), so the push is built as
    another decoder hands it on: its records a run. Only ``check_records`` refuses it here: the chain,
    the steps and the signature all hold."""
    state = empty()
    for i in range(3):
        state = queue2.commit(state, OWNER, now_ms=1_000 + i, records=[Record(b"x" * 10)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owner_changes, "check_records", lambda _: None)
        signed = queue2.commit(state, OWNER, now_ms=2_000, records=[record])
    sent = outgoing(signed, queue2.summary(state), 4096)
    records = tuple(sent.delta.records)
    run = RecordRun(
        [r.value for r in records],
        [r.key for r in records],
        [r.timestamp for r in records],
        [r.headers for r in records],
    )
    d = dataclasses.replace(sent.delta, records=run)
    assert generic_push(state, d, sent.steps) is MalformedError
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core2_live, "check_records", lambda _: None)
        assert isinstance(_fast(state, d, sent.steps), tuple)  # every other check of the one pass holds
    assert not isinstance(_fast(state, d, sent.steps), tuple)
    assert not _check(state, d, sent.steps)
    assert ahead_check(state, d, sent.steps) is None  # the storage thread's to refuse


# ---------------------------------------------------------------- deterministic cases


def _owner(records: int = 5) -> QueueState2:
    """An owner's value of ``records`` single offers, the first with metadata."""
    state = queue2.commit(empty(), OWNER, now_ms=999, records=[Record(b"x" * 10)], meta_updates={"k": "v"})
    for i in range(records - 1):
        state = queue2.commit(state, OWNER, now_ms=1_000 + i, records=[Record(b"x" * 10)])
    return state


def test_records_signed_with_new_metadata_are_the_generic_paths() -> None:
    """New metadata signed with records: its steps are not plain (the compiled decode reads a body over
    the previous metadata only), so the one pass answers None and the generic path accepts."""
    before = _owner()
    after = queue2.commit(before, OWNER, now_ms=2_000, records=[Record(b"m")], meta_updates={"k": "w"})
    d, steps = _push(before, after)
    assert d.meta is not None and d.meta != before.meta
    assert core2_live.next_push(before, d, steps) is None
    assert not _check(before, d, steps)
    assert isinstance(generic_push(before, d, steps), tuple)


def test_unchanged_metadata_other_than_ours_is_checked_against_the_hash() -> None:
    """Our metadata's shortcut needs the very pairs we hold: other pairs under an unchanged hash are
    hashed, kept canonical when they hash right (a 0.2.0 relay's repeated key), refused when forged."""
    before = _owner()
    after = queue2.commit(before, OWNER, now_ms=2_000, records=[Record(b"m")])
    d, steps = _push(before, after)
    assert d.meta == before.meta
    assert _check(before, d, steps)
    fast = core2_live.next_push(before, d, steps)
    assert fast is not None and fast[2].meta == before.meta
    repeated = dataclasses.replace(d, meta=(("k", "stale"), *d.meta))  # dict() keeps the last "k"
    assert _check(before, repeated, steps)
    fast = core2_live.next_push(before, repeated, steps)
    assert fast is not None and fast[1].meta == before.meta and fast[0].meta == repeated.meta
    for pairs in ((("x", "y"),), (("k", "w"),), ()):
        forged = dataclasses.replace(d, meta=pairs)
        assert not _check(before, forged, steps)
        assert generic_push(before, forged, steps) is queue2_errors.TamperedError


def test_a_one_pass_that_raises_at_its_last_step_keeps_nothing_and_the_generic_path_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "Anything raised is the caller's cue for the generic path" holds only if nothing was kept before
    the raise: the steps memo is told the run last, and our value's views are unchanged."""
    before = _owner()
    after = queue2.commit(before, OWNER, now_ms=2_000, records=[Record(b"n")])
    d, steps = _push(before, after)
    shared, bodies, memo = tuple(before.chains.shared), tuple(before.bodies), steps_memo._slot[0]

    def late(*_: object) -> None:
        raise RuntimeError("the last step of the one pass")

    with monkeypatch.context() as patch:
        patch.setattr(core2_live, "appended", late)
        with pytest.raises(RuntimeError):
            core2_live.next_push(before, d, steps)
        assert steps_memo._slot[0] is memo
        assert tuple(before.chains.shared) == shared and tuple(before.bodies) == bodies
        push = AheadPushes().check(1, before, d, steps)  # the generic path's, after the raise
    assert push is not None
    same_push((push.delta, push.verified, push.value), generic_push(before, d, steps))
    assert link_summary(push.value) == link_summary(after)
    steps_memo._slot[0] = ()
    fast = core2_live.next_push(before, d, steps)
    assert (
        fast is not None
    )  # the store is told the steps of bodies it will keep, as the generic path tells it
    assert [(e.steps, e.bodies) for e in steps_memo._slot[0]] == [(steps[1], fast[1].bodies.run)]


def _value(d: queue2.Delta, **fields: Any) -> queue2.Delta:
    """``d`` with its log's value changed (what a hostile relay may send: no signature covers it)."""
    assert d.log is not None
    return dataclasses.replace(
        d, log=dataclasses.replace(d.log, value=dataclasses.replace(d.log.value, **fields))
    )


#: A relay's forgeries of the unsigned parts of a valid push's log: ``(delta, our value) -> delta``.
UNSIGNED: dict[str, Any] = {
    "a shared leaf": lambda d, s: _value(d, shared=(s.chains.tips[0].head.leaf(),)),
    "a second tip (ours)": lambda d, s: _value(d, tips=(*d.log.value.tips, Tip(s.chains.tips[0].head))),
    "a tip's tail": lambda d, s: _value(
        d, tips=(Tip(d.log.value.tips[0].head, (s.chains.tips[0].head.leaf(),)),)
    ),
    "our start head": lambda d, s: _value(d, start_head=s.chains.start_head),
    "an equal start head": lambda d, s: _value(d, start_head=dataclasses.replace(d.log.value.start_head)),
    "no start head": lambda d, s: _value(d, start_head=None),
    "held end": lambda d, s: _value(d, held_end=d.log.value.held_end + 1_000),
    "epoch": lambda d, s: _value(d, epoch=d.log.value.epoch + 1),
    "queue id": lambda d, s: _value(d, queue_id=bytes(32)),
    "owner": lambda d, s: _value(d, owner=bytes(32)),
}


@pytest.mark.parametrize("forgery", sorted(UNSIGNED))
def test_a_relays_forgery_of_the_logs_unsigned_parts_is_not_the_one_passes(forgery: str) -> None:
    before = _owner()
    after = queue2.commit(before, OWNER, now_ms=2_000, records=[Record(b"n")])
    d, steps = _push(before, after)
    assert core2_live.next_push(before, d, steps) is not None  # the push itself takes the one pass
    forged = UNSIGNED[forgery](d, before)
    accepted = _check(before, forged, steps)
    if forgery == "held end":  # the merged value keeps our held end: the generic path's too
        assert accepted
    else:
        assert not accepted


def test_a_forked_replica_takes_a_branchs_next_version_by_the_generic_path() -> None:
    """A replica frozen at a fork (two tips) is never the one pass's: its value keeps both branches."""
    shared = _owner()
    a1 = queue2.commit(shared, OWNER, now_ms=3_000, records=[Record(b"a1")])
    b1 = queue2.commit(shared, OWNER, now_ms=3_001, records=[Record(b"b1")])
    a2 = queue2.commit(a1, OWNER, now_ms=3_002, records=[Record(b"a2")])
    forked = queue2.join(a1, b1)
    assert forked.forked
    d, steps = _push(a1, a2)
    assert core2_live.next_push(a1, d, steps) is not None  # to branch a's replica: the one pass
    assert core2_live.next_push(forked, d, steps) is None
    assert not _check(forked, d, steps)
    same_height = _push(shared, b1)  # the second version at b1's height, to a replica holding a1
    assert core2_live.next_push(a1, *same_height) is None
    assert not _check(a1, *same_height)


def test_a_replica_short_of_its_heads_end_is_not_the_one_passs() -> None:
    """A replica caught up to below its newest head's end, sent the records from its end through the next
    version with that version's log and steps (a relay's splice; every record genuine): the generic path
    refuses it (the body ending at our head's end is missing), so the one pass must answer None. Without
    its ``ours.end == hi`` check it accepted this."""
    before = queue2.commit(_owner(), OWNER, now_ms=5_000, records=[Record(b"a"), Record(b"b"), Record(b"c")])
    after = queue2.commit(before, OWNER, now_ms=6_000, records=[Record(b"n")])
    d, steps = _push(before, after)
    partial = catch_up(empty(), before, 1, 5)
    hi = partial.held[1]
    assert hi < partial.chains.tips[0].head.end == before.held[1]
    rows = [*before.records()[hi:], *after.records()[before.held[1] :]]
    run = RecordRun([r.value for r in rows], [r.key for r in rows], [r.timestamp for r in rows])
    spliced = dataclasses.replace(d, from_offset=hi, records=run)
    assert core2_live.next_push(partial, spliced, steps) is None
    assert generic_push(partial, spliced, steps) is queue2_errors.TamperedError
    assert not _check(partial, spliced, steps)


def test_records_past_the_signed_heads_end_are_not_the_one_passs() -> None:
    """A relay appends a record past the signed head's end: the full path keeps the records up to the
    head only, so the one pass (which would keep them all) must answer None."""
    before = _owner()
    after = queue2.commit(before, OWNER, now_ms=2_000, records=[Record(b"n")])
    d, steps = _push(before, after)
    records = d.records
    assert type(records) is RecordRun
    more = RecordRun((*records.values, b"extra"), (*records.keys, None), (*records.timestamps, 1))
    longer = dataclasses.replace(d, records=more)
    assert core2_live.next_push(before, longer, steps) is None
    _check(before, longer, steps)
