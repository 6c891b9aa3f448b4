"""The lattice sink's pure half (latticed/spark/sink_records.py, the options and the schema check of
latticed/spark/sink.py): rows to records, chunks cut the same way every time, producer ids and sequences
that a retried task reproduces, and every mistake a clear error naming what is wrong."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from latticed.errors import MalformedError  # noqa: E402
from latticed.spark.sink import check_schema, parse_sink_options  # noqa: E402
from latticed.spark.sink_records import (  # noqa: E402
    CHUNKS_PER_EPOCH,
    batch_records,
    batch_rows,
    chunk_rows,
    chunks,
    producer_id,
    sequence,
)

ME = "ab" * 32


def resolve(queue: str) -> str:
    return queue if "/" in queue else f"{ME}/{queue}"


def test_rows_become_records_with_their_key_headers_and_timestamp() -> None:
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    batch = pa.record_batch(
        {
            "value": pa.array(["a", "b"]),
            "key": pa.array([b"k", None]),
            "headers": pa.array([[{"key": "h", "value": b"1"}], None], pa.list_(header)),
            "timestamp": pa.array([1_700_000_000_123_000, None], pa.timestamp("us", tz="UTC")),
            "queue": pa.array(["q", f"{'cd' * 32}/r"]),
        }
    )
    assert list(batch_records(batch, None, resolve)) == [
        (f"{ME}/q", [b"a", b"k", [["h", b"1"]], 1_700_000_000_123]),
        (f"{'cd' * 32}/r", [b"b", None, [], None]),
    ]
    assert [q for q, _ in batch_records(batch, f"{ME}/fixed", resolve)] == [f"{ME}/fixed"] * 2


def test_rows_without_a_timestamp_column_are_sent_as_three_items() -> None:
    """No timestamp: ``[value, key, headers]``, which the owner takes as a nil timestamp (its clock) and
    digests the same, one item less to pack, send and slice for each row."""
    batch = pa.record_batch({"value": pa.array(["a", "b"]), "key": pa.array([b"k", None])})
    assert [record for _, record in batch_records(batch, "q", resolve)] == [
        [b"a", b"k", []],
        [b"b", None, []],
    ]


def test_a_null_value_or_queue_is_refused() -> None:
    with pytest.raises(MalformedError, match="'value' is null"):
        list(batch_records(pa.record_batch({"value": pa.array([None], pa.binary())}), "q", resolve))
    with pytest.raises(MalformedError, match="'queue' is null"):
        batch = pa.record_batch({"value": pa.array([b"x"]), "queue": pa.array([None], pa.string())})
        list(batch_records(batch, None, resolve))


def test_chunks_are_cut_by_count_and_bytes_per_queue_the_same_way_every_time() -> None:
    rows = [("a" if i % 3 else "b", [b"x" * 10, None, [], None]) for i in range(10)]
    cut = [(c.queue, c.index, len(c.records)) for c in chunks(rows, max_records=3, max_bytes=1 << 20)]
    assert cut == [("a", 0, 3), ("b", 0, 3), ("a", 1, 3), ("b", 1, 1)]  # in the order they fill
    assert cut == [(c.queue, c.index, len(c.records)) for c in chunks(rows, max_records=3, max_bytes=1 << 20)]
    by_bytes = [len(c.records) for c in chunks(rows[:4], max_records=100, max_bytes=80)]
    assert by_bytes == [2, 2]  # 10 + 32 bytes a record: a chunk closes at the second


def test_producer_ids_and_sequences_are_what_a_retry_reproduces() -> None:
    assert producer_id("query:q1", 0) == producer_id("query:q1", 0)
    assert len({producer_id("query:q1", 0), producer_id("query:q1", 1), producer_id("query:q2", 0)}) == 3
    assert len(producer_id("write:" + "x" * 256, 7)) <= 128
    assert sequence(3, 5) == 3 * CHUNKS_PER_EPOCH + 5
    with pytest.raises(MalformedError, match="more than"):
        sequence(0, CHUNKS_PER_EPOCH)


def test_options_are_checked_and_unknown_ones_refused() -> None:
    options = parse_sink_options({"Queue": "feed", "recordsPerOffer": "5", "checkpointLocation": "/x"})
    assert (options.queue, options.records_per_offer, options.write_id) == ("feed", 5, None)
    with pytest.raises(MalformedError, match="unknown lattice sink option"):
        parse_sink_options({"queues": "feed"})
    with pytest.raises(MalformedError, match="'timeout'"):
        parse_sink_options({"timeout": "soon"})
    with pytest.raises(MalformedError, match="neither NAME nor OWNER/NAME"):
        parse_sink_options({"queue": "a/b/c"})


def test_the_schema_is_kafkas_sink_shape() -> None:
    header = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
    good = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("headers", header),
            StructField("timestamp", TimestampType()),
        ]
    )
    check_schema(good, has_queue_option=True)
    with pytest.raises(MalformedError, match="'queue' option or give the DataFrame a 'queue' column"):
        check_schema(good, has_queue_option=False)
    with pytest.raises(MalformedError, match="needs a column 'value'"):
        check_schema(StructType([StructField("value", IntegerType())]), has_queue_option=True)
    with pytest.raises(MalformedError, match="unknown column"):
        check_schema(StructType([*good.fields, StructField("topic", StringType())]), has_queue_option=True)


def test_whole_batches_are_cut_exactly_as_row_by_row() -> None:
    """The sink cuts an Arrow batch for one queue a slice at a time: the chunks (and so the sequences a
    retried task sends) must be the ones a row-by-row cut makes, across batch boundaries too."""
    values = [b"v" * (i % 17) for i in range(500)]
    batches = [
        pa.record_batch({"value": pa.array(values[lo:hi], pa.binary())})
        for lo, hi in ((0, 1), (1, 130), (130, 131), (131, 400), (400, 500))
    ]
    for max_records, max_bytes in ((7, 1 << 20), (1000, 200), (13, 333), (1, 1), (500, 1 << 30)):
        rows = [row for b in batches for row in batch_records(b, "q", resolve)]
        expected = [
            (c.queue, c.index, c.records, c.size)
            for c in chunks(rows, max_records=max_records, max_bytes=max_bytes)
        ]
        sliced = chunk_rows(
            (batch_rows(b, "q", resolve) for b in batches), max_records=max_records, max_bytes=max_bytes
        )
        assert [(c.queue, c.index, c.records, c.size) for c in sliced] == expected
        assert sum(len(c[2]) for c in expected) == 500


def test_a_queue_column_naming_one_queue_or_several_cuts_the_same_as_row_by_row() -> None:
    batch = pa.record_batch(
        {"value": pa.array([b"x" * i for i in range(40)]), "queue": pa.array(["a", "b", "a", "a"] * 10)}
    )
    one = pa.record_batch({"value": pa.array([b"y"] * 9), "queue": pa.array(["a"] * 9)})
    for max_records, max_bytes in ((3, 1 << 20), (100, 120)):
        rows = [row for b in (batch, one) for row in batch_records(b, None, resolve)]
        expected = [
            (c.queue, c.index, c.records) for c in chunks(rows, max_records=max_records, max_bytes=max_bytes)
        ]
        sliced = chunk_rows(
            (batch_rows(b, None, resolve) for b in (batch, one)), max_records=max_records, max_bytes=max_bytes
        )
        assert [(c.queue, c.index, c.records) for c in sliced] == expected


def test_columns_of_other_types_are_refused() -> None:
    with pytest.raises(MalformedError, match="not string or binary"):
        batch_rows(pa.record_batch({"value": pa.array([1])}), "q", resolve)
