"""The sink's rows as columns (``offer_batch``'s ``packed`` layout, local API 2): cut into the same
chunks as every other shape (the owner's idempotence rests on the cut), each chunk's columns the same
records to the daemon (values, keys, and the digest a retry is compared by), slices of the Arrow buffers
rather than a Python object per row; and a task sends them to a daemon speaking API 2 and the list form
to an older one, the same records stored either way."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import BinaryType, StringType, StructField, StructType
from support.arrow_rows import arrow_batches, resolve
from support.inprocess import InProcessDaemon, start_in_process

from latticed.api.client.blocking_client import Client
from latticed.host.config import DaemonConfig
from latticed.produce.offered_columns import offered_columns
from latticed.spark import sink_send
from latticed.spark.sink import _Plan, parse_sink_options
from latticed.spark.sink_columns import ColumnRecords
from latticed.spark.sink_packed import column_request, column_rows, packed_records, packed_rows
from latticed.spark.sink_records import PackedRecords, batch_rows, chunk_rows
from latticed.spark.sink_send import frame_buffers

blobs = st.binary(max_size=300) | st.sampled_from([b"x" * 70_000, b""])
keys = st.none() | st.binary(max_size=300) | st.just(b"k" * 65_536)  # up to the longest key a record has
rows = st.lists(st.tuples(blobs, keys), min_size=1, max_size=60)


def _sent(records: ColumnRecords) -> tuple[list[list[Any]], bytes]:
    """What the daemon takes from a chunk's request: the records, and the bytes its digest hashes."""
    frame = b"".join(frame_buffers(column_request(records)))  # as the request frame carries them
    fields = msgpack.unpackb(frame[4:])
    offered = offered_columns(fields, 100_000)
    return offered.rows(), offered.packed


@settings(max_examples=60, deadline=None)
@given(rows, st.booleans(), st.booleans(), st.integers(1, 25), st.integers(1, 30), st.integers(40, 3_000))
def test_columns_are_cut_as_the_records_and_carry_the_same_records(
    data: list[tuple[bytes, bytes | None]], text: bool, keyed: bool, cut: int, per: int, max_bytes: int
) -> None:
    batches = arrow_batches(data, text, keyed, cut)
    plain = [batch_rows(b, "q", resolve) for b in batches]
    columns = [column_rows(b, "q", resolve) for b in batches]
    for c, b, p in zip(columns, plain, batches, strict=True):
        assert c is not None and (c.queues, c.sizes.tolist()) == (b.queues, b.sizes)
        packed = packed_rows(p, "q", resolve)
        assert packed is not None and packed.sizes.tolist() == c.sizes.tolist()
    expected = list(chunk_rows(plain, max_records=per, max_bytes=max_bytes))
    got = list(chunk_rows([c for c in columns if c is not None], max_records=per, max_bytes=max_bytes))
    assert [(c.queue, c.index, len(c.records), c.size) for c in got] == [
        (c.queue, c.index, len(c.records), c.size) for c in expected
    ]
    for mine, theirs in zip(got, expected, strict=True):
        assert type(mine.records) is ColumnRecords
        records, digested = _sent(mine.records)
        assert records == theirs.records == mine.records.records()
        assert digested == msgpack.packb(theirs.records, use_bin_type=True)  # the list form's digest


def test_a_chunk_holds_slices_of_the_batches_not_a_row_each() -> None:
    data = [(b"v%05d" % i, b"k%d" % i) for i in range(5_000)]
    columns = [column_rows(b, "q", resolve) for b in arrow_batches(data, text=True, keyed=True, cut=1_000)]
    got = list(chunk_rows([c for c in columns if c is not None], max_records=1_500, max_bytes=1 << 30))
    assert [len(c.records) for c in got] == [1_500, 1_500, 1_500, 500]
    records = got[0].records
    assert type(records) is ColumnRecords
    assert (
        len(records.values) == len(records.keys) == 2
    )  # rows 0-999 of the first batch, 1000-1499 of the second
    assert _sent(records)[0] == [[v, k, []] for v, k in data[:1_500]]


def _columns_carry(mine: object, theirs: list[Any]) -> bool:
    return type(mine) is ColumnRecords and _sent(mine)[0] == theirs


def _packed_carry(mine: object, theirs: list[Any]) -> bool:
    return type(mine) is PackedRecords and packed_records(mine) == msgpack.packb(theirs, use_bin_type=True)


@pytest.mark.parametrize(
    ("fast", "carries"),
    [(column_rows, _columns_carry), (packed_rows, _packed_carry)],
    ids=["columns", "packed"],
)
def test_rows_of_both_shapes_in_one_chunk_carry_the_same_records(
    fast: Callable[..., Any], carries: Callable[[object, list[Any]], bool]
) -> None:
    """A queue's chunk may get records built row by row (``batch_rows``) and rows in a fast form, in
    either order: the same chunks, each carrying the records building every record row by row gives."""
    data = [(b"v" * (i % 7), None if i % 3 else b"k%d" % i) for i in range(90)]
    batches = arrow_batches(data, text=False, keyed=True, cut=20)
    fast_chunks = 0
    for first_plain in (True, False):
        mixed: list[Any] = []
        for i, b in enumerate(batches):
            f = fast(b, "q", resolve)
            mixed.append(batch_rows(b, "q", resolve) if (i % 2 == 0) == first_plain or f is None else f)
        plain = [batch_rows(b, "q", resolve) for b in batches]
        for per, max_bytes in ((30, 1 << 20), (90, 1 << 20), (1_000, 700)):
            expected = list(chunk_rows(plain, max_records=per, max_bytes=max_bytes))
            got = list(chunk_rows(mixed, max_records=per, max_bytes=max_bytes))
            assert [(c.index, len(c.records), c.size) for c in got] == [
                (c.index, len(c.records), c.size) for c in expected
            ]
            fast_chunks += sum(carries(c.records, t.records) for c, t in zip(got, expected, strict=True))
            for mine, theirs in zip(got, expected, strict=True):
                assert mine.records == theirs.records or carries(mine.records, theirs.records)
    assert fast_chunks > 0  # the fast form was taken somewhere, not only the records


def test_keys_absent_in_one_batch_and_present_in_the_next_share_a_chunk() -> None:
    unkeyed = arrow_batches([(b"a", None), (b"b", None)], text=False, keyed=False, cut=10)
    keyed = arrow_batches([(b"c", b"k"), (b"d", None)], text=False, keyed=True, cut=10)
    columns = [column_rows(b, "q", resolve) for b in unkeyed + keyed + unkeyed]
    (chunk,) = chunk_rows([c for c in columns if c is not None], max_records=10, max_bytes=1 << 20)
    assert type(chunk.records) is ColumnRecords
    sent = [(v, k) for v, k, _ in _sent(chunk.records)[0]]
    assert sent == [(b"a", None), (b"b", None), (b"c", b"k"), (b"d", None), (b"a", None), (b"b", None)]


# --- a task against a daemon: columns to one that speaks API 2, the list to one that does not --------


@pytest.fixture(scope="module")
def daemon() -> Iterator[InProcessDaemon]:
    root = Path(tempfile.mkdtemp(prefix="ld-sink-columns-"))
    d = start_in_process(DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"))
    yield d
    d.stop()


@pytest.mark.parametrize("speaks", [(1, 2), (1,)], ids=["api2", "api1"])
def test_a_task_sends_columns_only_to_a_daemon_that_speaks_them(
    daemon: InProcessDaemon, speaks: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"sink-{len(speaks)}"
    with daemon.client() as client:
        client.queue_create(queue)
    sent: list[dict[str, Any]] = []
    real_send = sink_send.InFlight.send

    def spy(self: sink_send.InFlight, request: dict[str, Any], *, alone: bool = False) -> Iterator[Any]:
        sent.append(request)
        return real_send(self, request, alone=alone)

    monkeypatch.setattr(sink_send.InFlight, "send", spy)
    monkeypatch.setattr(Client, "api_versions", lambda self: speaks)
    options = parse_sink_options({"socket": str(daemon.socket), "queue": queue, "recordsPerOffer": "40"})
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    plan = _Plan(options, False, schema)
    data = [(b"v%d" % i, None if i % 4 == 0 else b"k%d" % i) for i in range(100)]
    batches = arrow_batches(data, text=False, keyed=True, cut=30)
    batches = [b.select(["key", "value"]) for b in batches]
    commit = plan.write(iter(batches), "write:columns-test", 0)
    assert (commit.written, commit.duplicates) == (100, 0)
    assert len(sent) == 3 and all(("layout" in r) == (2 in speaks) for r in sent)
    assert all(("records" in r) == (2 not in speaks) for r in sent)
    again = plan.write(iter(batches), "write:columns-test", 0)  # a retried task: nothing twice
    assert (again.written, again.duplicates) == (0, 100)
    with daemon.client() as client:
        got = client.read(queue, 0)
    assert list(zip(got.values, got.keys, strict=True)) == data
