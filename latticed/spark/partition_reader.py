"""The executor side of the lattice source: read one planned range from this host's daemon as Arrow.

Everything here runs in a Spark Python worker after the partition was pickled, so it depends only on the
:class:`LatticePartition` (options included) and connects lazily, once per partition. Records are fetched
with bulk ``read`` calls (tens of thousands per round trip) and turned column by column into
``pyarrow.RecordBatch``es that match ``to_arrow_schema(schema, timezone="UTC")`` exactly, which Spark
takes without a per-row conversion.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import socket as socket_mod
import struct
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from latticed.api.client.blocking_client import Client
from latticed.crdt.core_errors import LatticedError
from latticed.errors import NotFoundError
from latticed.process.logs import get_logger, log_event
from latticed.spark.local_daemon import connect, resolve_socket
from latticed.spark.offsets import DataLossError, QueueView, readable_from, stops_at_fork

log = get_logger(__name__)

#: Records and bytes per ``read`` round trip (the daemon caps one reply at 100k records and
#: ``max_frame_bytes``). Replies of ~2 MiB cost the daemon and the worker less CPU than 5-8 MiB ones (fewer
#: fresh pages to fault in per reply) and than 1 MiB ones (fewer batches to hand to Spark).
READ_RECORDS: Final = 20_000
READ_BYTES: Final = 4 << 20

_HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
_TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
_TIMESTAMP_US = pa.timestamp("us", tz="UTC")
#: The ``packed`` read layout is little-endian, as Arrow's buffers are on the hosts Spark runs on; a
#: big-endian host asks for the ``lists`` layout instead.
PACKED: Final = sys.byteorder == "little"


class ReplicaLagError(LatticedError):
    """This host's daemon did not receive records the driver's daemon had planned, in time."""

    code = "replica_lag"


def lattice_schema(include_headers: bool) -> StructType:
    """Kafka's shape: queue/owner instead of topic/partition; ``headers`` only with ``includeHeaders``."""
    fields = [
        StructField("queue", StringType()),
        StructField("owner", StringType()),
        StructField("offset", LongType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("timestamp", TimestampType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(_HEADER)))
    return StructType(fields)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark checks every RecordBatch against (it compares types and nullability)."""
    from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415 - pulls in pandas; executors only

    return to_arrow_schema(lattice_schema(include_headers), timezone="UTC")


@dataclass(frozen=True)
class LatticePartition(InputPartition):
    """Records ``[lo, hi)`` of ``queue`` plus every option ``read()`` needs on the executor."""

    queue: str
    lo: int
    hi: int
    socket: str | None
    include_headers: bool
    fail_on_data_loss: bool
    timeout: float
    replica_wait: float


def record_batch(
    schema: pa.Schema,
    columns: Mapping[str, Any],
    count: int,
    *,
    queue: str,
    owner: str,
    include_headers: bool,
) -> pa.RecordBatch:
    """The first ``count`` records of a ``read`` reply's columns as one RecordBatch, column by column.

    ``columns`` holds the wire columns (``offsets``, ``keys``, ``values``, ``timestamps``, ``headers`` with
    each record's headers as ``None`` or ``[[name, value], ...]``)."""

    def cut(name: str) -> list[Any]:
        column: list[Any] = columns[name]
        return column if count == len(column) else column[:count]

    arrays = [
        pa.repeat(pa.scalar(queue, pa.string()), count),
        pa.repeat(pa.scalar(owner, pa.string()), count),
        pa.array(cut("offsets"), pa.int64()),
        pa.array(cut("keys"), pa.binary()),
        pa.array(cut("values"), pa.binary()),
        pa.array(cut("timestamps"), _TIMESTAMP_MS).cast(_TIMESTAMP_US),
    ]
    if include_headers:
        # Kafka's convention: a record without headers has null, not an empty array. Arrow wants each
        # struct as a tuple, msgpack gives lists.
        headers = [[(k, v) for k, v in h] if h else None for h in cut("headers")]
        arrays.append(pa.array(headers, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _scalar(kind: pa.DataType, raw: bytes) -> pa.Scalar:
    """A fixed-width scalar from its native bytes. (``pa.scalar``/``pa.array`` of Python objects import
    pandas on first use: ~35k more objects for the ``gc.collect()`` Spark's Python workers run after every
    task, and ~0.3 s more start-up for the driver's planner process. The read path stays off them.)"""
    return pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(raw)])[0]


_ZERO32 = _scalar(pa.int32(), struct.pack("=i", 0))
_ONE64 = _scalar(pa.int64(), struct.pack("=q", 1))


def constant_strings(text: str, count: int) -> pa.Array:
    """A string column holding ``text`` ``count`` times (the ``queue`` and ``owner`` columns)."""
    data = text.encode()
    one = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(struct.pack("=2i", 0, len(data))), pa.py_buffer(data)]
    )
    return pa.repeat(one[0], count)


def _compute() -> Any:
    """``pyarrow.compute``, imported on first use: only executors build arrays, and the import costs
    ~40 ms, which the planner process every streaming query starts would pay for nothing."""
    import pyarrow.compute  # noqa: PLC0415

    return pyarrow.compute


def _binary(lengths: bytes, data: bytes, count: int) -> pa.Array:
    """A binary array from the ``packed`` layout: ``count`` int32 lengths (-1 = null) and the bytes."""
    pc = _compute()
    sizes = pa.Array.from_buffers(pa.int32(), count + 1, [None, pa.py_buffer(b"\0\0\0\0" + lengths)])
    valid = None
    if pc.min(sizes).as_py() < 0:
        valid = pc.greater_equal(sizes.slice(1), _ZERO32).buffers()[1]
        sizes = pc.max_element_wise(sizes, _ZERO32)
    ends = pc.cumulative_sum(sizes)  # [0, end of 1st, end of 2nd, ...]: Arrow's offsets
    return pa.Array.from_buffers(pa.binary(), count, [valid, ends.buffers()[1], pa.py_buffer(data)])


def packed_record_batch(
    schema: pa.Schema,
    reply: Mapping[str, Any],
    count: int,
    *,
    queue: pa.Array,
    owner: pa.Array,
    include_headers: bool,
) -> pa.RecordBatch:
    """The first ``count`` records of a ``packed`` ``read`` reply as one RecordBatch, without a per-record
    step in Python: values and keys are Arrow binary arrays over the reply's buffers (no copy), offsets
    and timestamps are the reply's int64 buffers. ``queue``/``owner`` are constant columns of at least
    ``count`` rows."""
    n = int(reply["count"])
    if reply["offsets"] is None:
        before = _scalar(pa.int64(), struct.pack("=q", int(reply["first"]) - 1))
        offsets = _compute().cumulative_sum(pa.repeat(_ONE64, n), start=before)
    else:
        offsets = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(reply["offsets"])])
    if reply["key_lengths"] is None:
        keys = pa.nulls(n, pa.binary())
    else:
        keys = _binary(reply["key_lengths"], reply["keys"], n)
    arrays = [
        queue if len(queue) == n else queue.slice(0, n),
        owner if len(owner) == n else owner.slice(0, n),
        offsets,
        keys,
        _binary(reply["value_lengths"], reply["values"], n),
        pa.Array.from_buffers(_TIMESTAMP_MS, n, [None, pa.py_buffer(reply["timestamps"])]).cast(
            _TIMESTAMP_US
        ),
    ]
    if include_headers:
        headers = reply["headers"]
        if headers is None:
            arrays.append(pa.nulls(n, schema.field("headers").type))
        else:
            arrays.append(
                pa.array(
                    [[(k, v) for k, v in h] if h else None for h in headers], schema.field("headers").type
                )
            )
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    return batch if count == n else batch.slice(0, count)


def read_columns(client: Client, queue: str, lo: int, max_records: int) -> dict[str, Any]:
    """One bulk ``read`` as the daemon's reply: columns plus ``next_offset``/``start_offset``/``end_offset``.

    The ``packed`` layout (one buffer per column) where this host is little-endian; a daemon that predates
    it answers with lists, as does the ``lists`` request. Either is taken as it is, not as
    ``Client.read()``'s ReadBatch, which rebuilds every record's headers as tuples."""
    if PACKED:
        return client.read_packed(queue, lo, max_records=max_records, max_bytes=READ_BYTES)
    return client.call("read", queue=queue, max_records=max_records, max_bytes=READ_BYTES, **{"from": lo})


def reply_offsets(reply: Mapping[str, Any]) -> Sequence[int]:
    """The offsets of a ``read`` reply in either layout, in order."""
    if reply.get("layout") != "packed":
        offsets: list[int] = reply["offsets"]
        return offsets
    if reply["offsets"] is None:
        first = int(reply["first"])
        return range(first, first + int(reply["count"]))
    return memoryview(reply["offsets"]).cast("q")


def read_partition(part: LatticePartition) -> Iterator[pa.RecordBatch]:
    """Yield ``[part.lo, part.hi)`` of ``part.queue`` from this host's daemon.

    The next chunk is requested before the current one is converted and handed to Spark, so the daemon
    reads and packs it meanwhile (one request in flight; the client is only used from the fetch thread).
    Truncated records are data loss (fail, or skip and log). If this host's replica is behind the range
    the driver planned (its daemon may be ahead), or does not hold the queue yet (it has not replicated
    here), poll with backoff for up to ``replica_wait`` seconds, then fail with :class:`ReplicaLagError`.
    A range that goes past a frozen core-2 queue's fork point is not lag: it stops there (or fails, with
    ``failOnDataLoss``), see :func:`~latticed.spark.offsets.stops_at_fork`.
    """
    schema = arrow_schema(part.include_headers)
    owner = part.queue.partition("/")[0]
    constant: dict[int, tuple[pa.Array, pa.Array]] = {}  # rows -> the queue and owner columns
    client = connect(part.socket, part.timeout)
    fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lattice-read")

    def fetch(lo: int) -> Future[dict[str, Any]]:
        return fetcher.submit(read_columns, client, part.queue, lo, min(part.hi - lo, READ_RECORDS))

    pending: Future[dict[str, Any]] | None = None
    try:
        pos = part.lo
        deadline: float | None = None  # set while waiting for the replica
        pause = 0.01
        pending = fetch(pos)
        while pending is not None:
            try:
                batch = pending.result()
            except NotFoundError as exc:
                # The queue has not reached this host's daemon yet: the replica-lag case, not a typo
                # (the driver's daemon resolved the name), so wait as for missing records.
                pending = None
                deadline, pause = _wait_for_replica(part, None, deadline, pause, missing=exc)
                pending = fetch(pos)
                continue
            pending = None
            offsets = reply_offsets(batch)
            end_offset = int(batch["end_offset"])
            first = offsets[0] if offsets else max(pos, int(batch["start_offset"]))
            if first > pos:
                view = QueueView(part.queue, first, end_offset)
                pos = min(
                    readable_from(part.queue, pos, view, fail_on_data_loss=part.fail_on_data_loss), part.hi
                )
            if offsets:
                count = bisect.bisect_left(offsets, part.hi)  # the records below the partition's end
                if count > 0:
                    pos = max(pos, offsets[count - 1] + 1)
                if pos < part.hi:
                    pending = fetch(pos)
                if count > 0 and batch.get("layout") == "packed":
                    rows = len(offsets)
                    if rows not in constant:
                        constant[rows] = (constant_strings(part.queue, rows), constant_strings(owner, rows))
                    queue_column, owner_column = constant[rows]
                    yield packed_record_batch(
                        schema,
                        batch,
                        count,
                        queue=queue_column,
                        owner=owner_column,
                        include_headers=part.include_headers,
                    )
                elif count > 0:
                    yield record_batch(
                        schema,
                        batch,
                        count,
                        queue=part.queue,
                        owner=owner,
                        include_headers=part.include_headers,
                    )
                deadline = None
                pause = 0.01
                continue
            if pos >= part.hi:
                break
            if deadline is None and stops_at_fork(  # the rest of the range is past a fork point
                part.queue,
                pos,
                part.hi,
                QueueView.from_info(client.queue_info(part.queue)),
                part.fail_on_data_loss,
            ):
                break
            # Nothing at ``pos`` yet: this replica is behind what the driver planned.
            deadline, pause = _wait_for_replica(part, end_offset, deadline, pause)
            pending = fetch(pos)
    finally:
        if pending is not None:  # stopped early: let the request in flight finish before closing
            with contextlib.suppress(Exception):
                pending.result()
        fetcher.shutdown(wait=True)
        client.close()


def _wait_for_replica(
    part: LatticePartition,
    have: int | None,
    deadline: float | None,
    pause: float,
    *,
    missing: NotFoundError | None = None,
) -> tuple[float, float]:
    """One backoff step of waiting for this host's replica to catch up (``have``: its end offset; None
    with ``missing``: it holds no such queue yet). Sleeps at most until the deadline, so the last poll
    lands on it; raises :class:`ReplicaLagError` once the deadline has passed. Returns the deadline and
    the next pause."""
    now = time.monotonic()
    if deadline is None:
        deadline = now + part.replica_wait
        log_event(
            log,
            "spark.replica_wait",
            logging.INFO,
            queue=part.queue,
            want=part.hi,
            have=have,
            missing=missing is not None,
        )
    elif now >= deadline:
        where = (
            f"the latticed daemon on host {socket_mod.gethostname()} (socket {resolve_socket(part.socket)})"
        )
        waited = (
            f"within {part.replica_wait:g}s (option replicaWaitSeconds). Check replication between the hosts."
        )
        if missing is not None:
            raise ReplicaLagError(
                f"{where} does not hold queue {part.queue}, but this micro-batch was planned (from the "
                f"driver's daemon) to read offsets {part.lo}..{part.hi - 1} of it; the queue did not "
                f"arrive {waited}"
            ) from missing
        raise ReplicaLagError(
            f"{where} holds queue {part.queue} only up to offset {have}, but this micro-batch was "
            f"planned (from the driver's daemon) to read up to {part.hi}; it did not catch up {waited}"
        )
    time.sleep(max(0.0, min(pause, deadline - now)))
    return deadline, min(pause * 2, 0.5)


__all__ = [
    "DataLossError",
    "LatticePartition",
    "ReplicaLagError",
    "arrow_schema",
    "lattice_schema",
    "packed_record_batch",
    "read_partition",
    "record_batch",
]
