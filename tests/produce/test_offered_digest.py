"""The digest a retried offer must match: the values, keys and headers sent, not the timestamps. Records
sent as ``[value, key, headers]`` (the sink's rows without a timestamp) are digested without copying, and
must give the same digest as ever, and as the same rows sent with a timestamp."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from latticed.crdt.wire import pack
from latticed.produce.dedup import DIGEST_BYTES, offered_digest

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
