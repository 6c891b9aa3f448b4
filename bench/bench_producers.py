"""Many producers, one signer: remote offers against local ones, the Spark sink against Parquet, one run.

Usage: python bench/bench_producers.py [--records N] [--rows M] [--rounds R] [--parts offers,spark]

offers  Two daemons on loopback, A (the owner) and B (listed as a producer of A's queue), each with its
        own data directory (durable commits, as always). N records of 100 B, in requests of 1,000:
        (l1) local bulk on A, one request at a time, as ``latticectl offer --file`` sends them (a
             producer id and a sequence per request, as offer --file sends to any queue: plain
             ``offer_batch`` here, the local path's cheapest);
        (r1) the same through B into A's queue: each request forwarded to A over the peer link, A signs,
             commits and answers, B answers its client (``offer --file`` against OWNER/NAME);
        (l4) / (r4) the same with a ``Producer`` keeping 4 requests in flight on one connection.
        Ratios r/l per round, target (r1)/(l1) >= 0.5; the figures are the median of ``--rounds``.
spark   One daemon, ``local[2]``. One DataFrame of M rows (key, 100 B value), built from ``spark.range``:
        (s) ``df.write.format("lattice")`` into a queue of the daemon (each of the 2 tasks writes its
            rows through the daemon, chunks of ``recordsPerOffer``);
        (p) the same DataFrame ``df.write.parquet(...)``.
        Ratio (s)/(p) per round, target >= 0.5. Warmed once each first (JVM, Python workers). CPU per
        row: the daemon's, and all processes' (this one and all it started: the JVM, its Python
        workers, the daemon), the ratio a box whose cores are all busy tends to.

Figures are printed, never asserted; each ratio is taken within one round, the two sides run back to
back, because this box's speed drifts over minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _daemons import LoopbackDaemon, cpu_s, scratch, tree_cpu_s

from latticed.api.client.producer import Producer

BATCH = 1000
VALUE = b"x" * 100


class Node(LoopbackDaemon):
    """A ``latticed run`` on loopback with its own data directory."""

    def __init__(self, root: Path, name: str, peers: list[str]) -> None:
        super().__init__(root, name, peers, timeout=120)


def batches(n: int) -> list[list[tuple[bytes, bytes | None, list[Any]]]]:
    return [[(VALUE, None, [])] * min(BATCH, n - lo) for lo in range(0, n, BATCH)]


def sequential(node: Node, queue: str, n: int, remote: bool) -> float:
    """Records/s offering ``n`` records one request at a time, as ``offer --file`` does."""
    producer = os.urandom(12).hex() if remote else None
    with node.client() as c:
        started = time.perf_counter()
        for seq, batch in enumerate(batches(n)):
            extra: dict[str, Any] = {} if producer is None else {"producer": producer, "seq": seq}
            c.offer_batch(queue, batch, **extra)
        return n / (time.perf_counter() - started)


def pipelined(node: Node, queue: str, n: int, window: int) -> float:
    """Records/s with a ``Producer`` keeping ``window`` requests of ``BATCH`` records in flight."""
    with node.client() as c:
        started = time.perf_counter()
        with Producer(c, queue, window=window) as p:
            for batch in batches(n):
                p.offer_batch(batch)
        return n / (time.perf_counter() - started)


def offers(n: int, rounds: int) -> None:
    with scratch("ld-bench-prod-", remove=True) as (root, nodes):
        a = Node(root, "A", [])
        nodes.append(a)
        b = Node(root, "B", [a.listen])
        nodes.append(b)
        with b.client() as c:
            b_id = c.identity()
        with a.client() as c:
            local = c.queue_create("local")
            remote = c.queue_create("remote", producers=[b_id])
        sequential(b, remote, BATCH, remote=True)  # dials the link and warms both sides
        sequential(a, local, BATCH, remote=False)
        cases: dict[str, Callable[[], float]] = {
            "l1": lambda: sequential(a, local, n, remote=False),
            "r1": lambda: sequential(b, remote, n, remote=True),
            "l4": lambda: pipelined(a, local, n, 4),
            "r4": lambda: pipelined(b, remote, n, 4),
        }
        results: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for r in range(rounds):
            for key, run in cases.items():
                before = cpu_s(a.proc.pid), cpu_s(b.proc.pid)
                results[key].append(run())
                cpu[key].append((cpu_s(a.proc.pid) - before[0], cpu_s(b.proc.pid) - before[1]))
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in results.items()))
        with a.client() as c:
            held = c.queue_info(remote)
        assert int(held["end_offset"]) == BATCH + 2 * n * rounds, held

    print(f"\nremote offers, {n:,} x 100 B in requests of {BATCH:,}, median of {rounds} rounds (records/s):")
    labels = {
        "l1": "(l1) local on A, one request at a time (offer --file)",
        "r1": "(r1) B -> A's queue, one request at a time",
        "l4": "(l4) local on A, Producer, 4 in flight",
        "r4": "(r4) B -> A's queue, Producer, 4 in flight",
    }
    for key, label in labels.items():
        a_us, b_us = (statistics.median(c[i] for c in cpu[key]) * 1e6 / n for i in (0, 1))
        cost = f"CPU/record: A {a_us:.1f} us, B {b_us:.1f} us"
        print(f"  {label:<58} {statistics.median(results[key]):>10,.0f}   {cost}")
    for remote_key, local_key, target in (("r1", "l1", "   (target >= 0.5)"), ("r4", "l4", "")):
        paired = [r / loc for r, loc in zip(results[remote_key], results[local_key], strict=True)]
        each = ", ".join(f"{p:.2f}" for p in paired)
        print(f"  ({remote_key})/({local_key}): {statistics.median(paired):.2f}x (rounds {each}){target}")


def spark_sink(m: int, rounds: int, records_per_offer: int | None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
    from bench_spark import session  # noqa: PLC0415 - the same tuned session as the source's bench
    from spark_fixtures import start_daemon  # noqa: PLC0415

    root = Path(tempfile.mkdtemp(prefix="lsk-", dir="/tmp"))
    daemon = start_daemon(root, "bench")
    try:
        spark = session()
        df = spark.range(0, m, 1, 2).selectExpr(
            "cast(id as string) as key", f"concat(repeat('x', {len(VALUE) - 12}), lpad(id, 12, '0')) as value"
        )

        daemon_cpu: list[float] = []
        box_cpu: dict[str, list[float]] = {"s": [], "p": []}  # this process and all it started

        def lattice(queue: str) -> float:
            before, box = cpu_s(daemon.proc.pid), tree_cpu_s(os.getpid())
            writer = df.write.format("lattice").mode("append").option("socket", str(daemon.socket))
            if records_per_offer is not None:
                writer = writer.option("recordsPerOffer", str(records_per_offer))
            started = time.perf_counter()
            writer.option("queue", queue).save()
            rate = m / (time.perf_counter() - started)
            daemon_cpu.append(cpu_s(daemon.proc.pid) - before)
            box_cpu["s"].append(tree_cpu_s(os.getpid()) - box)
            return rate

        def parquet(path: Path) -> float:
            box = tree_cpu_s(os.getpid())
            started = time.perf_counter()
            df.write.parquet(str(path))
            rate = m / (time.perf_counter() - started)
            box_cpu["p"].append(tree_cpu_s(os.getpid()) - box)
            return rate

        client = daemon.client
        client.queue_create("warm")
        lattice("warm")
        parquet(root / "warm.parquet")
        sink, files = [], []
        for r in range(rounds):
            client.queue_create(f"sink{r}")
            sink.append(lattice(f"sink{r}"))
            files.append(parquet(root / f"p{r}.parquet"))
            assert int(client.queue_info(f"sink{r}")["end_offset"]) == m
            print(f"  round {r + 1}: sink {sink[-1]:,.0f} rows/s, parquet {files[-1]:,.0f} rows/s")
        spark.stop()
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
    paired = [s / p for s, p in zip(sink, files, strict=True)]
    print(
        f"\nSpark sink, {m:,} rows (key, 100 B value), local[2], 2 partitions, median of {rounds} (rows/s):"
    )
    cost = statistics.median(daemon_cpu[1:]) * 1e6 / m
    sink_all, parquet_all = (statistics.median(box_cpu[k][1:]) * 1e6 / m for k in ("s", "p"))
    print(
        f"  (s) df.write.format('lattice')  {statistics.median(sink):>10,.0f}   "
        f"daemon CPU {cost:.1f} us/row, all processes {sink_all:.1f} us/row"
    )
    print(
        f"  (p) df.write.parquet            {statistics.median(files):>10,.0f}   "
        f"all processes {parquet_all:.1f} us/row"
    )
    each = ", ".join(f"{p:.2f}" for p in paired)
    print(f"  (s)/(p): {statistics.median(paired):.2f}x (rounds {each})   (target >= 0.5)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000, help="records per offers case")
    parser.add_argument("--rows", type=int, default=300_000, help="rows of the Spark DataFrame")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="offers,spark")
    parser.add_argument("--records-per-offer", type=int, default=None, help="the sink's recordsPerOffer")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "offers" in parts:
        offers(args.records, args.rounds)
    if "spark" in parts:
        spark_sink(args.rows, args.rounds, args.records_per_offer)


if __name__ == "__main__":
    main()
