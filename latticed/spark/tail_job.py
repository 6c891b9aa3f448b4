"""The tail pipeline: latticed queues -> Parquet, exactly once, plus a windowed count per key.

Run it with ``python -m latticed.spark.tail_job --queues events --output DIR --checkpoint DIR`` (or under
``spark-submit``, or from systemd/latticed-spark-tail.service). Two streaming queries share the options:

* **archive**: every record into Parquet under ``--output``, partitioned by ``queue`` and ``date``; with
  ``--json-schema 'a INT, b STRING'`` the JSON values are decoded into those columns. The file sink and
  the source's checkpointed offsets make it exactly once across restarts.
* **windows**: records per key in 1-minute tumbling windows (event time = the record timestamp) with a
  watermark, into Parquet under ``--windows-output`` (a window lands once the watermark passes its end) or
  to the console (update mode) without it.

``run_demo_tail`` is the short run ``make demo`` ends with.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from latticed.errors import MalformedError
from latticed.spark import register, use_worker_python
from latticed.spark.source import SOURCE_NAME
from latticed.spark.tuning import is_local_path, use_local_checkpoint_manager

METADATA_COLUMNS = ("queue", "owner", "offset", "key", "timestamp", "date")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours"}


def spark_interval(text: str) -> str:
    """``500ms``/``1s``/``2m``/``1h`` as Spark's interval words; other text is passed through."""
    match = _DURATION.match(text)
    return f"{match.group(1)} {_UNITS[match.group(2)]}" if match else text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m latticed.spark.tail_job",
        description="Tail latticed queues into Parquet with Spark Structured Streaming (exactly once).",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--queues", help="comma list of queues: NAME (your own) or OWNER/NAME")
    which.add_argument("--queue-pattern", help="glob over OWNER/NAME; later queues are tailed too")
    parser.add_argument("--output", required=True, type=Path, help="Parquet directory of the records")
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint directory (keep it!)")
    parser.add_argument("--json-schema", help="decode JSON values into these columns, e.g. 'a INT, b STRING'")
    parser.add_argument("--windows-output", type=Path, help="Parquet directory of the per-key window counts")
    parser.add_argument("--window", default="1 minute", help="tumbling window length [1 minute]")
    parser.add_argument("--watermark", default="1 minute", help="how late a record may arrive [1 minute]")
    parser.add_argument("--trigger", default="1s", help="micro-batch interval, e.g. 500ms, 1s, 1m [1s]")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then exit")
    parser.add_argument("--starting-offsets", default="earliest", help="first run: earliest|latest|JSON")
    parser.add_argument("--max-records-per-trigger", type=int, help="cap on records per micro-batch")
    parser.add_argument("--socket", help="latticed socket on each host ({host} and $VAR are expanded there)")
    parser.add_argument("--master", help="Spark master when not run by spark-submit [local[*]]")
    return parser


def source_options(args: argparse.Namespace) -> dict[str, str]:
    """The lattice source's options from the command line."""
    options = {"startingOffsets": args.starting_offsets}
    if args.queues:
        options["queues"] = args.queues
    else:
        options["queuePattern"] = args.queue_pattern
    if args.socket:
        options["socket"] = args.socket
    if args.max_records_per_trigger:
        options["maxRecordsPerTrigger"] = str(args.max_records_per_trigger)
    return options


def read_records(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    return spark.readStream.format(SOURCE_NAME).options(**options).load()


def archive_frame(records: DataFrame, json_schema: str | None) -> DataFrame:
    """Records with a ``date`` partition column; with a schema, the JSON value becomes columns.

    A value that is not valid JSON for the schema gives nulls (Spark's PERMISSIVE mode) rather than
    stopping the pipeline; the raw value is kept in ``value`` only when no schema is given."""
    out = records.withColumn("date", F.to_date("timestamp"))
    if json_schema is None:
        return out
    schema = StructType.fromDDL(json_schema)
    if not isinstance(schema, StructType):
        raise MalformedError(
            f"--json-schema: expected column definitions like 'a INT, b STRING', got {json_schema!r}"
        )
    clash = sorted(set(schema.fieldNames()) & set(METADATA_COLUMNS))
    if clash:
        raise MalformedError(f"--json-schema: columns {', '.join(clash)} clash with the record's own columns")
    decoded = F.from_json(F.col("value").cast("string"), schema)
    return out.withColumn("data", decoded).select(*METADATA_COLUMNS, "data.*")


def window_counts(records: DataFrame, window: str, watermark: str) -> DataFrame:
    """Records per (queue, key) in tumbling event-time windows; the watermark bounds the state kept."""
    return (
        records.withWatermark("timestamp", watermark)
        .groupBy(F.window("timestamp", window), "queue", F.col("key").cast("string").alias("key"))
        .count()
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "queue",
            "key",
            "count",
        )
    )


def start_queries(spark: SparkSession, args: argparse.Namespace) -> list[StreamingQuery]:
    """Start the archive and window queries (each with its own checkpoint under ``--checkpoint``)."""
    register(spark)
    if is_local_path(str(args.checkpoint)):
        use_local_checkpoint_manager(spark)  # ~90 ms less per micro-batch (latticed/spark/tuning.py)
    options = source_options(args)
    # A backlog (a first run, a restart after downtime) is spread over every core (docs/spark.md).
    options["minPartitions"] = str(max(1, int(spark.sparkContext.defaultParallelism)))
    trigger: dict[str, Any] = (
        {"availableNow": True} if args.available_now else {"processingTime": spark_interval(args.trigger)}
    )
    archive = (
        archive_frame(read_records(spark, options), args.json_schema)
        .writeStream.queryName("lattice_archive")
        .format("parquet")
        .partitionBy("queue", "date")
        .option("path", str(args.output))
        .option("checkpointLocation", str(args.checkpoint / "archive"))
        .trigger(**trigger)
        .start()
    )
    counts = window_counts(read_records(spark, options), args.window, args.watermark)
    if args.windows_output is not None:
        writer = (
            counts.writeStream.format("parquet").outputMode("append").option("path", str(args.windows_output))
        )
    else:
        writer = counts.writeStream.format("console").outputMode("update").option("truncate", "false")
    windows = (
        writer.queryName("lattice_windows")
        .option("checkpointLocation", str(args.checkpoint / "windows"))
        .trigger(**trigger)
        .start()
    )
    return [archive, windows]


_LATTICED_ERROR = re.compile(r"^latticed\.[\w.]*?(\w+Error): (.*)$", re.MULTILINE)


def summarize(error: str) -> str:
    """A query failure in one line: the source's own error if there is one, not Spark's plan dump."""
    found = _LATTICED_ERROR.findall(error)
    if found:
        name, message = found[-1]
        return f"{name}: {message}"
    return error.strip().splitlines()[0] if error.strip() else error


def wait(queries: Sequence[StreamingQuery], stop: threading.Event) -> str | None:
    """Until every query ends (AvailableNow), one fails, or ``stop`` is set; the first error (one line)
    or None."""
    while not stop.is_set() and all(q.isActive for q in queries):
        queries[0].awaitTermination(1)
    if stop.is_set() or any(q.exception() is not None for q in queries):
        for query in queries:
            query.stop()
    else:
        for query in queries:
            query.awaitTermination()
    errors = [summarize(str(q.exception())) for q in queries if q.exception() is not None]
    return errors[0] if errors else None


#: Spark's default retries of a failed task may all land on the executor it failed on. A host without a
#: daemon (or with a socket elsewhere) fails a task within milliseconds, so on a cluster every attempt
#: can go there and fail the job while healthy hosts stand by; exclusion sends the retry elsewhere.
CLUSTER_DEFAULTS: Final = {"spark.excludeOnFailure.enabled": "true"}
#: The same setting under its name before Spark 3.1, which Spark still honours.
_LEGACY_EXCLUDE = "spark.blacklist.enabled"


@dataclass(frozen=True)
class SessionPlan:
    """How :func:`session` builds the SparkSession, decided without a JVM."""

    #: To set on the builder; None when spark-submit's ``--master`` stands.
    master: str | None
    #: A ``local[...]`` master: the worker wrapper and prefork server apply (python_workers.py).
    local: bool
    #: Settings to add, none of which was configured already.
    config: dict[str, str]
    #: Lines for stderr: a likely mistake in the set-up.
    warnings: tuple[str, ...]


def plan_session(master: str | None, submitted: Mapping[str, str], env: Mapping[str, str]) -> SessionPlan:
    """``master`` from ``--master``; ``submitted``: spark-submit's settings (``--master``, ``--conf``,
    spark-defaults.conf), empty outside spark-submit; ``env``: the driver's environment.

    Outside spark-submit the master defaults to ``local[*]``. The window aggregation's state gets 4
    shuffle partitions unless configured (Spark's 200 are 200 state stores per micro-batch, and the
    number is fixed in the checkpoint once the query has run). On a cluster, failed tasks are retried on
    other executors (:data:`CLUSTER_DEFAULTS`) unless configured otherwise."""
    effective = master or submitted.get("spark.master") or "local[*]"
    local = effective.startswith("local")
    config: dict[str, str] = {}
    if "spark.sql.shuffle.partitions" not in submitted:
        config["spark.sql.shuffle.partitions"] = "4"
    warnings: list[str] = []
    if not local:
        if _LEGACY_EXCLUDE not in submitted:
            config.update({k: v for k, v in CLUSTER_DEFAULTS.items() if k not in submitted})
        if not env.get("PYSPARK_PYTHON"):
            # Executors start the interpreter the driver names (PYSPARK_PYTHON, which spark-submit sets
            # from spark.pyspark.python), not one of their own host's choosing.
            warnings.append(
                "latticed tail: PYSPARK_PYTHON is not set here, so the executors run `python3` from their "
                "PATH, which needs latticed installed; set PYSPARK_PYTHON on the driver (or "
                "spark.pyspark.python with spark-submit) to an interpreter with latticed that exists on "
                "every host (docs/spark.md, Cluster deployment)"
            )
    return SessionPlan(
        master=master or (None if "spark.master" in submitted else effective),
        local=local,
        config=config,
        warnings=tuple(warnings),
    )


def submitted_conf(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """spark-submit's settings, when it started this process. They live in its JVM (already running), so a
    SparkConf made before connecting to it is empty; connect first (the session would anyway). Outside
    spark-submit: empty, and no JVM is started here (the worker wrapper must be set up before that)."""
    if "PYSPARK_GATEWAY_PORT" not in env:
        return {}
    from pyspark import SparkConf, SparkContext  # noqa: PLC0415

    SparkContext._ensure_initialized()  # connects to spark-submit's gateway
    return dict(SparkConf().getAll())


def session(
    master: str | None, app_name: str = "latticed-tail", extra: Mapping[str, str] | None = None
) -> SparkSession:
    """The active session, or a new one as :func:`plan_session` decides."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    plan = plan_session(master, submitted_conf(), os.environ)
    builder = SparkSession.builder.appName(app_name)
    if plan.master is not None:
        builder = builder.master(plan.master)
    if plan.local:
        # Workers need latticed: this venv's interpreter, started without pyspark.zip. Only for a local
        # master: on a cluster the wrapper would not exist on the executors' hosts.
        use_worker_python()
    for line in plan.warnings:
        print(line, file=sys.stderr)
    for key, value in {**plan.config, **(extra or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spark = session(args.master)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        error = wait(start_queries(spark, args), stop)
    except Exception as exc:  # analysis errors: bad options, unknown queue, daemon not running
        print(f"latticed tail: {exc}", file=sys.stderr)
        return 1
    finally:
        if stop.is_set():
            spark.stop()
    if error is not None:
        print(f"latticed tail: a query failed: {error}", file=sys.stderr)
        return 1
    return 0


def run_demo_tail(socket_path: str | Path, queues: Sequence[str], workdir: str | Path) -> list[Row]:
    """``make demo``'s last step: tail ``queues`` into Parquet once (AvailableNow), print and return what
    landed (queue name, offset, key, value as text, timestamp), ordered by queue and offset."""
    work = Path(workdir)
    quiet = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    spark = session("local[2]", app_name="latticed-demo-tail", extra=quiet)
    spark.sparkContext.setLogLevel("ERROR")
    args = build_parser().parse_args(
        [
            "--queues",
            ",".join(queues),
            "--output",
            str(work / "records"),
            "--checkpoint",
            str(work / "checkpoint"),
            "--windows-output",
            str(work / "windows"),
            "--socket",
            str(socket_path),
            "--available-now",
        ]
    )
    error = wait(start_queries(spark, args), threading.Event())
    if error is not None:
        raise RuntimeError(f"the demo tail query failed: {error}")
    landed = spark.read.parquet(str(work / "records")).select(
        F.element_at(F.split("queue", "/"), 2).alias("name"),
        "offset",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        "timestamp",
    )
    ordered = landed.orderBy("name", "offset")
    rows = ordered.collect()
    print(f"  Spark tailed {len(rows)} record(s) from {len(queues)} queue(s) into {work / 'records'}:")
    ordered.show(20, truncate=40)
    return rows


if __name__ == "__main__":
    sys.exit(main())
