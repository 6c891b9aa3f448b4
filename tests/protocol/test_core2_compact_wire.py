"""The compact forms of core-2 messages (``compact`` and ``heads-v2`` agreed): what a link leaves out is
rebuilt to the exact signed bytes, whatever the history and whatever the link carried before; a live
one-record DELTA2 is about the record and a signature; anything else a peer sends is its
RemoteProtocolError; the memory a peer can make a link keep is bounded. Sans-IO, no sockets."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core2_push import push_delta2
from support.queue2_histories import OWNER, empty, states

from latticed.crdt import queue2
from latticed.crdt.core_errors import GapError, IntegrityError, MalformedError
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.wire import pack
from latticed.errors import RemoteProtocolError
from latticed.protocol import core2_compact
from latticed.protocol.core2_compact import COMPACT2_CODES, Compact2Link
from latticed.protocol.core2_session import Core2Link
from latticed.protocol.core2_steps import outgoing, unpack_steps
from latticed.protocol.core2_wire import (
    CACKS2,
    CDELTA2,
    CDIGEST2,
    CORE2_CODES,
    CORE2_NAMES,
    DIGEST2,
    Ack2,
    AckHeld2,
    AckRun2,
    Delta2,
    Digest2,
    Have2,
    Message2,
    Prune2,
    Want2,
    encode2,
    link_summary,
    summary_to_wire,
)
from latticed.protocol.replication_messages import unpack_message
from latticed.protocol.versions import HEADS_V2

KEY = (OWNER.public_key, "q", 0)
OTHER = (OWNER.public_key, "r", 0)
BOTH = frozenset({HEADS_V2, "compact"})
INT64 = st.integers(-(2**63), 2**64 - 1)
SUMMARY = summary_to_wire(link_summary(empty()))


def _as_sent(message: Message2) -> Message2:
    """``message`` as any core-2 form carries it: a log without the sender's records end, bodies
    without signatures (as in test_core2_wire)."""
    if not isinstance(message, Delta2):
        return message
    delta, log = message.delta, message.delta.log
    if log is not None:
        log = dataclasses.replace(log, value=dataclasses.replace(log.value, held_end=0))
    bodies = tuple(dataclasses.replace(b, signature=b"") for b in delta.bodies)
    return dataclasses.replace(message, delta=dataclasses.replace(delta, log=log, bodies=bodies))


def _through(sender: Compact2Link, receiver: Compact2Link, message: Message2) -> Message2:
    raw = unpack_message(sender.encode(message))
    assert raw[0] in COMPACT2_CODES or isinstance(message, AckHeld2)
    return receiver.decode(raw) if raw[0] in COMPACT2_CODES else message


def _apply(replica: QueueState2, message: Delta2) -> object:
    """What joining the delta (its steps rebuilt) does to ``replica``: the joined state, or the refusal."""
    try:
        whole = unpack_steps(replica, message.delta, message.steps)
        return queue2.join_verified(replica, queue2.verify_delta(replica, whole))
    except (GapError, IntegrityError, MalformedError) as exc:
        return type(exc)


def _live(n: int, gap_ms: int = 200) -> tuple[QueueState2, list[tuple[QueueState2, Delta2]]]:
    """A queue of 20 records, then ``n`` single offers of 100 bytes and the DELTA2 each goes out as
    (from the summary of the replica that joined the one before, as a live stream's link does)."""
    state = empty()
    for i in range(20):
        state = queue2.commit(state, OWNER, now_ms=1_700_000_000_000 + i, records=[Record(bytes(100))])
    start, out = state, []
    for i in range(n):
        before = state
        now = 1_700_000_001_000 + gap_ms * i
        state = queue2.commit(
            state, OWNER, now_ms=now, records=[Record(bytes([i % 256]) * 100, timestamp=now)]
        )
        out.append((before, push_delta2(before, state, 300 + i)))
    return start, out


def test_a_live_one_record_delta2_is_the_record_a_signature_and_little_else() -> None:
    """A 100-byte record's DELTA2 is ~600 bytes in full; on a compact link, once the queue has a number
    and a ref, about 220: the signed head rebuilt from the last one, the summary implied."""
    _, pushes = _live(4)
    sender, receiver = Compact2Link(), Compact2Link()
    sizes = []
    for replica, message in pushes:
        wire = sender.encode(message)
        got = receiver.decode(unpack_message(wire))
        assert got == _as_sent(message)
        assert isinstance(_apply(replica, got), queue2.Merged)  # the signature holds over rebuilt bytes
        sizes.append((len(encode2(message)), len(wire)))
    assert all(full >= 580 for full, _ in sizes), sizes
    assert all(compact <= 222 for _, compact in sizes[1:]), sizes
    assert unpack_message(sender.encode(pushes[-1][1]))[3] is None  # the sender's summary is implied


@settings(max_examples=150, deadline=None)
@given(
    states(4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from([None, 1, 3])), max_size=6),
)
def test_a_stream_of_deltas_from_any_histories_decodes_to_the_deltas_sent_and_joins_as_they_do(
    values: list[QueueState2], sends: list[tuple[int, int, int | None]]
) -> None:
    """Deltas of one queue from copies that forked, recovered or lag, in any order over one link: each
    compact field is rebuilt from whatever the link carried last, exactly, or sent."""
    sender, receiver = Compact2Link(), Compact2Link()
    for seq, (source, target, size) in enumerate(sends):
        since = queue2.summary(values[target])
        sent = outgoing(values[source], since, size or 4096)
        message = Delta2(seq, link_summary(values[source]), sent.delta, sent.steps)
        got = _through(sender, receiver, message)
        assert got == _as_sent(message)
        assert isinstance(got, Delta2)
        assert _apply(values[target], got) == _apply(values[target], message)


summaries = states(1).map(lambda v: link_summary(v[0]))
keys = st.tuples(st.binary(min_size=32, max_size=32), st.text(min_size=1, max_size=20), st.integers(0, 255))
others: st.SearchStrategy[Message2] = st.one_of(
    st.builds(Digest2, st.lists(st.tuples(keys, summaries), max_size=3).map(tuple)),
    st.builds(Ack2, st.integers(0, 2**64 - 1), keys, st.none() | summaries),
    st.builds(AckHeld2, st.integers(0, 2**64 - 1)),
    st.integers(2, 2**64 - 1).flatmap(lambda n: st.builds(AckRun2, st.integers(0, 2**64 - n), st.just(n))),
    st.builds(Have2, keys, summaries),
    st.builds(Want2, keys, st.none() | summaries),
    st.builds(Prune2, keys),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(others, max_size=8))
def test_every_other_message_round_trips_naming_its_queue_by_number_once_known(
    messages: list[Message2],
) -> None:
    sender, receiver = Compact2Link(), Compact2Link()
    named: set[Any] = set()
    for message in messages:
        raw = unpack_message(sender.encode(message))
        assert receiver.decode(raw) == message if raw[0] in COMPACT2_CODES else isinstance(message, AckHeld2)
        if isinstance(message, Digest2):
            named.update(k for k, _ in message.entries)
        key = getattr(message, "key", None)
        if key is not None:
            assert (type(raw[-2 if not isinstance(message, Prune2) else -1]) is int) == (key in named)
            named.add(key)


def test_a_link_computes_a_queues_id_once_at_its_first_delta(monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay decodes a delta per record, and a link's digest may number thousands of queues: a queue's
    id (a hash of its names) is computed at its first delta and kept with the link's memory of it."""
    _, pushes = _live(5)
    sender, receiver = Compact2Link(), Compact2Link()
    hashed: list[tuple[Any, ...]] = []
    real = core2_compact.fresh_queue_id

    def counted(*key: Any) -> bytes:
        hashed.append(key)
        return real(*key)

    monkeypatch.setattr(core2_compact, "fresh_queue_id", counted)
    digest = Digest2(((KEY, link_summary(pushes[0][0])), (OTHER, link_summary(empty()))))
    receiver.decode(unpack_message(sender.encode(digest)))
    assert hashed == []
    for _, message in pushes:
        assert receiver.decode(unpack_message(sender.encode(message))) == _as_sent(message)
    assert hashed == [KEY, KEY]  # once each side


def test_a_field_the_receiver_cannot_rebuild_is_a_protocol_error() -> None:
    _, pushes = _live(2)
    sender = Compact2Link()
    first, second = (unpack_message(sender.encode(m)) for _, m in pushes)
    with pytest.raises(RemoteProtocolError, match="never numbered"):
        Compact2Link().decode(second)  # names queue 0, which this link never numbered
    second[2] = list(KEY)  # named in full, but it continues a chunk never carried
    with pytest.raises(RemoteProtocolError, match="not carried"):
        Compact2Link().decode(second)
    second[6] = 21  # with its offset, the head's counters read as absolute and its hashes are still left out
    with pytest.raises(RemoteProtocolError, match="cannot rebuild"):
        Compact2Link().decode(second)
    receiver = Compact2Link()
    receiver.decode(first)
    dropped = unpack_message(sender.encode(pushes[1][1]))  # a third delta, decoded after only the first
    with pytest.raises(RemoteProtocolError):
        Compact2Link().decode(dropped)


@pytest.mark.parametrize("mutate", ["signature", "record", "timestamp"])
def test_a_forged_signature_or_changed_field_fails_verification_over_the_rebuilt_bytes(mutate: str) -> None:
    _, pushes = _live(2)
    sender, receiver = Compact2Link(), Compact2Link()
    receiver.decode(unpack_message(sender.encode(pushes[0][1])))
    raw = unpack_message(sender.encode(pushes[1][1]))
    head = raw[4][4][0][0]
    assert head[5] is None  # the head hash is rebuilt from the records
    if mutate == "signature":
        head[9] = bytes(64)
    elif mutate == "record":
        raw[7][0][1] = b"y" * 100
    else:
        head[8] += 1
    got = receiver.decode(raw)
    assert isinstance(got, Delta2)
    outcome = _apply(pushes[1][0], got)
    assert isinstance(outcome, type) and issubclass(outcome, IntegrityError)


def test_a_summary_left_out_where_the_delta_implies_none_is_a_protocol_error() -> None:
    _, pushes = _live(1)
    raw = unpack_message(Compact2Link().encode(pushes[0][1]))
    raw[4] = None  # no log: nothing implies a summary
    raw[3] = None
    with pytest.raises(RemoteProtocolError, match="summary"):
        Compact2Link().decode(raw)


def test_a_links_memory_is_bounded_by_the_queues_it_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer naming ever new queues makes the link keep at most MAX_REFS of them; past that they travel
    (and are read) in full, and nothing more is remembered."""
    monkeypatch.setattr(core2_compact, "MAX_REFS", 3)
    sender, receiver = Compact2Link(), Compact2Link()
    keys = [(OWNER.public_key, f"q{i}", 0) for i in range(6)]
    for _ in range(2):
        for key in keys:
            raw = unpack_message(sender.encode(Prune2(key)))
            assert receiver.decode(raw) == Prune2(key)
            assert (type(raw[1]) is int) == (key in keys[:3] and _ > 0)
    memory = receiver._in  # the bound is the point
    assert len(memory.keys) == len(memory.queues) == len(memory.numbers) == 3


@pytest.mark.parametrize(
    "raw",
    [
        [CDELTA2],
        [CDELTA2, 1, 0, None, None, None, 0, [], [], None],  # queue 0 never numbered
        [CDELTA2, -1, list(KEY), None, None, None, 0, [], [], None],
        [CDELTA2, 1, list(KEY), None, None, None, 0, [], [], [0, "x"]],
        [CDELTA2, 1, [KEY[0], "a/b", 0], [0, 0, b"", 0, b"", b""], None, None, 0, [], [], None],
        [CDELTA2, 1, list(KEY), None, [0, None, 0, b"", [[[1] * 10, b""]], None], None, 0, [], [], None],
        [CDELTA2, 1, list(KEY), None, [0, None, 0, b"", [[b"x", b""]], None], None, 0, [], [], None],
        [CDELTA2, 1, list(KEY), None, [0, None, 0, b"x", [], None], None, 0, [], [], None],
        [CDELTA2, 1, list(KEY), SUMMARY, None, None, 0, [[None, b"v", "t", []]], [], None],  # not a step
        [
            CDELTA2,
            1,
            list(KEY),
            SUMMARY,
            None,
            None,
            0,
            [[None, b"v", 2**63 - 1, []], [None, b"v", 1, []]],
            [],
            None,
        ],
        [CDELTA2, 1, list(KEY), SUMMARY, None, None, 0, [[None, b"v", 1]], [], None],
        [CDELTA2 + 1, 1, [KEY[0], "q", 256], None],
        [CDELTA2 + 2, [KEY[0], "q"]],
        [CDELTA2 + 4, 7],
        [CDELTA2 - 1, [[0, []]]],
        [CACKS2, 1, 1],  # a run of one is AckHeld2's
        [CACKS2, 1, 0],
        [CACKS2, 1, -3],
        [CACKS2, 2**64 - 1, 2],  # past the last sequence number
        [CACKS2, -1, 2],
        [CACKS2, 1, "2"],
        [CACKS2, 1],
        [CACKS2, 1, 2, 3],
    ],
)
def test_malformed_compact_frames_are_typed_errors(raw: list[Any]) -> None:
    with pytest.raises(RemoteProtocolError):
        Compact2Link().decode(raw)


msgpack_values = st.recursive(
    st.none() | st.booleans() | INT64 | st.text(max_size=8) | st.binary(max_size=48),
    lambda inner: st.lists(inner, max_size=9),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(COMPACT2_CODES)), st.lists(msgpack_values, max_size=10))
def test_any_fields_under_a_compact_code_decode_or_raise_the_typed_error(
    code: int, fields: list[object]
) -> None:
    with contextlib.suppress(RemoteProtocolError):
        Compact2Link().decode(unpack_message(pack([code, *fields])))


def _paths(value: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(_paths(item, (*prefix, i)))
    return found


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_live_delta_with_any_nested_field_replaced_decodes_or_raises_the_typed_error(
    data: st.DataObject,
) -> None:
    _, pushes = _live(2)
    sender, receiver = Compact2Link(), Compact2Link()
    receiver.decode(unpack_message(sender.encode(pushes[0][1])))
    raw = unpack_message(sender.encode(pushes[1][1]))
    path = data.draw(st.sampled_from(_paths(raw)[1:]))
    target = raw
    for i in path[:-1]:
        target = target[i]
    target[path[-1]] = data.draw(msgpack_values)
    try:
        got = receiver.decode(unpack_message(pack(raw)))
    except RemoteProtocolError:
        return
    assert isinstance(got, Delta2)
    _apply(pushes[1][0], got)  # joins, or is refused with a typed error: never another exception


def test_compact_codes_are_core2_codes_counted_under_the_same_names() -> None:
    assert COMPACT2_CODES <= CORE2_CODES
    assert {CORE2_NAMES[c] for c in COMPACT2_CODES} == {
        "digest2",
        "delta2",
        "ack2",
        "have2",
        "want2",
        "prune2",
    }


def _pair(features: frozenset[str]) -> tuple[Core2Link, Core2Link]:
    links = Core2Link(), Core2Link()
    for link in links:
        link.agree(features)
    return links


@pytest.mark.parametrize("features", [BOTH, frozenset({HEADS_V2})])
def test_a_link_sends_compact_forms_only_once_it_agreed_on_both_features(features: frozenset[str]) -> None:
    start, _ = _live(1)
    a, b = _pair(features)
    a.start({KEY: link_summary(start)})
    b.start({})
    codes = {unpack_message(m)[0] for m in a.messages_to_send()}
    assert codes == ({CDIGEST2} if features == BOTH else {DIGEST2})


def _relayed(upstream: Compact2Link, relay_in: Compact2Link, message: Delta2) -> Delta2:
    """``message`` as a relay reads it; passed on, it is this very delta and steps (core2_ahead.Relay)."""
    got = relay_in.decode(unpack_message(upstream.encode(message)))
    assert isinstance(got, Delta2)
    return got


@settings(max_examples=100, deadline=None)
@given(
    states(4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from([None, 1, 3])), max_size=6),
)
def test_a_push_passed_on_as_it_came_goes_out_in_the_bytes_a_rebuild_gives(
    values: list[QueueState2], sends: list[tuple[int, int, int | None]]
) -> None:
    """Where the outgoing link carried the same ref as the incoming one, the relay reuses the fields as
    they came; elsewhere it rebuilds them. Either way the bytes are the rebuild's, and the next hop
    decodes the delta sent."""
    upstream, relay_in, relay_out, rebuilt, downstream = (Compact2Link() for _ in range(5))
    for seq, (source, target, size) in enumerate(sends):
        sent = outgoing(values[source], queue2.summary(values[target]), size or 4096)
        message = Delta2(seq, link_summary(values[source]), sent.delta, sent.steps)
        got = _relayed(upstream, relay_in, message)
        wire = relay_out.encode(got)
        came, core2_compact._as_received[0] = core2_compact._as_received[0], None
        assert wire == rebuilt.encode(got)
        core2_compact._as_received[0] = came
        assert downstream.decode(unpack_message(wire)) == got == _as_sent(message)


def test_a_live_push_passed_on_as_it_came_is_not_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    _, pushes = _live(3)
    upstream, relay_in, relay_out, downstream = (Compact2Link() for _ in range(4))
    for replica, message in pushes:
        got = _relayed(upstream, relay_in, message)
        with monkeypatch.context() as m:
            m.setattr(core2_compact, "_head_out", None)  # the head is not written again
            wire = relay_out.encode(got)
        again = downstream.decode(unpack_message(wire))
        assert again == got and isinstance(_apply(replica, again), queue2.Merged)


def test_a_push_whose_upstream_left_nothing_out_is_passed_on_as_it_came_and_verifies_downstream() -> None:
    """An upstream may send any field it could leave out (here every head whole, every hash): the next
    hop, with the same ref, reads the same delta and the signature holds over it."""
    _, pushes = _live(3)
    upstream, relay_in, relay_out, downstream = (Compact2Link() for _ in range(4))
    for replica, message in pushes:
        raw = unpack_message(upstream.encode(message))
        assert message.delta.log is not None
        raw[4][1] = message.delta.log.base_fold
        raw[4][4] = [
            [t.head.to_bytes(), tail]
            for t, (_, tail) in zip(message.delta.log.value.tips, raw[4][4], strict=True)
        ]
        got = relay_in.decode(unpack_message(pack(raw)))
        assert isinstance(got, Delta2) and got == _as_sent(message)
        wire = relay_out.encode(got)
        assert unpack_message(wire)[4] == raw[4]  # as it came
        again = downstream.decode(unpack_message(wire))
        assert again == got and isinstance(_apply(replica, again), queue2.Merged)


def test_a_live_push_read_on_a_compact_link_hashes_its_records_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head hash the decoder rebuilt from the records is the chain the steps and the verification
    need next: it is handed on (crdt/chain_memo), not computed again; the checks are the same."""
    from latticed.crdt import records as records_module  # noqa: PLC0415
    from latticed.crdt.queue2 import replica_deltas  # noqa: PLC0415
    from latticed.protocol import core2_steps  # noqa: PLC0415

    calls = []

    def counted(*args: Any) -> list[bytes]:
        calls.append(args[1])
        return records_module.chain_extend(*args)

    for module in (core2_compact, core2_steps, replica_deltas):
        monkeypatch.setattr(module, "chain_extend", counted)
    _, pushes = _live(3)
    sender, receiver = Compact2Link(), Compact2Link()
    for replica, message in pushes:
        wire = sender.encode(message)
        calls.clear()
        got = receiver.decode(unpack_message(wire))
        assert isinstance(got, Delta2) and isinstance(_apply(replica, got), queue2.Merged)
        assert len(calls) == 1, calls  # read, steps rebuilt, verified and joined
