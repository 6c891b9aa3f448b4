"""``df.write.format("lattice")`` and ``df.writeStream.format("lattice")``: a queue as a Spark sink, in the
manner of Spark's Kafka sink (columns ``value``, and optionally ``key``, ``headers``, ``timestamp``,
``queue``; the ``queue`` option names one queue for every row).

Spark plans on the driver (``writer``/``streamWriter`` run there, in a Python worker that pickles the
writer it returns) and runs ``write`` in executor workers, once per task. Each task writes through the
daemon of its own host (the ``socket`` option is resolved there): into that daemon's own queue, or, for
another daemon's queue that lists it as a producer, as a remote offer its owner signs
(docs/producers.md). Every request is idempotent and keyed so a retried, speculative or re-run task
writes nothing twice (:mod:`latticed.spark.sink_records`); ``commit`` and ``abort`` on the driver have
nothing left to do.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from latticed.api.client.blocking_client import Produced
from latticed.api.messages import PACKED_OFFERS_VERSION
from latticed.errors import MalformedError
from latticed.process.logs import get_logger, log_event
from latticed.spark.local_daemon import connect
from latticed.spark.sink_columns import ColumnRecords
from latticed.spark.sink_packed import column_request, column_rows, packed_records, packed_rows
from latticed.spark.sink_records import COLUMNS, batch_rows, chunk_rows, producer_id, sequence
from latticed.spark.sink_send import InFlight

log = get_logger(__name__)

#: Local properties Spark sets on a streaming query's tasks: its id (kept across restarts from its
#: checkpoint) and the micro-batch's id.
QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"

DEFAULT_TIMEOUT_S: Final = 30.0
#: How long a task waits for another daemon's queue's owner to be reached and answer, per request.
DEFAULT_OWNER_WAIT_S: Final = 60.0
DEFAULT_RECORDS_PER_OFFER: Final = 10_000
#: Bytes per request: well under the daemon's 16 MiB frames, big enough that a request's fixed cost
#: (a round trip, one commit) is spread over many records.
BYTES_PER_OFFER: Final = 4 << 20

#: Every option the sink understands, lower-cased (Spark adds the last three itself).
KNOWN: Final = frozenset(
    {
        "socket",
        "queue",
        "timeout",
        "ownerwaitseconds",
        "writeid",
        "recordsperoffer",
        "checkpointlocation",
        "path",
        "paths",
    }
)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """What the sink was asked to do; ``queue`` is resolved to ``OWNER/NAME`` on the driver."""

    socket: str | None
    queue: str | None
    timeout: float
    owner_wait: float
    write_id: str | None
    records_per_offer: int


def _positive(name: str, text: str, kind: type[int] | type[float]) -> Any:
    try:
        value = kind(text.strip())
    except ValueError:
        raise MalformedError(
            f"lattice sink option {name!r}: expected a positive number, got {text!r}"
        ) from None
    if not value > 0:
        raise MalformedError(f"lattice sink option {name!r}: expected a positive number, got {text!r}")
    return value


def check_queue(text: str, where: str) -> str:
    owner, sep, name = text.strip().rpartition("/")
    if not name or (sep and (not owner or "/" in owner)):
        raise MalformedError(f"lattice sink: {where} {text!r} is neither NAME nor OWNER/NAME")
    return text.strip()


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate Spark's option map (case-insensitive, as Spark hands it over)."""
    opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise MalformedError(f"unknown lattice sink option(s): {', '.join(unknown)} (see docs/spark.md)")
    write_id = opts.get("writeid", "").strip() or None
    if write_id is not None and len(write_id) > 256:
        raise MalformedError("lattice sink option 'writeId': at most 256 characters")
    return SinkOptions(
        socket=opts.get("socket") or None,
        queue=check_queue(opts["queue"], "option 'queue'") if opts.get("queue", "").strip() else None,
        timeout=_positive("timeout", opts.get("timeout", str(DEFAULT_TIMEOUT_S)), float),
        owner_wait=_positive(
            "ownerWaitSeconds", opts.get("ownerwaitseconds", str(DEFAULT_OWNER_WAIT_S)), float
        ),
        write_id=write_id,
        records_per_offer=_positive(
            "recordsPerOffer", opts.get("recordsperoffer", str(DEFAULT_RECORDS_PER_OFFER)), int
        ),
    )


def _text_or_binary(t: DataType) -> bool:
    return isinstance(t, StringType | BinaryType)


def check_schema(schema: StructType, has_queue_option: bool) -> None:
    """The DataFrame's columns as the sink reads them (Kafka's sink rules: ``value`` required, the rest
    optional; a column the sink does not know is refused rather than dropped)."""
    types = {f.name: f.dataType for f in schema.fields}
    unknown = sorted(set(types) - set(COLUMNS))
    if unknown:
        raise MalformedError(
            f"lattice sink: unknown column(s) {', '.join(unknown)}; it writes {', '.join(COLUMNS)}"
        )
    if "value" not in types or not _text_or_binary(types["value"]):
        raise MalformedError("lattice sink: needs a column 'value' of type string or binary")
    if "key" in types and not _text_or_binary(types["key"]):
        raise MalformedError("lattice sink: column 'key' is string or binary")
    header = types.get("headers")
    if header is not None and not (
        isinstance(header, ArrayType)
        and isinstance(header.elementType, StructType)
        and [f.name for f in header.elementType.fields] == ["key", "value"]
        and isinstance(header.elementType.fields[0].dataType, StringType)
        and _text_or_binary(header.elementType.fields[1].dataType)
    ):
        raise MalformedError("lattice sink: column 'headers' is array<struct<key: string, value: binary>>")
    stamp = types.get("timestamp")
    if stamp is not None and not isinstance(stamp, TimestampType | TimestampNTZType | LongType | IntegerType):
        raise MalformedError("lattice sink: column 'timestamp' is a timestamp or a long (milliseconds)")
    if "queue" in types and not isinstance(types["queue"], StringType):
        raise MalformedError("lattice sink: column 'queue' is a string (NAME or OWNER/NAME)")
    if not has_queue_option and "queue" not in types:
        raise MalformedError("lattice sink: set the 'queue' option or give the DataFrame a 'queue' column")


@dataclass(frozen=True)
class LatticeCommit(WriterCommitMessage):
    """One task's outcome: records written, and records the owner already had (a retry's)."""

    partition: int
    written: int
    duplicates: int


class _Plan:
    """What every task needs, fixed on the driver: options, this daemon's identity (a ``NAME`` in the
    queue column means the driver's daemon's queue, as the option does)."""

    def __init__(self, options: SinkOptions, overwrite: bool, schema: StructType) -> None:
        if overwrite:
            raise MalformedError("lattice sink: a queue is append-only; write with mode('append')")
        check_schema(schema, options.queue is not None)
        with connect(options.socket, options.timeout) as client:
            self.identity = client.identity()
            if options.queue is not None and "/" not in options.queue:
                info = client.queue_info(options.queue)  # one of this daemon's: it must exist
                options = dataclasses.replace(options, queue=str(info["queue"]))
        self.options = options

    def resolve(self, queue: Any) -> str:
        text = check_queue(str(queue), "queue")
        return text if "/" in text else f"{self.identity}/{text}"

    def write(self, batches: Iterator[pa.RecordBatch], scope: str, epoch: int) -> LatticeCommit:
        """Send this task's rows (see the module docstring); runs on an executor."""
        from pyspark import TaskContext  # noqa: PLC0415 - only inside a task

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        producer = producer_id(scope, partition)
        o = self.options
        answers: list[Produced] = []
        with connect(o.socket, o.timeout) as client:
            own = client.identity() + "/"  # this host's daemon's queues take pipelined requests
            shape = column_rows if PACKED_OFFERS_VERSION in client.api_versions() else packed_rows
            rows = (
                shape(batch, o.queue, self.resolve) or batch_rows(batch, o.queue, self.resolve)
                for batch in batches
            )
            flight = InFlight(client.open_stream(o.timeout + o.owner_wait))
            try:
                for chunk in chunk_rows(rows, max_records=o.records_per_offer, max_bytes=BYTES_PER_OFFER):
                    request = {
                        "queue": chunk.queue,
                        **_records(chunk.records),
                        "producer": producer,
                        "seq": sequence(epoch, chunk.index),
                        "shared": True,
                        "wait": o.owner_wait,
                    }
                    answers += flight.send(request, alone=not chunk.queue.startswith(own))
                answers += flight.drain()
            finally:
                flight.stream.close()
        written = sum(a.count for a in answers if not a.duplicate)
        return LatticeCommit(partition, written, sum(a.count for a in answers if a.duplicate))


def _records(records: Any) -> dict[str, Any]:
    """A chunk's records as request fields: columns (local API 2) or a list."""
    if type(records) is ColumnRecords:
        return {"v": PACKED_OFFERS_VERSION, **column_request(records)}
    return {"records": packed_records(records)}


def _task_property(name: str) -> str:
    from pyspark import TaskContext  # noqa: PLC0415 - only inside a task

    context = TaskContext.get()
    value = context.getLocalProperty(name) if context is not None else None
    if value is None:
        raise MalformedError(f"lattice sink: Spark did not give this streaming task its {name!r}")
    return value


def _log_outcome(messages: list[WriterCommitMessage | None], batch: str) -> None:
    done = [m for m in messages if isinstance(m, LatticeCommit)]
    log_event(
        log,
        "spark.sink_committed",
        batch=batch,
        written=sum(m.written for m in done),
        duplicates=sum(m.duplicates for m in done),
    )


class LatticeBatchWriter(DataSourceArrowWriter):
    """``df.write.format("lattice")``: one write id for every task of the job (``writeId``, or a fresh
    one): a task retry writes nothing twice, and so does a re-run of the job with the same ``writeId``."""

    def __init__(self, options: SinkOptions, overwrite: bool, schema: StructType) -> None:
        self._plan = _Plan(options, overwrite, schema)
        self._scope = "write:" + (options.write_id or str(uuid.uuid4()))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LatticeCommit:
        return self._plan.write(iterator, self._scope, 0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_outcome(messages, "batch")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """What committed tasks wrote stays (a queue is append-only); a re-run with the same ``writeId``
        writes only the rest."""


class LatticeStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("lattice")``: keyed by the query's id and the micro-batch id, which a
    restart from the checkpoint keeps, so a re-run batch writes nothing twice."""

    def __init__(self, options: SinkOptions, overwrite: bool, schema: StructType) -> None:
        self._plan = _Plan(options, overwrite, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LatticeCommit:
        scope = "query:" + _task_property(QUERY_ID_PROPERTY)
        epoch = int(_task_property(BATCH_ID_PROPERTY))
        return self._plan.write(iterator, scope, epoch)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_outcome(messages, str(batchId))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """As for a batch write: Spark runs the batch again, and only what is missing is written."""


__all__ = [
    "LatticeBatchWriter",
    "LatticeCommit",
    "LatticeStreamWriter",
    "SinkOptions",
    "check_schema",
    "parse_sink_options",
]
