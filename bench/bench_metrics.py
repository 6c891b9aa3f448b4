"""Does scraping the metrics endpoint slow the write path? A same-run A/B of two daemon processes.

    .venv/bin/python bench/bench_metrics.py                          # 6 rounds of 3 s per arm and workload
    .venv/bin/python bench/bench_metrics.py --rounds 10 --seconds 5 --scrape-interval 0.25

Two daemons on the same disk, started together: A without metrics, B with ``--metrics-listen`` and a
scraper (its own process, so it takes no GIL from the clients) fetching ``/metrics`` every
``--scrape-interval`` seconds while B is measured. Only one daemon is loaded at a time; the arms alternate
A B B A A B ..., so drift (other load, the disk) falls on both. Each daemon holds ``--queues`` extra queues
and a consumer group, so a scrape has something to read. Workloads, each for ``--seconds`` per round:

  bulk:   1 connection offering batches of 1000 x 100 B, waiting for each reply: records/s.
  single: 1 connection offering one 100 B record at a time, waiting for each ack: offers/s, p50/p99.

Reported per arm: the median over rounds, and the daemon's CPU per record (user + system, from /proc: robust
to other load). Ratios are B / A. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

from bench_daemon import cpu_s, pct

from latticed.api.client import Client
from latticed.errors import ConnectionClosedError

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
    proc = subprocess.Popen([*argv, "--config", str(config), "--no-mdns"])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(sock) as c:
                    address = c.status().get("metrics")
                break
            except ConnectionClosedError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield Daemon(proc, sock, f"http://{address}/metrics" if address else None)
    finally:
        proc.terminate()
        proc.wait(30)


def populate(d: Daemon, queues: int) -> None:
    with Client(d.sock, timeout=60) as c:
        c.queue_create("bench")
        for i in range(queues):
            c.queue_create(f"extra-{i}")
            c.offer(f"extra-{i}", b"x")
        c.group_create("workers", ["extra-0"] if queues else [])


def scraper(url: str, interval: float, stop: MpEvent, out: mp.Queue[list[float]]) -> None:
    """Fetch ``url`` every ``interval`` s until ``stop``; report each scrape's duration."""
    took: list[float] = []
    next_at = time.monotonic()
    while not stop.is_set():
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
        took.append(time.perf_counter() - t0)
        next_at += interval
        stop.wait(max(0.0, next_at - time.monotonic()))
    out.put(took)


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
    interval: float,
    arm: Arm,
) -> None:
    stop, out, proc = None, None, None
    if d.metrics_url is not None:
        stop, out = mp.Event(), mp.Queue()
        proc = mp.Process(target=scraper, args=(d.metrics_url, interval, stop, out))
        proc.start()
    cpu0, t0 = cpu_s(d.proc.pid), time.perf_counter()
    n, latencies = work(d.sock, seconds)
    elapsed, cpu = time.perf_counter() - t0, cpu_s(d.proc.pid) - cpu0
    if proc is not None and stop is not None and out is not None:
        stop.set()
        arm.scrapes += out.get(timeout=30)
        proc.join(30)
    arm.rate.append(n / elapsed)
    arm.cpu_us.append(cpu / n * 1e6)
    if latencies:
        arm.p50_ms.append(pct(latencies, 0.50) * 1e3)
        arm.p99_ms.append(pct(latencies, 0.99) * 1e3)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(name: str, a: Arm, b: Arm) -> None:
    print(f"\n{name}: per round (A without metrics, B scraped), then medians and B/A")
    print(f"  A rate/s: {' '.join(f'{v:,.0f}' for v in a.rate)}")
    print(f"  B rate/s: {' '.join(f'{v:,.0f}' for v in b.rate)}")
    rows = [("rate/s", a.rate, b.rate), ("daemon CPU µs/record", a.cpu_us, b.cpu_us)]
    if a.p50_ms:
        rows += [("p50 ms", a.p50_ms, b.p50_ms), ("p99 ms", a.p99_ms, b.p99_ms)]
    for label, xa, xb in rows:
        print(f"  {label:22} A {med(xa):>10,.3f}   B {med(xb):>10,.3f}   B/A {med(xb) / med(xa):.3f}")
    if b.scrapes:
        print(
            f"  scrapes during B: {len(b.scrapes)}, each p50 {pct(b.scrapes, 0.5) * 1e3:.2f} ms, "
            f"max {max(b.scrapes) * 1e3:.2f} ms (HTTP round trip, collection and encoding)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
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
            for name in args.workloads.split(","):
                arms = {"a": Arm(), "b": Arm()}
                for r in range(args.rounds):
                    order = ("a", "b") if r % 2 == 0 else ("b", "a")
                    for key in order:
                        measure(
                            a if key == "a" else b, works[name], args.seconds, args.scrape_interval, arms[key]
                        )
                report(name, arms["a"], arms["b"])


if __name__ == "__main__":
    main()
