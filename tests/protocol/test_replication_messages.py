"""Replication messages (one table encodes and decodes them) and the session's state table."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueState, Summary
from latticed.crdt.records import MAX_OFFSET, Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import delta_to_wire, pack, summary_to_wire
from latticed.errors import IncompatiblePeerError, LocalProtocolError, RemoteProtocolError
from latticed.protocol.replication import PeerMemory, ReplicationSession
from latticed.protocol.replication_messages import (
    MESSAGES,
    PROTOCOL_VERSION,
    Ack,
    Delta,
    Digest,
    Have,
    Hello,
    Message,
    MessageType,
    Ping,
    Pong,
    Prune,
    Want,
    decode_message,
    encode_message,
)
from latticed.protocol.replication_state import TRANSITIONS, Command, SessionState, transition
from latticed.version import RELEASE

ALICE = Identity.from_seed(b"a" * 32)
MALLORY = Identity.from_seed(b"m" * 32)
INT64 = st.integers(-(2**63), 2**64 - 1)  # what msgpack carries


def _states() -> list[QueueState]:
    """An owner's history with a truncation, and a fork, so deltas come with checkpoints and proofs."""
    state = core.empty_state(ALICE.public_key, "q")
    states = [state]
    for i in range(4):
        records = [Record(value=b"%d.%d" % (i, j), key=b"k" if j % 2 else None) for j in range(3)]
        state = core.commit(state, ALICE, now_ms=i, records=records, meta_updates={"m": str(i)})
        states.append(state)
    states.append(core.commit(state, ALICE, now_ms=9, new_start=5))
    twin = core.commit(states[1], ALICE, now_ms=7, records=[Record(value=b"twin")])
    states.append(core.merge(state, twin))
    return states


STATES = _states()

summaries = st.builds(
    Summary,
    version=st.integers(0, 2**64 - 1),
    start=st.integers(0, MAX_OFFSET),
    held_end=st.integers(0, MAX_OFFSET),
    held_hash=st.binary(max_size=32),
    meta_version=st.integers(-1, 2**64 - 1),
    forked=st.booleans(),
)
keys = st.tuples(st.binary(min_size=32, max_size=32), st.text(max_size=20), INT64)


@st.composite
def deltas(draw: st.DrawFn) -> core.QueueDelta:
    state = draw(st.sampled_from(STATES))
    since = draw(st.sampled_from([None, *(s.summary() for s in STATES)]))
    return core.delta(state, since, draw(st.sampled_from([None, 1, 4])))


messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        Hello,
        st.just(PROTOCOL_VERSION),
        st.none() | st.lists(st.text(max_size=10), max_size=3).map(tuple),
        st.none() | st.binary(min_size=16, max_size=16),
    ),
    st.builds(Digest, st.lists(st.tuples(keys, summaries), max_size=4).map(tuple)),
    st.builds(Delta, INT64, deltas()),
    st.builds(Ack, INT64, keys, summaries),
    st.builds(Have, keys, summaries),
    st.builds(Want, keys, summaries),
    st.builds(Prune, keys),
    st.builds(Ping, INT64),
    st.builds(Pong, INT64),
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_every_message_round_trips(message: Message) -> None:
    assert decode_message(encode_message(message)) == message


def test_the_table_has_one_row_per_type_and_the_wire_layouts_are_unchanged() -> None:
    assert [row.code for row in MESSAGES] == list(MessageType)
    assert len({row.cls for row in MESSAGES}) == len(MessageType)
    key = (ALICE.public_key, "q", 0)
    s = STATES[2].summary()
    d = core.delta(STATES[2])
    # The layouts of protocol version 1, as every release so far sent them.
    expected: list[tuple[Message, list[Any]]] = [
        (Hello(1, None), [0, 1, None]),
        (Hello(1, ("a/*",), b"i" * 16), [0, 1, ["a/*"], b"i" * 16]),
        (Digest(((key, s),)), [1, [[*key, summary_to_wire(s)]]]),
        (Delta(7, d), [2, 7, delta_to_wire(d)]),
        (Ack(7, key, s), [3, 7, *key, summary_to_wire(s)]),
        (Have(key, s), [4, *key, summary_to_wire(s)]),
        (Want(key, s), [5, *key, summary_to_wire(s)]),
        (Prune(key), [6, *key]),
        (Ping(3), [7, 3]),
        (Pong(3), [8, 3]),
    ]
    for message, layout in expected:
        assert encode_message(message) == pack(layout)


def test_only_messages_encode() -> None:
    with pytest.raises(LocalProtocolError):
        encode_message(Summary())  # type: ignore[arg-type]


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(msgpack_values)
def test_any_msgpack_value_decodes_or_raises_the_typed_error(value: object) -> None:
    try:
        decoded = decode_message(pack(value))
    except RemoteProtocolError:
        return
    assert type(decoded) in {row.cls for row in MESSAGES}


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(list(MessageType)), st.lists(msgpack_values, max_size=6))
def test_any_fields_under_a_known_type_decode_or_raise_the_typed_error(
    code: MessageType, fields: list[object]
) -> None:
    with contextlib.suppress(RemoteProtocolError):
        decode_message(pack([int(code), *fields]))


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_a_valid_message_with_one_field_replaced_decodes_or_raises_the_typed_error(
    message: Message, data: st.DataObject
) -> None:
    row = next(r for r in MESSAGES if r.cls is type(message))
    layout = [int(row.code), *row.encode(message)]
    index = data.draw(st.integers(0, len(layout) - 1))
    layout[index] = data.draw(msgpack_values)
    with contextlib.suppress(RemoteProtocolError):
        decode_message(pack(layout))


@pytest.mark.parametrize(
    "layout",
    [
        [7, "nonce"],  # a PING's nonce is an integer (it used to be echoed back whatever it was)
        [True, []],  # a bool is not a type code (it used to read as DIGEST)
        [3, "seq", ALICE.public_key, "q", 0, summary_to_wire(Summary())],  # an ACK's seq is an integer
        [2, True, []],  # so is a DELTA's
        [0, True, None],  # and the version
        [6, ALICE.public_key, "q", False],  # a kind is an integer, not a bool
        [0, 1, None, None, None],  # HELLO has at most 4 items
        [8],
    ],
)
def test_strict_decoding_refuses_what_was_loosely_accepted(layout: list[object]) -> None:
    a, b = ReplicationSession(), ReplicationSession()
    a.start({})
    b.start({})
    for message in a.messages_to_send():
        b.receive_message(message)
    b.messages_to_send()
    with pytest.raises(RemoteProtocolError):
        b.receive_message(pack(layout))


def test_another_version_is_refused_before_its_layout_is_read() -> None:
    # A HELLO of a version we do not speak: no version in common, said with both sides' versions.
    with pytest.raises(IncompatiblePeerError, match="the peer speaks protocol 2, this daemon speaks") as info:
        decode_message(pack([0, 2, {"a newer": "layout"}, 1, 2, 3]))
    assert f"latticed {RELEASE}, protocol 1" in str(info.value) and "upgrade this daemon" in str(info.value)
    assert "network key" not in str(info.value)
    with pytest.raises(RemoteProtocolError, match="unsupported protocol version"):
        decode_message(pack([0, "1", None]))


# ------------------------------------------------------------------ the state table

INPUTS: list[Any] = [*Command, *(row.cls for row in MESSAGES)]


def test_every_input_in_every_state_is_allowed_by_the_table_or_a_typed_error() -> None:
    for state in SessionState:
        for event in INPUTS:
            allowed = TRANSITIONS[state].get(event)
            if allowed is not None:
                assert transition(state, event) is allowed
                continue
            # The host's mistakes (and a message fed before start) are ours; the rest the peer's.
            ours = isinstance(event, Command) or state is SessionState.IDLE
            with pytest.raises(LocalProtocolError if ours else RemoteProtocolError):
                transition(state, event)


def test_a_session_walks_the_table() -> None:
    a, b = ReplicationSession(incarnation=b"A" * 16), ReplicationSession()
    assert a.state is b.state is SessionState.IDLE
    a.start({})
    assert a.state is SessionState.AWAITING_HELLO
    a.ping(1)  # after our HELLO, before theirs: fine
    with pytest.raises(LocalProtocolError):
        a.start({})
    b.start({}, memory=PeerMemory(b"A" * 16, {}, {}))
    assert b.state is SessionState.DIGEST_DEFERRED
    assert len(b.messages_to_send()) == 1  # HELLO only: the digest waits for a's HELLO
    for message in a.messages_to_send():
        b.receive_message(message)
    assert b.state is SessionState.OPEN
    assert len(b.messages_to_send()) == 2  # the digest, then the PONG
    with pytest.raises(RemoteProtocolError, match="HELLO twice"):
        b.receive_message(encode_message(Hello(PROTOCOL_VERSION, None)))


def test_the_host_may_not_skip_ahead_of_the_table() -> None:
    """Used to pass silently: a PING before our HELLO (the peer then saw PING first and hung up), a
    message fed before start() (whose digest was then never sent), a delta provided before the peer's
    HELLO."""
    idle = ReplicationSession()
    with pytest.raises(LocalProtocolError):
        idle.ping(1)
    with pytest.raises(LocalProtocolError):
        idle.receive_message(encode_message(Hello(PROTOCOL_VERSION, None)))
    waiting = ReplicationSession()
    waiting.start({})
    with pytest.raises(LocalProtocolError):
        waiting.provide_delta((ALICE.public_key, "q", 0), core.delta(STATES[1]))
    with pytest.raises(LocalProtocolError):
        waiting.delta_applied(1, Summary(), True)
    with pytest.raises(RemoteProtocolError, match="first message must be HELLO"):
        waiting.receive_message(encode_message(Ping(1)))
    assert waiting.state is SessionState.AWAITING_HELLO  # a refused input changes nothing


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["start", "remember", "update", "ping", "hello", "ping_in", "pong_in"])))
def test_any_sequence_follows_the_table(steps: list[str]) -> None:
    """Whatever the order of the host's calls and the peer's messages, a session is where the table says,
    and what the table refuses raises its typed error and changes nothing."""
    session = ReplicationSession()
    key = (ALICE.public_key, "q", 0)
    inputs: dict[str, tuple[Any, Any]] = {
        "start": (Command.START, lambda: session.start({})),
        "remember": (
            Command.START_REMEMBERING,
            lambda: session.start({}, memory=PeerMemory(b"x" * 16, {}, {})),
        ),
        "update": (Command.LOCAL_UPDATE, lambda: session.local_update(key, STATES[1].summary())),
        "ping": (Command.PING, lambda: session.ping(5)),
        "hello": (Hello, lambda: session.receive_message(encode_message(Hello(PROTOCOL_VERSION, None)))),
        "ping_in": (Ping, lambda: session.receive_message(encode_message(Ping(1)))),
        "pong_in": (Pong, lambda: session.receive_message(encode_message(Pong(1)))),
    }
    for step in steps:
        event, call = inputs[step]
        before = session.state
        expected = TRANSITIONS[before].get(event)
        if expected is None:
            with pytest.raises((LocalProtocolError, RemoteProtocolError)):
                call()
            assert session.state is before
        else:
            call()
            assert session.state is expected


def test_messages_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Ping(1).nonce = 2  # type: ignore[misc]
