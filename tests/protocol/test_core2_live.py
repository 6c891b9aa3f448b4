"""``core2_live.next_push``, a relay's one-pass check of its usual push, against the generic path it
stands in for (``unpack_steps`` → ``verify_delta`` → ``join_verified``): on valid pushes it gives the same
delta, verification and joined value; on every kind of bad input it accepts nothing the generic path
refuses, and ``AheadPushes.check`` answers exactly as with the generic path alone."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.core2_push import ahead_alike, generic_push, push_delta2, same_push
from support.queue2_histories import OWNER, empty

from latticed.crdt import queue2
from latticed.crdt.epochs import Tip
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, RecordRun
from latticed.errors import LatticedError
from latticed.protocol import core2_live
from latticed.protocol.core2_compact import Compact2Link
from latticed.protocol.core2_wire import Delta2, link_summary
from latticed.protocol.replication_messages import unpack_message

N = 6


@functools.cache
def _pushes() -> tuple[tuple[QueueState2, ...], tuple[Delta2, ...]]:
    """The owner's states (20 records, then ``N`` single offers) and each offer's DELTA2 as a relay
    decodes it on a compact link (records a run, the body as steps)."""
    state = empty()
    for i in range(20):
        state = queue2.commit(state, OWNER, now_ms=1_700_000_000_000 + i, records=[Record(bytes(100))])
    states, got = [state], []
    sender, receiver = Compact2Link(), Compact2Link()
    for i in range(N):
        before, now = state, 1_700_000_001_000 + 200 * i
        state = queue2.commit(state, OWNER, now_ms=now, records=[Record(bytes([i]) * 100, timestamp=now)])
        message = push_delta2(before, state, 300 + i)
        decoded = receiver.decode(unpack_message(sender.encode(message)))
        assert isinstance(decoded, Delta2)
        states.append(state)
        got.append(decoded)
    return tuple(states), tuple(got)


def _head_changed(d: queue2.Delta, **fields: Any) -> queue2.Delta:
    assert d.log is not None
    value = d.log.value
    head = dataclasses.replace(value.tips[0].head, **fields)
    log = dataclasses.replace(d.log, value=dataclasses.replace(value, tips=(Tip(head),), start_head=head))
    return dataclasses.replace(d, log=log)


def _run(d: queue2.Delta, value: bytes) -> RecordRun:
    records = d.records
    assert type(records) is RecordRun
    return RecordRun((value,), records.keys, records.timestamps)


#: Each kind of bad input: (delta, steps) -> (delta, steps).
BAD: dict[str, Any] = {
    "none": lambda d, s: (d, s),
    "signature": lambda d, s: (_head_changed(d, signature=bytes(64)), s),
    "signature bit": lambda d, s: (
        _head_changed(d, signature=bytes([1]) + d.log.value.tips[0].head.signature[1:]),
        s,
    ),
    "head timestamp": lambda d, s: (_head_changed(d, timestamp=d.log.value.tips[0].head.timestamp + 1), s),
    "head end": lambda d, s: (_head_changed(d, end=d.log.value.tips[0].head.end + 1), s),
    "head version": lambda d, s: (_head_changed(d, version=d.log.value.tips[0].head.version + 1), s),
    "record": lambda d, s: (dataclasses.replace(d, records=_run(d, b"y" * 100)), s),
    "record type": lambda d, s: (dataclasses.replace(d, records=_run(d, "y" * 100)), s),  # type: ignore[arg-type]
    "records tuple": lambda d, s: (dataclasses.replace(d, records=tuple(d.records)), s),
    "no records": lambda d, s: (dataclasses.replace(d, records=RecordRun((), (), ())), s),
    "offset up": lambda d, s: (dataclasses.replace(d, from_offset=d.from_offset + 1), s),
    "offset down": lambda d, s: (dataclasses.replace(d, from_offset=d.from_offset - 1), s),
    "offset bool": lambda d, s: (dataclasses.replace(d, from_offset=True), s),
    "base fold": lambda d, s: (
        dataclasses.replace(d, log=dataclasses.replace(d.log, base_fold=bytes(32))),
        s,
    ),
    "log base": lambda d, s: (dataclasses.replace(d, log=dataclasses.replace(d.log, base=d.log.base - 1)), s),
    "meta": lambda d, s: (dataclasses.replace(d, meta=(("a", "b"),)), s),
    "meta list": lambda d, s: (dataclasses.replace(d, meta=list(d.meta)), s),
    "meta none": lambda d, s: (dataclasses.replace(d, meta=None), s),
    "meta odd": lambda d, s: (dataclasses.replace(d, meta=((1, 2),)), s),
    "name": lambda d, s: (dataclasses.replace(d, name="other"), s),
    "owner": lambda d, s: (dataclasses.replace(d, owner=bytes(32)), s),
    "owner type": lambda d, s: (dataclasses.replace(d, owner="x"), s),
    "kind": lambda d, s: (dataclasses.replace(d, kind=1), s),
    "bodies": lambda d, s: (dataclasses.replace(d, bodies=(d.log.value.tips[0].head,)), s),
    "steps none": lambda d, s: (d, None),
    "steps list": lambda d, s: (d, list(s)),
    "steps version": lambda d, s: (d, (s[0] - 1, s[1])),
    "steps version up": lambda d, s: (d, (s[0] + 1, s[1])),
    "steps version str": lambda d, s: (d, (str(s[0]), s[1])),
    "steps bytearray": lambda d, s: (d, (s[0], bytearray(s[1]))),
    "steps cut": lambda d, s: (d, (s[0], s[1][:-1])),
    "steps longer": lambda d, s: (d, (s[0], s[1] + s[1])),
    "steps empty": lambda d, s: (d, (s[0], b"")),
}
#: Which value the push is checked against: its own predecessor, or one out of order.
AGAINST = st.sampled_from([0, 0, -1, 1, -2])


def test_a_live_push_takes_the_one_pass_and_gives_the_generic_paths_values() -> None:
    states, pushes = _pushes()
    for i, message in enumerate(pushes):
        fast = core2_live.next_push(states[i], message.delta, message.steps)
        assert fast is not None, i  # the usual push is the fast path's
        same_push(fast, generic_push(states[i], message.delta, message.steps))
        assert fast[2].held == states[i + 1].held
        assert link_summary(fast[2]) == link_summary(states[i + 1])


@settings(max_examples=400, deadline=None)
@given(st.integers(0, N - 1), AGAINST, st.sampled_from(sorted(BAD)))
def test_bad_input_is_accepted_by_neither_path_or_by_both_alike(index: int, shift: int, bad: str) -> None:
    states, pushes = _pushes()
    state = states[max(0, min(N, index + shift))]
    message = pushes[index]
    try:
        d, steps = BAD[bad](message.delta, message.steps)
    except (TypeError, ValueError, AttributeError, LatticedError):
        return  # the mutation itself is not constructible here (a delta that cannot be built)
    try:
        fast = core2_live.next_push(state, d, steps)
    except Exception:  # anything raised sends the push to the generic path
        fast = None
    same_push(fast, generic_push(state, d, steps))
    if bad != "none" or state is not states[index]:
        assert fast is None, (bad, shift)
    ahead_alike(state, d, steps)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, N - 1), st.binary(min_size=1, max_size=8), st.integers(0, 7))
def test_steps_with_any_bytes_changed_are_refused_by_both_or_accepted_alike(
    index: int, noise: bytes, at: int
) -> None:
    states, pushes = _pushes()
    message = pushes[index]
    version, raw = message.steps
    changed = bytearray(raw)
    for k, byte in enumerate(noise):
        changed[(at + k) % len(changed)] ^= byte
    steps = (version, bytes(changed))
    fast = core2_live.next_push(states[index], message.delta, steps)
    same_push(fast, generic_push(states[index], message.delta, steps))
    ahead_alike(states[index], message.delta, steps)
