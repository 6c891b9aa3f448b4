"""Gossip simulation: the sans-IO replication protocol in an in-process network.

Usage: python bench/bench_gossip.py [--nodes 1000 10000] [--degree 4] [--batch 500] [--batches 4]
Reports, per network size: rounds for a batch written at one node to reach every node (target
<= log2 N + 2), and wire bytes received per record per node relative to the payload in steady state
(target <= 1.1), plus the same under message loss with churn.

With ``--mesh 8 1000`` it runs instead the daemons of ``bench/bench_mesh.py`` simulated in time
(``tests/support/mesh_sim.py``: the same graph, seed and parts, real sessions and queue states, modelled
delays and CPU; links agree on the features daemons of this build agree on, ``--plain`` on none; the
queue on fork core 2 as the daemons' default, ``tests/support/mesh_sim2.py``, or ``--core 1``) and
prints what bench_mesh prints from the daemons' counters: messages and bytes received per type per record
per replica, and the total / ((N - 1) x payload); then copies of each record per node, the most hops a
first copy took, and how long the last node waited.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

from latticed.crdt.records import Record
from latticed.crdt.signing import Identity

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the simulator is a test helper
from support import mesh_sim, mesh_sim2
from support.sim import SimNetwork

OWNER = Identity.from_seed(b"o" * 32)
KEY = (OWNER.public_key, "q", 0)


def spread(net: SimNetwork, writer: int, batch: int, payload: int, index: int) -> tuple[int, int]:
    """Write one batch at ``writer``; returns (rounds until every node holds it, bytes received)."""
    before = sum(node.bytes_received for node in net.nodes.values())
    node = net.nodes[writer]
    target = (node.states[KEY].held_end if KEY in node.states else 0) + batch
    node.write(OWNER, "q", [Record(value=bytes(payload), timestamp=index) for _ in range(batch)], index)
    net.settle()
    rounds = 0
    while not all(KEY in n.states and n.states[KEY].held_end >= target for n in net.nodes.values()):
        net.round()
        rounds += 1
        if rounds > 1000:
            raise RuntimeError("did not converge")
    net.run_until_quiet()
    after = sum(node.bytes_received for node in net.nodes.values())
    return rounds, after - before


def run(size: int, degree: int, batch: int, batches: int, payload: int, loss: float) -> None:
    started = time.perf_counter()
    net = SimNetwork(loss=0.0)
    net.random_graph(size, degree)
    net.run_until_quiet()
    rounds_list, ratios = [], []
    for index in range(batches):
        if loss:
            net.loss = loss
            for _ in range(max(1, size // 100)):  # 1% of nodes churn per batch
                victim = net.rng.randrange(1, size)
                net.churn(victim, net.rng.sample(range(size), degree))
        rounds, received = spread(net, 0, batch, payload, index)
        net.loss = 0.0
        rounds_list.append(rounds)
        ratios.append(received / (batch * (size - 1)) / payload)
    steady = ratios[1:] or ratios
    label = f"N={size:>6} degree={degree} batch={batch}x{payload}B loss={loss:.0%}"
    print(
        f"{label}: rounds {rounds_list} (target <= {math.log2(size) + 2:.1f}); "
        f"bytes/record/node first {ratios[0]:.2f}x, steady {max(steady):.3f}x payload; "
        f"{time.perf_counter() - started:.0f} s"
    )


def report(label: str, part: mesh_sim.PartResult, replicas: bool) -> None:
    """One part, as bench_mesh prints it (means per replica), plus what only a simulation sees."""
    records = part.records
    if replicas:
        for index, counts in enumerate(part.received, 1):
            mix = ", ".join(
                f"{k} {counts[k] / records:.3g} ({counts[k + '_bytes'] / records:,.0f} B)"
                for k in sorted(counts)
                if not k.endswith("_bytes") and k != "copies" and counts[k]
            )
            size = sum(v for k, v in counts.items() if k.endswith("_bytes")) / records
            print(f"    replica n{index}: bytes/record {size:,.0f}; msgs/record: {mix}")
    mix = ", ".join(
        f"{k} {part.per_record(k):.3g} ({part.per_record(k + '_bytes'):,.0f} B)" for k in part.types()
    )
    latency = sorted(part.last_latency)
    tail = ""
    if latency:
        p99 = latency[min(len(latency) - 1, int(len(latency) * 0.99))]
        tail = f"; last node p50 {statistics.median(latency) * 1e3:.1f} / p99 {p99 * 1e3:.1f} ms"
    print(
        f"  {label}: {records:,} records of {part.payload} B, {part.elapsed:.2f} s simulated until every "
        f"replica held them\n    mean per replica: msgs/record: {mix}; bytes/record "
        f"{part.bytes_per_record():,.0f}; total bytes / ((N-1) x payload) {part.total_bytes_ratio():.2f}\n"
        f"    copies per record per node {part.per_record('copies'):.3f}; most hops of a first copy "
        f"{part.max_hops}{tail}"
    )


def run_mesh(size: int, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    base = mesh_sim2.CORE2_COSTS if args.core == 2 else mesh_sim.Costs()
    costs = dataclasses.replace(base, cores=args.cores or None)
    if not args.cores:  # a machine per node: nothing else deschedules its event loop
        costs = dataclasses.replace(costs, stall_chance=0.0)
    features = None
    if args.plain:  # links as to a daemon that states no features, HAVEs sent at once
        costs = dataclasses.replace(costs, have_linger=0.0)
        features = frozenset[str]()
    kind = mesh_sim2.MeshSim2 if args.core == 2 else mesh_sim.MeshSim
    extra: dict[str, bool] = {}
    if args.core == 2 and not args.cores:  # no shared run queue: the COMMIT's sleeps are modelled, not drawn
        extra["fsync_waits"] = False
    sim = kind(size, degree=3, seed=args.seed, draws=args.draws, costs=costs, **extra)
    if features is not None:
        sim = kind(size, degree=3, seed=args.seed, draws=args.draws, costs=costs, features=features, **extra)
    far, hops = mesh_sim.farthest(size, sim.edges)
    print(
        f"N = {size}: {len(sim.edges)} links (bench_mesh's graph, seed {args.seed}), draws {args.draws}, "
        f"{'one box of ' + str(args.cores) + ' cores' if args.cores else 'a machine per node'}; "
        f"writer 0, farthest {far} ({hops} hops); the queue on fork core {args.core}"
    )
    if isinstance(sim, mesh_sim2.MeshSim2):
        mesh_sim2.warm_up(sim)
    else:
        mesh_sim.warm_up(sim)
    parts = set(args.parts.split(","))
    replicas = size <= 16
    if "bulk" in parts:
        report("bulk", mesh_sim.bulk(sim, args.bulk, args.payload), replicas)
    if "live" in parts:
        for rate in (float(r) for r in args.rates.split(",")):
            count = max(args.live, int(rate * args.live_seconds))
            report(f"live {rate:g}/s", mesh_sim.live(sim, rate, count), replicas)
    print(f"  ({time.perf_counter() - started:.0f} s of CPU time)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--degree", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--loss", type=float, default=0.01)
    mesh = parser.add_argument_group("the daemons of bench_mesh.py, simulated (--mesh)")
    mesh.add_argument("--mesh", type=int, nargs="+", help="mesh sizes N (instead of the round-based runs)")
    mesh.add_argument("--seed", type=int, default=28, help="the graph's seed (bench_mesh's default)")
    mesh.add_argument("--draws", type=int, default=None, help="seed of the CPU jitter (default: --seed)")
    mesh.add_argument("--parts", default="bulk,live")
    mesh.add_argument(
        "--cores",
        type=int,
        default=2,
        help="cores all nodes share, as on bench_mesh's box (0: one machine each)",
    )
    mesh.add_argument(
        "--plain",
        action="store_true",
        help="links without optional features (no compact encodings) and HAVEs sent at once",
    )
    mesh.add_argument(
        "--core",
        type=int,
        choices=(1, 2),
        default=2,
        help="the queue's fork core (2, the daemons' default: tests/support/mesh_sim2.py; 1: mesh_sim.py)",
    )
    mesh.add_argument("--bulk", type=int, default=50_000, help="records in the bulk part")
    mesh.add_argument("--rates", default="5,100", help="live offers per second, comma-separated")
    mesh.add_argument("--live", type=int, default=100, help="live records per rate (at least)")
    mesh.add_argument("--live-seconds", type=float, default=10.0, help="... or this long at each rate")
    args = parser.parse_args()
    if args.mesh:
        for size in args.mesh:
            run_mesh(size, args)
        return
    for size in args.nodes:
        run(size, args.degree, args.batch, args.batches, args.payload, 0.0)
        run(size, args.degree, args.batch, args.batches, args.payload, args.loss)


if __name__ == "__main__":
    main()
