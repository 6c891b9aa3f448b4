"""A live push that is exactly a relay's next version is checked on a direct path
(``replica_deltas._next_version``): it must accept and refuse what the full path of
``queue2.verify_delta`` accepts and refuses, with the same verified delta and joined value, on the
owner's real pushes (offers, truncations, metadata, touches) and on pushes forged on the wire."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.queue2_histories import OWNER, Step, empty, extend, step

from latticed.crdt import queue2
from latticed.crdt.core_errors import TamperedError
from latticed.crdt.epoch_delta import LogDelta
from latticed.crdt.lazy_bodies import LazyDecoded
from latticed.crdt.queue2 import QueueState2, next_version, replica_deltas
from latticed.crdt.queue2.delta_values import Verified
from latticed.crdt.records import Record
from latticed.errors import LatticedError
from latticed.protocol.core2_steps import Outgoing2, outgoing, unpack_steps

Outcome = tuple[str, object]


@contextmanager
def full_path_only() -> Iterator[None]:
    with mock.patch.object(replica_deltas, "_next_version", lambda state, d: None):
        yield


def outcome(relay: QueueState2, d: queue2.Delta) -> Outcome:
    """What ``verify_delta`` then ``join_verified`` make of ``d``: the error's type, or the verified
    delta's fields and the joined value with its bodies."""
    try:
        v = queue2.verify_delta(relay, d)
    except (LatticedError, ValueError) as exc:
        return "refused", type(exc)
    joined = queue2.join_verified(relay, v).state
    fields = (v.chains, v.meta, v.from_offset, tuple(v.records), v.chain, tuple(v.bodies))
    return "accepted", (fields, joined, tuple(joined.bodies))


def both(relay: QueueState2, d: queue2.Delta) -> Outcome:
    """The two paths' outcomes, asserted equal."""
    direct = outcome(relay, d)
    with full_path_only():
        full = outcome(relay, d)
    assert direct == full
    return direct


def live(owner: QueueState2, relay: QueueState2) -> Outgoing2:
    out = outgoing(owner, queue2.summary(relay), 64)
    assert out is not None
    return out


def flipped(raw: bytes, at: int) -> bytes:
    at %= len(raw)
    return raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]


def _head(d: queue2.Delta, **changes: object) -> queue2.Delta:
    assert d.log is not None
    tip = d.log.value.tips[0]
    head = dataclasses.replace(tip.head, **changes)  # type: ignore[arg-type]
    start = head if d.log.value.start_head == tip.head else d.log.value.start_head
    value = dataclasses.replace(d.log.value, tips=(dataclasses.replace(tip, head=head),), start_head=start)
    return dataclasses.replace(d, log=dataclasses.replace(d.log, value=value))


def _log(d: queue2.Delta, **changes: object) -> queue2.Delta:
    assert d.log is not None
    return dataclasses.replace(d, log=dataclasses.replace(d.log, **changes))  # type: ignore[arg-type]


def _records(d: queue2.Delta, at: int) -> queue2.Delta:
    records = list(d.records)
    records[at % len(records)] = Record(value=b"forged", timestamp=records[at % len(records)].timestamp)
    return dataclasses.replace(d, records=tuple(records))


#: Forgeries of a push as it travels (before the relay rebuilds its bodies from the steps).
FORGE: dict[str, Callable[[queue2.Delta, int], queue2.Delta]] = {
    "record": _records,
    "record dropped": lambda d, at: dataclasses.replace(d, records=tuple(d.records)[:-1]),
    "record added": lambda d, at: dataclasses.replace(d, records=(*d.records, Record(value=b"x"))),
    "from offset": lambda d, at: dataclasses.replace(d, from_offset=d.from_offset + (1 if at % 2 else -1)),
    "signature": lambda d, at: _head(d, signature=flipped(d.log.value.tips[0].head.signature, at)),  # type: ignore[union-attr]
    "timestamp": lambda d, at: _head(d, timestamp=at + 1),
    "end": lambda d, at: _head(d, end=d.log.value.tips[0].head.end + 1),  # type: ignore[union-attr]
    "version": lambda d, at: _head(d, version=d.log.value.tips[0].head.version + 1),  # type: ignore[union-attr]
    "head hash": lambda d, at: _head(d, head_hash=bytes(32)),
    "meta hash": lambda d, at: _head(d, meta_hash=bytes(32)),
    "start": lambda d, at: _head(d, start=at % 4),
    "meta": lambda d, at: dataclasses.replace(d, meta=(("k", "forged"),)),
    "meta dropped": lambda d, at: dataclasses.replace(d, meta=None),
    "base fold": lambda d, at: _log(d, base_fold=flipped(d.log.base_fold, at)),  # type: ignore[union-attr]
    "base": lambda d, at: _log(d, base=d.log.base + (1 if at % 2 else -1)),  # type: ignore[union-attr]
    "name": lambda d, at: dataclasses.replace(d, name="other"),
    "owner": lambda d, at: dataclasses.replace(d, owner=bytes(32)),
}


def relayed(history: list[Step]) -> tuple[QueueState2, QueueState2, Outgoing2]:
    """The owner after ``history`` plus one offer, a relay fed each of its heads as a live push but the
    last, and that last push as the owner sends it; every push on the way checked on both paths."""
    relay = empty()
    *line, owner = extend(relay, [("offer", 1), *history, ("offer", 2)], b"h")
    for state in line:
        out = live(state, relay)
        verdict, value = both(relay, unpack_steps(relay, out.delta, out.steps))
        assert verdict == "accepted" and isinstance(value, tuple)
        relay = value[1]
    return owner, relay, live(owner, relay)


histories = st.lists(step, min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, more=st.integers(1, 3))
def test_the_owners_pushes_are_accepted_alike_and_join_to_the_owners_value(
    history: list[Step], more: int
) -> None:
    owner, relay, _ = relayed(history)
    state = owner
    for i in range(more):
        state = queue2.commit(state, OWNER, now_ms=10_000 + i, records=[Record(value=b"n%d" % i)] * (i + 1))
        out = live(state, relay)
        verdict, value = both(relay, unpack_steps(relay, out.delta, out.steps))
        assert verdict == "accepted" and isinstance(value, tuple)
        relay = value[1]
        assert relay == state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, forge=st.sampled_from(sorted(FORGE)), at=st.integers(0, 300))
def test_a_forged_push_gets_one_verdict_on_both_paths(history: list[Step], forge: str, at: int) -> None:
    owner, relay, out = relayed(history)
    try:
        forged = FORGE[forge](out.delta, at)
    except (ValueError, LatticedError):
        return  # not a head the library builds: the wire's decode refuses it before any check
    try:
        d = unpack_steps(relay, forged, out.steps)
    except (ValueError, LatticedError):
        return  # refused before verification: neither path sees it
    verdict, value = both(relay, d)
    if verdict == "accepted":  # only what changes nothing checked: e.g. a dropped record, a shorter push
        assert isinstance(value, tuple)
        assert value[1].held[1] <= owner.held[1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, at=st.integers(0, 10_000))
def test_changed_steps_get_one_verdict_on_both_paths(history: list[Step], at: int) -> None:
    _, relay, out = relayed([*history, ("offer", 1)])  # the relay holds the body the steps follow
    assert out.steps is not None
    version, raw = out.steps
    try:
        d = unpack_steps(relay, out.delta, (version, flipped(raw, at)))
    except (ValueError, LatticedError):
        return
    both(relay, d)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, at=st.integers(0, 300))
def test_records_swapped_under_a_rebuilt_run_are_refused_on_both_paths(history: list[Step], at: int) -> None:
    """The run's claims (rebuilt over these very records) are checked, not assumed: records swapped
    after the relay rebuilt the bodies are refused as the walk refuses them."""
    _, relay, out = relayed([*history, ("offer", 1)])
    d = unpack_steps(relay, out.delta, out.steps)
    assert type(d.bodies) is LazyDecoded
    assert both(relay, _records(d, at)) == ("refused", TamperedError)


def test_a_relays_live_push_takes_the_direct_path_and_a_forged_one_does_not() -> None:
    owner, relay, out = relayed([("offer", 2), ("meta", 0), ("offer", 1)])
    d = unpack_steps(relay, out.delta, out.steps)
    assert type(d.bodies) is LazyDecoded and isinstance(d.log, LogDelta)
    direct = next_version.next_version(relay, d)
    assert type(direct) is Verified  # the values' own module's class, as queue2 exports it
    assert Verified is queue2.Verified
    with full_path_only():
        assert direct == queue2.verify_delta(relay, d)
    assert queue2.join_verified(relay, direct).state == owner
    forged = unpack_steps(relay, FORGE["signature"](out.delta, 7), out.steps)
    assert next_version.next_version(relay, forged) is None
    assert both(relay, forged)[0] == "refused"
