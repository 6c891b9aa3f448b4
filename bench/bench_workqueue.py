"""Work-queue benchmark against a real latticed daemon process over its Unix socket (acks durable).

    .venv/bin/python bench/bench_workqueue.py                       # 100k records, 8 workers
    .venv/bin/python bench/bench_workqueue.py --records 20000 --parts 1,3
    .venv/bin/python bench/bench_workqueue.py --parts 2,4,5         # local vs remote consumers

Parts:
  1. ``--records`` records through one group, ``--workers`` worker processes each looping
     ``dequeue`` + ``ack`` (one request each, every ack durable before its reply): tasks/s end to end.
  2. the same with ``subscribe`` (leases pushed, window ``--window``) and acks pipelined on the same
     connection (each ack still durable before its reply; the worker does not wait for it to lease more).
  3. dequeue wake-up latency: a consumer process blocked in ``dequeue(wait=...)`` on an empty group; the
     bench appends one record and measures until the consumer has it (p50/p99 over ``--samples``).
     Reported from the append's request (includes its fsync) and from its reply.

  4. remote consumers: a second daemon on loopback (replicating from the first, which owns the group),
     ``--workers`` worker processes subscribed to the group through it, acks pipelined and durable at
     the owner; payloads read from the second daemon's replica (the source is replicated first). Its
     rate against part 2's, measured in the same run.
  5. dequeue -> ack round trip of one consumer, one record at a time (``--samples``), against the
     owner directly and through the second daemon: p50/p99 each.

Figures are printed, never asserted. Targets: >= 10k tasks/s (part 1), p99 <= 10 ms (part 3), remote
subscribe >= 0.5x local (part 4), remote round trip p50 <= local p50 + 2 ms (part 5).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from _daemons import cpu_s  # bench/ is on sys.path when this runs as a script
from bench_daemon import daemon, pct

from latticed.api.client.blocking_client import Client
from latticed.errors import NotFoundError

VALUE = b"t" * 100


def fill(sock: Path, queue: str, total: int, batch: int = 1000) -> None:
    with Client(sock, timeout=120) as c:
        sent = 0
        while sent < total:
            n = min(batch, total - sent)
            c.offer_batch(queue, [(VALUE, None, ())] * n)
            sent += n


def box_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat): how saturated a part ran it."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def rate(done: int, elapsed: float, cpu: float) -> str:
    rate_s, per_task_us = done / elapsed, cpu / done * 1e6
    return f"    {rate_s:,.0f} tasks/s ({done:,} in {elapsed:.2f}s); daemon CPU {per_task_us:.0f} us/task"


def transactions(sock: Path) -> int:
    with Client(sock) as c:
        return int(c.status()["transactions"])


def worker_sync(sock: str, group: str, start: mp.synchronize.Event, out: Connection) -> None:
    done = 0
    with Client(sock, timeout=60) as c:
        c.identity()
        start.wait()
        while True:
            lease = c.dequeue(group)
            if lease is None:
                break
            c.ack(group, lease)
            done += 1
    out.send(done)


def worker_subscribe(
    sock: str, group: str, window: int, start: mp.synchronize.Event, out: Connection
) -> None:
    """Ack every pushed lease without waiting for the reply; stop at a ``stop`` record (one per worker,
    appended after the data: a worker holding extra ones gives them back when it unsubscribes)."""
    done = 0
    with Client(sock, timeout=60) as c:
        c.identity()
        start.wait()
        with c.subscribe(group, max_in_flight=window) as sub:
            for lease in sub:
                sub.ack(lease, wait=False)
                if lease.value == b"stop":
                    break
                done += 1
            sub.flush()
    out.send(done)


def run_workers(target: object, args: tuple[object, ...], workers: int) -> tuple[float, int]:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    pipes = []
    procs = []
    for _ in range(workers):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=target, args=(*args, start, child))  # type: ignore[arg-type]
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    time.sleep(1.0)  # let every worker connect (they wait on the start event)
    t0 = time.perf_counter()
    start.set()
    counts = [p.recv() for p in pipes]
    elapsed = time.perf_counter() - t0
    for proc in procs:
        proc.join(30)
    return elapsed, sum(counts)


def part_sync(pid: int, sock: Path, total: int, workers: int) -> None:
    with Client(sock) as c:
        c.queue_create("sync")
    fill(sock, "sync", total)
    with Client(sock) as c:
        c.group_create("sync-g", ["sync"], visibility=120)
    cpu0, tx0 = cpu_s(pid), transactions(sock)
    elapsed, done = run_workers(worker_sync, (str(sock), "sync-g"), workers)
    cpu, tx = cpu_s(pid) - cpu0, transactions(sock) - tx0
    with Client(sock) as c:
        stats = c.group_stats("sync-g")
    print(f"[1] {total:,} records, {workers} worker processes, dequeue + ack per record (sync):")
    print(rate(done, elapsed, cpu))
    print(f"    {done / tx:.1f} acks per commit; after: done={stats['done']} available={stats['available']}")


def part_subscribe(pid: int, sock: Path, total: int, workers: int, window: int) -> float:
    with Client(sock) as c:
        c.queue_create("subs")
        fill(sock, "subs", total)
        c.offer_batch("subs", [(b"stop", None, ())] * workers)
        c.group_create("subs-g", ["subs"], visibility=120, retry_backoff=0, max_attempts=0)
    cpu0, tx0, box0 = cpu_s(pid), transactions(sock), box_busy()
    elapsed, done = run_workers(worker_subscribe, (str(sock), "subs-g", window), workers)
    cpu, tx, box1 = cpu_s(pid) - cpu0, transactions(sock) - tx0, box_busy()
    print(f"[2] {total:,} records, {workers} worker processes, subscribe (window {window}) + pipelined acks:")
    print(rate(done, elapsed, cpu))
    print(f"    {done / tx:.1f} acks per commit")
    print(f"    the machine was {(box1[0] - box0[0]) / (box1[1] - box0[1]):.0%} busy meanwhile")
    return done / elapsed


def replicated(sock: Path, queue: str, end: int) -> None:
    deadline = time.monotonic() + 300
    while True:
        with Client(sock) as c:
            try:
                if c.queue_info(queue)["end_offset"] >= end:
                    return
            except NotFoundError:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{queue} did not replicate")
        time.sleep(0.1)


def part_remote_subscribe(
    owner: tuple[int, Path],
    worker: tuple[int, Path],
    total: int,
    workers: int,
    window: int,
    local: float | None,
) -> None:
    (pid, sock), (wpid, wsock) = owner, worker
    with Client(sock) as c:
        me = c.identity()
        c.queue_create("rsubs")
        fill(sock, "rsubs", total)
        c.offer_batch("rsubs", [(b"stop", None, ())] * workers)
        c.group_create("rsubs-g", ["rsubs"], visibility=120, retry_backoff=0, max_attempts=0)
    replicated(wsock, f"{me}/rsubs", total + workers)  # payloads from the worker's daemon's replica
    cpu0, wcpu0, tx0, box0 = cpu_s(pid), cpu_s(wpid), transactions(sock), box_busy()
    elapsed, done = run_workers(worker_subscribe, (str(wsock), f"{me}/rsubs-g", window), workers)
    cpu, wcpu, tx, box1 = cpu_s(pid) - cpu0, cpu_s(wpid) - wcpu0, transactions(sock) - tx0, box_busy()
    print(
        f"[4] {total:,} records, {workers} worker processes on a second daemon, subscribe (window {window}) "
        "to the first's group, pipelined acks:"
    )
    print(rate(done, elapsed, cpu))
    print(f"    worker's daemon CPU {wcpu / done * 1e6:.0f} us/task; {done / tx:.1f} acks per commit")
    print(f"    the machine was {(box1[0] - box0[0]) / (box1[1] - box0[1]):.0%} busy meanwhile")
    if local:
        print(f"    {done / elapsed / local:.2f}x the local subscribe rate of part 2 (target >= 0.5x)")


def round_trips(sock: Path, group: str, samples: int) -> list[float]:
    out = []
    with Client(sock, timeout=60) as c:
        for _ in range(samples):
            t0 = time.perf_counter()
            lease = c.dequeue(group)
            assert lease is not None
            c.ack(group, lease)
            out.append(time.perf_counter() - t0)
    return out


def part_round_trip(owner: Path, worker: Path, samples: int) -> None:
    with Client(owner) as c:
        me = c.identity()
        c.queue_create("rt")
        fill(owner, "rt", 2 * samples + 100)
        c.group_create("rt-g", ["rt"])
    replicated(worker, f"{me}/rt", 2 * samples + 100)
    round_trips(owner, "rt-g", 50)  # warm both paths up
    round_trips(worker, f"{me}/rt-g", 50)
    local = round_trips(owner, "rt-g", samples // 2)
    remote = round_trips(worker, f"{me}/rt-g", samples // 2)
    print(f"[5] dequeue -> ack round trip, one record at a time, {samples // 2} samples each (acks durable):")
    for label, got in (("at the owner            ", local), ("through a second daemon", remote)):
        print(f"    {label}: p50 {pct(got, 0.5) * 1000:.2f} ms, p99 {pct(got, 0.99) * 1000:.2f} ms")
    gap = (pct(remote, 0.5) - pct(local, 0.5)) * 1000
    print(f"    remote p50 - local p50 = {gap:.2f} ms (target <= 2 ms)")


def consumer(sock: str, group: str, ready: mp.synchronize.Event, out: Connection) -> None:
    with Client(sock, timeout=60) as c:
        ready.set()
        while True:
            lease = c.dequeue(group, wait=30)
            now = time.monotonic()
            if lease is None or lease.value == b"stop":
                break
            out.send(now)
            c.ack(group, lease)


def part_latency(sock: Path, samples: int) -> None:
    with Client(sock) as c:
        c.queue_create("wake")
        c.group_create("wake-g", ["wake"])
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=consumer, args=(str(sock), "wake-g", ready, child))
    proc.start()
    ready.wait(30)
    time.sleep(0.5)
    from_request, from_reply = [], []
    with Client(sock) as c:
        for _ in range(samples):
            time.sleep(0.005)  # the consumer is blocked again (it acked before this)
            t0 = time.monotonic()
            c.offer("wake", b"x")
            t1 = time.monotonic()
            got = parent.recv()
            from_request.append(got - t0)
            from_reply.append(max(got - t1, 0.0))
        c.offer("wake", b"stop")
    proc.join(30)
    print(f"[3] dequeue wake-up after an append, {samples} samples (consumer blocked in dequeue(wait=30)):")
    for label, samples_s in (("the append request", from_request), ("the append's reply", from_reply)):
        p50, p99 = pct(samples_s, 0.5) * 1000, pct(samples_s, 0.99) * 1000
        print(f"    from {label}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="1,2,3,4,5")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--group-commit-ms", type=float, default=2.0, help="the daemon's default")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary data directory")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    mesh = 'listen = "127.0.0.1:0"\nmdns = false\n'
    with contextlib.ExitStack() as stack:
        tmp = Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="latticed-wq-bench-", dir=args.dir))
        )
        (tmp / "a").mkdir()
        proc, sock = stack.enter_context(daemon(tmp / "a", args.group_commit_ms, mesh))
        print(f"daemon pid {proc.pid}, cpus={os.cpu_count()}, group_commit_ms={args.group_commit_ms}")
        local = None
        if 1 in parts:
            part_sync(proc.pid, sock, args.records, args.workers)
        if 2 in parts:
            local = part_subscribe(proc.pid, sock, args.records, args.workers, args.window)
        if 3 in parts:
            part_latency(sock, args.samples)
        if parts & {4, 5}:
            with Client(sock) as c:
                port = c.status()["listen"].rsplit(":", 1)[1]
            (tmp / "b").mkdir()
            peer = f'peers = ["127.0.0.1:{port}"]\n'
            wproc, wsock = stack.enter_context(daemon(tmp / "b", args.group_commit_ms, mesh + peer))
            if 4 in parts:
                part_remote_subscribe(
                    (proc.pid, sock), (wproc.pid, wsock), args.records, args.workers, args.window, local
                )
            if 5 in parts:
                part_round_trip(sock, wsock, args.samples)


if __name__ == "__main__":
    main()
