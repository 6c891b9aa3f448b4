"""Rows packed straight from Arrow are, byte for byte, the request the records built row by row give,
and are cut into the same chunks (the owner's idempotence rests on the cut and its digest on the bytes),
without a Python object per row."""

from __future__ import annotations

import msgpack
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from support.arrow_rows import arrow_batches, resolve

from latticed.api.messages import Packed, pack
from latticed.spark.sink_packed import packed_records, packed_rows
from latticed.spark.sink_records import PackedRecords, batch_rows, chunk_rows

blobs = st.binary(max_size=300) | st.sampled_from([b"x" * 70_000, b""])
rows = st.lists(st.tuples(blobs, st.none() | blobs), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(rows, st.booleans(), st.booleans(), st.integers(1, 25), st.integers(1, 30), st.integers(40, 3_000))
def test_packed_rows_send_the_same_bytes_in_the_same_chunks(
    data: list[tuple[bytes, bytes | None]], text: bool, keyed: bool, cut: int, per: int, max_bytes: int
) -> None:
    batches = arrow_batches(data, text, keyed, cut)
    plain = [batch_rows(b, "q", resolve) for b in batches]
    packed = [packed_rows(b, "q", resolve) for b in batches]
    assert all(p is not None for p in packed)
    for p, b in zip(packed, plain, strict=True):
        assert p is not None and (p.queues, p.sizes.tolist()) == (b.queues, b.sizes)
    expected = list(chunk_rows(plain, max_records=per, max_bytes=max_bytes))
    got = list(chunk_rows([p for p in packed if p is not None], max_records=per, max_bytes=max_bytes))
    assert [(c.queue, c.index, len(c.records), c.size) for c in got] == [
        (c.queue, c.index, len(c.records), c.size) for c in expected
    ]
    for mine, theirs in zip(got, expected, strict=True):
        records = packed_records(mine.records)
        assert type(records) is Packed
        assert records == msgpack.packb(theirs.records, use_bin_type=True)
        request = {"op": "offer_batch", "records": records, "seq": 3}
        assert pack(request) == msgpack.packb({**request, "records": theirs.records}, use_bin_type=True)


def test_other_shapes_are_left_to_batch_rows() -> None:
    base = {"value": pa.array([b"v"]), "key": pa.array([b"k"])}
    shapes = [
        (
            {
                **base,
                "headers": pa.array(
                    [[]], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
                ),
            },
            "q",
        ),
        ({**base, "timestamp": pa.array([5], pa.int64())}, "q"),
        ({**base, "queue": pa.array(["q"])}, None),
        ({"value": pa.array(["v"], pa.large_string())}, "q"),
    ]
    for columns, queue in shapes:
        batch = pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
        assert packed_rows(batch, queue, resolve) is None
    assert packed_records([[b"v", None, []]]) == [[b"v", None, []]]


def test_a_chunk_holds_slices_of_the_batches_not_a_row_each() -> None:
    """A chunk of packed rows is one slice of each Arrow batch it spans: no per-row bytes objects, no
    per-row list slicing, whatever the row count."""
    data = [(b"v%05d" % i, b"k%d" % i) for i in range(5_000)]
    batches = arrow_batches(data, text=True, keyed=True, cut=1_000)
    packed = [packed_rows(b, "q", resolve) for b in batches]
    got = list(chunk_rows([p for p in packed if p is not None], max_records=1_500, max_bytes=1 << 30))
    assert [len(c.records) for c in got] == [1_500, 1_500, 1_500, 500]
    records = got[0].records
    assert type(records) is PackedRecords
    assert len(records.parts) == 2  # rows 0-999 from the first batch, 1000-1499 from the second
    assert packed_records(records) == msgpack.packb([[v, k, []] for v, k in data[:1_500]], use_bin_type=True)
