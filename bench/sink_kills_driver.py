"""The streaming driver of bench/bench_sink_kills.py, run as its own process against a standalone cluster
(a driver and its JVM are one process group, so the bench can kill it -9 as a machine dies):

    python sink_kills_driver.py MASTER FILES SOCKET QUEUE CHECKPOINT MARKERS RUN \
        FILES_PER_TRIGGER RECORDS_PER_OFFER

Parquet files of one ``id`` column under ``FILES`` are read ``FILES_PER_TRIGGER`` at a time
(``Trigger.AvailableNow``: the query stops once every file is written) and written with
``writeStream.format("lattice")`` through the daemon at ``SOCKET`` into ``QUEUE``. A ``mapInArrow`` step
turns each row into a record: key = the id, value = the id padded to 100 bytes, headers ``q``, ``b``,
``p`` = the query's id, the micro-batch and the partition that wrote it (the same in every attempt, so a
retried chunk is the same chunk), and writes ``MARKERS/RUN-B-P-A`` = its pid when attempt A of partition
P of micro-batch B starts in driver run RUN (what the bench kills, and how it tells where the kills landed),
and ``MARKERS/RUN-B-P-A.done`` once it has handed on its last row.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA = "key string, value string, headers array<struct<key: string, value: binary>>"
VALUE_BYTES = 100


def stamp(markers: str, run: str) -> Any:
    """The ``mapInArrow`` function: ids in, the sink's columns out."""

    def records(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # noqa: PLC0415 - in the executor
        import pyarrow.compute as pc  # noqa: PLC0415
        from pyspark import TaskContext  # noqa: PLC0415

        context = TaskContext.get()
        assert context is not None
        query = context.getLocalProperty("sql.streaming.queryId") or ""
        batch = context.getLocalProperty("streaming.sql.batchId") or ""
        part = context.partitionId()
        marker = Path(markers, f"{run}-{batch}-{part}-{context.attemptNumber()}")
        marker.write_text(str(os.getpid()))
        header_type = pa.struct([("key", pa.string()), ("value", pa.binary())])
        one = [("q", query.encode()), ("b", batch.encode()), ("p", str(part).encode())]
        for ids in batches:
            n = ids.num_rows
            keys = pc.cast(ids.column(0), pa.string())
            values = pc.utf8_lpad(keys, width=VALUE_BYTES, padding="x")
            flat = pa.StructArray.from_arrays(
                [
                    pa.array([k for k, _ in one] * n, pa.string()),
                    pa.array([v for _, v in one] * n, pa.binary()),
                ],
                fields=list(header_type),
            )
            offsets = pa.array(range(0, len(one) * n + 1, len(one)), pa.int32())
            headers = pa.ListArray.from_arrays(offsets, flat)
            yield pa.RecordBatch.from_arrays([keys, values, headers], names=["key", "value", "headers"])
        marker.with_suffix(".done").touch()  # every row handed on (the sink may still be sending)

    return records


def session(master: str) -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from latticed.spark import register  # noqa: PLC0415

    jvm = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    spark = (
        SparkSession.builder.master(master)
        .appName("latticed-bench-sink-kills")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.driver.extraJavaOptions", jvm)
        .config("spark.executor.extraJavaOptions", jvm)
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        # A file source cuts a batch's files by bytes per core: pinned, a re-run batch is cut alike
        # (one file per partition here) whatever executors are up when it is planned (docs/spark.md).
        .config("spark.sql.files.minPartitionNum", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main(argv: list[str]) -> None:
    master, files, sock, queue, checkpoint, markers, run, per_trigger, per_offer = argv
    spark = session(master)
    ids = spark.readStream.schema("id long").option("maxFilesPerTrigger", per_trigger).parquet(files)
    query = (
        ids.mapInArrow(stamp(markers, run), SCHEMA)
        .writeStream.format("lattice")
        .option("socket", sock)
        .option("queue", queue)
        .option("recordsPerOffer", per_offer)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print(f"QUERY {query.id}", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    print("DRIVER DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
