"""Does scraping the metrics endpoint slow the write path? A same-run A/B of two daemon processes.

    .venv/bin/python bench/bench_metrics.py                     # 12 rounds of 2 s per arm and workload
    .venv/bin/python bench/bench_metrics.py --rounds 30 --seconds 2 --scrape-interval 0.25

Two daemons on the same disk, started together: A without metrics, B with ``--metrics-listen``. Arms:
A; B with a scraper (its own process, so it takes no GIL from the clients) fetching ``/metrics`` every
``--scrape-interval`` seconds; and B0, the same daemon B not scraped, which separates the cost of the
scrapes from the differences between two daemon processes. One arm runs at a time, in a rotating order
(every permutation in turn), so drift (other load, the disk) falls on all of them. Each daemon holds
``--queues`` extra queues and a consumer group, so a scrape has something to read. Workloads, each for
``--seconds`` per arm and round:

  bulk:   1 connection offering batches of 1000 x 100 B, waiting for each reply: records/s.
  single: 1 connection offering one 100 B record at a time, waiting for each ack: offers/s, p50/p99.

Reported per arm: the median over rounds, and the daemon's CPU per record (user + system, from /proc:
less sensitive to other load than the rate). Ratios are B / A (metrics on and scraped against off) and
B / B0 (the scrapes alone): of the medians, and the median of the per-round ratios, whose arms ran
seconds apart (on a shared box the rate drifts far more between rounds than within one). Figures are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from _daemons import cpu_s, start, stop
from bench_daemon import pct

from latticed.api.client.blocking_client import Client

VALUE = b"x" * 100
BATCH = [(VALUE, None, ())] * 1000


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    sock: Path
    metrics_url: str | None


@contextlib.contextmanager
def daemon(root: Path, name: str, metrics: bool) -> Iterator[Daemon]:
    sock = root / f"{name}.sock"
    config = root / f"{name}.toml"
    text = 'log_level = "WARNING"\n'
    if metrics:
        text += 'metrics_listen = "127.0.0.1:0"\n'
    config.write_text(text)
    argv = [sys.executable, "-m", "latticed", "run", "--data-dir", str(root / name), "--socket", str(sock)]
    proc, address = start(
        [*argv, "--config", str(config), "--no-mdns"], sock, lambda c: c.status().get("metrics")
    )
    try:
        yield Daemon(proc, sock, f"http://{address}/metrics" if address else None)
    finally:
        stop(proc)


def populate(d: Daemon, queues: int) -> None:
    with Client(d.sock, timeout=60) as c:
        c.queue_create("bench")
        for i in range(queues):
            c.queue_create(f"extra-{i}")
            c.offer(f"extra-{i}", b"x")
        c.group_create("workers", ["extra-0"] if queues else [])


def scraper(url: str, interval: float, conn: Connection) -> None:
    """A process that fetches ``url`` every ``interval`` s between "start" and "stop" (then answers with
    each scrape's duration), until "quit". It lives for the whole run: no process starts inside an arm."""
    while conn.recv() == "start":
        took: list[float] = []
        next_at = time.monotonic()
        while True:
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
            took.append(time.perf_counter() - t0)
            next_at += interval
            if conn.poll(max(0.0, next_at - time.monotonic())):
                conn.recv()  # "stop"
                break
        conn.send(took)


def bulk(sock: Path, seconds: float) -> tuple[int, list[float]]:
    records = 0
    with Client(sock, timeout=60) as c:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            c.offer_batch("bench", BATCH)
            records += len(BATCH)
    return records, []


def single(sock: Path, seconds: float) -> tuple[int, list[float]]:
    latencies: list[float] = []
    with Client(sock, timeout=60) as c:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            c.offer("bench", VALUE)
            latencies.append(time.perf_counter() - t0)
    return len(latencies), latencies


@dataclass
class Arm:
    rate: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    scrapes: list[float] = field(default_factory=list)


def measure(
    d: Daemon,
    work: Callable[[Path, float], tuple[int, list[float]]],
    seconds: float,
    arm: Arm,
    scrapes: Connection | None = None,
) -> None:
    if scrapes is not None:
        scrapes.send("start")
    cpu0, t0 = cpu_s(d.proc.pid), time.perf_counter()
    n, latencies = work(d.sock, seconds)
    elapsed, cpu = time.perf_counter() - t0, cpu_s(d.proc.pid) - cpu0
    if scrapes is not None:
        scrapes.send("stop")
        if not scrapes.poll(30):
            raise RuntimeError("the scraper did not answer (its traceback is above)")
        arm.scrapes += scrapes.recv()
    arm.rate.append(n / elapsed)
    arm.cpu_us.append(cpu / n * 1e6)
    if latencies:
        arm.p50_ms.append(pct(latencies, 0.50) * 1e3)
        arm.p99_ms.append(pct(latencies, 0.99) * 1e3)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(name: str, a: Arm, b: Arm, base: str = "A") -> None:
    print(f"\n{name}: per round ({base}, then B scraped), then medians and B/{base}")
    print(f"  {base} rate/s: {' '.join(f'{v:,.0f}' for v in a.rate)}")
    print(f"  B rate/s: {' '.join(f'{v:,.0f}' for v in b.rate)}")
    rows = [("rate/s", a.rate, b.rate), ("daemon CPU µs/record", a.cpu_us, b.cpu_us)]
    if a.p50_ms:
        rows += [("p50 ms", a.p50_ms, b.p50_ms), ("p99 ms", a.p99_ms, b.p99_ms)]
    for label, xa, xb in rows:
        # Each round's arms ran seconds apart: their ratio cancels the drift between rounds.
        paired = sorted(y / x for x, y in zip(xa, xb, strict=True))
        quartiles = f"{pct(paired, 0.25):.3f}-{pct(paired, 0.75):.3f}"
        ratio = med(xb) / med(xa)
        print(
            f"  {label:22} {base} {med(xa):>10,.3f}  B {med(xb):>10,.3f}  ratio of medians {ratio:.3f},"
            f" median of paired ratios {med(paired):.3f} (quartiles {quartiles})"
        )
    if b.scrapes:
        print(
            f"  scrapes during B: {len(b.scrapes)}, each p50 {pct(b.scrapes, 0.5) * 1e3:.2f} ms, "
            f"max {max(b.scrapes) * 1e3:.2f} ms (HTTP round trip, collection and encoding)"
        )


def scrape_cost(d: Daemon, n: int = 200) -> None:
    """Daemon CPU per scrape, ``n`` back to back on the otherwise idle daemon."""
    assert d.metrics_url is not None
    cpu0, t0 = cpu_s(d.proc.pid), time.perf_counter()
    for _ in range(n):
        with urllib.request.urlopen(d.metrics_url, timeout=10) as response:
            size = len(response.read())
    cpu, elapsed = cpu_s(d.proc.pid) - cpu0, time.perf_counter() - t0
    print(
        f"a scrape ({size:,} bytes): {cpu / n * 1e3:.2f} ms of daemon CPU, {elapsed / n * 1e3:.2f} ms"
        f" round trip ({n} back to back, daemon otherwise idle)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--scrape-interval", type=float, default=0.5)
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--workloads", default="bulk,single")
    args = parser.parse_args()
    works = {"bulk": bulk, "single": single}
    with tempfile.TemporaryDirectory(prefix="ld-bench-metrics-") as tmp:
        root = Path(tmp)
        with daemon(root, "a", metrics=False) as a, daemon(root, "b", metrics=True) as b:
            assert b.metrics_url is not None
            for d in (a, b):
                populate(d, args.queues)
            print(
                f"{args.rounds} rounds x {args.seconds:g} s per arm and workload; B scraped every "
                f"{args.scrape_interval:g} s at {b.metrics_url} ({args.queues} extra queues, 1 group each)"
            )
            scrape_cost(b)
            control, conn = mp.Pipe()
            scraping = mp.Process(target=scraper, args=(b.metrics_url, args.scrape_interval, conn))
            scraping.start()
            targets = {"a": (a, None), "b": (b, control), "b0": (b, None)}
            orders = list(itertools.permutations(targets))
            try:
                for name in [w for w in args.workloads.split(",") if w]:
                    arms = {key: Arm() for key in targets}
                    for r in range(args.rounds):
                        for key in orders[r % len(orders)]:
                            d, scrapes = targets[key]
                            measure(d, works[name], args.seconds, arms[key], scrapes)
                    report(name, arms["a"], arms["b"])
                    report(f"{name}, daemon B unscraped (B0) against scraped", arms["b0"], arms["b"], "B0")
            finally:
                control.send("quit")
                scraping.join(30)


if __name__ == "__main__":
    main()
