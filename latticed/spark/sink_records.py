"""The lattice sink's rows as idempotent offers: Arrow batches -> per-queue chunks, producer ids, sequences
(no Spark, no daemon: unit-testable with pyarrow alone).

Exactly once rests on the owner's idempotent append (docs/producers.md): every chunk a task sends names a
producer id and a sequence, and the owner writes a (producer, sequence) pair at most once. So both must
come out the same when Spark runs the same work again, on any host:

* the producer id is a hash of the write's scope (a streaming query's id, stable across driver restarts
  from its checkpoint; a batch write's ``writeId``) and the task's partition id;
* the sequence is ``epoch * CHUNKS_PER_EPOCH + chunk``: the micro-batch id (0 for a batch write) and the
  chunk's index among that queue's chunks in this partition. Chunks are cut at a fixed count of records
  and bytes, so the same rows in the same order cut the same way.

A retried, speculative or re-run task sends the same pairs: the owner answers those it has with the
offsets they got and writes the rest. If the rows differ (a source that does not replay the same rows),
the owner refuses a sequence whose record count changed, and the task fails rather than write twice.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from typing import Any, Final

import msgpack
import numpy as np
import pyarrow as pa

from latticed.errors import MalformedError
from latticed.spark.sink_columns import ColumnRecords, ColumnRows

#: Chunks one partition may send per queue and epoch (sequence = epoch * this + chunk).
CHUNKS_PER_EPOCH: Final = 1 << 20
#: Columns the sink reads (Kafka's sink shape, ``queue`` for ``topic``).
COLUMNS: Final = ("key", "value", "headers", "timestamp", "queue")
#: Per-record bytes counted on top of its key, value and headers (offsets, lengths, framing).
RECORD_OVERHEAD: Final = 32

#: A record as the local API takes it: ``[value, key, headers, timestamp_ms or None]``, or
#: ``[value, key, headers]`` when the rows have no timestamp (the same to the owner, one item less to
#: send and to digest).
Record = list[Any]


def producer_id(scope: str, partition: int) -> str:
    """The producer id of one task's rows: the same for every attempt of that partition, on any host."""
    digest = hashlib.blake2b(f"{scope}\x00{partition}".encode(), digest_size=16).hexdigest()
    return f"spark/{digest}"


def sequence(epoch: int, chunk: int) -> int:
    if not 0 <= chunk < CHUNKS_PER_EPOCH:
        raise MalformedError(
            f"a Spark partition sent more than {CHUNKS_PER_EPOCH} chunks to one queue in one batch"
        )
    return epoch * CHUNKS_PER_EPOCH + chunk


class PackedRecords:
    """A chunk's records as their msgpack bytes, in slices of Arrow buffers (no Python object per
    record): what :class:`PackedRows` are cut into. Records added as lists are packed here, byte for byte
    as msgpack packs them inside the request's array."""

    __slots__ = ("count", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, data: memoryview, count: int) -> None:
        """``count`` records packed back to back in ``data``."""
        self.parts.append(data)
        self.count += count

    def append(self, record: Record) -> None:
        self.add(memoryview(msgpack.packb(record, use_bin_type=True)), 1)

    def extend(self, records: list[Record]) -> None:
        for record in records:
            self.append(record)


@dataclass(slots=True)
class Chunk:
    """Records for one queue, sent as one idempotent request."""

    queue: str
    index: int
    records: list[Record] | PackedRecords | ColumnRecords = field(default_factory=list)
    size: int = 0


def _text_or_bytes(value: Any, column: str) -> bytes:
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode()
    raise MalformedError(f"lattice sink: column {column!r} holds {type(value).__name__}, not bytes or text")


def _headers(raw: Any) -> list[list[Any]]:
    if raw is None:
        return []
    out = []
    for item in raw:
        if not isinstance(item, dict) or item.get("key") is None or item.get("value") is None:
            raise MalformedError("lattice sink: a header is a struct of a non-null key and value")
        out.append([str(item["key"]), _text_or_bytes(item["value"], "headers")])
    return out


def _timestamps(column: pa.Array) -> list[int | None]:
    """Milliseconds since the epoch from a timestamp or an integer (milliseconds) column."""
    if pa.types.is_timestamp(column.type):
        micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        return [None if v is None else v // 1000 for v in micros.to_pylist()]
    if pa.types.is_integer(column.type):
        values: list[int | None] = column.to_pylist()
        if any(v is not None and v < 0 for v in values):
            raise MalformedError("lattice sink: a timestamp in milliseconds is negative")
        return values
    raise MalformedError(f"lattice sink: column 'timestamp' is {column.type}, not a timestamp or long")


def _binary(column: pa.Array, name: str) -> list[bytes | None]:
    """A string or binary column as bytes (strings cast to their UTF-8 bytes by Arrow, not row by row)."""
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    elif not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise MalformedError(f"lattice sink: column {name!r} is {column.type}, not string or binary")
    values: list[bytes | None] = column.to_pylist()
    return values


def _lengths(column: list[bytes | None]) -> list[int]:
    return [0 if v is None else len(v) for v in column]


@dataclass(slots=True)
class Rows:
    """One Arrow batch's rows as records: ``queues`` is one address for every row, or one per row;
    ``sizes`` what each record counts towards a chunk's bytes."""

    queues: str | list[str]
    records: list[Record]
    sizes: list[int]


@dataclass(slots=True)
class PackedRows:
    """One Arrow batch's rows for one queue as each record's msgpack bytes, back to back in ``data``;
    row ``i`` is ``data[offsets[i]:offsets[i + 1]]`` and counts ``sizes[i]`` towards a chunk's bytes
    (as :class:`Rows`' sizes)."""

    queues: str
    data: memoryview
    offsets: np.ndarray
    sizes: np.ndarray


def batch_rows(batch: pa.RecordBatch, queue: str | None, resolve: Any) -> Rows:
    """The records of ``batch``, a column at a time; ``queue`` (the option) wins over the column,
    ``resolve`` turns a column's ``NAME`` into ``OWNER/NAME``."""
    names = batch.schema.names
    n = batch.num_rows
    value_column = batch.column(names.index("value"))
    if value_column.null_count:
        raise MalformedError("lattice sink: a row's 'value' is null (a record always has a value)")
    values = _binary(value_column, "value")
    keys: list[bytes | None] = (
        _binary(batch.column(names.index("key")), "key") if "key" in names else [None] * n
    )
    headers = (
        [_headers(h) for h in batch.column(names.index("headers")).to_pylist()]
        if "headers" in names
        else [[]] * n
    )
    stamps = _timestamps(batch.column(names.index("timestamp"))) if "timestamp" in names else None
    sizes = list(map(sum, zip(_lengths(values), _lengths(keys), repeat(RECORD_OVERHEAD, n), strict=True)))
    if "headers" in names:
        sizes = [size + sum(len(k) + len(v) for k, v in h) for size, h in zip(sizes, headers, strict=True)]
    queues: str | list[str]
    if queue is not None:
        queues = resolve(queue)
    else:
        raw = batch.column(names.index("queue")).to_pylist()
        if None in raw or "" in raw:
            raise MalformedError("lattice sink: a row's 'queue' is null; set it, or the 'queue' option")
        named = {q: resolve(q) for q in set(raw)}
        queues = named[raw[0]] if len(named) == 1 else [named[q] for q in raw]
    columns = (values, keys, headers) if stamps is None else (values, keys, headers, stamps)
    records = list(map(list, zip(*columns, strict=True)))
    return Rows(queues, records, sizes)


def batch_records(batch: pa.RecordBatch, queue: str | None, resolve: Any) -> Iterator[tuple[str, Record]]:
    """``(queue address, record)`` per row of ``batch`` (see :func:`batch_rows`)."""
    rows = batch_rows(batch, queue, resolve)
    queues = repeat(rows.queues) if isinstance(rows.queues, str) else rows.queues
    return zip(queues, rows.records, strict=False)  # one address repeated, or one a row


def record_size(record: Record) -> int:
    """What a record counts towards a chunk's ``max_bytes``."""
    return (
        len(record[0]) + len(record[1] or b"") + RECORD_OVERHEAD + sum(len(k) + len(v) for k, v in record[2])
    )


class _Cutter:
    """Cuts records into per-queue chunks; a chunk closes once it holds ``max_records`` records or
    ``max_bytes`` bytes, so the same rows in the same order are cut the same way, however they are fed."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.open: dict[str, Chunk] = {}
        self.counts: dict[str, int] = {}

    def chunk(self, queue: str) -> Chunk:
        chunk = self.open.get(queue)
        if chunk is None:
            index = self.counts.get(queue, 0)
            self.counts[queue] = index + 1
            chunk = self.open[queue] = Chunk(queue, index)
        return chunk

    def listed(self, queue: str) -> Chunk:
        """:meth:`chunk`, whose records, if columns, are made lists (rows of another shape join them)."""
        chunk = self.chunk(queue)
        if type(chunk.records) is ColumnRecords:
            chunk.records = chunk.records.records()
        return chunk

    def add(self, queue: str, record: Record, size: int) -> Chunk | None:
        """One record; the chunk it closed, if any."""
        chunk = self.listed(queue)
        assert type(chunk.records) is list
        chunk.records.append(record)
        chunk.size += size
        if len(chunk.records) >= self.max_records or chunk.size >= self.max_bytes:
            del self.open[queue]
            return chunk
        return None

    def add_packed(self, rows: PackedRows) -> Iterator[Chunk]:
        """:meth:`add_all` for packed rows: the same cut, by a running sum over the size column."""
        i, n = 0, len(rows.sizes)
        while i < n:
            chunk = self.listed(rows.queues)
            if type(chunk.records) is list:  # rows of other shapes before: packed, the same bytes
                packed = PackedRecords()
                packed.extend(chunk.records)
                chunk.records = packed
            records = chunk.records
            assert type(records) is PackedRecords
            room = self.max_records - len(records)
            running = np.cumsum(rows.sizes[i : i + room])
            full = int(np.searchsorted(running, self.max_bytes - chunk.size, side="left"))
            take = full + 1 if full < len(running) else len(running)
            records.add(rows.data[int(rows.offsets[i]) : int(rows.offsets[i + take])], take)
            chunk.size += int(running[take - 1])
            i += take
            if len(records) >= self.max_records or chunk.size >= self.max_bytes:
                del self.open[rows.queues]
                yield chunk

    def add_columns(self, rows: ColumnRows) -> Iterator[Chunk]:
        """:meth:`add_packed` for rows as columns (the same cut); rows of another shape in the open
        chunk make the rest lists."""
        i, n = 0, len(rows.sizes)
        while i < n:
            chunk = self.chunk(rows.queues)
            if type(chunk.records) is not ColumnRecords:
                if len(chunk.records):
                    yield from self.add_all(rows.queues, *rows.rows(i))
                    return
                chunk.records = ColumnRecords()
            records = chunk.records
            room = self.max_records - len(records)
            running = np.cumsum(rows.sizes[i : i + room])
            full = int(np.searchsorted(running, self.max_bytes - chunk.size, side="left"))
            take = full + 1 if full < len(running) else len(running)
            records.add(rows, i, i + take)
            chunk.size += int(running[take - 1])
            i += take
            if len(records) >= self.max_records or chunk.size >= self.max_bytes:
                del self.open[rows.queues]
                yield chunk

    def add_all(self, queue: str, records: list[Record], sizes: list[int]) -> Iterator[Chunk]:
        """Records of one queue, sliced by a running sum instead of one at a time (same cut as
        :meth:`add`); yields the chunks they closed."""
        i, n = 0, len(records)
        while i < n:
            chunk = self.listed(queue)
            room = self.max_records - len(chunk.records)
            running = list(accumulate(sizes[i : i + room]))
            full = bisect_left(running, self.max_bytes - chunk.size)  # first record reaching max_bytes
            take = full + 1 if full < len(running) else len(running)
            assert not isinstance(chunk.records, ColumnRecords)
            chunk.records.extend(records[i : i + take])
            chunk.size += running[take - 1]
            i += take
            if len(chunk.records) >= self.max_records or chunk.size >= self.max_bytes:
                del self.open[queue]
                yield chunk


def chunk_rows(
    batches: Iterable[Rows | PackedRows | ColumnRows], *, max_records: int, max_bytes: int
) -> Iterator[Chunk]:
    """:func:`chunks` of the rows of many batches (a batch for one queue goes a slice at a time)."""
    cutter = _Cutter(max_records, max_bytes)
    for rows in batches:
        if type(rows) is PackedRows:
            yield from cutter.add_packed(rows)
            continue
        if type(rows) is ColumnRows:
            yield from cutter.add_columns(rows)
            continue
        assert type(rows) is Rows
        if isinstance(rows.queues, str):
            yield from cutter.add_all(rows.queues, rows.records, rows.sizes)
            continue
        for queue, record, size in zip(rows.queues, rows.records, rows.sizes, strict=True):
            closed = cutter.add(queue, record, size)
            if closed is not None:
                yield closed
    yield from cutter.open.values()


def chunks(rows: Iterable[tuple[str, Record]], *, max_records: int, max_bytes: int) -> Iterator[Chunk]:
    """The rows cut into per-queue chunks of at most ``max_records`` records and about ``max_bytes``
    (a chunk closes once it reaches either), each queue's in row order; the last partial chunks come at
    the end in the order their queues first appeared."""
    cutter = _Cutter(max_records, max_bytes)
    for queue, record in rows:
        closed = cutter.add(queue, record, record_size(record))
        if closed is not None:
            yield closed
    yield from cutter.open.values()


__all__ = [
    "CHUNKS_PER_EPOCH",
    "COLUMNS",
    "Chunk",
    "PackedRecords",
    "PackedRows",
    "Record",
    "Rows",
    "batch_records",
    "batch_rows",
    "chunk_rows",
    "chunks",
    "record_size",
    "producer_id",
    "sequence",
]
