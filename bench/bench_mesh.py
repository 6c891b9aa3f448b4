"""What a record costs each replica of a mesh of real daemons, linked by static peers or found by mDNS.

    .venv/bin/python bench/bench_mesh.py                        # N = 2, 4, 8; bulk, then live 5/s, 100/s
    .venv/bin/python bench/bench_mesh.py --sizes 4 --bulk 50000 --parts bulk,live
    .venv/bin/python bench/bench_mesh.py --sizes 16 --discovery mdns   # root: a LAN in network namespaces
    .venv/bin/python bench/bench_mesh.py --sizes 4,8 --core 1           # the queue on fork core 1

N daemons, one writer, ``--payload``-byte records. ``--discovery static`` (the default): each daemon dials
``--degree`` random others (a connected sparse graph, seeded: what static peers give). ``--discovery mdns``:
no peers are given, the daemons find each other by mDNS only and the links are whatever their peer books
(the bounded active view) make of it. ``--core``: the queue's fork core (default: the daemon's
``default_queue_core``; the core that ran is printed). Where they run (``--net``): ``loopback``
(127.0.0.1, the static default) or ``netns``, one host each on a bridge in network namespaces made for the run
(integration/netns.py: nothing leaves them, so mDNS reaches no other daemon on this machine; needs root;
the mdns default). ``--net loopback`` with mdns runs mDNS on 127.0.0.1 under a network key of the run's
own: other daemons on this machine see the announcements but cannot join. In one mesh per N:

  bulk   ``--bulk`` records offered on the writer in batches of 1,000; until every replica holds them.
  live   single offers at each ``--rates`` rate (``--live`` records each, or at least ``--live-seconds``);
         a tail on the daemon farthest from the writer measures latency.

Per part, per replica (the writer excluded), from the daemons' own counters (``latticectl status``:
``received_<type>`` and ``received_<type>_bytes``, what ``latticed_peer_messages_total`` exports) and
/proc: deltas received per record (core 1's DELTA and core 2's DELTA2), bytes received per record (every
message type) and that ÷ payload, CPU per record (utime + stime); then the mesh's total bytes ÷ ((N - 1) x
payload) and, live, the last daemon's latency p50/p99; DELTAs and ACKs (or DELTA2s and ACK2s) each daemon
sent and the transactions its store committed (``status``'s ``transactions``), the writer's included (a relay
that falls behind its sender stores several chunks in one commit and sends them on as one delta: fewer of
all three), and for the bulk how long the writer's client calls took.
After each part: every daemon's open links (``connected``: its active view) and RSS. Figures are printed,
never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from _daemons import (
    cpu_ns_s,
    cpu_s,
    listen_address,
    rss_mb,
    run_argv,
    sched_by_role,
    sched_report,
    scratch,
    start,
    stop,
    thread_cpu_s,
    thread_role,
    thread_schedstat,
    wait_end,
)

from latticed.api.client.blocking_client import Client
from latticed.host.netkey import write_network_key

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
import netns  # integration/ is not a package

LAN_PORT = 7464
#: The storage's histograms (their sums) that ``--metrics`` reads, under the names :class:`Meter` keeps.
_SECONDS = {
    "latticed_storage_commit_seconds_sum": "commit_s",
    "latticed_storage_fsync_seconds_sum": "fsync_s",
}


class Node:
    """One ``latticed run``: on 127.0.0.1 (port 0) or on its own namespace ``host`` of a LAN; mDNS on
    ``mdns_on`` (its one address) or off; ``key``: the network key file (any address beyond loopback
    needs one)."""

    def __init__(
        self,
        root: Path,
        name: str,
        *,
        host: netns.Host | None = None,
        mdns: bool = False,
        key: Path | None = None,
        metrics: bool = False,
    ) -> None:
        self.name = name
        self.metrics = metrics
        self.socket = root / f"{name}.sock"
        address = host.address if host is not None else "127.0.0.1"
        listen = f"{address}:{LAN_PORT}" if host is not None else "127.0.0.1:0"
        args = ["--data-dir", str(root / name), "--socket", str(self.socket), "--listen", listen]
        args += ["--log-level", "WARNING"]
        args += ["--mdns", "--mdns-interface", address] if mdns else ["--no-mdns"]
        if key is not None:
            args += ["--network-key-file", str(key)]
        if metrics:
            args += ["--metrics-listen", f"{address}:0"]
        argv = run_argv(*args)
        if host is not None:
            argv = host.cmd(*argv)  # ``ip netns exec`` execs: the PID is the daemon's
        self.proc, self.listen = start(argv, self.socket, listen_address, timeout=60)

    def client(self) -> Client:
        return Client(self.socket, timeout=120)

    def stop(self) -> None:
        stop(self.proc)

    def counters(self) -> dict[str, float]:
        """The replication counters, ``transactions`` (the store's group commits so far) and, with
        metrics on, the seconds those took until durable and in SQLite's COMMIT (``commit_s``,
        ``fsync_s``: the histograms' sums)."""
        with self.client() as c:
            status = c.status()
        counters = {**(status.get("replication") or {}), "transactions": int(status.get("transactions") or 0)}
        if status.get("metrics"):
            with urllib.request.urlopen(f"http://{status['metrics']}/metrics", timeout=30) as reply:
                text = reply.read().decode()
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name in _SECONDS:
                    counters[_SECONDS[name]] = float(value)
        return counters

    def links(self) -> int:
        """Links open now (identities with a gossip link up, both directions)."""
        return int(self.counters().get("connected", 0))

    def found_by_mdns(self) -> int:
        """Distinct identities this daemon has seen announced by mDNS."""
        with self.client() as c:
            return len({p.get("public_key") for p in c.peers() if "mdns" in p.get("sources", ())})


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


def discover(nodes: list[Node], settle_s: float = 3.0, timeout: float = 120.0) -> None:
    """Until every daemon has seen every other announced by mDNS, then until the links stop changing for
    ``settle_s`` (nothing to wait on but the daemons' status)."""
    n = len(nodes)
    deadline = time.monotonic() + timeout
    while (short := [x.name for x in nodes if x.found_by_mdns() < n - 1]) and time.monotonic() < deadline:
        time.sleep(0.5)
    if short:
        raise TimeoutError(f"{short} did not find all {n - 1} others by mDNS within {timeout:.0f} s")
    seen, since = links(nodes), time.monotonic()
    while time.monotonic() - since < settle_s and time.monotonic() < deadline:
        time.sleep(0.5)
        now = links(nodes)
        if now != seen:
            seen, since = now, time.monotonic()


def open_links(nodes: list[Node]) -> set[frozenset[int]]:
    """The links open now, as pairs of node indexes (from each daemon's peer list)."""
    index = {}
    for i, node in enumerate(nodes):
        with node.client() as c:
            index[c.identity()] = i
    edges = set()
    for i, node in enumerate(nodes):
        with node.client() as c:
            for row in c.peers():
                j = index.get(row.get("public_key") or "")
                if row.get("connected") and j is not None and j != i:
                    edges.add(frozenset((i, j)))
    return edges


def links(nodes: list[Node]) -> list[int]:
    return [node.links() for node in nodes]


def report_links(nodes: list[Node], label: str) -> None:
    """Every daemon's open links and RSS: what discovery and the active view made of the mesh."""
    counts = links(nodes)
    rss = [rss_mb(node.proc.pid) for node in nodes]
    print(
        f"    {label}: links per daemon {counts} (mean {statistics.mean(counts):.1f}, max {max(counts)}; "
        f"{sum(counts) // 2} links); RSS MB mean {statistics.mean(rss):.0f}, max {max(rss):.0f}, "
        f"total {sum(rss):.0f} [{', '.join(f'{r:.0f}' for r in rss)}]"
    )


def report_trees(nodes: list[Node], label: str) -> None:
    """Each daemon's place in the queues' eager trees (``status``): the queues no link pushes to it (cut
    off: each record then waits for a HAVE and a graft timer), and its links' pruned (link, queue) pairs
    each way, in / out."""
    parts, cut = [], []
    for node in nodes:
        with node.client() as c:
            counters = c.status().get("replication") or {}
        off = int(counters.get("queues_cut_off", 0))
        if off:
            cut.append(node.name)
        pruned, lazy = counters.get("queue_links_pruned_in", 0), counters.get("queue_links_lazy_out", 0)
        parts.append(f"{node.name} {pruned}/{lazy}" + (f" CUT OFF {off}" if off else ""))
    shown = ", ".join(cut) or "none"
    print(f"    eager trees {label}: cut off: {shown}; pruned in/out per daemon {', '.join(parts)}")


@contextlib.contextmanager
def lan(hosts: int, net: str) -> Iterator[netns.Lan | None]:
    """A LAN of ``hosts`` namespaces for ``--net netns`` (deleted on the way out), else None."""
    if net != "netns":
        yield None
        return
    with netns.Lan(hosts) as made:
        yield made


class Meter:
    """Counters and CPU of every replica between two points."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.before = [(node.counters(), cpu_s(node.proc.pid)) for node in nodes]
        self.threads_before = [(cpu_ns_s(node.proc.pid), thread_cpu_s(node.proc.pid)) for node in nodes]
        # --metrics: each thread's run-queue wait too (the hops a relayed chunk waits for a core)
        self.sched_before = [thread_schedstat(node.proc.pid) if node.metrics else None for node in nodes]
        self.started = time.perf_counter()

    def by_thread(self, index: int, records: int) -> str:
        """Daemon ``index``'s CPU per record since the start in us to 0.01, by thread: its event loop
        (the main thread), storage thread, trio's worker threads (store reads), others (the checkpointer)
        and threads gone since
        (the process's CPU clock less its live threads'): what the mesh simulator's costs are per role."""
        pid = self.nodes[index].proc.pid
        total0, before = self.threads_before[index]
        total, after = cpu_ns_s(pid), thread_cpu_s(pid)
        roles = {"loop": 0.0, "storage": 0.0, "readers": 0.0, "other": 0.0}
        for tid, (name, seconds) in after.items():
            roles[thread_role(pid, tid, name)] += seconds - before.get(tid, (name, 0.0))[1]
        roles["gone"] = total - total0 - sum(roles.values())
        parts = " + ".join(f"{role} {cpu / records * 1e6:.2f}" for role, cpu in roles.items())
        return f"{(total - total0) / records * 1e6:.2f} us = {parts}"

    def report_sched(self, records: int) -> None:
        """Per daemon and thread role: CPU and run-queue wait (runnable, not running) and times run since
        the start, and the box's mean of threads waiting for a core; a line saying so where the kernel
        keeps no schedstat."""
        elapsed = time.perf_counter() - self.started
        lines, waited = [], 0.0
        for node, before in zip(self.nodes, self.sched_before, strict=True):
            after = thread_schedstat(node.proc.pid)
            if before is None or after is None:
                print("    run-queue waits: no /proc/PID/task/TID/schedstat here (CONFIG_SCHED_INFO)")
                return
            roles = sched_by_role(node.proc.pid, before, after)
            waited += sum(wait for _, wait, _ in roles.values())
            lines.append(sched_report(node.name, roles, records))
        print(
            f"    CPU/run-queue wait by thread (the writer first; {waited:.2f} s waiting over "
            f"{elapsed:.2f} s: {waited / elapsed:.1f} threads waiting for a core on average):"
        )
        for line in lines:
            print(f"      {line}")

    def report(self, label: str, records: int, payload: int) -> None:
        n = len(self.nodes)
        rows = []
        for node, (before, cpu0) in zip(self.nodes[1:], self.before[1:], strict=True):
            after, cpu1 = node.counters(), cpu_s(node.proc.pid)

            def diff(name: str, after: dict[str, float] = after, before: dict[str, float] = before) -> int:
                return int(after.get(name, 0) - before.get(name, 0))

            received = sum(diff(k) for k in after if k.startswith("received_") and k.endswith("_bytes"))
            kinds = {
                k.removeprefix("received_"): (diff(k), diff(k + "_bytes"))
                for k in after
                if k.startswith("received_") and not k.endswith("_bytes") and diff(k)
            }
            deltas = diff("received_delta") + diff("received_delta2")  # core 1's DELTA, core 2's DELTA2
            carried = (diff("delta2_records_in"), diff("delta2_records_held"))  # core 2's, as they came
            rows.append((node.name, deltas, received, cpu1 - cpu0, kinds, carried))
        print(f"  {label}: {records:,} records of {payload} B, N = {n}")
        for name, deltas, received, cpu, kinds, (carried, held) in rows:
            per = received / records
            mix = ", ".join(
                f"{k} {v / records:.3g} ({size / records:,.0f} B)" for k, (v, size) in sorted(kinds.items())
            )
            print(
                f"    replica {name}: deltas/record {deltas / records:.2f}, bytes/record {per:,.0f} "
                f"({per / payload:.2f}x payload), CPU/record {cpu / records * 1e3:.3f} ms; msgs/record: {mix}"
                + (
                    f"; DELTA2 records/record {carried / records:.2f} ({held / records:.2f} held already)"
                    if carried
                    else ""
                )
            )
        writer_cpu = cpu_s(self.nodes[0].proc.pid) - self.before[0][1]
        print(f"    the writer's CPU/record {writer_cpu / records * 1e3:.3f} ms")
        threads = "; ".join(f"{node.name} {self.by_thread(i, records)}" for i, node in enumerate(self.nodes))
        print(f"    CPU/record by thread (the writer first): {threads}")
        if self.nodes[0].metrics:
            self.report_sched(records)
        sent, timing, grafts, wants = [], [], [], 0
        for node, (before, _) in zip(self.nodes, self.before, strict=True):
            after = node.counters()

            def sent_of(kind: str, after: dict[str, float] = after, before: dict[str, float] = before) -> int:
                return int(sum(after.get(k, 0) - before.get(k, 0) for k in (f"sent_{kind}", f"sent_{kind}2")))

            commits = int(after.get("transactions", 0) - before.get("transactions", 0))
            sent.append(f"{node.name} {sent_of('delta')}/{sent_of('ack')}/{commits}")
            grafts.append(f"{node.name} {sent_of('want')}/{sent_of('prune')}")
            wants += sent_of("want")
            if "commit_s" in after and commits:
                took = (after["commit_s"] - before.get("commit_s", 0)) / commits * 1e3
                synced = (after["fsync_s"] - before.get("fsync_s", 0)) / commits * 1e3
                timing.append(f"{node.name} {took:.1f}/{synced:.1f}")
        print(f"    DELTAs/ACKs sent/transactions committed per daemon (the writer first): {', '.join(sent)}")
        if timing:
            print(f"    ms per transaction until durable/in its COMMIT (fsync): {', '.join(timing)}")
        print(f"    WANTs/PRUNEs sent per daemon (both cores): {', '.join(grafts)}; WANTs {wants}")
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
    calls = []
    with nodes[0].client() as c:
        for lo in range(0, count, 1000):
            t0 = time.perf_counter()
            c.offer_batch(name, [(b"b" * payload, None, ())] * min(1000, count - lo))
            calls.append(time.perf_counter() - t0)
    offered = time.perf_counter() - started
    print(
        f"    the writer's client: {len(calls)} calls in {offered:.2f} s, each "
        f"{statistics.mean(calls) * 1e3:.1f} ms mean (median {statistics.median(calls) * 1e3:.1f}, "
        f"max {max(calls) * 1e3:.1f})"
    )
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
    mdns = args.discovery == "mdns"
    net = args.net or ("netns" if mdns else "loopback")
    where = "network namespaces (a bridge, one host each)" if net == "netns" else "loopback"
    if mdns:
        edges: set[frozenset[int]] = set()
        print(f"N = {n}: mDNS only, no static peers, on {where}; writer 0")
    else:
        edges = topology(n, args.degree, args.seed)
        far, hops = farthest(n, edges)
        print(
            f"N = {n}: static, on {where}; links {sorted(tuple(sorted(e)) for e in edges)}; writer 0, "
            f"farthest {far} ({hops} hops)"
        )
    with lan(n, net) as made, scratch("ld-mesh-", remove=True) as (root, nodes):
        key = None
        if made is not None or mdns:  # beyond loopback, or a discovery of the run's own
            key = root / "network.key"
            write_network_key(key)
        hosts = list(made.members.values()) if made is not None else [None] * n
        started = time.perf_counter()
        for i, host in enumerate(hosts):
            nodes.append(Node(root, f"n{i}", host=host, mdns=mdns, key=key, metrics=args.metrics))
        if mdns:
            discover(nodes)
            print(f"    all found each other by mDNS and links settled {time.perf_counter() - started:.1f} s "
                  "after the first start")  # fmt: skip
        else:
            connect(nodes, edges)
        with nodes[0].client() as c:
            queue = c.queue_create("mesh", core=args.core)
            c.offer("mesh", b"warm-up")
            ran = c.queue_info("mesh").get("core")
            print(f"    queue on fork core {ran} (asked: {args.core or 'the default'})")
        for node in nodes[1:]:
            wait_end(node, queue, 1)
        if mdns:  # the daemon farthest from the writer, over the links discovery made
            far, hops = farthest(n, open_links(nodes))
            print(f"    writer 0, farthest {far} ({hops} hops over the links open now)")
        report_links(nodes, "at start")
        report_trees(nodes, "at start")
        if "bulk" in parts:
            bulk(nodes, queue, "mesh", args.bulk, args.payload)
            report_links(nodes, "after bulk")
            report_trees(nodes, "after bulk")
        if "live" in parts:
            for rate in (float(r) for r in args.rates.split(",")):
                count = max(args.live, int(rate * args.live_seconds))
                live(nodes, queue, "mesh", rate, count, nodes[far], hops)
                report_links(nodes, f"after live {rate:g}/s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2,4,8", help="mesh sizes N, comma-separated")
    parser.add_argument("--discovery", choices=("static", "mdns"), default="static")
    parser.add_argument(
        "--net", choices=("loopback", "netns"), default=None, help="default: loopback (static), netns (mdns)"
    )
    parser.add_argument("--degree", type=int, default=3, help="peers each daemon dials (static)")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--bulk", type=int, default=50_000, help="records in the bulk part")
    parser.add_argument("--payload", type=int, default=100, help="bytes per bulk record")
    parser.add_argument("--rates", default="5,100", help="live offers per second, comma-separated")
    parser.add_argument("--live", type=int, default=100, help="live records per rate (at least)")
    parser.add_argument("--live-seconds", type=float, default=10.0, help="... or this long at each rate")
    parser.add_argument("--parts", default="bulk,live")
    parser.add_argument(
        "--core", type=int, choices=(1, 2), help="the queue's fork core (default: the daemon's)"
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="serve each daemon's metrics and print its transactions' mean time until durable and fsync, "
        "and each thread role's CPU and run-queue wait (schedstat)",
    )
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        run(n, args)


if __name__ == "__main__":
    main()
