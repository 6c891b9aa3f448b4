"""Benchmarks of a real latticed daemon process over its Unix socket (durable: synchronous=FULL).

    .venv/bin/python bench/bench_daemon.py                 # everything; part 4 stores 10M records
    .venv/bin/python bench/bench_daemon.py --records 1000000 --parts 1,2,3,4

Parts:
  1. bulk: ``--bulk`` records of 100 bytes offered in batches of 1000 (one request each), from one
     connection (waiting for each reply, then with 4 batches in flight) and from ``--bulk-connections``.
  2. single-record offers from ``--clients`` concurrent client processes: records/s and p50/p99 latency
     (from the offer call, or from when an open-loop offer was due, to its acknowledgment), for each
     ``--windows`` row: 0 = the same clients sending a no-op request (``id``) instead, the baseline of
     what the box allows; 1 = a blocking ``Client.offer`` per record; N = a ``Producer`` with N
     single-record requests in flight, as fast as it goes; bK = a ``Producer`` with one request in
     flight and up to K records waiting behind it (they leave as one request), as fast as it goes;
     rN = open loop at ``--rate`` records/s in
     all (each client on a fixed schedule), through a ``Producer`` with N requests in flight that sends
     the records waiting behind them as one request, as a Kafka producer batches.
  3. offer -> tail subscriber latency p50/p99 (the subscriber gets records pushed as they commit),
     beside the host's own floors over the same run: how late a sleeping process wakes, and how long
     a bare fdatasync of 8 KiB takes on the same filesystem (bench/hostjitter.py).
  4. daemon RSS (VmRSS) with ``--records`` records stored, after storing them and after reading them all.

Figures are printed, never asserted. Each part uses its own queue in one temporary data directory.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import floor_offers
from _daemons import cpu_s, rss_mb, start, stop
from hostjitter import FsyncProbe, WakeProbe

from latticed.api.client.blocking_client import Client
from latticed.api.client.producer import Ack, Producer

VALUE = b"x" * 100


@contextlib.contextmanager
def daemon(
    data_dir: Path, group_commit_ms: float, extra_config: str = ""
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A daemon process on ``data_dir``; ``extra_config``: more TOML lines for its config file."""
    sock = data_dir / "latticed.sock"
    config = data_dir / "latticed.toml"
    config.write_text(f'group_commit_ms = {group_commit_ms}\nlog_level = "WARNING"\n{extra_config}')
    argv = [sys.executable, "-m", "latticed", "run", "--data-dir", str(data_dir / "data")]
    proc, _ = start([*argv, "--socket", str(sock), "--config", str(config)], sock, Client.identity)
    try:
        yield proc, sock
    finally:
        stop(proc)


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(len(ordered) * p), len(ordered) - 1)]


def fill(sock: Path, queue: str, total: int, connections: int, batch: int = 1000, window: int = 1) -> float:
    """Offer ``total`` records in batches from ``connections`` threads, each with up to ``window`` batches
    unacknowledged (1: wait for each reply); returns records/s."""
    records = [(VALUE, None, ())] * batch
    per = total // connections
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with Client(sock, timeout=120) as c, Producer(c, queue, window) as producer:
                sent = 0
                while sent < per:
                    n = min(batch, per - sent)
                    producer.offer_batch(records[:n])
                    sent += n
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return per * connections / elapsed


def part_bulk(pid: int, sock: Path, total: int, connections: int) -> None:
    print(f"[1] bulk {total:,} x 100 B, batches of 1000, durable:")
    for row, (label, conns, window) in enumerate(
        (
            ("1 connection, waiting for each reply:", 1, 1),
            ("1 connection, 4 batches in flight:   ", 1, 4),
            (f"{connections} connections, waiting for replies:", connections, 1),
        )
    ):
        # One queue per row: with --bulk-connections 1 two rows have the same (conns, window).
        name = f"bulk-{row}-{conns}-{window}"
        with Client(sock) as c:
            c.queue_create(name)
        cpu0 = cpu_s(pid)
        rate = fill(sock, name, total, conns, window=window)
        us = (cpu_s(pid) - cpu0) / total * 1e6
        print(f"    {label} {rate:,.0f} records/s   (daemon CPU {us:.1f} us/record)")


@dataclass(frozen=True)
class Mode:
    """One row of part 2: ``noop`` (the baseline), ``block`` (``Client.offer``, each waits), ``window``
    (a ``Producer`` with ``window`` single-record requests in flight, no batching: closed loop, as fast as
    it goes), ``batch`` (closed loop too: a ``Producer`` with one request in flight and up to ``window``
    records waiting behind it, which leave as one request) or ``rate`` (open loop: each client offers on
    a fixed schedule, ``rate`` records/s in all, through a ``Producer`` with ``window`` requests in flight
    that batches what waits behind them)."""

    kind: str
    window: int = 1

    @classmethod
    def parse(cls, text: str) -> Mode:
        if text == "0":
            return cls("noop")
        if text == "1":
            return cls("block")
        if text.startswith("r"):
            return cls("rate", int(text[1:] or 1))
        if text.startswith("b"):
            return cls("batch", int(text[1:] or 1))
        return cls("window", int(text))

    def describe(self, rate: float) -> str:
        if self.kind == "noop":
            return "baseline, a no-op request (id) instead, each waits for its reply"
        if self.kind == "block":
            return "each waits for its ack"
        if self.kind == "window":
            return f"each with {self.window} offers in flight (Producer, batch_records=1)"
        if self.kind == "batch":
            return (
                f"closed loop, each a Producer with 1 request in flight and up to {self.window} records "
                "waiting behind it"
            )
        return (
            f"open loop, {rate:,.0f} offered/s in all, each client a Producer (window {self.window}, "
            "batching what waits)"
        )


def _single_client(
    sock: str, mode: Mode, rate: float, clients: int, start: float, stop: float, out: mp.Queue[Any]
) -> None:
    """One client process: single-record offers until ``stop`` (time.time()); sends its latencies, the
    CPU seconds it used meanwhile and the requests it sent."""
    latencies: list[float] = []
    requests = 0
    with Client(sock) as c:
        c.offer("single", VALUE)  # connect first
        while time.time() < start:
            time.sleep(0.001)
        cpu0 = time.process_time()
        clock = time.perf_counter
        if mode.kind == "noop":  # the baseline: a request the daemon answers without its store
            while time.time() < stop:
                t = clock()
                c.identity()
                latencies.append(clock() - t)
        elif mode.kind == "block":
            while time.time() < stop:
                t = clock()
                c.offer("single", VALUE)
                latencies.append(clock() - t)
        elif mode.kind in ("window", "batch"):
            sent: list[tuple[float, Ack]] = []
            window, batch = (mode.window, 1) if mode.kind == "window" else (1, mode.window)
            with Producer(c, "single", window, batch_records=batch) as producer:
                while time.time() < stop:
                    t = clock()
                    sent.append((t, producer.offer(VALUE)))
                requests = producer.requests_sent
            latencies = [ack.acked_at - t for t, ack in sent if ack.acked_at is not None]
        else:
            # Open loop: offer i is due at start + i * interval whatever happened before, and its latency
            # runs from when it was due (a client that falls behind pays for it: no coordinated omission).
            interval = clients / rate
            due = clock() + (start - time.time())
            end = clock() + (stop - time.time())
            sent = []
            with Producer(c, "single", mode.window) as producer:
                while due < end:
                    now = clock()
                    if now < due:
                        if producer.in_flight:
                            producer.poll(due - now)  # read acks as they come, not at the next offer
                        else:
                            time.sleep(due - now)
                        continue
                    sent.append((due, producer.offer(VALUE)))
                    due += interval
                producer.flush()
                requests = producer.requests_sent
            latencies = [ack.acked_at - t for t, ack in sent if ack.acked_at is not None]
        cpu = time.process_time() - cpu0
    out.put((latencies, cpu, requests))


def part_single(
    pid: int, sock: Path, clients: int, seconds: float, modes: list[Mode], rate: float, *, floor: bool = True
) -> None:
    rates: dict[str, float] = {}
    with Client(sock) as c:
        c.queue_create("single")
    print(f"[2] single-record offers, {clients} concurrent client processes, {seconds:.0f}s each:")
    context = mp.get_context("spawn")
    for mode in modes:
        with Client(sock) as c:
            commits0 = c.status()["transactions"]
        results: mp.Queue[Any] = context.Queue()
        start = time.time() + 2.0  # every client connected and imported by then
        procs = [
            context.Process(
                target=_single_client, args=(str(sock), mode, rate, clients, start, start + seconds, results)
            )
            for _ in range(clients)
        ]
        for proc in procs:
            proc.start()
        while time.time() < start:
            time.sleep(0.001)
        cpu0 = cpu_s(pid)
        reports = [results.get() for _ in procs]
        cpu = cpu_s(pid) - cpu0
        flat = [x for latencies, _, _ in reports for x in latencies]
        client_cpu = sum(used for _, used, _ in reports)
        requests = sum(sent for _, _, sent in reports)
        for proc in procs:
            proc.join()
        with Client(sock) as c:
            commits = c.status()["transactions"] - commits0
        unit = "request" if mode.kind == "noop" else "offer"
        print(
            f"    {mode.describe(rate)}: {len(flat) / seconds:,.0f} {unit}s/s; latency p50 "
            f"{pct(flat, 0.5) * 1e3:.2f} ms, p99 {pct(flat, 0.99) * 1e3:.2f} ms"
        )
        extra = "" if mode.kind == "noop" else f", {len(flat) / max(commits, 1):.1f} offers/commit"
        if requests:
            extra += f", {len(flat) / requests:.1f} offers/request"
        print(
            f"        daemon CPU {cpu / len(flat) * 1e6:.0f} us/{unit}, clients' CPU "
            f"{client_cpu / len(flat) * 1e6:.0f} us/{unit}{extra}"
        )
        rates[mode.kind] = len(flat) / seconds
    if floor and "noop" in rates and "block" in rates:
        # Same minutes: the most any server of this shape reaches here (floor_offers.py).
        bare_noop, bare_durable = floor_offers.report(clients, seconds)
        print(
            f"    blocking offers / no-op: latticed {rates['block'] / rates['noop']:.2f}, the bare floor "
            f"{bare_durable / bare_noop:.2f}; latticed's offers ÷ the floor's "
            f"{rates['block'] / bare_durable:.2f}"
        )


def part_tail(sock: Path, count: int, interval: float) -> None:
    with Client(sock) as c:
        c.queue_create("tailq")
    sent: dict[int, float] = {}
    received: dict[int, float] = {}
    ready = threading.Event()

    def subscriber() -> None:
        with Client(sock) as c:
            it = c.tail("tailq", None, follow=True)
            ready.set()
            for entry in it:
                received[entry.offset] = time.perf_counter()
                if len(received) >= count:
                    break

    t = threading.Thread(target=subscriber)
    t.start()
    ready.wait()
    time.sleep(0.2)
    with WakeProbe() as probe, FsyncProbe(sock.parent) as disk, Client(sock) as c:
        for _ in range(count):
            t0 = time.perf_counter()
            offset = c.offer("tailq", VALUE)
            sent[offset] = t0
            time.sleep(interval)
    t.join(30)
    lat = [received[o] - sent[o] for o in sent if o in received]
    print(f"[3] offer -> tail push latency ({len(lat)} records, one every {interval * 1e3:.0f} ms):")
    p50, p99, worst = pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3, max(lat) * 1e3
    print(f"    p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {worst:.2f} ms")
    print(f"    {probe.summary()}")
    print(f"    {disk.summary()}")


def part_rss(proc: subprocess.Popen[bytes], sock: Path, records: int, connections: int) -> None:
    with Client(sock) as c:
        c.queue_create("big")
        before = c.status()["records"]
    print(f"[4] storing {records:,} records in one queue ({before:,} already stored in other queues)...")
    t0 = time.perf_counter()
    rate = fill(sock, "big", records, connections)
    took = time.perf_counter() - t0
    with Client(sock) as c:
        status = c.status()
    print(
        f"    stored in {took:.0f}s ({rate:,.0f} records/s); store {status['storage_bytes'] / 2**20:,.0f} MiB"
    )
    print(f"    daemon RSS after storing: {rss_mb(proc.pid):.1f} MB (total records {status['records']:,})")
    t0 = time.perf_counter()
    with Client(sock, timeout=120) as c:
        offset, n = 0, 0
        while True:
            batch = c.read("big", offset, max_records=10000)
            if not batch.offsets:
                break
            n += len(batch)
            offset = batch.next_offset
    took = time.perf_counter() - t0
    print(
        f"    read all back: {n / took:,.0f} records/s; daemon RSS after reading: {rss_mb(proc.pid):.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="1,2,3,4")
    parser.add_argument("--bulk", type=int, default=1_000_000)
    parser.add_argument("--bulk-connections", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--windows",
        default="0,1,4,b8,r1",
        help="part 2 rows, comma list: 0 the no-op baseline, 1 blocking offers, N a Producer with N in "
        "flight (closed loop), bK a Producer with 1 in flight and up to K records batched behind it "
        "(closed loop), rN open loop at --rate through a batching Producer with N in flight",
    )
    parser.add_argument("--rate", type=float, default=20_000.0, help="part 2: offered records/s (rN rows)")
    parser.add_argument("--tail-count", type=int, default=2000)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--group-commit-ms", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary data directory")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    with (
        tempfile.TemporaryDirectory(prefix="latticed-bench-", dir=args.dir) as tmp,
        daemon(Path(tmp), args.group_commit_ms) as (proc, sock),
    ):
        print(f"daemon pid {proc.pid}, data in {tmp}, group_commit_ms={args.group_commit_ms}")
        print(f"    cpus={os.cpu_count()}, RSS at start: {rss_mb(proc.pid):.1f} MB")
        if 1 in parts:
            part_bulk(proc.pid, sock, args.bulk, args.bulk_connections)
        if 2 in parts:
            modes = [Mode.parse(w) for w in args.windows.split(",")]
            part_single(proc.pid, sock, args.clients, args.seconds, modes, args.rate)
        if 3 in parts:
            part_tail(sock, args.tail_count, 0.002)
        if 4 in parts:
            part_rss(proc, sock, args.records, args.bulk_connections)
        print(f"    RSS at end: {rss_mb(proc.pid):.1f} MB")


if __name__ == "__main__":
    main()
