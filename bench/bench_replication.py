"""Replication between real daemon processes on loopback.

    .venv/bin/python bench/bench_replication.py                       # everything
    .venv/bin/python bench/bench_replication.py --records 200000 --parts catchup

Parts:
  catchup  ``--records`` x 100 B records written on A, then a fresh B dials A: records/s until B holds
           them all (verified and durable on B); then ``--big`` x 64 KiB records: MB/s.
  live     single-record offers on A every few ms; a tail on B (one hop) and on D (three hops, A-B-C-D;
           ``--hops``) receives each: latency percentiles, and against a baseline in the same run, a tail
           on A itself (the writer's own durable commit, no network), what replication adds.
  handshake  connections/s and ms per connection (TCP connect + authenticated handshake).
  cores    ``--records`` x 100 B records on A (batches of 1,000; with ``--singles N`` also N single
           offers, a catch-up of their own) in a queue of each fork core of ``--core`` (``1,2``), a fresh
           B catching up each; ``--rounds`` rounds alternated (1, 2, 1, 2...): seconds, bytes B received
           (every replication message), B's CPU, both less a daemon's start; with both cores, the
           median of the paired ratios 2 ÷ 1.

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from pathlib import Path

import floor_relay
import trio
from _daemons import CpuSplit, LoopbackDaemon, cpu_s, scratch, wait_end
from hostjitter import FsyncProbe, WakeProbe

from latticed.crdt.signing import Identity
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.transport import open_peer

Node = LoopbackDaemon


def cluster() -> contextlib.AbstractContextManager[tuple[Path, list[Node]]]:
    return scratch("ld-bench-", remove=True)


def catchup(records: int, big: int) -> None:
    for label, count, value, per_batch in (
        (f"{records:,} x 100 B", records, b"x" * 100, 1000),
        (f"{big:,} x 64 KiB", big, b"y" * 65536, 16),
    ):
        with cluster() as (root, nodes):
            a = Node(root, "A", [])
            nodes.append(a)
            with a.client() as c:
                queue = c.queue_create("backlog")
                for start in range(0, count, per_batch):
                    c.offer_batch("backlog", [(value, None, ())] * min(per_batch, count - start))
            a_cpu = cpu_s(a.proc.pid)
            started = time.perf_counter()
            b = Node(root, "B", [a.listen])
            nodes.append(b)
            b_started = cpu_s(b.proc.pid)
            elapsed = wait_end(b, queue, count) - started
            b_cpu = cpu_s(b.proc.pid) - b_started
            a_cpu = cpu_s(a.proc.pid) - a_cpu
            rate = f"{count / elapsed:,.0f} records/s, {count * len(value) / elapsed / 1e6:,.1f} MB/s"
            cpu = f"CPU/record: receiver {b_cpu / count * 1e6:.2f} us, sender {a_cpu / count * 1e6:.2f} us"
            print(f"catch-up {label} to a fresh daemon (verified, durable): {rate} ({elapsed:.1f} s; {cpu})")


def _received_bytes(node: Node) -> int:
    with node.client() as c:
        counters = c.status().get("replication") or {}
    return sum(v for k, v in counters.items() if k.startswith("received_") and k.endswith("_bytes"))


def catchup_once(core: int, count: int, per_batch: int) -> tuple[float, int, float]:
    """A fresh B catching up ``count`` x 100 B records written on A in a core-``core`` queue in offers
    of ``per_batch`` (1: single offers): (seconds, bytes B received, B's CPU seconds), the seconds and
    CPU less those of a daemon starting alone next to it (B catches up while it starts)."""
    with cluster() as (root, nodes):
        a = Node(root, "A", [])
        nodes.append(a)
        with a.client() as c:
            queue = c.queue_create("backlog", core=core)
            if per_batch == 1:
                for _ in range(count):
                    c.offer("backlog", b"x" * 100)
            else:
                for start in range(0, count, per_batch):
                    c.offer_batch("backlog", [(b"x" * 100, None, ())] * min(per_batch, count - start))
        started = time.perf_counter()
        b = Node(root, "B", [a.listen])
        nodes.append(b)
        elapsed = wait_end(b, queue, count) - started
        b_cpu = cpu_s(b.proc.pid)  # from its start: it catches up while it starts
        received = _received_bytes(b)
        # What starting a daemon alone costs (no peer), taken off both figures: the catch-up's own.
        started = time.perf_counter()
        c = Node(root, "C", [])
        nodes.append(c)
        alone = time.perf_counter() - started
        return elapsed - alone, received, b_cpu - cpu_s(c.proc.pid)


def catchup_cores(records: int, singles: int, cores: list[int], rounds: int) -> None:
    shapes = [(f"{records:,} x 100 B in batches of 1,000", records, 1000)]
    if singles:
        shapes.append((f"{singles:,} x 100 B single offers", singles, 1))
    for label, count, per_batch in shapes:
        runs: dict[int, list[tuple[float, int, float]]] = {core: [] for core in cores}
        for round_no in range(rounds):
            for core in cores:
                got = catchup_once(core, count, per_batch)
                runs[core].append(got)
                secs, received, cpu = got
                print(
                    f"catch-up {label}, core {core}, round {round_no + 1}: {secs:.2f} s, "
                    f"{count / max(secs, 1e-9):,.0f} records/s, B received {received / count:.1f} B/record, "
                    f"B CPU {cpu:.2f} s ({cpu / count * 1e6:.1f} us/record)",
                    flush=True,
                )
        for core in cores:
            secs, received, cpu = (statistics.median(r[i] for r in runs[core]) for i in range(3))
            print(f"  median core {core}: {secs:.2f} s, {received / count:.1f} B/record, B CPU {cpu:.2f} s")
        if len(cores) == 2:
            one, two = runs[cores[0]], runs[cores[1]]
            for i, name in enumerate(("seconds", "bytes received", "B CPU")):
                ratios = [b[i] / a[i] for a, b in zip(one, two, strict=True) if a[i] > 0]
                print(
                    f"  core {cores[1]} ÷ core {cores[0]}, {name}: median {statistics.median(ratios):.3f} "
                    f"(min {min(ratios or [0]):.3f}, max {max(ratios or [0]):.3f}, {len(ratios)} pairs)"
                )


def live(samples: int, interval: float, hops: int = 3, *, floor: bool = True) -> dict[str, list[float]]:
    """Returns each tail's latencies in ms, sorted, by label: "A" (the writer's own), "B" (1 hop) and, with
    ``hops`` > 1, the last daemon of the chain's (``hops`` = 1 runs only A and B)."""
    with cluster() as (root, nodes):
        for name in "ABCDEFGH"[: hops + 1]:
            nodes.append(Node(root, name, [nodes[-1].listen] if nodes else []))
        a, b, d = nodes[0], nodes[1], nodes[-1]
        with a.client() as c:
            queue = c.queue_create("live")
            c.offer("live", b"warm-up")
        wait_end(b, queue, 1)
        wait_end(d, queue, 1)
        sent: dict[int, float] = {}
        ends = {"A": a, "B": b, d.name: d}
        arrivals: dict[str, dict[int, float]] = {label: {} for label in ends}

        def follow(node: Node, label: str) -> None:
            with node.client() as c:
                for entry in c.tail(queue, from_offset=1):
                    arrivals[label][entry.offset] = time.perf_counter()
                    if entry.offset >= samples:
                        return

        threads = [threading.Thread(target=follow, args=(n, lbl), daemon=True) for lbl, n in ends.items()]
        for t in threads:
            t.start()
        time.sleep(0.5)
        cpu = {node.name: CpuSplit(node.proc.pid) for node in nodes}
        with WakeProbe() as probe, FsyncProbe(root) as disk, a.client() as c:
            for _ in range(samples):
                t0 = time.perf_counter()
                offset = c.offer("live", b"ping")
                sent[offset] = t0
                time.sleep(interval)
        for t in threads:
            t.join(30)
        spent = {name: split.since() for name, split in cpu.items()}
        # Baseline in the same run: a tail on the writer itself (its commit, no network, no peer), so a
        # noisy host shows in both figures and the difference is what replication adds.
        figures: dict[str, tuple[float, float]] = {}
        latencies: dict[str, list[float]] = {}
        names = {"A": "baseline: tail on the writer itself", "B": "1 hop"}
        if hops > 1:
            names[d.name] = f"{hops} hops"
        for label, name in names.items():
            lat = sorted((arrivals[label][o] - sent[o]) * 1000 for o in sent if o in arrivals[label])
            latencies[label] = lat
            if not lat:
                print(f"live {name}: no samples")
                continue
            p50 = statistics.median(lat)
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
            figures[label] = (p50, p99)
            print(f"live propagation, {name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms ({len(lat)} samples)")
        if "A" in figures:
            base = figures["A"]
            for label, name in list(names.items())[1:]:
                if label in figures:
                    add50, add99 = figures[label][0] - base[0], figures[label][1] - base[1]
                    print(f"    {name} over the baseline: p50 +{add50:.2f} ms, p99 {add99:+.2f} ms")
        print(f"    {probe.summary()}")
        print(f"    {disk.summary()}")
        # Per daemon, from /proc: what each record cost it (the relays' figure is the per-hop cost).
        relays: list[tuple[str, float]] = []
        for node in nodes:
            role = "writer" if node is a else "leaf" if node is d else "relay"
            if node.name in ends:
                role += ", a tail on it"
            loop_s, rest_s, woke = spent[node.name]
            loop_us, rest_us = loop_s / samples * 1e6, rest_s / samples * 1e6
            if node is not a and node is not d:
                relays.append((node.name, loop_us + rest_us))
            print(
                f"    daemon {node.name} ({role}): CPU/record {loop_us + rest_us:,.0f} us (event loop "
                f"{loop_us:,.0f} us, storage and other threads {rest_us:,.0f} us), "
                f"{woke / samples:.1f} wake-ups/record"
            )
    if floor and relays:
        # Same minutes, same rate: what a bare trio relay that only verifies, passes on, flushes (4
        # records a flush, as ours) and acknowledges costs this host. See floor_relay.py.
        bare = floor_relay.measure(samples, interval, hops, durable=True, verify=True)[:-1]
        mean = statistics.mean(us for us, _ in bare)
        print(
            f"    floor, bare trio relays (verify + pass on + fdatasync + ACK): CPU/record "
            f"{', '.join(f'{us:,.0f}' for us, _ in bare)} us, wake-ups/record "
            f"{', '.join(f'{woke:.1f}' for _, woke in bare)}; latticed's relays ÷ floor "
            f"{', '.join(f'{name} {us / mean:.2f}' for name, us in relays)}"
        )
    return latencies


def handshake(count: int) -> None:
    with cluster() as (root, nodes):
        a = Node(root, "A", [])
        nodes.append(a)
        host, port = a.listen.rsplit(":", 1)
        me = Identity.generate()

        async def run() -> float:
            started = time.perf_counter()
            for _ in range(count):
                stream = await open_peer(host, int(port), seed=me.seed, network_key=DEFAULT_NETWORK_KEY)
                await stream.aclose()
            return time.perf_counter() - started

        elapsed = trio.run(run)
        each_ms = elapsed / count * 1000
        print(f"handshake with a daemon over loopback: {count / elapsed:,.0f}/s, {each_ms:.2f} ms each")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--big", type=int, default=2000, help="64 KiB records for the MB/s figure")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.005)
    parser.add_argument(
        "--hops", type=int, default=3, choices=range(1, 8), help="live: daemons in the chain after the writer"
    )
    parser.add_argument("--parts", default="catchup,live,handshake")
    parser.add_argument("--core", default="1,2", help="cores: the fork cores compared, in this order")
    parser.add_argument("--rounds", type=int, default=3, help="cores: rounds of each, alternated")
    parser.add_argument("--singles", type=int, default=0, help="cores: also this many single offers")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "cores" in parts:
        cores = [int(c) for c in args.core.split(",")]
        catchup_cores(args.records, args.singles, cores, args.rounds)
    if "catchup" in parts:
        catchup(args.records, args.big)
    if "live" in parts:
        live(args.samples, args.interval, args.hops)
    if "handshake" in parts:
        handshake(200)


if __name__ == "__main__":
    main()
