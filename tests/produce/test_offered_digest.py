"""The digest a retried offer must match: the values, keys and headers sent, not the timestamps. Records
sent as ``[value, key, headers]`` (the sink's rows without a timestamp) are digested without copying, and
must give the same digest as ever, and as the same rows sent with a timestamp."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from latticed.crdt.wire import pack, unpack
from latticed.produce.dedup import DIGEST_BYTES, offered_digest, packed_size
from latticed.produce.owner import _verbatim, produced_run, retry_digest

rows = st.lists(
    st.tuples(st.binary(max_size=30), st.none() | st.binary(max_size=10), st.none() | st.integers(0, 2**40)),
    min_size=1,
    max_size=20,
)


def defined(records: list[list[object]]) -> bytes:
    """The digest as remembered sequences hold it: of each record's first three items."""
    data = pack([record[:3] for record in records])
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES, person=b"latticed.offer").digest()


@given(rows)
def test_three_item_records_digest_as_the_same_rows_with_timestamps(
    rows: list[tuple[bytes, bytes | None, int | None]],
) -> None:
    short = [[value, key, [["h", b"1"]]] for value, key, _ in rows]
    long = [[value, key, [["h", b"1"]], stamp] for value, key, stamp in rows]
    assert offered_digest(short) == offered_digest(long) == defined(long) == defined(short)
    mixed = [*short[:1], *long[1:]]  # a request mixing both forms
    assert offered_digest(mixed) == defined(long)


# The sink's records decoded from the bytes they were sent as: the owner hashes those bytes as they are
# when they are what packing the records gives, and packs the records anew otherwise (a client free to
# choose longer encodings must not change the digest an older retry is compared with).

sink_rows = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.none() | st.binary(max_size=300),
        st.sampled_from(["list", "nil", "map"]),
    ),
    min_size=1,
    max_size=40,
)


def _bin(data: bytes, wide: bool) -> bytes:
    n = len(data)
    if n < 256 and not wide:
        return b"\xc4" + bytes((n,)) + data
    if n < 1 << 16 and (n >= 256) != wide:
        return b"\xc5" + n.to_bytes(2, "big") + data
    return b"\xc6" + n.to_bytes(4, "big") + data


def _array(n: int, wide: bool) -> bytes:
    if wide:
        return b"\xdd" + n.to_bytes(4, "big")
    return bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big")


def _encode(records: list[list[object]], wide: list[bool]) -> bytes:
    """``records`` in msgpack, each item in a longer form than msgpack's own where ``wide`` says so."""
    flags = iter(wide * (4 * len(records) + 1))
    out = [_array(len(records), next(flags))]
    for value, key, headers in records:
        out.append(_array(3, next(flags)))
        out.append(_bin(value, next(flags)))  # type: ignore[arg-type]
        out.append(b"\xc0" if key is None else _bin(key, next(flags)))  # type: ignore[arg-type]
        wide_headers = next(flags)
        if headers is None:
            out.append(b"\xc0")
        elif headers == {}:
            out.append(b"\xde\x00\x00" if wide_headers else b"\x80")
        else:
            out.append(_array(0, wide_headers))
    return b"".join(out)


@given(sink_rows, st.lists(st.booleans(), min_size=1, max_size=7))
def test_the_digest_from_the_bytes_sent_is_the_defined_one(
    rows: list[tuple[bytes, bytes | None, str]], wide: list[bool]
) -> None:
    headers: dict[str, object] = {"list": [], "nil": None, "map": {}}
    records: list[list[object]] = [[value, key, headers[kind]] for value, key, kind in rows]
    run = produced_run(records, "ab" * 32, 7)
    assert packed_size(run.values, run.keys) == len(pack(records))
    assert _verbatim(records, run, pack(records))  # hashed as sent, not packed again
    for encoded in (pack(records), _encode(records, wide)):
        assert unpack(encoded) == records
        assert _verbatim(records, run, encoded) == (encoded == pack(records))
        assert retry_digest(records, run, memoryview(encoded)) == defined(records)
    assert retry_digest(records, run, None) == defined(records)


def test_records_with_headers_or_timestamps_are_packed_anew() -> None:
    for records in ([[b"v", b"k", [["h", b"1"]]]], [[b"v", b"k", [], 5]]):
        run = produced_run(records, "ab" * 32, 7)
        sent = pack(records)
        assert retry_digest(records, run, sent) == defined(records)
