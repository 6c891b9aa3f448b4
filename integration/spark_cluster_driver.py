"""A driver for integration/test_spark_cluster_sink.py, run as its own process against a standalone
cluster: ``python spark_cluster_driver.py MASTER MODE ...``.

batch  SOCKET QUEUE N MARKERS: ``N`` rows over 4 partitions written with ``df.write.format("lattice")``.
       The first attempt of partition 0 stops half-way (after 200 rows, which the sink has sent by then) and
       writes ``MARKERS/blocked`` with its pid, then waits to be killed with its worker.
stream SOCKET IN OUT CHECKPOINT MARKERS BLOCK: a streaming query from queue ``IN`` into queue ``OUT``
       (``Trigger.AvailableNow``, 300 rows a micro-batch). With ``BLOCK`` = 1, partition 0 of micro-batch 2
       stops after 100 rows as above (``MARKERS/blocked``), and the test kills this driver.

Every row flows through a ``mapInArrow`` step, which is where a run is made to stop. Rows are ~1 KB:
the JVM hands rows to the sink's Python worker through a 64 KiB buffer, which must fill for the rows
before the stop to reach the sink.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def stopper(markers: str, block: bool, after: int) -> Any:
    """The ``mapInArrow`` function: rows pass through; in the task chosen to stop, after ``after`` rows
    (which the sink has sent by then) it marks the spot and waits (forever: the test kills it)."""

    def passing(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext  # noqa: PLC0415 - in the executor

        context = TaskContext.get()
        assert context is not None
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        chosen = (
            block and context.attemptNumber() == 0 and context.partitionId() == 0 and batch_id in (None, "2")
        )
        seen = 0
        for batch in batches:
            yield batch
            seen += batch.num_rows
            if chosen and seen >= after:
                Path(markers, "blocked").write_text(str(os.getpid()))
                while True:
                    time.sleep(60)

    return passing


def session(master: str) -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from latticed.spark import register  # noqa: PLC0415

    spark = (
        SparkSession.builder.master(master)
        .appName("latticed-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main(argv: list[str]) -> None:
    master, mode, sock, *rest = argv
    spark = session(master)
    if mode == "batch":
        queue, n, markers = rest
        df = spark.range(0, int(n), 1, 4).selectExpr(
            "cast(id as string) as key", "concat('row-', cast(id as string), '-', repeat('x', 1000)) as value"
        )
        (
            df.mapInArrow(stopper(markers, True, 200), df.schema)
            .write.format("lattice")
            .mode("append")
            .option("socket", sock)
            .option("queue", queue)
            .option("recordsPerOffer", "50")
            .save()
        )
    elif mode == "stream":
        source, sink, checkpoint, markers, block = rest
        df = (
            spark.readStream.format("lattice")
            .option("socket", sock)
            .option("queues", source)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "300")
            .load()
            .selectExpr("key", "value")
            .repartition(2)
        )
        query = (
            df.mapInArrow(stopper(markers, block == "1", 100), df.schema)
            .writeStream.format("lattice")
            .option("socket", sock)
            .option("queue", sink)
            .option("recordsPerOffer", "50")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print("DRIVER DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
