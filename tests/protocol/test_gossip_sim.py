"""The replication protocol in a 1,000-node in-process network: convergence rounds and bytes on the wire."""

from __future__ import annotations

import math

from support.sim import SimNetwork

from latticed.crdt.records import Record
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(b"o" * 32)
KEY = (OWNER.public_key, "q", 0)
NODES = 1000


def spread(net: SimNetwork, batch: int, index: int) -> tuple[int, int]:
    before = sum(node.bytes_received for node in net.nodes.values())
    writer = net.nodes[0]
    target = (writer.states[KEY].held_end if KEY in writer.states else 0) + batch
    writer.write(OWNER, "q", [Record(value=bytes(100), timestamp=index) for _ in range(batch)], index)
    net.settle()
    rounds = 0
    while not all(KEY in n.states and n.states[KEY].held_end >= target for n in net.nodes.values()):
        assert rounds < 100, "no convergence"
        net.round()
        rounds += 1
    net.run_until_quiet()
    return rounds, sum(node.bytes_received for node in net.nodes.values()) - before


def test_thousand_nodes_converge_within_log_rounds_and_near_payload_bytes() -> None:
    net = SimNetwork()
    net.random_graph(NODES, 4)
    net.run_until_quiet()
    results = [spread(net, 300, i) for i in range(3)]
    for rounds, _ in results:
        assert rounds <= math.log2(NODES) + 2
    steady_ratio = max(received / (300 * (NODES - 1)) / 100 for _, received in results[1:])
    assert steady_ratio <= 1.1, steady_ratio
    final = net.nodes[0].states[KEY]
    assert all(node.states[KEY] == final for node in net.nodes.values())


def test_loss_and_churn_still_converge() -> None:
    net = SimNetwork(loss=0.02)
    net.random_graph(300, 4)
    net.run_until_quiet()
    for index in range(3):
        for _ in range(5):
            net.churn(net.rng.randrange(1, 300), net.rng.sample(range(300), 4))
        spread(net, 20, index)
    net.loss = 0.0
    net.run_until_quiet()
    final = net.nodes[0].states[KEY]
    assert final.held_end == 60
    assert all(node.states[KEY] == final for node in net.nodes.values())
