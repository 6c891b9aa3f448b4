"""Retention under a steady stream of writes, with real daemon processes on loopback.

    .venv/bin/python bench/bench_retention.py                        # the issue's run: 15 minutes
    .venv/bin/python bench/bench_retention.py --duration 120 --baseline 30   # a quick look

An owner daemon gets ``--rate`` records/s of ``--size`` bytes (open loop: records are due on a fixed
schedule, offered through one batching ``Producer``, and a record's latency runs from when it was due to
its acknowledgment) into a queue created with ``--max-bytes``, for ``--duration`` seconds; a replica daemon
dialled to it keeps at most ``--replica-cap`` of the queue (``--replica-max-bytes``). Every ``--sample``
seconds both data directories are measured (every file in them: the store, its WAL and shared memory, the
identity), with the bytes the queue holds and the retention counters.

The baseline is the same pair of daemons without retention (no policy, no replica cap), written at the
same rate for ``--baseline`` seconds, half before and half after the main run, in this process. Offer
latency p99 of the main run while it prunes (from its first truncation on) is compared with the
baseline's: the ratio is printed.

Bounds checked (printed, never asserted): each data directory stays within 1.5x its cap plus the WAL's
working size (what the store preallocates, ``latticed/storage/sqlite.py``).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from _daemons import listen_address, run_argv, start, stop

from latticed.api.client.blocking_client import Client
from latticed.api.client.producer import Ack, Producer
from latticed.host.retention_policy import RetentionPolicy, format_size, parse_size
from latticed.storage.sqlite import WAL_AUTOCHECKPOINT_PAGES, WAL_FRAME_HEADER_BYTES, WAL_HEADER_BYTES

PAGE = 4096
WAL_WORKING_BYTES = WAL_HEADER_BYTES + WAL_AUTOCHECKPOINT_PAGES * (WAL_FRAME_HEADER_BYTES + PAGE)
#: Records are offered in bursts every this many seconds (each timed wake-up costs the client ~0.1 ms).
TICK_S = 0.005


class Node:
    """One daemon process."""

    def __init__(self, root: Path, name: str, extra: list[str]) -> None:
        self.data_dir = root / name
        self.socket = root / f"{name}.sock"
        args = ["--data-dir", str(self.data_dir), "--socket", str(self.socket), "--no-mdns"]
        args += ["--listen", "127.0.0.1:0", "--log-level", "ERROR", *extra]
        self.proc, self.listen = start(run_argv(*args), self.socket, listen_address)

    def dir_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file())

    def wal_bytes(self) -> int:
        with contextlib.suppress(OSError):
            return (self.data_dir / "latticed.db-wal").stat().st_size
        return 0

    def stop(self) -> None:
        stop(self.proc, 60)


@contextlib.contextmanager
def pair(root: Path, name: str, replica_cap: int | None) -> Iterator[tuple[Node, Node]]:
    owner = Node(root, f"{name}-owner", [])
    extra = ["--peer", owner.listen]
    if replica_cap is not None:
        extra += ["--replica-max-bytes", str(replica_cap)]
    replica = Node(root, f"{name}-replica", extra)
    try:
        yield owner, replica
    finally:
        replica.stop()
        owner.stop()


@dataclass
class Writer:
    """Offers ``rate`` records/s to one queue on a thread of its own, open loop."""

    socket: Path
    queue: str
    rate: float
    value: bytes
    sent: list[tuple[float, Ack]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.socket, timeout=60) as c, Producer(c, self.queue, window=2) as producer:
                interval = 1.0 / self.rate
                due = time.perf_counter()
                while not self.stop.is_set():
                    now = time.perf_counter()
                    if now < due:
                        if producer.in_flight:
                            producer.poll(min(due - now, TICK_S))  # read acks as they come
                        else:
                            time.sleep(min(due - now, TICK_S))
                        continue
                    burst_end = now + TICK_S
                    while due <= burst_end:
                        self.sent.append((due, producer.offer(self.value)))
                        due += interval
                producer.flush()
        except BaseException as exc:
            self.error = exc

    def latencies(self, since: float = 0.0) -> list[float]:
        return [ack.acked_at - t for t, ack in self.sent if t >= since and ack.acked_at is not None]


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1000:.2f} ms"


def drive(owner: Node, queue: str, rate: float, value: bytes, seconds: float) -> Writer:
    writer = Writer(owner.socket, queue, rate, value)
    thread = threading.Thread(target=writer.run, daemon=True)
    thread.start()
    time.sleep(seconds)
    writer.stop.set()
    thread.join(120)
    if writer.error is not None:
        raise writer.error
    return writer


def baseline(root: Path, args: argparse.Namespace, seconds: float, tag: str) -> list[float]:
    with pair(root, f"baseline-{tag}", None) as (owner, _replica):
        with Client(owner.socket) as c:
            c.queue_create("stream")
        writer = drive(owner, "stream", args.rate, b"b" * args.size, seconds)
    latencies = writer.latencies(writer.sent[0][0] + 2.0 if writer.sent else 0.0)  # past the first 2 s
    print(
        f"baseline ({tag}): {len(writer.sent)} offers in {seconds:.0f}s, p50 {ms(pct(latencies, 50))}, "
        f"p99 {ms(pct(latencies, 99))}",
        flush=True,
    )
    return latencies


def window_p99(writer: Writer, first: int, until: float) -> tuple[float, int]:
    """p99 of the offers from index ``first`` that were due before ``until``, and where the next window
    starts (offers are appended in due order, so each window costs only its own offers)."""
    sent = writer.sent
    end = bisect.bisect_left(sent, until, lo=first, hi=len(sent), key=lambda item: item[0])
    window = [ack.acked_at - t for t, ack in sent[first:end] if ack.acked_at is not None]
    return pct(window, 99), end


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=900.0, help="seconds of writes with retention")
    parser.add_argument(
        "--mode",
        choices=("concurrent", "back-to-back"),
        default="concurrent",
        help="the baseline pair is written at the same time (its latency then sees the same box load), "
        "or for --baseline seconds, half before and half after",
    )
    parser.add_argument("--baseline", type=float, default=120.0, help="back-to-back: seconds without, in all")
    parser.add_argument("--rate", type=float, default=5000.0, help="records per second")
    parser.add_argument("--size", type=int, default=200, help="bytes per record value")
    parser.add_argument("--max-bytes", default="50MB", help="the owner's policy")
    parser.add_argument("--replica-cap", default="20MB", help="the replica's --replica-max-bytes")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between size samples")
    args = parser.parse_args()
    cap = parse_size(args.max_bytes)
    replica_cap = parse_size(args.replica_cap)
    assert cap is not None and replica_cap is not None
    owner_bound = 1.5 * cap + WAL_WORKING_BYTES
    replica_bound = 1.5 * replica_cap + WAL_WORKING_BYTES
    print(
        f"retention: {args.rate:.0f} records/s of {args.size} B for {args.duration:.0f}s, owner --max-bytes "
        f"{format_size(cap)} (bound {format_size(int(owner_bound))}), replica cap {format_size(replica_cap)} "
        f"(bound {format_size(int(replica_bound))}); WAL working size {format_size(WAL_WORKING_BYTES)}; "
        f"baseline {args.mode}",
        flush=True,
    )
    concurrent = args.mode == "concurrent"
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        before = [] if concurrent else baseline(root, args, args.baseline / 2, "before")
        owner, replica = stack.enter_context(pair(root, "retention", replica_cap))
        writers = []
        with Client(owner.socket) as c:
            queue = c.queue_create("stream", retention=RetentionPolicy(max_bytes=cap))
        writers.append(Writer(owner.socket, "stream", args.rate, b"r" * args.size))
        if concurrent:
            base_owner, _ = stack.enter_context(pair(root, "baseline", None))
            with Client(base_owner.socket) as c:
                c.queue_create("stream")
            writers.append(Writer(base_owner.socket, "stream", args.rate, b"b" * args.size))
        threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        writer = writers[0]
        samples: list[tuple[float, int, int, int, int]] = []
        pruning_since: float | None = None
        print(
            "   t  owner dir  (wal)    held    replica dir (wal)    held   cuts drops  p99 ret / base",
            flush=True,
        )
        marks = [0] * len(writers)
        with Client(owner.socket) as oc, Client(replica.socket) as rc:
            while time.perf_counter() - started < args.duration:
                time.sleep(min(args.sample, max(args.duration - (time.perf_counter() - started), 0)))
                for w in writers:
                    if w.error is not None:
                        raise w.error
                now = time.perf_counter()
                t = now - started
                counters = oc.status()["retention"] or {}
                if pruning_since is None and counters.get("truncations"):
                    pruning_since = now
                held = oc.retention_get("stream")["bytes"]
                drops = (rc.status()["retention"] or {}).get("local_drops", 0)
                try:
                    replica_held = rc.retention_get(queue)["bytes"]
                except Exception:
                    replica_held = 0
                o_dir, r_dir = owner.dir_bytes(), replica.dir_bytes()
                o_wal, r_wal = owner.wal_bytes(), replica.wal_bytes()
                samples.append((t, o_dir, o_wal, r_dir, r_wal))
                windows = []
                for i, w in enumerate(writers):  # offers due up to 1 s ago: acknowledged by now
                    p99, marks[i] = window_p99(w, marks[i], now - 1.0)
                    windows.append(ms(p99))
                p99s = " / ".join(windows)
                print(
                    f"{t:4.0f}  {format_size(o_dir):>9} ({format_size(o_wal)})  {format_size(held):>7}   "
                    f"{format_size(r_dir):>9} ({format_size(r_wal)})  {format_size(replica_held):>7}  "
                    f"{counters.get('truncations', 0):>4} {drops:>5}  {p99s}",
                    flush=True,
                )
        for w in writers:
            w.stop.set()
        for thread in threads:
            thread.join(120)
        with Client(owner.socket) as c:
            end = c.queue_info("stream")
        print(f"owner: {end['end_offset']} records written, holds {end['size']} from {end['start_offset']}")
        stack.close()
        after = [] if concurrent else baseline(root, args, args.baseline / 2, "after")
    offered = len(writer.sent)
    all_lat = writer.latencies()
    since = pruning_since or float("inf")
    pruning = writer.latencies(since)
    base = writers[1].latencies(since) if concurrent else before + after
    max_owner = max(s[1] for s in samples)
    max_replica = max(s[3] for s in samples)
    print()
    print(f"offered {offered} records ({offered / args.duration:.0f}/s)")
    for name, largest, bound, wal in (
        ("owner", max_owner, owner_bound, max(s[2] for s in samples)),
        ("replica", max_replica, replica_bound, max(s[4] for s in samples)),
    ):
        verdict = "within" if largest <= bound else "OVER"
        print(
            f"{name} data dir: max {format_size(largest)} of bound {format_size(int(bound))} -> {verdict}; "
            f"max WAL {format_size(wal)}"
        )
    steady = [s for s in samples if s[0] >= args.duration / 2]
    if steady:
        owner_range = f"{format_size(min(s[1] for s in steady))}..{format_size(max(s[1] for s in steady))}"
        replica_range = f"{format_size(min(s[3] for s in steady))}..{format_size(max(s[3] for s in steady))}"
        print(f"second half: owner dir {owner_range}, replica dir {replica_range}")
    print(f"offer latency, whole run: p50 {ms(pct(all_lat, 50))}, p99 {ms(pct(all_lat, 99))}")
    print(
        f"offer latency while pruning ({len(pruning)} offers): p50 {ms(pct(pruning, 50))}, "
        f"p99 {ms(pct(pruning, 99))}"
    )
    what = "same minutes" if concurrent else "before and after"
    print(
        f"baseline without retention ({what}, {len(base)} offers): p50 {ms(pct(base, 50))}, "
        f"p99 {ms(pct(base, 99))}"
    )
    print(f"p99 ratio (pruning / baseline): {pct(pruning, 99) / pct(base, 99):.2f} (target <= 2)")


if __name__ == "__main__":
    main()
