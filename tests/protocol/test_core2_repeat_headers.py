"""``repeat-headers``: on a compact core-2 link that agreed on it, a DELTA2 row whose headers equal the
row's before carries nil; the receiver rebuilds the very records (the signature still checked over
them), a link without the feature gets every row's headers whole, and nil headers that repeat nothing
are the sender's RemoteProtocolError. Sans-IO, no sockets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.queue2_histories import OWNER, empty

from latticed.crdt import queue2
from latticed.crdt.core_errors import IntegrityError
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.wire import pack
from latticed.errors import RemoteProtocolError
from latticed.protocol.core2_compact import REPEAT_HEADERS, Compact2Link
from latticed.protocol.core2_session import Core2Link
from latticed.protocol.core2_steps import outgoing, unpack_steps
from latticed.protocol.core2_wire import Delta2, link_summary
from latticed.protocol.replication_messages import unpack_message
from latticed.protocol.versions import HEADS_V2
from latticed.version import PROTOCOL_FEATURES

NOW = 1_700_000_000_000
STAMP = (("lattice.producer", b"ab" * 32),)
HEADERS = [(), STAMP, (("lattice.producer", b"cd" * 32),), (("a", b""), ("b", b"x"))]


def _delta(headers: list[tuple[tuple[str, bytes], ...]]) -> tuple[QueueState2, Delta2]:
    """A queue's first commit of one record per entry of ``headers``, and the DELTA2 it goes out as."""
    records = [Record(b"x" * 100, None, NOW, h) for h in headers]
    state = queue2.commit(empty(), OWNER, now_ms=NOW, records=records)
    sent = outgoing(state, queue2.summary(empty()), 4096)
    return state, Delta2(1, link_summary(state), sent.delta, sent.steps)


def _joined(message: Delta2) -> QueueState2:
    whole = unpack_steps(empty(), message.delta, message.steps)
    return queue2.join_verified(empty(), queue2.verify_delta(empty(), whole)).state


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(HEADERS))), st.integers(1, 5)), min_size=1, max_size=8))
def test_records_with_and_without_repeated_headers_decode_to_the_very_records(
    runs: list[tuple[int, int]],
) -> None:
    headers = [HEADERS[i] for i, n in runs for _ in range(n)]
    state, message = _delta(headers)
    for repeat in (True, False):
        sender, receiver = Compact2Link(repeat_headers=repeat), Compact2Link()
        got = receiver.decode(unpack_message(sender.encode(message)))
        assert isinstance(got, Delta2)
        assert tuple(got.delta.records) == tuple(message.delta.records)
        assert _joined(got).entries == state.entries  # chain values and signature over the same bytes


def test_a_producers_stamp_goes_once_a_delta_where_the_link_agreed() -> None:
    _, message = _delta([STAMP] * 1000)
    whole = Compact2Link().encode(message)
    short = Compact2Link(repeat_headers=True).encode(message)
    assert len(whole) - len(short) >= 999 * 80
    rows = unpack_message(short)[7]
    assert rows[0][3] == [["lattice.producer", b"ab" * 32]] and all(row[3] is None for row in rows[1:])


@pytest.mark.parametrize(
    ("features", "repeats"),
    [
        (frozenset({HEADS_V2, "compact", REPEAT_HEADERS}), True),
        (frozenset({HEADS_V2, "compact"}), False),  # a peer without it (0.2.0 has no core 2 at all)
        (frozenset({HEADS_V2, REPEAT_HEADERS}), False),  # the full forms carry every row's headers
    ],
)
def test_rows_repeat_headers_only_on_a_link_that_agreed_on_the_feature(
    features: frozenset[str], repeats: bool
) -> None:
    assert REPEAT_HEADERS in PROTOCOL_FEATURES
    link = Core2Link()
    link.agree(features)
    assert link._codec.repeat_headers is repeats


def _raw(message: Delta2) -> list[object]:
    return unpack_message(Compact2Link(repeat_headers=True).encode(message))  # type: ignore[no-any-return]


@pytest.mark.parametrize("first", [None, 7, [[1, b"x"]]])
def test_nil_headers_that_repeat_nothing_or_garbage_are_the_peers_protocol_error(first: object) -> None:
    _, message = _delta([STAMP] * 3)
    raw = _raw(message)
    raw[7][0][3] = first  # type: ignore[index]
    with pytest.raises(RemoteProtocolError):
        Compact2Link().decode(unpack_message(pack(raw)))


def test_nil_headers_where_the_signed_records_differ_fail_verification() -> None:
    """A peer cannot make a record carry another's headers: the rebuilt records are hashed and checked
    against the signed head as any are."""
    _, message = _delta([STAMP, HEADERS[2], HEADERS[2]])
    raw = _raw(message)
    raw[7][1][3] = None  # type: ignore[index]
    got = Compact2Link().decode(unpack_message(pack(raw)))
    assert isinstance(got, Delta2)
    with pytest.raises(IntegrityError):
        _joined(got)
