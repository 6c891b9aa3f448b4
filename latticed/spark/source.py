"""``format("lattice")``: latticed queues as a Spark source (and sink), in the manner of Spark's Kafka source.

Spark runs the pieces in different processes: ``initialOffset``/``latestOffset``/``partitions`` in one
long-lived Python process on the driver (which keeps a client of the driver host's daemon), ``read`` in
executor workers that receive a pickled copy of the reader made *before* any of those calls. So readers
connect lazily, drop their client when pickled, and put everything ``read`` needs into the partition.
Offset semantics are in :mod:`latticed.spark.offsets`, the executor side in
:mod:`latticed.spark.partition_reader`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from latticed.api.client.blocking_client import Client
from latticed.errors import ConnectionClosedError, MalformedError
from latticed.spark.epoch_offsets import past_recovery, split_epochs, with_epochs
from latticed.spark.local_daemon import connect, list_views, resolve_queues
from latticed.spark.offsets import (
    Offsets,
    QueueSelection,
    QueueView,
    Range,
    batch_bounds,
    initial_offsets,
    latest_offsets,
    plan_ranges,
    resolve_spec_keys,
    sorted_offsets,
)
from latticed.spark.options import OffsetSpec, SourceOptions, parse_options
from latticed.spark.partition_reader import LatticePartition, lattice_schema, read_partition
from latticed.spark.timestamps import resolve as resolve_times

SOURCE_NAME = "lattice"
#: Pause before the one reconnect attempt of the driver's planner (systemd restarts latticed in ~2 s).
RECONNECT_PAUSE_S = 3.0


def _check_schema(schema: StructType, include_headers: bool) -> None:
    """The schema is fixed, like Kafka's: a user-supplied one that differs is refused, not half-honoured."""
    expected = lattice_schema(include_headers)
    if schema.simpleString() != expected.simpleString():
        raise MalformedError(
            f"the lattice source has a fixed schema ({expected.simpleString()}); remove .schema(...) "
            f"or set includeHeaders to match (got {schema.simpleString()})"
        )


class _Planner:
    """The driver's view of the subscription: one client, queue names resolved once."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: Client | None = None
        self._selection: QueueSelection | None = None
        self._names: dict[str, str] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a socket does not survive pickling to an executor
        return state

    def client(self) -> Client:
        if self._client is None:
            self._client = connect(self.options.socket, self.options.timeout)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def selection(self) -> QueueSelection:
        if self._selection is None:
            if self.options.queues is not None:
                self._names = resolve_queues(self.client(), self.options.queues)
                self._selection = QueueSelection(queues=tuple(dict.fromkeys(self._names.values())))
            else:
                self._selection = QueueSelection(pattern=self.options.queue_pattern)
        return self._selection

    def views(self, *, strict: bool) -> dict[str, QueueView]:
        """The subscribed queues now. A dropped connection (the daemon restarted) is retried once, after
        a pause, so a routine daemon restart does not fail a long-running query."""
        selection = self.selection()
        try:
            found = list_views(self.client())
        except ConnectionClosedError:
            self.close()
            time.sleep(RECONNECT_PAUSE_S)
            found = list_views(self.client())
        return selection.select(found, strict=strict)

    def spec(self, spec: OffsetSpec, option: str) -> OffsetSpec:
        """An offsets JSON with its keys (``NAME`` or ``OWNER/NAME``) rewritten to ``OWNER/NAME``."""
        if not isinstance(spec, dict):
            return spec
        names = dict(self._names)
        own = [key for key in spec if "/" not in key and key not in names]
        if own:
            names.update(resolve_queues(self.client(), tuple(own)))
        return resolve_spec_keys(spec, names, option)

    def bound(self, views: Mapping[str, QueueView], *, ending: bool) -> OffsetSpec:
        """``startingOffsets`` (``endingOffsets``) with the timestamp options, which take precedence,
        resolved to offsets against the daemon (latticed.spark.timestamps)."""
        o = self.options
        spec = self.spec(o.ending, "endingOffsets") if ending else self.spec(o.starting, "startingOffsets")
        times = o.ending_by_time if ending else o.starting_by_time
        if times is None:
            return spec
        if isinstance(times, dict):
            option = "endingOffsetsByTimestamp" if ending else "startingOffsetsByTimestamp"
            keyed = self.spec(times, option)
            assert isinstance(keyed, dict)
            times = keyed
        return resolve_times(
            views, times, self.offset_at, fallback=spec, ending=ending, strategy=o.by_time_strategy
        )

    def offset_at(self, queue: str, ts: int) -> tuple[int | None, int]:
        reply = self.client().call("offsets_for_times", queue=queue, timestamp=ts)
        return reply.get("offset"), int(reply["end"])

    def partitions(self, ranges: list[Range]) -> list[InputPartition]:
        o = self.options
        return [
            LatticePartition(
                queue=r.queue,
                lo=r.lo,
                hi=r.hi,
                socket=o.socket,
                include_headers=o.include_headers,
                fail_on_data_loss=o.fail_on_data_loss,
                timeout=o.timeout,
                replica_wait=o.replica_wait,
            )
            for r in ranges
        ]


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, LatticePartition):  # Spark's placeholder when there is nothing to read
        return iter(())
    return read_partition(partition)


class LatticeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader with read limits (``maxRecordsPerTrigger``) and Trigger.AvailableNow."""

    def __init__(self, options: SourceOptions) -> None:
        self._planner = _Planner(options)
        self._initial: dict[str, Any] | None = None
        self._target: Offsets | None = None
        self._latest: Offsets | None = None

    def initialOffset(self) -> dict[str, Any]:
        # Pinned for the life of this process; across restarts "latest" stays the -1 sentinel until the
        # first batch pins it (see latticed.spark.offsets), so a re-run of batch 0 sees the same start.
        if self._initial is None:
            views = self._planner.views(strict=True)
            self._initial = with_epochs(
                initial_offsets(views, self._planner.bound(views, ending=False)), views, {}
            )
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._planner.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        views = self._planner.views(strict=False)
        self._latest = sorted_offsets({queue: view.end for queue, view in views.items()})
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        fail = self._planner.options.fail_on_data_loss
        offsets, seen = split_epochs(start)
        # A recovery since the epoch the checkpoint was planned in: an empty batch back to the new epoch's
        # start (the freeze itself may never have been seen: see latticed.spark.epoch_offsets).
        rewinds = {
            queue: point
            for queue, view in views.items()
            if (offset := offsets.get(queue)) is not None
            and offset >= 0
            and (point := past_recovery(queue, offset, seen.get(queue, 0), view, fail_on_data_loss=fail))
            is not None
        }
        end = latest_offsets(
            {q: o for q, o in offsets.items() if q not in rewinds},
            views,
            max_rows=max_rows,
            target=self._target,
            fail_on_data_loss=fail,
        )
        end.update(rewinds)
        return with_epochs(end, views, seen)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    def prepareForTriggerAvailableNow(self) -> None:
        views = self._planner.views(strict=False)
        self._target = sorted_offsets({queue: view.end for queue, view in views.items()})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        o = self._planner.options
        ranges = plan_ranges(
            split_epochs(start)[0], split_epochs(end)[0], o.max_records_per_partition, o.min_partitions
        )
        return self._planner.partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the daemon keeps no per-reader state. (Spark calls this one batch late
        and not at all for the last Trigger.AvailableNow batch, so nothing may depend on it.)"""

    def stop(self) -> None:
        self._planner.close()


class LatticeBatchReader(DataSourceReader):
    """``spark.read.format("lattice")``: ``[startingOffsets, endingOffsets)`` resolved once, at planning."""

    def __init__(self, options: SourceOptions) -> None:
        self._planner = _Planner(options)

    def partitions(self) -> list[InputPartition]:
        planner = self._planner
        try:
            views = planner.views(strict=True)
            starting = planner.bound(views, ending=False)
            ending = planner.bound(views, ending=True)
            start, end = batch_bounds(
                views, starting, ending, fail_on_data_loss=planner.options.fail_on_data_loss
            )
            o = planner.options
            return planner.partitions(plan_ranges(start, end, o.max_records_per_partition, o.min_partitions))
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class LatticeDataSource(DataSource):
    """``spark.read/readStream.format("lattice")`` and ``df.write/writeStream.format("lattice")``
    (:mod:`latticed.spark.sink`); options are listed in docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _include_headers(self) -> bool:
        options: Mapping[str, str] = self.options
        value = next((v for k, v in options.items() if str(k).lower() == "includeheaders"), "false")
        return str(value).strip().lower() in ("true", "1", "yes")

    def schema(self) -> StructType:
        return lattice_schema(self._include_headers())

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_options(self.options, streaming=False)
        _check_schema(schema, options.include_headers)
        return LatticeBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_options(self.options, streaming=True)
        _check_schema(schema, options.include_headers)
        return LatticeStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from latticed.spark.sink import LatticeBatchWriter, parse_sink_options  # noqa: PLC0415 - writes only

        return LatticeBatchWriter(parse_sink_options(self.options), overwrite, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from latticed.spark.sink import LatticeStreamWriter, parse_sink_options  # noqa: PLC0415 - writes only

        return LatticeStreamWriter(parse_sink_options(self.options), overwrite, schema)


__all__ = ["SOURCE_NAME", "LatticeBatchReader", "LatticeDataSource", "LatticeStreamReader"]
