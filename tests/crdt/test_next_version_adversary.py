"""review22c: pushes crafted from valid ones against ``replica_deltas._next_version`` (the direct path
for a relay's next version). Each must get the full path's verdict and value; none that is not the
relay's next version on the owner's one history may be taken on the direct path. The pushes travel
through the wire codec (``core2_wire``) and are rebuilt from their steps as a relay rebuilds them."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.queue2_histories import OWNER, Step, empty, extend, step
from test_next_version_direct import both, full_path_only, live, outcome, relayed

from latticed.crdt import queue2
from latticed.crdt.core_errors import GapError, TamperedError
from latticed.crdt.epoch_delta import LogDelta
from latticed.crdt.lazy_bodies import LazyDecoded
from latticed.crdt.queue2 import QueueState2, replica_deltas
from latticed.crdt.queue2.chain_state import cut
from latticed.crdt.records import Record
from latticed.crdt.wire import pack, unpack
from latticed.errors import LatticedError
from latticed.protocol.core2_steps import Outgoing2, unpack_steps
from latticed.protocol.core2_wire import Steps, delta_from_wire, delta_to_wire

histories = st.lists(step, min_size=1, max_size=5)


def wired(relay: QueueState2, out: Outgoing2, **changes: object) -> queue2.Delta:
    """``out`` as it arrives (encoded, ``changes`` made on the wire, decoded) and rebuilt from its steps."""
    raw = unpack(pack(delta_to_wire(out.delta, out.steps)))
    names = ["owner", "name", "kind", "log", "meta", "from_offset", "records", "bodies"]
    for name, value in changes.items():
        raw[names.index(name)] = value
    d, steps = delta_from_wire(raw)
    return unpack_steps(relay, d, steps)


def arrived(out: Outgoing2) -> tuple[queue2.Delta, Steps | None]:
    return delta_from_wire(unpack(pack(delta_to_wire(out.delta, out.steps))))


def refused_alike(relay: QueueState2, d: queue2.Delta) -> object:
    """Asserts the direct path does not take ``d`` and both paths refuse it; returns the error type."""
    assert replica_deltas._next_version(relay, d) is None
    verdict, error = both(relay, d)
    assert verdict == "refused"
    return error


def test_an_honest_push_through_the_wire_takes_the_direct_path() -> None:
    owner, relay, out = relayed([("offer", 2), ("meta", 1), ("offer", 1)])
    d = wired(relay, out)
    assert type(d.bodies) is LazyDecoded and isinstance(d.log, LogDelta)
    direct = replica_deltas._next_version(relay, d)
    assert direct is not None
    with full_path_only():
        assert direct == queue2.verify_delta(relay, d)
    assert queue2.join_verified(relay, direct).state == owner


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, name=st.sampled_from(["q2", "other"]))
def test_another_queues_valid_push_is_not_taken(history: list[Step], name: str) -> None:
    """The owner's same history on another queue: each head validly signed, of another queue id. Sent
    under its own name (the relay's state is another queue's) or renamed on the wire to ours."""
    _, relay, _ = relayed(history)
    other = [queue2.empty_state(OWNER.public_key, name)]
    other += extend(other[0], [("offer", 1), *history, ("offer", 2)], b"h")
    out = live(other[-1], other[-2])
    try:
        renamed = wired(relay, out, name="q")
    except (ValueError, LatticedError):
        renamed = None  # the steps do not rebuild against our heads: refused before verification
    if renamed is not None:
        refused_alike(relay, renamed)
    as_sent = unpack_steps(other[-2], *arrived(out))
    assert replica_deltas._next_version(relay, as_sent) is None
    assert outcome(relay, as_sent)[0] == "refused"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, back=st.integers(1, 4))
def test_a_replayed_older_push_is_not_taken(history: list[Step], back: int) -> None:
    """An earlier push of the owner, validly signed, sent again to a relay that is past it."""
    line = extend(empty(), [("offer", 1), *history, ("offer", 2)], b"h")
    relay = line[-1]
    k = max(1, len(line) - 1 - back)
    old = live(line[k], line[k - 1])
    try:
        d = wired(relay, old)
    except (ValueError, LatticedError):
        return  # its steps follow a version we no longer rebuild from: refused before verification
    assert replica_deltas._next_version(relay, d) is None
    verdict, value = both(relay, d)
    if verdict == "accepted":  # an old push adds nothing
        assert isinstance(value, tuple) and value[1] == relay


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, dup=st.booleans())
def test_metadata_of_another_head_with_its_valid_hash_is_refused(history: list[Step], dup: bool) -> None:
    """The push's metadata swapped for metadata whose hash some other head signed (the relay's own
    when the push changes it, an older one when it does not)."""
    line = extend(empty(), [("offer", 1), ("meta", 0), *history], b"h")
    relay = line[-1]
    lasts: list[Step] = [("meta", 1), ("offer", 2)]
    for last in lasts:
        owner = extend(relay, [last], b"z")[-1]
        out = live(owner, relay)
        stale = [list(p) for p in (line[0].meta if last[0] == "offer" else relay.meta)]
        if stale == [list(p) for p in owner.meta]:
            continue  # the same metadata: nothing swapped
        assert refused_alike(relay, wired(relay, out, meta=stale)) is TamperedError


def test_metadata_with_a_repeated_key_gets_one_verdict_on_both_paths() -> None:
    """Pairs whose dict is the signed metadata but which repeat a key: accepted on
    both paths, as 0.2.0 accepts them (the signature covers the hash of the dict), and kept in the
    owner's form, sorted and each key once (fix23: docs/protocol.md, "Metadata"); a repeated key whose
    last value is not the signed one is refused."""
    owner, relay, out = relayed([("meta", 1)])
    pairs = [list(p) for p in owner.meta]
    for sent in ([[pairs[0][0], "shadowed"], *pairs], [*pairs, *pairs]):
        d = wired(relay, out, meta=sent)
        direct = replica_deltas._next_version(relay, d)
        assert direct is not None and direct.meta == owner.meta
        verdict, value = both(relay, d)
        assert verdict == "accepted" and isinstance(value, tuple)
        assert value[1].meta == owner.meta
    assert refused_alike(relay, wired(relay, out, meta=[*pairs, [pairs[0][0], "shadowed"]])) is TamperedError


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, mine=histories, theirs=histories)
def test_a_forks_valid_next_version_from_another_history_is_not_taken(
    history: list[Step], mine: list[Step], theirs: list[Step]
) -> None:
    """The owner signed two histories past a shared prefix; the relay holds one, at version v, and is
    sent the other's own push to version v + 1 (its base v, its fold the other history's)."""
    shared = extend(empty(), [("offer", 1), *history], b"s")
    a = extend(shared[-1], [*mine, ("offer", 1)], b"a")
    b = extend(shared[-1], [*theirs, ("offer", 1), ("offer", 2)], b"b")
    relay = a[-1]
    v = relay.chains.tips[0].head.version
    at = next((i for i, s in enumerate(b) if s.chains.tips[0].head.version == v + 1), None)
    if at is None or at == 0:
        return
    out = live(b[at], b[at - 1])
    try:
        d = wired(relay, out)
    except (ValueError, LatticedError):
        return
    if b[at - 1].chains.tips[0].head == relay.chains.tips[0].head:
        return  # one history after all (the same tags and steps)
    assert replica_deltas._next_version(relay, d) is None
    both(relay, d)


def test_a_run_whose_claims_lie_is_not_taken() -> None:
    """A decode's run that is not over these records, from this chain value, at our end, or not the
    signed head's body: the direct path leaves it to the full path (which refuses or walks it)."""
    _, relay, out = relayed([("offer", 2), ("offer", 1)])
    d = wired(relay, out)
    run = d.bodies
    assert type(run) is LazyDecoded
    hi = relay.held[1]
    lies = [
        LazyDecoded(run.head, run.run, run.leaves, first=hi, base=run.base, records=tuple(d.records)),
        LazyDecoded(run.head, run.run, run.leaves, first=hi - 1, base=run.base, records=run.records),
        LazyDecoded(run.head, run.run, run.leaves, first=hi, base=bytes(32), records=run.records),
    ]  # equal records but not these very ones; another first offset; another chain value
    for lie in lies:
        forged = dataclasses.replace(d, bodies=lie)
        assert replica_deltas._next_version(relay, forged) is None
        both(relay, forged)
    other = [(bytes(32), run.leaves[0][1])]
    step_lie = type(run.run)(
        run.run.prev, tuple(other), run.run._logs, bytes(run.run._stamps), run.run._window
    )
    forged = dataclasses.replace(
        d,
        bodies=LazyDecoded(
            run.head, step_lie, tuple(other), first=run.first, base=run.base, records=run.records
        ),
    )
    assert refused_alike(relay, forged) is TamperedError


def test_records_of_the_right_count_but_other_content_are_refused() -> None:
    _, relay, out = relayed([("offer", 2)])
    d, steps = arrived(out)
    swapped = dataclasses.replace(d, records=tuple(Record(value=b"x%d" % i) for i in range(len(d.records))))
    try:
        rebuilt = unpack_steps(relay, swapped, steps)
    except (ValueError, LatticedError) as exc:
        assert isinstance(exc, LatticedError | ValueError)
        return
    assert refused_alike(relay, rebuilt) in (TamperedError, GapError)


def test_a_start_head_above_the_push_keeps_the_push_off_the_direct_path() -> None:
    """A value whose start head (the highest signed start) is not its newest head: the owner once signed
    a lower start after a higher one. A plain next version keeps the newest head's start, so it ranks
    below that start head, which stays: the direct path, which would make the new head the start head,
    must leave it to the full path (one verdict and value: accepted, that start head kept)."""
    _, relay, out = relayed([("offer", 3), ("truncate", 1), ("offer", 1)])
    ours = relay.chains.tips[0].head
    higher = dataclasses.replace(ours, version=ours.version - 1, start=ours.start + 1, signature=b"")
    higher = higher.signed(OWNER)
    value = cut(relay, dataclasses.replace(relay.chains, start_head=higher))  # its records from there
    d = wired(value, out)
    assert replica_deltas._next_version(value, d) is None
    verdict, joined = both(value, d)
    assert verdict == "accepted" and isinstance(joined, tuple)
    assert joined[1].chains.start_head == higher


def test_a_log_of_another_epoch_around_our_next_head_is_not_taken() -> None:
    """Our valid next head under a log that names another epoch (the wire's steps refuse it before
    verification; a delta built otherwise reaches ``verify_delta``): the full path merges no records
    of another epoch's log, so the direct path must not take it."""
    _, relay, out = relayed([("offer", 2)])
    d = wired(relay, out)
    assert d.log is not None and replica_deltas._next_version(relay, d) is not None
    log = dataclasses.replace(d.log, value=dataclasses.replace(d.log.value, epoch=d.log.value.epoch + 1))
    assert refused_alike(relay, dataclasses.replace(d, log=log)) is not None


def test_leaves_added_beside_our_next_head_are_not_taken() -> None:
    """An honest push with leaves added to its log on the wire (the head's signed log does not fold
    them): the direct path, which folds none, must leave it to the full path, which refuses it."""
    _, relay, out = relayed([("offer", 2)])
    raw = unpack(pack(delta_to_wire(out.delta, out.steps)))
    ours = relay.chains.tips[0].head
    raw[3][3] = ours.leaf()[0] + ours.end.to_bytes(8, "big")
    rebuilt = unpack_steps(relay, *delta_from_wire(raw))
    assert rebuilt.log is not None and rebuilt.log.value.shared
    assert refused_alike(relay, rebuilt) is not None
