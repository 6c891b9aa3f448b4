"""The wire forms of core-2 queues (feature ``heads-v2``): every message round-trips, a decoded delta
verifies and joins as the one sent, and anything else a peer sends (any msgpack value, any field
replaced, too many branches, too large) is its RemoteProtocolError, never a crash."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.queue2_histories import OWNER, catch_up, empty, extend, states

from latticed.crdt import leaf_codec, queue2
from latticed.crdt import records as records_module
from latticed.crdt.core_errors import GapError, IntegrityError, MalformedError
from latticed.crdt.head2 import HeadV2, next_log
from latticed.crdt.leaf_bodies import decode_versions
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, RecordRun
from latticed.crdt.wire import pack
from latticed.errors import RemoteProtocolError
from latticed.protocol.core2_steps import pack_steps, unpack_steps
from latticed.protocol.core2_wire import (
    CORE2_CODES,
    MAX_TIPS,
    Ack2,
    AckHeld2,
    Delta2,
    Digest2,
    Have2,
    Message2,
    Prune2,
    Steps,
    Summary2,
    Want2,
    decode2,
    delta_to_wire,
    encode2,
    link_summary,
    summary_to_wire,
)
from latticed.protocol.replication_messages import decode_message, unpack_message

INT64 = st.integers(-(2**63), 2**64 - 1)
KEY = (OWNER.public_key, "q", 0)


def _decode(payload: bytes, max_bytes: int = 16 * 1024 * 1024) -> Message2:
    raw = unpack_message(payload, max_bytes)
    if raw[0] not in CORE2_CODES:
        raise RemoteProtocolError("not a core-2 message")
    return decode2(raw)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[QueueState2, QueueState2]:
    """Two replicas of one forked owner's queue (sometimes recovered in a new epoch)."""
    a, b = draw(states(2))
    return a, b


@st.composite
def deltas(draw: st.DrawFn) -> queue2.Delta:
    source, peer = draw(pairs())
    since = draw(st.sampled_from([None, queue2.summary(peer)]))
    return queue2.delta(source, since, draw(st.sampled_from([None, 1, 3])))


summaries = pairs().map(lambda p: link_summary(p[0]))
keys = st.tuples(st.binary(min_size=32, max_size=32), st.text(min_size=1, max_size=20), st.integers(0, 255))
messages: st.SearchStrategy[Message2] = st.one_of(
    st.builds(Digest2, st.lists(st.tuples(keys, summaries), max_size=3).map(tuple)),
    st.builds(Delta2, st.integers(0, 2**64 - 1), summaries, deltas()),
    st.builds(Ack2, st.integers(0, 2**64 - 1), keys, summaries),
    st.builds(AckHeld2, st.integers(0, 2**64 - 1)),
    st.builds(Have2, keys, summaries),
    st.builds(Want2, keys, st.none() | summaries),
    st.builds(Prune2, keys),
)


def _as_sent(message: Message2) -> Message2:
    """``message`` as the wire carries it: a delta's log leaves out how far the sender holds records
    (the receiver's own progress counts, ``epoch_delta``), and its bodies their signatures (a body
    vouches by being on the verified log)."""
    if not isinstance(message, Delta2):
        return message
    delta, log = message.delta, message.delta.log
    if log is not None:
        log = dataclasses.replace(log, value=dataclasses.replace(log.value, held_end=0))
    bodies = tuple(dataclasses.replace(b, signature=b"") for b in delta.bodies)
    return dataclasses.replace(message, delta=dataclasses.replace(delta, log=log, bodies=bodies))


@settings(max_examples=150, deadline=None)
@given(messages)
def test_every_core2_message_round_trips(message: Message2) -> None:
    assert _decode(encode2(message)) == _as_sent(message)


@settings(max_examples=100, deadline=None)
@given(pairs(), st.sampled_from([None, 1, 3]))
def test_a_decoded_delta_verifies_and_joins_as_the_one_sent(
    pair: tuple[QueueState2, QueueState2], size: int | None
) -> None:
    source, replica = pair
    sent = queue2.delta(source, queue2.summary(replica), size)
    received = _decode(encode2(Delta2(1, link_summary(source), sent)))
    assert isinstance(received, Delta2) and received == _as_sent(Delta2(1, link_summary(source), sent))
    outcomes = []
    for d in (sent, received.delta):
        try:
            outcomes.append(queue2.join_verified(replica, queue2.verify_delta(replica, d)))
        except Exception as exc:  # the same refusal for both (a GapError from a part-way summary)
            outcomes.append(type(exc))  # type: ignore[arg-type]
    assert outcomes[0] == outcomes[1]


@settings(max_examples=200, deadline=None)
@given(pairs())
def test_a_link_summary_is_queue2s_summary(pair: tuple[QueueState2, QueueState2]) -> None:
    for state in pair:
        assert link_summary(state).core == queue2.summary(state)


def test_a_forked_value_names_its_branches_in_its_summary() -> None:
    """Two forked values with the same shared leaves and records may hold other branches: their
    summaries differ by ``heads``, so the link exchanges them."""
    shared = extend(empty(), [("offer", 2)], b"s")[-1]
    one, two, three = (extend(shared, [("offer", 1)], tag)[-1] for tag in (b"a", b"b", b"c"))
    x, y = queue2.join(one, two), queue2.join(one, three)
    assert x.forked and y.forked and queue2.summary(x) == queue2.summary(y)
    assert link_summary(x) != link_summary(y) and link_summary(x).heads
    assert not link_summary(one).heads


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=48),
    lambda inner: st.lists(inner, max_size=9) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(CORE2_CODES)), st.lists(msgpack_values, max_size=6))
def test_any_fields_under_a_core2_type_decode_or_raise_the_typed_error(
    code: int, fields: list[object]
) -> None:
    with contextlib.suppress(RemoteProtocolError):
        _decode(pack([code, *fields]))


def _paths(value: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every position inside a nested layout (lists only)."""
    found = [prefix] if prefix else []
    if isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(_paths(item, (*prefix, i)))
    return found


def _layout(message: Message2) -> list[Any]:
    return unpack_message(encode2(message))


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_a_valid_message_with_any_nested_field_replaced_decodes_or_raises_the_typed_error(
    message: Message2, data: st.DataObject
) -> None:
    layout = _layout(message)
    path = data.draw(st.sampled_from(_paths(layout)))
    target = layout
    for i in path[:-1]:
        target = target[i]
    target[path[-1]] = data.draw(msgpack_values)
    with contextlib.suppress(RemoteProtocolError):
        _decode(pack(layout))


def _forked_delta() -> queue2.Delta:
    shared = extend(empty(), [("offer", 2)], b"s")[-1]
    value = queue2.join(*(extend(shared, [("offer", 1)], tag)[-1] for tag in (b"a", b"b")))
    return queue2.delta(value, None)


def test_too_many_branches_or_too_many_bytes_are_the_peers_error() -> None:
    d = _forked_delta()
    layout: list[Any] = [33, 1, summary_to_wire(link_summary(queue2.empty_state(*KEY))), delta_to_wire(d)]
    layout[3][3][4] = layout[3][3][4] * (MAX_TIPS // 2 + 1)
    with pytest.raises(RemoteProtocolError, match="branches"):
        _decode(pack(layout))
    good = encode2(Delta2(1, link_summary(queue2.empty_state(*KEY)), d))
    with pytest.raises(RemoteProtocolError, match="too large"):
        _decode(good, max_bytes=len(good) - 1)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda lay: lay[3].__setitem__(1, "a/b"),  # a name with a slash
        lambda lay: lay[3].__setitem__(2, 256),  # a kind past one byte
        lambda lay: lay[3][3].__setitem__(3, lay[3][3][3] + b"x"),  # leaves not 40 bytes each
        lambda lay: lay[3][3][4][0].__setitem__(0, lay[3][3][4][0][0][:-1]),  # a short signed head
        lambda lay: lay[3].__setitem__(5, -1),  # a negative first offset
        lambda lay: lay[2].__setitem__(3, 2**63),  # a held end past the last offset
        lambda lay: lay.append(None),  # an item too many
        lambda lay: lay[3][3].__setitem__(5, len(lay[3][3][4])),  # a start head naming no tip
        lambda lay: lay[3][3].__setitem__(5, -1),  # a negative tip index
    ],
)
def test_strict_decoding_refuses_malformed_deltas(mutate: Any) -> None:
    d = _forked_delta()
    layout = [33, 1, summary_to_wire(link_summary(queue2.empty_state(*KEY))), delta_to_wire(d)]
    mutate(layout)
    with pytest.raises(RemoteProtocolError):
        _decode(pack(layout))


def test_a_start_head_that_is_a_tips_head_travels_as_its_index() -> None:
    """Where the start did not move, the start head is the tip's own head: sent once, not twice."""
    value = extend(empty(), [("offer", 1), ("offer", 1)], b"s")[-1]
    d = queue2.delta(value, None)
    assert d.log is not None and d.log.value.start_head == d.log.value.tips[0].head
    wire = delta_to_wire(d)
    assert wire[3][5] == 0
    decoded = _decode(encode2(Delta2(1, link_summary(queue2.empty_state(*KEY)), d)))
    assert isinstance(decoded, Delta2) and decoded.delta.log is not None
    assert decoded.delta.log.value.start_head == d.log.value.start_head
    assert decoded.delta.log.value.tips == d.log.value.tips
    as_before = [*wire[:3], [*wire[3][:5], d.log.value.start_head.to_bytes()], *wire[4:]]
    assert len(pack(as_before)) - len(pack(wire)) >= 290


def test_a_v1_decoder_never_reads_a_core2_message_as_one_of_its_own() -> None:
    """The codes are new: a session without a core-2 part refuses them as unknown, as 0.2.0 does."""
    for message in (Prune2(KEY), Digest2(())):
        with pytest.raises(RemoteProtocolError, match="unknown message type"):
            decode_message(encode2(message))


def test_summaries_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        link_summary(queue2.empty_state(*KEY)).heads = b""  # type: ignore[misc]
    assert isinstance(link_summary(queue2.empty_state(*KEY)), Summary2)


def _apply(replica: QueueState2, d: queue2.Delta, steps: Steps | None = None) -> object:
    """What joining ``d`` (its steps rebuilt) does to ``replica``: the joined state, or the refusal."""
    try:
        return queue2.join_verified(replica, queue2.verify_delta(replica, unpack_steps(replica, d, steps)))
    except (GapError, IntegrityError, MalformedError) as exc:
        return type(exc)


@settings(max_examples=200, deadline=None)
@given(pairs(), st.sampled_from([None, 1, 2, 5]))
def test_a_delta_sent_with_steps_joins_as_the_whole_delta(
    pair: tuple[QueueState2, QueueState2], size: int | None
) -> None:
    """Bodies (and leaves) sent as steps after a body the receiver holds are rebuilt to the same delta:
    joining it does what joining the whole one does, through the wire. A receiver may lack the body the
    steps start from (a forked one, one whose records end below that head): that delta is a GapError
    (nothing joined), and the link's next offer, our whole value, joins as it would whole."""
    source, replica = pair
    since = queue2.summary(replica)
    whole = queue2.delta(source, since, size)
    packed, steps = pack_steps(source, whole, since.log.known)
    received = _decode(encode2(Delta2(1, link_summary(source), packed, steps)))
    assert isinstance(received, Delta2) and received.steps == steps
    outcome = _apply(replica, received.delta, received.steps)
    if outcome is GapError and _apply(replica, whole) is not GapError:
        whole = queue2.delta(source, None, size)
        packed, steps = pack_steps(source, whole)
    assert _apply(replica, packed, steps) == _apply(replica, whole)


def test_a_catch_up_of_single_offers_sends_bodies_as_steps() -> None:
    state = empty()
    for i in range(40):
        state = queue2.commit(state, OWNER, now_ms=1000 + i, records=[Record(value=b"v")])
    replica = catch_up(empty(), state, 1, 10)
    since = queue2.summary(replica)
    whole = queue2.delta(state, since, 10)
    packed, steps = pack_steps(state, whole, since.log.known)
    assert steps is not None and not packed.bodies and len(whole.bodies) == 10
    plain, stepped = (
        len(encode2(Delta2(1, link_summary(state), whole))),
        len(encode2(Delta2(1, link_summary(state), packed, steps))),
    )
    assert stepped < plain - 10 * 200  # about 3 bytes a version instead of a 232-byte body
    assert _apply(replica, packed, steps) == _apply(replica, whole)


def test_a_first_chunk_to_a_new_replica_sends_bodies_as_steps_after_its_first_body() -> None:
    """A replica that holds nothing has no body to start steps from: the chunk's first body travels
    whole and the others as steps after it, and it joins as the whole delta does."""
    state = empty()
    for i in range(40):
        state = queue2.commit(state, OWNER, now_ms=1000 + i, records=[Record(value=b"v")])
    for since in (None, queue2.summary(empty())):
        whole = queue2.delta(state, since, 10)
        packed, steps = pack_steps(state, whole)
        assert steps is not None and packed.bodies == whole.bodies[:1] and steps[0] == whole.bodies[0].version
        plain, stepped = (
            len(encode2(Delta2(1, link_summary(state), whole))),
            len(encode2(Delta2(1, link_summary(state), packed, steps))),
        )
        assert stepped < plain - 9 * 200
        got = _decode(encode2(Delta2(1, link_summary(state), packed, steps)))
        assert isinstance(got, Delta2) and _apply(empty(), got.delta, got.steps) == _apply(empty(), whole)


def test_a_whole_values_steps_over_records_of_another_branch_here_join_as_the_whole_value() -> None:
    """A copy of the owner's store that wrote its own records over the same offsets: the steps after the
    chunk's first body rebuild the sender's bodies from its start head's base, not from the chain of the
    records held here (another branch's), and the fork is proved as the whole value proves it."""
    common = extend(empty(), [("offer", 2)], b"c")[-1]
    mine = extend(common, [("offer", 3)], b"a")[-1]
    theirs = extend(common, [("offer", 2), ("offer", 2), ("truncate", 4), ("offer", 1), ("offer", 1)], b"b")[
        -1
    ]
    assert mine.held == (0, 5) and theirs.chains.start == 4  # we hold records where their chunk starts
    for size in (None, 2):
        whole = queue2.delta(theirs, None, size)
        packed, steps = pack_steps(theirs, whole)
        assert steps is not None and whole.from_offset == 4
        got = _decode(encode2(Delta2(1, link_summary(theirs), packed, steps)))
        assert isinstance(got, Delta2)
        joined = _apply(mine, got.delta, got.steps)
        assert (
            joined == _apply(mine, whole) and isinstance(joined, queue2.Merged) and joined.state.chains.forked
        )


@settings(max_examples=200, deadline=None)
@given(pairs(), st.sampled_from([None, 1, 2, 5]), st.booleans())
def test_a_delta_to_a_replica_that_holds_nothing_joins_as_the_whole_delta_with_steps(
    pair: tuple[QueueState2, QueueState2], size: int | None, summarised: bool
) -> None:
    source, _ = pair
    since = queue2.summary(empty()) if summarised else None
    whole = queue2.delta(source, since, size)
    packed, steps = pack_steps(source, whole)
    received = _decode(encode2(Delta2(1, link_summary(source), packed, steps)))
    assert isinstance(received, Delta2) and received.steps == steps
    assert _apply(empty(), received.delta, received.steps) == _apply(empty(), whole)


@settings(max_examples=300, deadline=None)
@given(pairs(), st.binary(max_size=80), st.integers(0, 8))
def test_any_steps_from_a_peer_rebuild_or_are_refused_with_a_typed_error(
    pair: tuple[QueueState2, QueueState2], raw: bytes, version: int
) -> None:
    source, replica = pair
    d = queue2.delta(source, queue2.summary(replica), 3)
    outcome = _apply(replica, d, (version, raw))
    refused = isinstance(outcome, type) and issubclass(outcome, (GapError, IntegrityError, MalformedError))
    assert refused or isinstance(outcome, queue2.Merged)


@settings(max_examples=200, deadline=None)
@given(pairs(), st.data())
def test_bodies_rebuilt_from_steps_have_the_leaves_leaf_codec_rebuilds(
    pair: tuple[QueueState2, QueueState2], data: st.DataObject
) -> None:
    """Over a run of versions a replica holds the records of, both decoders read the same steps alike."""
    source = pair[0]
    bodies = source.bodies
    if len(bodies) < 2:
        return
    first = data.draw(st.integers(0, len(bodies) - 2))
    prev, versions = bodies[first], list[HeadV2]()
    for body in bodies[first + 1 :]:  # one chain: a forked value holds bodies of several branches
        if body.version != prev.version + len(versions) + 1 or body.log != next_log(
            versions[-1] if versions else prev
        ):
            break
        versions.append(body)
    raw = leaf_codec.encode(prev, versions)
    try:
        expected = leaf_codec.decode(prev, raw, source.chain_at)
    except MalformedError:  # a start below what the replica holds: not ours to rebuild
        with pytest.raises(GapError):
            decode_versions(prev, raw, source.chain_at)
        return
    rebuilt = decode_versions(prev, raw, source.chain_at)
    assert (
        [b.leaf() if isinstance(b, HeadV2) else b for b in rebuilt]
        == expected
        == [b.leaf() for b in versions]
    )


def test_a_decoded_delta_keeps_its_records_as_one_run_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The records arrive as a checked run (columns, as core 1's): verifying them checks none again,
    and the run verifies and joins as the tuple that was sent."""
    source = empty()
    for i in range(3):
        records = [Record(value=b"%d.%d" % (i, j), timestamp=i) for j in range(50)]
        source = queue2.commit(source, OWNER, now_ms=i, records=records)
    sent = queue2.delta(source, None)
    received = _decode(encode2(Delta2(1, link_summary(source), sent)))
    assert isinstance(received, Delta2) and type(received.delta.records) is RecordRun
    checked: list[Record] = []
    monkeypatch.setattr(records_module, "check_record", checked.append)
    verified = queue2.verify_delta(empty(), received.delta)
    assert not checked and type(verified.records) is RecordRun
    assert queue2.join_verified(empty(), verified) == queue2.join_verified(
        empty(), queue2.verify_delta(empty(), sent)
    )


def test_a_deltas_records_go_out_as_the_rows_of_core_1s_wire() -> None:
    """Records are encoded from columns: the same bytes as one row per record, headers included."""
    state = empty()
    records = [Record(value=b"v%d" % i, key=b"k" if i % 2 else None, timestamp=i) for i in range(20)]
    records[3] = Record(value=b"h", timestamp=3, headers=(("a", b"1"), ("b", b"2")))
    state = queue2.commit(state, OWNER, now_ms=1, records=records)
    d = queue2.delta(state, None)
    rows = [[r.key, r.value, r.timestamp, [[k, v] for k, v in r.headers]] for r in d.records]
    assert pack(delta_to_wire(d)[6]) == pack(rows)


def test_an_ack_of_what_the_delta_carried_is_its_seq_alone_and_other_lengths_are_refused() -> None:
    assert len(encode2(AckHeld2(7))) == 3 and _decode(encode2(AckHeld2(7))) == AckHeld2(7)
    for layout in ([34], [34, -1], [34, b"x"], [34, 1, 2], [34, 1, b"o" * 32, "q"]):
        with pytest.raises(RemoteProtocolError):
            _decode(pack(layout))
