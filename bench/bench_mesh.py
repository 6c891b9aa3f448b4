"""What a record costs each replica of a mesh of real daemons on loopback.

    .venv/bin/python bench/bench_mesh.py                        # N = 2, 4, 8; bulk, then live 5/s, 100/s
    .venv/bin/python bench/bench_mesh.py --sizes 4 --bulk 50000 --parts bulk,live

N daemons, each dialling ``--degree`` random others (a connected sparse graph, seeded: what static peers
or mDNS on a LAN of laptops give), one writer, ``--payload``-byte records. In one mesh per N:

  bulk   ``--bulk`` records offered on the writer in batches of 1,000; until every replica holds them.
  live   single offers at each ``--rates`` rate (``--live`` records each, or at least ``--live-seconds``);
         a tail on the daemon farthest from the writer measures latency.

Per part, per replica (the writer excluded), from the daemons' own counters (``latticectl status``:
``received_<type>`` and ``received_<type>_bytes``, what ``latticed_peer_messages_total`` exports) and
/proc: deltas received per record, bytes received per record (every message type) and that ÷ payload,
CPU per record (utime + stime); then the mesh's total bytes ÷ ((N - 1) x payload) and, live, the last
daemon's latency p50/p99. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections import deque
from pathlib import Path

from _daemons import LoopbackDaemon, cpu_s, scratch, wait_end


class Node(LoopbackDaemon):
    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root, name, timeout=120)

    def counters(self) -> dict[str, int]:
        with self.client() as c:
            return dict(c.status().get("replication") or {})


def topology(n: int, degree: int, seed: int) -> set[frozenset[int]]:
    """Each node dials ``degree`` random others; node i first dials one of 0..i-1, so the graph is
    connected whatever the draw."""
    rng = random.Random(seed)
    edges: set[frozenset[int]] = set()
    for i in range(1, n):
        edges.add(frozenset((i, rng.randrange(i))))
    for i in range(n):
        others = [j for j in range(n) if j != i]
        rng.shuffle(others)
        dialled = sum(1 for e in edges if i in e)
        for j in others:
            if dialled >= min(degree, n - 1):
                break
            if frozenset((i, j)) not in edges:
                edges.add(frozenset((i, j)))
                dialled += 1
    return edges


def farthest(n: int, edges: set[frozenset[int]], source: int = 0) -> tuple[int, int]:
    """The node farthest from ``source`` in hops, and how many."""
    dist = {source: 0}
    todo = deque([source])
    while todo:
        x = todo.popleft()
        for e in edges:
            if x in e:
                (y,) = e - {x}
                if y not in dist:
                    dist[y] = dist[x] + 1
                    todo.append(y)
    far = max(range(n), key=lambda i: dist[i])
    return far, dist[far]


def connect(nodes: list[Node], edges: set[frozenset[int]]) -> None:
    for edge in sorted(tuple(sorted(e)) for e in edges):
        a, b = edge
        with nodes[a].client() as c:
            c.call("peers_add", address=nodes[b].listen)
    want = {i: sum(1 for e in edges if i in e) for i in range(len(nodes))}
    deadline = time.monotonic() + 60
    while True:  # nothing to wait on but the daemons' status
        short = [i for i, node in enumerate(nodes) if node.counters().get("connected", 0) < want[i]]
        if not short:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"daemons {short} did not connect to all their peers")
        time.sleep(0.2)


class Meter:
    """Counters and CPU of every replica between two points."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.before = [(node.counters(), cpu_s(node.proc.pid)) for node in nodes]

    def report(self, label: str, records: int, payload: int) -> None:
        n = len(self.nodes)
        rows = []
        for node, (before, cpu0) in zip(self.nodes[1:], self.before[1:], strict=True):
            after, cpu1 = node.counters(), cpu_s(node.proc.pid)

            def diff(name: str, after: dict[str, int] = after, before: dict[str, int] = before) -> int:
                return after.get(name, 0) - before.get(name, 0)

            received = sum(diff(k) for k in after if k.startswith("received_") and k.endswith("_bytes"))
            kinds = {
                k.removeprefix("received_"): (diff(k), diff(k + "_bytes"))
                for k in after
                if k.startswith("received_") and not k.endswith("_bytes") and diff(k)
            }
            rows.append((node.name, diff("received_delta"), received, cpu1 - cpu0, kinds))
        print(f"  {label}: {records:,} records of {payload} B, N = {n}")
        for name, deltas, received, cpu, kinds in rows:
            per = received / records
            mix = ", ".join(
                f"{k} {v / records:.3g} ({size / records:,.0f} B)" for k, (v, size) in sorted(kinds.items())
            )
            print(
                f"    replica {name}: deltas/record {deltas / records:.2f}, bytes/record {per:,.0f} "
                f"({per / payload:.2f}x payload), CPU/record {cpu / records * 1e3:.3f} ms; msgs/record: {mix}"
            )
        total = sum(r[2] for r in rows)
        print(
            f"    mean per replica: deltas/record {statistics.mean(r[1] for r in rows) / records:.2f}, "
            f"bytes/record {statistics.mean(r[2] for r in rows) / records:,.0f}, "
            f"CPU/record {statistics.mean(r[3] for r in rows) / records * 1e3:.3f} ms; "
            f"total bytes / ((N-1) x payload) {total / ((n - 1) * records * payload):.2f}"
        )


def bulk(nodes: list[Node], queue: str, name: str, count: int, payload: int) -> None:
    meter = Meter(nodes)
    base = _end(nodes[0], name)
    started = time.perf_counter()
    with nodes[0].client() as c:
        for lo in range(0, count, 1000):
            c.offer_batch(name, [(b"b" * payload, None, ())] * min(1000, count - lo))
    for node in nodes[1:]:
        wait_end(node, queue, base + count)
    elapsed = time.perf_counter() - started
    meter.report(f"bulk ({elapsed:.2f} s until every replica held them)", count, payload)


def live(nodes: list[Node], queue: str, name: str, rate: float, count: int, last: Node, hops: int) -> None:
    payload_len = 100
    base = _end(nodes[0], name)
    for node in nodes[1:]:
        wait_end(node, queue, base)
    arrivals: dict[int, float] = {}

    def follow() -> None:
        with last.client() as c:
            for entry in c.tail(queue, from_offset=base):
                arrivals[entry.offset] = time.perf_counter()
                if entry.offset >= base + count - 1:
                    return

    tail = threading.Thread(target=follow, daemon=True)
    tail.start()
    time.sleep(0.5)
    meter = Meter(nodes)
    sent: dict[int, float] = {}
    interval = 1 / rate
    started = time.perf_counter()
    with nodes[0].client() as c:
        for i in range(count):
            due = started + i * interval
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            t0 = time.perf_counter()
            sent[c.offer(name, b"l" * payload_len)] = t0
    reached = count / (time.perf_counter() - started)
    for node in nodes[1:]:
        wait_end(node, queue, base + count)
    tail.join(60)
    meter.report(f"live {rate:g}/s (writer reached {reached:.0f}/s)", count, payload_len)
    lat = sorted((arrivals[o] - t) * 1000 for o, t in sent.items() if o in arrivals)
    if lat:
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(
            f"    last daemon {last.name} ({hops} hops): p50 {statistics.median(lat):.1f} ms, "
            f"p99 {p99:.1f} ms ({len(lat)} samples)"
        )


def _end(node: Node, name: str) -> int:
    with node.client() as c:
        return int(c.queue_info(name)["end_offset"])


def run(n: int, args: argparse.Namespace) -> None:
    parts = set(args.parts.split(","))
    edges = topology(n, args.degree, args.seed)
    far, hops = farthest(n, edges)
    print(f"N = {n}: links {sorted(tuple(sorted(e)) for e in edges)}; writer 0, farthest {far} ({hops} hops)")
    with scratch("ld-mesh-", remove=True) as (root, nodes):
        for i in range(n):
            nodes.append(Node(root, f"n{i}"))
        connect(nodes, edges)
        with nodes[0].client() as c:
            queue = c.queue_create("mesh")
            c.offer("mesh", b"warm-up")
        for node in nodes[1:]:
            wait_end(node, queue, 1)
        if "bulk" in parts:
            bulk(nodes, queue, "mesh", args.bulk, args.payload)
        if "live" in parts:
            for rate in (float(r) for r in args.rates.split(",")):
                count = max(args.live, int(rate * args.live_seconds))
                live(nodes, queue, "mesh", rate, count, nodes[far], hops)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2,4,8", help="mesh sizes N, comma-separated")
    parser.add_argument("--degree", type=int, default=3, help="peers each daemon dials")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--bulk", type=int, default=50_000, help="records in the bulk part")
    parser.add_argument("--payload", type=int, default=100, help="bytes per bulk record")
    parser.add_argument("--rates", default="5,100", help="live offers per second, comma-separated")
    parser.add_argument("--live", type=int, default=100, help="live records per rate (at least)")
    parser.add_argument("--live-seconds", type=float, default=10.0, help="... or this long at each rate")
    parser.add_argument("--parts", default="bulk,live")
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        run(n, args)


if __name__ == "__main__":
    main()
