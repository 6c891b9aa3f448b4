"""``SignedHead.check``'s one-expression path for plain fields decides exactly as the field-by-field
checks do, on any field values (subclasses of bytes and int, bools, wrong lengths, out of range)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head import SignedHead
from latticed.crdt.records import MAX_OFFSET

U64 = 2**64


class _Bytes(bytes):
    pass


class _Int(int):
    pass


def reference_check(h: SignedHead) -> None:
    """The checks as they read field by field (the specification the fast path must match)."""
    for value in (h.queue_id, h.base_hash, h.head_hash, h.meta_hash):
        if not isinstance(value, bytes) or len(value) != 32:
            raise MalformedError("a head's hashes are 32 bytes")
    for number in (h.version, h.start, h.end, h.meta_version, h.timestamp):
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < U64:
            raise MalformedError("a head's counters are unsigned 64-bit integers")
    if h.start > h.end:
        raise MalformedError("head start is past its end")
    if h.end > MAX_OFFSET:
        raise MalformedError(f"a head's offsets stop at {MAX_OFFSET}, this one ends at {h.end}")
    if not isinstance(h.signature, bytes):
        raise MalformedError("a head's signature is bytes")


hashes = st.one_of(
    st.binary(min_size=32, max_size=32),
    st.binary(min_size=32, max_size=32).map(_Bytes),
    st.binary(max_size=40),
    st.just("x" * 32),
    st.none(),
)
counters = st.one_of(
    st.integers(min_value=0, max_value=1000),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.sampled_from([0, U64 - 1, U64, -1, MAX_OFFSET, MAX_OFFSET + 1]),
    st.integers(min_value=0, max_value=1000).map(_Int),
    st.booleans(),
    st.floats(allow_nan=False, min_value=0, max_value=10),
)


def outcome(check: Any, head: SignedHead) -> str | None:
    try:
        check(head)
    except MalformedError as error:
        return str(error)
    return None


@settings(max_examples=2000, deadline=None)
@given(
    st.tuples(hashes, hashes, hashes, hashes),
    st.tuples(counters, counters, counters, counters, counters),
    st.one_of(st.binary(min_size=64, max_size=64), st.none()),
)
def test_check_matches_field_by_field(hs: tuple[Any, ...], ns: tuple[Any, ...], signature: Any) -> None:
    q, b, h, m = hs
    version, start, end, meta_version, timestamp = ns
    head = SignedHead(q, version, start, end, b, h, meta_version, m, timestamp, signature)
    assert outcome(SignedHead.check, head) == outcome(reference_check, head)


def test_plain_head_takes_the_fast_path() -> None:
    head = SignedHead(b"q" * 32, 3, 0, 5, b"b" * 32, b"h" * 32, 1, b"m" * 32, 17, b"s" * 64)
    assert head._plain_fields()
    head.check()
    assert not SignedHead(
        b"q" * 32, True, 0, 5, b"b" * 32, b"h" * 32, 1, b"m" * 32, 17, b"s" * 64
    )._plain_fields()
