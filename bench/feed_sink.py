"""The daemon fed as the Spark sink feeds it, without Spark: its CPU per row, and a process to profile.

Usage: python bench/feed_sink.py [--rows M] [--rounds R] [--tasks T] [--chunk C] [--pause]

One ``latticed run`` on loopback. Each round, ``T`` threads (the sink's tasks, 2 as in ``local[2]``) send
their share of ``M`` rows into a fresh queue as the sink does (``latticed/spark/sink.py``): requests of
``C`` records ``[value, key, []]`` (a string key, a 100 B value), packed beforehand and spliced in as
:class:`~latticed.api.messages.Packed` (``sink_packed``), a shared producer id and a sequence each, up to
3 in flight (``InFlight``). Prints rows/s and the daemon's CPU per row (event loop, other threads) per
round and their median over rounds after the first (a warm-up). ``--pause``: print the daemon's pid and
wait for Enter before the rounds (attach py-spy).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import msgpack
from _daemons import CpuSplit, LoopbackDaemon, scratch

from latticed.spark.sink_packed import packed_records
from latticed.spark.sink_send import InFlight

VALUE_PAD = 88


def chunks(task: int, rows: int, chunk: int) -> list[object]:
    """One task's requests' ``records``: rows ``task``, ``task + T``... as the sink's rows."""
    out = []
    for lo in range(0, rows, chunk):
        records = []
        for i in range(lo, min(rows, lo + chunk)):
            row = f"{task}-{i}"
            value = b"x" * VALUE_PAD + str(i).zfill(12).encode()
            records.append(msgpack.packb([value, row.encode(), []], use_bin_type=True))
        out.append(packed_records(records))
    return out


def send(node: LoopbackDaemon, queue: str, producer: str, requests: list[object]) -> None:
    with node.client() as client:
        flight = InFlight(client.open_stream(120))
        try:
            for seq, records in enumerate(requests):
                request = {
                    "queue": queue,
                    "records": records,
                    "producer": producer,
                    "seq": seq,
                    "shared": True,
                }
                for _ in flight.send(request):
                    pass
            for _ in flight.drain():
                pass
        finally:
            flight.stream.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=10_000)
    parser.add_argument("--pause", action="store_true")
    args = parser.parse_args()
    per_task = args.rows // args.tasks
    work = [chunks(t, per_task, args.chunk) for t in range(args.tasks)]
    rows = per_task * args.tasks
    with scratch("ld-feed-", remove=True) as (root, nodes):
        node = LoopbackDaemon(root, "feed", timeout=120)
        nodes.append(node)
        if args.pause:
            input(f"daemon pid {node.proc.pid}; Enter to start ")
        rates, costs = [], []
        for r in range(args.rounds):
            with node.client() as c:
                queue = c.queue_create(f"sink{r}")
            split = CpuSplit(node.proc.pid)
            started = time.perf_counter()
            threads = [
                threading.Thread(target=send, args=(node, queue, f"{os.urandom(6).hex()}-{t}", work[t]))
                for t in range(args.tasks)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            loop, rest, _ = split.since()
            with node.client() as c:
                assert int(c.queue_info(queue)["end_offset"]) == rows
            rates.append(rows / elapsed)
            costs.append((loop + rest) * 1e6 / rows)
            print(
                f"  round {r + 1}: {rates[-1]:,.0f} rows/s, daemon CPU {costs[-1]:.2f} us/row "
                f"(loop {loop * 1e6 / rows:.2f}, other threads {rest * 1e6 / rows:.2f})"
            )
    kept = slice(1, None) if args.rounds > 1 else slice(None)
    print(
        f"median of rounds after the first: {statistics.median(rates[kept]):,.0f} rows/s, "
        f"daemon CPU {statistics.median(costs[kept]):.2f} us/row"
    )


if __name__ == "__main__":
    main()
