"""Catch-up of many small queues by a fresh replica, and its local API meanwhile.

    .venv/bin/python bench/bench_many_queues.py                       # 10,000 then 30,000 queues
    .venv/bin/python bench/bench_many_queues.py --sizes 3000,9000 --records 5
    .venv/bin/python bench/bench_many_queues.py --core 1,2             # both fork cores, one after the other
    .venv/bin/python bench/bench_many_queues.py --sizes 10000 --rounds 3   # 3 catch-ups: each, the median

Per size: a writer daemon creates ``--records``-record queues (many clients at once, so creates and
offers share group commits), then a fresh replica dials it. Printed: the seconds from the dial until the
replica holds every record, the replica's CPU meanwhile (and the writer's, which serves the deltas), and
the latency of ``queue list`` on the replica during the catch-up, called again ``--sample`` seconds after
each answer (max, p99, p50; its answers also tell when the replica holds everything, so nothing else
polls the daemon). Then the ratio of the time at each size to the first size's, against the ratio of the
sizes. ``--core``: the queues' fork core (default: the daemon's ``default_queue_core``; the core that ran
is printed), or several (``1,2``): every size on each, so both cores are compared in one sitting.
``--rounds K``: each catch-up K times (a new writer and replica each time), each printed, then the median
of its time and CPU (which the ratios between sizes are then taken of). Figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import threading
import time
from pathlib import Path

from _daemons import LoopbackDaemon, cpu_s, scratch


class Node(LoopbackDaemon):
    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root, name, timeout=600)


def fill(node: Node, queues: int, records: int, core: int | None, clients: int = 16) -> float:
    """Create ``queues`` queues of ``records`` 100-byte records on ``node`` on fork core ``core`` (None:
    the daemon's default); returns the seconds taken."""
    started = time.perf_counter()
    batch = [(b"x" * 100, None, ())] * records

    def work(part: range) -> None:
        with node.client() as c:
            for i in part:
                name = f"q{i:06d}"
                c.queue_create(name, core=core)
                c.offer_batch(name, batch)

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(work, range(k, queues, clients)) for k in range(clients)]:
            future.result()
    return time.perf_counter() - started


class ListSampler:
    """``queue list`` on a daemon, again ``interval`` seconds after each answer, until every one of
    ``queues`` queues holds ``records`` records: each call's latency, and when that was first seen."""

    def __init__(self, node: Node, interval: float, queues: int, records: int) -> None:
        self.latencies: list[float] = []
        self.done = threading.Event()
        self.done_at = 0.0
        self._node = node
        self._interval = interval
        self._want = (queues, records)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        queues, records = self._want
        with self._node.client() as c:
            while True:
                t0 = time.perf_counter()
                listed = c.queue_list()
                took = time.perf_counter() - t0
                self.latencies.append(took)
                # The answer shows the replica as it was when the daemon built it, about when it was sent.
                if len(listed) >= queues and all(q["size"] >= records for q in listed):
                    self.done_at = t0 + took
                    self.done.set()
                    return
                time.sleep(self._interval)  # between calls: a slow one is not followed at once


def catch_up(
    root: Path, nodes: list[Node], queues: int, records: int, sample: float, core: int | None, tag: str = ""
) -> dict[str, float]:
    writer = Node(root, f"w{queues}-{core}{tag}")
    nodes.append(writer)
    filled = fill(writer, queues, records, core)
    with writer.client() as c:
        ran = c.queue_info("q000000").get("core")
    replica = Node(root, f"r{queues}-{core}{tag}")
    nodes.append(replica)
    cpu0, writer_cpu0 = cpu_s(replica.proc.pid), cpu_s(writer.proc.pid)
    with replica.client() as c:
        t0 = time.perf_counter()
        c.call("peers_add", address=writer.listen)
    sampler = ListSampler(replica, sample, queues, records)
    if not sampler.done.wait(1800):
        raise TimeoutError(f"the replica did not hold {queues} queues within 30 minutes")
    took = sampler.done_at - t0
    latencies = sorted(sampler.latencies)
    cpu, writer_cpu = cpu_s(replica.proc.pid) - cpu0, cpu_s(writer.proc.pid) - writer_cpu0
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"{queues:,} queues x {records} records on fork core {ran} (filled in {filled:.1f} s): replica "
        f"holds all after {took:.1f} s, CPU {cpu:.1f} s (writer {writer_cpu:.1f} s); queue list during "
        f"catch-up ({len(latencies)} samples): "
        f"max {latencies[-1] * 1e3:,.0f} ms, p99 {p99 * 1e3:,.0f} ms, "
        f"p50 {statistics.median(latencies) * 1e3:,.0f} ms",
        flush=True,
    )
    for node in (replica, writer):
        node.stop()
        nodes.remove(node)
    return {"took": took, "cpu": cpu}


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[int], list[int | None]]:
    """The arguments, the sizes and the cores."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,30000")
    parser.add_argument("--records", type=int, default=5)
    parser.add_argument("--sample", type=float, default=0.2, help="seconds between queue list calls")
    parser.add_argument("--core", help="the queues' fork core, 1 or 2, or both (1,2) (default: the daemon's)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="catch-ups a size (each printed, then the median)"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    cores: list[int | None] = [int(c) for c in args.core.split(",")] if args.core else [None]
    if any(c not in (1, 2, None) for c in cores):
        parser.error("--core is 1, 2 or 1,2")
    if args.rounds < 1:
        parser.error("--rounds is at least 1")
    return args, sizes, cores


def median_of(queues: int, core: int | None, runs: list[dict[str, float]]) -> dict[str, float]:
    """The median time and CPU of ``runs`` (one catch-up each), printed with each run's when there are
    several."""
    median = {key: statistics.median(run[key] for run in runs) for key in ("took", "cpu")}
    if len(runs) > 1:
        took, cpu = (", ".join(f"{run[key]:.1f}" for run in runs) for key in ("took", "cpu"))
        print(
            f"  {'' if core is None else f'core {core}: '}{queues:,} queues, median of {len(runs)} rounds: "
            f"holds all after {median['took']:.1f} s ({took}), CPU {median['cpu']:.1f} s ({cpu})",
            flush=True,
        )
    return median


def main(argv: list[str] | None = None) -> None:
    args, sizes, cores = parse(argv)
    figures: dict[tuple[int | None, int], dict[str, float]] = {}
    with scratch("bench-many-queues-", remove=True) as (root, nodes):
        for core in cores:
            for n in sizes:
                runs = [
                    catch_up(root, nodes, n, args.records, args.sample, core, f"-{k}" if k else "")
                    for k in range(args.rounds)
                ]
                figures[core, n] = median_of(n, core, runs)
    first = sizes[0]
    for core in cores:
        for n in sizes[1:]:
            now, then = figures[core, n], figures[core, first]
            print(
                f"  {'' if core is None else f'core {core}: '}{n:,}/{first:,}: "
                f"{now['took'] / then['took']:.2f}x the time ({now['cpu'] / then['cpu']:.2f}x the CPU) "
                f"for {n / first:.1f}x the queues"
            )


if __name__ == "__main__":
    main()
