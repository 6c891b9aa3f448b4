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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa

from latticed.errors import MalformedError

#: Chunks one partition may send per queue and epoch (sequence = epoch * this + chunk).
CHUNKS_PER_EPOCH: Final = 1 << 20
#: Columns the sink reads (Kafka's sink shape, ``queue`` for ``topic``).
COLUMNS: Final = ("key", "value", "headers", "timestamp", "queue")
#: Per-record bytes counted on top of its key, value and headers (offsets, lengths, framing).
RECORD_OVERHEAD: Final = 32

#: A record as the local API takes it: ``[value, key, headers, timestamp_ms or None]``.
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


@dataclass(slots=True)
class Chunk:
    """Records for one queue, sent as one idempotent request."""

    queue: str
    index: int
    records: list[Record] = field(default_factory=list)
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


def batch_records(batch: pa.RecordBatch, queue: str | None, resolve: Any) -> Iterator[tuple[str, Record]]:
    """``(queue address, record)`` per row of ``batch``; ``queue`` (the option) wins over the column,
    ``resolve`` turns a column's ``NAME`` into ``OWNER/NAME``."""
    names = batch.schema.names
    n = batch.num_rows
    values = batch.column(names.index("value")).to_pylist()
    keys = batch.column(names.index("key")).to_pylist() if "key" in names else [None] * n
    headers = batch.column(names.index("headers")).to_pylist() if "headers" in names else [None] * n
    stamps = _timestamps(batch.column(names.index("timestamp"))) if "timestamp" in names else [None] * n
    queues: Sequence[Any] = (
        [queue] * n if queue is not None else batch.column(names.index("queue")).to_pylist()
    )
    for value, key, hdr, ts, q in zip(values, keys, headers, stamps, queues, strict=True):
        if value is None:
            raise MalformedError("lattice sink: a row's 'value' is null (a record always has a value)")
        if q is None or q == "":
            raise MalformedError("lattice sink: a row's 'queue' is null; set it, or the 'queue' option")
        record: Record = [_text_or_bytes(value, "value")]
        record.append(None if key is None else _text_or_bytes(key, "key"))
        record += [_headers(hdr), ts]
        yield resolve(q), record


def chunks(rows: Iterable[tuple[str, Record]], *, max_records: int, max_bytes: int) -> Iterator[Chunk]:
    """The rows cut into per-queue chunks of at most ``max_records`` records and about ``max_bytes``
    (a chunk closes once it reaches either), each queue's in row order; the last partial chunks come at
    the end in the order their queues first appeared."""
    open_chunks: dict[str, Chunk] = {}
    counts: dict[str, int] = {}
    for queue, record in rows:
        chunk = open_chunks.get(queue)
        if chunk is None:
            index = counts.get(queue, 0)
            counts[queue] = index + 1
            chunk = open_chunks[queue] = Chunk(queue, index)
        chunk.records.append(record)
        chunk.size += len(record[0]) + len(record[1] or b"") + RECORD_OVERHEAD
        chunk.size += sum(len(k) + len(v) for k, v in record[2])
        if len(chunk.records) >= max_records or chunk.size >= max_bytes:
            del open_chunks[queue]
            yield chunk
    yield from open_chunks.values()


__all__ = [
    "CHUNKS_PER_EPOCH",
    "COLUMNS",
    "Chunk",
    "Record",
    "batch_records",
    "chunks",
    "producer_id",
    "sequence",
]
