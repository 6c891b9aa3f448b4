"""Spark throughput and latency of ``format("lattice")``, against a ceiling and a peer, in one run.

Usage: python bench/bench_spark.py [--records N] [--rounds R] [--socket-rates 5000,...] [--socket-step S]

One daemon, one SparkSession (``local[2]``). N records of 100 bytes go through:

a. the lattice source -> ``noop`` sink (Trigger.AvailableNow): the source's own throughput (with
   ``minPartitions`` = the 2 cores, as docs/spark.md recommends; ``--max-records-per-partition`` too);
b. the lattice source -> Parquet sink;
c. *ceiling*: Spark streaming the same rows back from the Parquet files written in (b) -> Parquet sink;
d. *peer*: Spark's built-in ``socket`` source fed the same 100-byte lines by a small Python TCP server,
   paced at rising rates (2.5 s each, ~12 s in all) -> ``noop``; what it sustains is the best rate it
   processed while its backlog stayed bounded (it buffers lines on the driver and falls behind beyond);
e. latency: a record appended while a ``processingTime=0`` query runs, until its micro-batch reaches
   ``foreachBatch`` on the driver (p50/p90/p99).

The session runs Python workers through ``latticed.spark.worker_python()`` and its planner processes
through ``start_prefork()``, and writes checkpoint logs with ``use_local_checkpoint_manager()``, as
docs/spark.md recommends; for an A/B against Spark's defaults set ``BENCH_PYSPARK_PYTHON`` to an
interpreter, ``BENCH_NO_PREFORK=1`` and ``BENCH_DEFAULT_CHECKPOINTS=1``.

Each query time is wall clock from ``start()`` to termination, so query start-up is included (~0.2 s
with the prefork server, ~0.5 s without); warm-up queries run first on a fifth of N (at most 200k
records) so JVM start-up, JIT compilation and Python-worker start-up are not: every measured path, (a),
(b) and (c), once each. The second figure of each line counts only the micro-batches that moved rows
(Spark's ``triggerExecution``), i.e. without query start. (a), (b) and (c) run in turn ``--rounds``
times (3) and each figure is the median: the box's speed drifts over minutes, so the ceiling moved ±15%
between single runs. (b)/(c) is the median of each round's ratio ((b) and (c) run back to back); the
ratio of the two medians is printed too. Targets: (a) >= 300k rows/s, (b) >= 100k rows/s and >= 50% of
(c), (a) >= 10x (d), p50 <= 300 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))

from spark_fixtures import start_daemon

RECORD_BYTES = 100
LOAD_BATCH = 5000


def value_of(i: int) -> bytes:
    head = b"record %09d " % i
    return head + b"x" * (RECORD_BYTES - len(head))


def load(client: Any, queue: str, n: int) -> float:
    started = time.perf_counter()
    for lo in range(0, n, LOAD_BATCH):
        client.offer_batch(
            queue, [(value_of(i), b"key-%d" % (i % 100), []) for i in range(lo, min(n, lo + LOAD_BATCH))]
        )
    return time.perf_counter() - started


def session() -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from latticed.spark import (  # noqa: PLC0415
        register,
        start_prefork,
        use_local_checkpoint_manager,
        worker_python,
    )

    os.environ["PYSPARK_PYTHON"] = os.environ.get("BENCH_PYSPARK_PYTHON") or worker_python()
    if not os.environ.get("BENCH_NO_PREFORK"):
        start_prefork()

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("latticed-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        # On 2 cores G1's concurrent threads compete with the tasks; the serial collector costs ~25% less
        # JVM CPU here. Every query of the run (the ceiling and the peer too) uses the same JVM.
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if not os.environ.get("BENCH_DEFAULT_CHECKPOINTS"):
        use_local_checkpoint_manager(spark)
    return spark


def timed_query(writer: Any) -> tuple[float, float]:
    """(wall seconds from start() to termination, seconds spent in micro-batches with rows)."""
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return elapsed, sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000


#: ``minPartitions``: the cores of ``local[2]`` (docs/spark.md: set it to the executors' cores).
CORES = 2


def lattice(spark: Any, sock: Path, queue: str, per_partition: int | None = None) -> Any:
    reader = (
        spark.readStream.format("lattice")
        .option("socket", str(sock))
        .option("queues", queue)
        .option("startingOffsets", "earliest")
        .option("minPartitions", str(CORES))
    )
    if per_partition is not None:
        reader = reader.option("maxRecordsPerPartition", str(per_partition))
    return reader.load()


class LineServer:
    """Serves 100-byte lines to one client at ``rate`` lines/s (changeable while it runs), in 10 ms ticks."""

    def __init__(self) -> None:
        self.rate = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent = 0
        self.connected = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.connected.set()
        with conn:
            owed, last = 0.0, time.perf_counter()
            while not self.done.is_set():
                now = time.perf_counter()
                owed += (now - last) * self.rate
                last = now
                due = int(owed)
                if due > 0:
                    conn.sendall(
                        b"".join(value_of(i)[:-1] + b"\n" for i in range(self.sent, self.sent + due))
                    )
                    self.sent += due
                    owed -= due
                time.sleep(0.01)


def socket_peer(spark: Any, rates: list[int], step_s: float) -> list[tuple[int, float, int]]:
    """Spark's socket source fed at each rate for ``step_s``: (rate, rows/s processed, backlog at the end).

    One query throughout; what it sustains is the best processed rate with a bounded backlog."""
    server = LineServer()
    df = spark.readStream.format("socket").option("host", "127.0.0.1").option("port", server.port).load()
    query = df.writeStream.format("noop").trigger(processingTime="0 seconds").start()

    def processed() -> int:
        return sum(progress["numInputRows"] for progress in query.recentProgress)

    steps = []
    try:
        server.connected.wait(60)
        query.processAllAvailable()
        for rate in rates:
            server.rate = rate
            before, started = processed(), time.perf_counter()
            time.sleep(step_s)
            done = processed()
            steps.append((rate, (done - before) / (time.perf_counter() - started), server.sent - done))
    finally:
        server.done.set()
        # Stopping cancels the batch in flight, which Spark logs as task errors: expected here.
        spark.sparkContext.setLogLevel("OFF")
        try:
            query.stop()
        finally:
            spark.sparkContext.setLogLevel("ERROR")
    return steps


def latency(spark: Any, sock: Path, client: Any, queue: str, seconds: float) -> list[float]:
    """ms from ``offer`` to the record's micro-batch reaching foreachBatch, processingTime=0."""
    samples: list[float] = []
    lock = threading.Lock()

    def on_batch(df: Any, batch_id: int) -> None:
        values = [bytes(r.value) for r in df.select("value").collect()]
        now = time.time_ns()
        with lock:
            samples.extend((now - int(v.split(b" ")[1])) / 1e6 for v in values if v.startswith(b"lat "))

    df = (
        spark.readStream.format("lattice").option("socket", str(sock)).option("queues", queue).load()
    )  # startingOffsets=latest
    query = df.writeStream.foreachBatch(on_batch).trigger(processingTime="0 seconds").start()
    try:
        query.processAllAvailable()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            client.offer(queue, b"lat %d" % time.time_ns())
            time.sleep(0.05)
        query.processAllAvailable()
    finally:
        query.stop()
    return samples


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--socket-rates", default="5000,10000,20000,40000,80000", help="lines/s, one step each"
    )
    parser.add_argument("--socket-step", type=float, default=2.5, help="seconds per socket-source step")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--max-records-per-partition", type=int, help="[the source's default]")
    parser.add_argument("--rounds", type=int, default=3, help="(a), (b), (c) in turn this many times")
    args = parser.parse_args()
    n = args.records
    per_partition = args.max_records_per_partition

    root = Path(tempfile.mkdtemp(prefix="lsb-", dir="/tmp"))
    daemon = start_daemon(root, "bench")
    try:
        client = daemon.client
        client.queue_create("bench")
        client.queue_create("warm")
        client.queue_create("latency")
        load_s = load(client, "bench", n)
        load(client, "warm", max(1000, min(n // 5, 200_000)))
        print(f"loaded {n:,} x {RECORD_BYTES} B into the daemon in {load_s:.1f} s ({n / load_s:,.0f} rec/s)")

        t0 = time.perf_counter()
        spark = session()
        print(f"SparkSession up in {time.perf_counter() - t0:.1f} s (local[2])")
        warm = root / "warm"
        timed_query(lattice(spark, daemon.socket, "warm").writeStream.format("noop"))  # warm-ups: (a)
        timed_query(  # (b)
            lattice(spark, daemon.socket, "warm")
            .writeStream.format("parquet")
            .option("path", str(warm / "out"))
            .option("checkpointLocation", str(warm / "ck"))
        )
        timed_query(  # (c)
            spark.readStream.schema(spark.read.parquet(str(warm / "out")).schema)
            .parquet(str(warm / "out"))
            .writeStream.format("parquet")
            .option("path", str(warm / "out2"))
            .option("checkpointLocation", str(warm / "ck2"))
        )

        # (a), (b), (c) in turn, ``--rounds`` times: this box's speed drifts over minutes, so each ratio is
        # taken within one round and the medians are reported.
        rounds: list[tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = []
        for r in range(args.rounds):
            bench = lattice(spark, daemon.socket, "bench", per_partition)
            noop_r = timed_query(bench.writeStream.format("noop"))
            parquet_r = timed_query(
                lattice(spark, daemon.socket, "bench", per_partition)
                .writeStream.format("parquet")
                .option("path", str(root / f"parquet{r}"))
                .option("checkpointLocation", str(root / f"ck-parquet{r}"))
            )
            schema = spark.read.parquet(str(root / "parquet0")).schema
            ceiling_r = timed_query(
                spark.readStream.schema(schema)
                .parquet(str(root / "parquet0"))
                .writeStream.format("parquet")
                .option("path", str(root / f"copy{r}"))
                .option("checkpointLocation", str(root / f"ck-ceiling{r}"))
            )
            copied = spark.read.parquet(str(root / f"copy{r}")).count()
            assert copied == n, (copied, n)
            rounds.append((noop_r, parquet_r, ceiling_r))

        steps = socket_peer(spark, [int(r) for r in args.socket_rates.split(",")], args.socket_step)
        samples = latency(spark, daemon.socket, client, "latency", args.latency_seconds)
        spark.stop()
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)

    def median(times: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)

    noop_s, parquet_s, ceiling_s = (median([r[i] for r in rounds]) for i in range(3))
    noop, parquet, ceiling = n / noop_s[0], n / parquet_s[0], n / ceiling_s[0]
    # Kept up: less than a second's worth of lines waiting at the end of the step.
    kept_up = [done for rate, done, backlog in steps if backlog < rate]
    socket_rate = max(kept_up or [done for _, done, _ in steps])

    def line(label: str, times: tuple[float, float] | None, rate: float, target: str = "") -> None:
        batch = f"{n / times[1]:>12,.0f}" if times else " " * 12
        print(f"  {label:<50} {rate:>12,.0f} {batch}  {target}")

    print(
        f"\n{n:,} records x {RECORD_BYTES} B, local[2], rows/s (wall incl. query start | in micro-batches),"
        f" median of {len(rounds)} rounds:"
    )
    line("(a) lattice -> noop", noop_s, noop, "(target >= 300,000)")
    line("(b) lattice -> parquet", parquet_s, parquet, "(target >= 100,000)")
    line("(c) ceiling: parquet files -> parquet", ceiling_s, ceiling)
    line("(d) peer: socket source, best sustained", None, socket_rate)
    for rate, done, backlog in steps:
        step = f"fed {rate:>7,}/s for {args.socket_step:g} s"
        print(f"      {step}: processed {done:>9,.0f}/s, backlog {backlog:,}")
    # Each round's (b) and (c) ran back to back: their ratio cancels the box's drift between rounds,
    # which the ratio of the two medians (possibly from different rounds) does not.
    paired = [c[0] / b[0] for _, b, c in rounds]
    per_round = ", ".join(f"{ratio:.1%}" for ratio in paired)
    print(
        f"  (b)/(c) parquet vs ceiling:   {statistics.median(paired):6.1%}   (target >= 50%; median of the"
        f" rounds' paired ratios: {per_round}; ratio of the medians {parquet / ceiling:.1%})"
    )
    print(f"  (a)/(d) lattice vs socket:    {noop / socket_rate:6.1f}x   (target >= 10x)")
    if samples:
        p50, p90, p99 = pct(samples, 0.5), pct(samples, 0.9), pct(samples, 0.99)
        print(
            f"  (e) append -> visible, processingTime=0: p50 {p50:.0f} ms, p90 {p90:.0f} ms, "
            f"p99 {p99:.0f} ms over {len(samples)} records   (target p50 <= 300 ms)"
        )


if __name__ == "__main__":
    main()
