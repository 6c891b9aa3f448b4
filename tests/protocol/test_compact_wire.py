"""The ``compact`` encodings: what a link leaves out is rebuilt to the exact signed bytes, anything else is
a protocol error; a compact link and a full one replicate the same records. Sans-IO, no sockets."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.sim import SimNetwork

from latticed.crdt import queue as core
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack, unpack
from latticed.errors import (
    IntegrityError,
    LatticedError,
    RemoteProtocolError,
    TamperedError,
)
from latticed.protocol import compact
from latticed.protocol.compact import COMPACT_FEATURE, CompactLink
from latticed.protocol.replication import PROTOCOL_VERSION, ReplicationSession
from latticed.protocol.replication_messages import (
    COMPACT_ACK,
    COMPACT_DELTA,
    COMPACT_HAVES,
    HAVE,
    Ack,
    Delta,
    Have,
    Hello,
    encode_message,
    message_type_name,
    unpack_message,
)
from latticed.version import PROTOCOL_FEATURES

ALICE = Identity.from_seed(b"a" * 32)
KEY = (ALICE.public_key, "q", 0)
COMPACT = frozenset({COMPACT_FEATURE})


def _live(n: int, start: core.QueueState | None = None) -> list[tuple[core.QueueState, core.QueueDelta]]:
    """``n`` single-record commits of 100 bytes and the delta each one is pushed as."""
    state = start or core.empty_state(ALICE.public_key, "q")
    out = []
    for i in range(n):
        after = core.commit(state, ALICE, now_ms=1_700_000_000_000 + 200 * i, records=[Record(bytes(100))])
        out.append((state, core.delta(after, state.summary(), 4096)))
        state = after
    return out


def _stream(n: int) -> tuple[list[bytes], list[tuple[core.QueueState, core.QueueDelta]]]:
    sender = CompactLink()
    pushes = _live(n)
    return [pack(sender.encode_delta(Delta(i + 1, d))) for i, (_, d) in enumerate(pushes)], pushes


def test_live_deltas_decode_to_the_exact_delta_and_verify() -> None:
    frames, pushes = _stream(5)
    receiver = CompactLink()
    for frame, (before, delta) in zip(frames, pushes, strict=True):
        decoded = receiver.decode(unpack_message(frame))
        assert isinstance(decoded, Delta) and decoded.delta == delta
        core.verify_delta(before, decoded.delta)  # the signature over the rebuilt 248 bytes holds
        assert decoded.delta.head is not None
        assert decoded.delta.head.to_bytes() == delta.head.to_bytes()  # type: ignore[union-attr]
    full = len(encode_message(Delta(5, pushes[-1][1])))
    assert full > 440 and len(frames[-1]) < 200  # one 100-byte record: ~447 bytes in full


def test_a_link_computes_a_queues_id_once_not_per_delta(monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay decodes a delta per record: the queue's id (a hash of its names) is kept with the link's
    memory of the queue instead of hashed again each time."""
    frames, pushes = _stream(5)
    receiver = CompactLink()
    hashed: list[tuple[Any, ...]] = []
    real = compact.fresh_queue_id

    def counted(*key: Any) -> bytes:
        hashed.append(key)
        return real(*key)

    monkeypatch.setattr(compact, "fresh_queue_id", counted)
    for frame, (before, delta) in zip(frames, pushes, strict=True):
        decoded = receiver.decode(unpack_message(frame))
        assert isinstance(decoded, Delta) and decoded.delta == delta
        core.verify_delta(before, decoded.delta)
    assert hashed == [KEY]


def test_an_ack_of_what_the_delta_implied_is_two_bytes_and_reads_back() -> None:
    sender, receiver = CompactLink(), CompactLink()
    ((before, delta),) = _live(1)
    receiver.decode(unpack(pack(sender.encode_delta(Delta(7, delta)))))
    after = core.merge(before, delta).summary()
    wire = receiver.encode_ack(Ack(7, KEY, after))
    assert wire == [COMPACT_ACK, 7]
    assert sender.decode(unpack(pack(wire))) == Ack(7, KEY, after)
    with pytest.raises(RemoteProtocolError, match="did not send compact"):
        sender.decode([COMPACT_ACK, 7])  # acknowledged once already


def test_an_ack_holding_something_else_carries_its_summary() -> None:
    sender, receiver = CompactLink(), CompactLink()
    ((_, delta),) = _live(1)
    receiver.decode(unpack(pack(sender.encode_delta(Delta(1, delta)))))
    other = core.Summary(9, 0, 30, b"x" * 32, 0)
    assert sender.decode(unpack(pack(receiver.encode_ack(Ack(1, KEY, other))))) == Ack(1, KEY, other)


def test_a_forged_signature_or_record_fails_verification() -> None:
    frames, pushes = _stream(2)
    for mutate in ("signature", "record"):
        receiver = CompactLink()
        receiver.decode(unpack_message(frames[0]))
        raw = unpack_message(frames[1])
        if mutate == "signature":
            raw[3][8] = bytes(64)
        else:
            raw[8][0][1] = b"y" * 100  # the head hash the receiver rebuilds changes: the signature fails
        decoded = receiver.decode(raw)
        assert isinstance(decoded, Delta)
        with pytest.raises(IntegrityError) as refused:
            core.verify_delta(pushes[1][0], decoded.delta)
        # Changed records get the verdict a full delta gets (the log tells a corrupt relay's store
        # from a bad key); with the hash rebuilt from the records, a forged signature reads the same.
        assert isinstance(refused.value, TamperedError)
        assert "records do not hash to the signed head" in str(refused.value)
    # The same records changed in a full delta: the signature holds, the records do not fold to it.
    bad = dataclasses.replace(pushes[1][1], records=(Record(b"y" * 100),))
    with pytest.raises(TamperedError, match="records do not hash to the signed head"):
        core.verify_delta(pushes[1][0], bad)


def test_a_field_the_receiver_cannot_rebuild_is_a_protocol_error() -> None:
    frames, _ = _stream(2)
    second = unpack_message(frames[1])
    with pytest.raises(RemoteProtocolError, match="never numbered"):
        CompactLink().decode(second)  # names queue 0, which this link never named
    second[2] = [KEY[0], KEY[1], KEY[2]]  # named in full, but it continues a chunk never carried
    with pytest.raises(RemoteProtocolError, match="not carried"):
        CompactLink().decode(second)
    second[6] = 1  # and with its offset, the starting hash is still left out
    with pytest.raises(RemoteProtocolError, match="cannot rebuild"):
        CompactLink().decode(second)


def test_haves_of_one_flush_travel_in_one_message() -> None:
    sender, receiver = CompactLink(), CompactLink()
    other = (ALICE.public_key, "p", 0)
    haves = [Have(KEY, core.Summary(1, 0, 1, b"h" * 32, 0)), Have(other, core.Summary(2, 0, 5, b"g" * 32, 0))]
    first = pack(sender.encode_haves(haves))
    again = pack(sender.encode_haves(haves))
    assert receiver.decode(unpack(first)) == tuple(haves) == receiver.decode(unpack(again))
    assert len(again) < len(first) - 60  # the queues by number the second time
    assert message_type_name(first) == "have"
    with pytest.raises(RemoteProtocolError):
        CompactLink().decode(unpack(again))


def _truncations_and_swaps() -> list[list[Any] | bytes]:
    frames, _ = _stream(2)
    out: list[list[Any] | bytes] = [frames[1][:cut] for cut in range(len(frames[1]))]
    for index in range(1, 11):
        for bad in (None, "x", -1, 2**64 - 1, True, b"", [], [1, 2], {"a": 1}):
            raw = unpack_message(frames[1])
            raw[index] = bad
            out.append(raw)
    return out


@pytest.mark.parametrize("case", _truncations_and_swaps())
def test_truncated_or_mistyped_frames_are_typed_errors(case: list[Any] | bytes) -> None:
    frames, pushes = _stream(2)
    session = _open_session()
    session.receive_message(frames[0])
    payload = case if isinstance(case, bytes) else pack(case)
    try:
        session.receive_message(payload)
    except RemoteProtocolError:
        return
    for event in iter(session.next_event, None):  # decoded: verification is the rest of the check
        delta = getattr(event, "delta", None)
        if delta is not None:
            with contextlib.suppress(LatticedError):
                core.verify_delta(pushes[1][0], delta)


def _open_session() -> ReplicationSession:
    session = ReplicationSession()
    session.start({})
    session.receive_message(encode_message(Hello(PROTOCOL_VERSION, None, None)))
    return session


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([COMPACT_DELTA, COMPACT_ACK, COMPACT_HAVES]),
    st.lists(
        st.one_of(
            st.integers(-(2**63), 2**64 - 1),
            st.binary(max_size=70),
            st.text(max_size=5),
            st.none(),
            st.booleans(),
            st.lists(st.one_of(st.integers(0, 3), st.binary(max_size=33), st.none()), max_size=10),
        ),
        max_size=11,
    ),
)
def test_structured_fuzz_of_compact_frames_only_protocol_errors(code: int, items: list[object]) -> None:
    with contextlib.suppress(RemoteProtocolError):
        _open_session().receive_message(pack([code, *items]))


def test_the_feature_is_spoken_and_named_for_counters() -> None:
    assert COMPACT_FEATURE in PROTOCOL_FEATURES
    frames, _ = _stream(1)
    assert message_type_name(frames[0]) == "delta"
    assert message_type_name(pack([COMPACT_ACK, 1])) == "ack"


def test_a_compact_link_and_a_full_one_replicate_the_same_records() -> None:
    """Node 0 writes; its link to 1 agreed on ``compact``, its link to 2 did not (a 0.2.0 peer): both
    end with the same verified state, 1 for fewer bytes, and 2 never gets a compact message."""
    net = SimNetwork()
    for name in range(3):
        net.add(name)
    net.connect(0, 1)
    net.connect(0, 2)
    for x, y in ((0, 1), (1, 0)):
        net.nodes[x].sessions[y].agree_features(COMPACT)
    seen_by_2: list[int] = []

    def run() -> None:
        net.settle()
        while not net.quiet():
            seen_by_2.extend(unpack(m)[0] for m in net.wires[(0, 2)])
            net.round()

    run()
    before = (net.nodes[1].bytes_received, net.nodes[2].bytes_received)
    for i in range(20):
        net.nodes[0].write(ALICE, "q", [Record(f"r{i}".encode() * 20)], 1_700_000_000_000 + i)
        run()
    net.nodes[0].write(ALICE, "q", [Record(f"b{i}".encode()) for i in range(300)], 1_700_000_001_000)
    run()
    owner = net.nodes[0].states[KEY]
    assert net.nodes[1].states[KEY] == owner == net.nodes[2].states[KEY]
    assert owner.held_end == 320
    compact_bytes = net.nodes[1].bytes_received - before[0]
    full_bytes = net.nodes[2].bytes_received - before[1]
    assert compact_bytes < full_bytes - 20 * 200
    assert 2 in seen_by_2 and max(seen_by_2) < COMPACT_DELTA  # full DELTAs only


def test_haves_linger_then_go_out_as_one_compact_message() -> None:
    a = ReplicationSession(have_linger=0.5)
    a.start({})
    a.receive_message(encode_message(Hello(PROTOCOL_VERSION, None, None)))
    a.agree_features(COMPACT)
    a.messages_to_send()
    while a.next_event() is not None:
        pass
    other = (ALICE.public_key, "p", 0)
    for key in (KEY, other):
        a._link(key).eager = False
        a.local_update(key, core.Summary(1, 0, 1, b"h" * 32, 0))
    assert not a.has_work() and a.next_deadline() == 0.0  # tick now, to start the linger
    a.tick(10.0)
    assert a.messages_to_send() == [] and a.next_deadline() == 10.5
    a.tick(10.5)
    assert a.has_work()
    (message,) = a.messages_to_send()
    assert unpack(message)[0] == COMPACT_HAVES and len(unpack(message)[1]) == 2
    assert a.next_deadline() is None


def test_without_the_feature_haves_go_out_one_by_one_in_full() -> None:
    a = _open_session()
    a.messages_to_send()
    a._link(KEY).eager = False
    a.local_update(KEY, core.Summary(1, 0, 1, b"h" * 32, 0))
    (message,) = a.messages_to_send()
    assert unpack(message)[0] == HAVE
