"""Gossip simulation: the sans-IO replication protocol in an in-process network.

Usage: python bench/bench_gossip.py [--nodes 1000 10000] [--degree 4] [--batch 500] [--batches 4]
Reports, per network size: rounds for a batch written at one node to reach every node (target
<= log2 N + 2), and wire bytes received per record per node relative to the payload in steady state
(target <= 1.1), plus the same under message loss with churn.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from latticed.crdt.records import Record
from latticed.crdt.signing import Identity

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the simulator is a test helper
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--degree", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--loss", type=float, default=0.01)
    args = parser.parse_args()
    for size in args.nodes:
        run(size, args.degree, args.batch, args.batches, args.payload, 0.0)
        run(size, args.degree, args.batch, args.batches, args.payload, args.loss)


if __name__ == "__main__":
    main()
