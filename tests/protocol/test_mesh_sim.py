"""The timed mesh simulator (tests/support/mesh_sim.py): bench_mesh's graph, deterministic, and the
dissemination it shows for live records (one copy per record per replica)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from support.mesh_sim import Costs, MeshSim, bulk, farthest, live, mesh_topology, warm_up

from latticed.net.gossip import GRAFT_TIMEOUT_S, HAVE_LINGER_S
from latticed.protocol.compact import COMPACT_FEATURE
from latticed.protocol.versions import agree, ours


def test_graph_is_connected_and_every_node_has_its_links() -> None:
    for n in (2, 8, 100):
        edges = mesh_topology(n, 3, 28)
        degrees = {i: sum(1 for e in edges if i in e) for i in range(n)}
        assert all(d >= min(3, n - 1) for d in degrees.values())
        _, hops = farthest(n, edges)
        assert hops < n  # every node reached from the writer
    assert mesh_topology(8, 3, 28) == mesh_topology(8, 3, 28)
    # bench_mesh prints this graph for N = 8 (bench/RESULTS.md): the same draw
    assert sorted(tuple(sorted(e)) for e in mesh_topology(8, 3, 28)) == [
        (0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (1, 6), (2, 3),
        (2, 4), (2, 6), (2, 7), (3, 5), (4, 7), (5, 7), (6, 7),
    ]  # fmt: skip


def _live_counts(draws: int) -> list[dict[str, int]]:
    sim = MeshSim(8, draws=draws)
    warm_up(sim)
    part = live(sim, 5, 20)
    return [dict(c) for c in part.received]


def test_same_seeds_same_messages() -> None:
    assert _live_counts(3) == _live_counts(3)


def test_live_records_reach_every_replica_once() -> None:
    sim = MeshSim(8)
    warm_up(sim)
    part = live(sim, 5, 40)
    assert sim.all_hold(41)
    assert part.per_record("copies") <= 1.05
    assert part.per_record("delta") <= 1.05
    assert part.max_hops is not None and part.max_hops <= 4
    final = sim.nodes[0].durable[sim.key].summary()
    assert all(node.durable[sim.key].summary() == final for node in sim.nodes)


def test_a_bulk_crosses_a_busy_mesh_about_once() -> None:
    """20,000 records in batches of 1,000 on bench_mesh's graph and box: chunks used to reach replicas
    twice and more, because a HAVE whose news streamed in more slowly from another link grafted a second
    one (1.4-1.5 x (N - 1) x payload here, 1.9-2.5 from the daemons); now about once."""
    ratios = []
    for draws in (0, 1, 3):
        sim = MeshSim(8, draws=draws)
        warm_up(sim)
        ratios.append(bulk(sim, 20_000, 100).total_bytes_ratio())
        assert sim.all_hold(20_001)
    assert sum(ratios) / len(ratios) <= 1.3, ratios


def test_links_are_configured_as_daemon_links() -> None:
    """Every link agrees on the features two daemons of this build agree on, with the daemons' HAVE
    linger and graft timer: otherwise the message counts it is compared with are another protocol's."""
    sim = MeshSim(4)
    features = agree(ours(), ours()).features
    assert COMPACT_FEATURE in features
    for node in sim.nodes:
        for session in node.sessions.values():
            assert session.peer_features == features
            assert session.have_linger == HAVE_LINGER_S
            assert session.graft_timeout == GRAFT_TIMEOUT_S


def test_live_records_travel_compact_with_haves_lingering() -> None:
    """A live record costs each replica about one compact DELTA (~200 B, the plain one is ~460) and the
    HAVEs of a flush go out as one message per 0.5 s, so at 5/s fewer than one per record per link."""
    sim = MeshSim(8)
    warm_up(sim)
    part = live(sim, 5, 40)
    assert part.per_record("delta") <= 1.05
    assert part.per_record("delta_bytes") <= 250
    assert part.per_record("have") <= 1.0
    assert part.total_bytes_ratio() <= 2.5
    plain = MeshSim(8, features=frozenset(), costs=Costs(have_linger=0.0))
    warm_up(plain)
    assert live(plain, 5, 40).per_record("delta_bytes") >= 400


def test_a_bulk_crosses_a_mesh_of_sixteen_on_two_cores_about_once() -> None:
    """16 daemons on 2 cores: a relay's traffic is held back by up to a second, longer than a fixed
    graft timer, so lazy links grafted while the eager one was still delivering, and chunks crossed two
    links (1.4-1.6 x (N - 1) x payload here, 1.5-2.1 from the daemons). The timer now learns how late
    copies come on each link and does not graft while the queue is still arriving."""
    busier = Costs(  # a box busier than the calibration's: each step twice the cost, no wake-ups
        message=0.0002, verify=0.001, verify_record=5e-6, cut=0.002, cut_record=2.5e-6, wake=0.0, client=0.02
    )
    ratios = []
    for draws in (0, 2):
        sim = MeshSim(16, draws=draws, costs=busier)
        warm_up(sim)
        ratios.append(bulk(sim, 30_000, 100).total_bytes_ratio())
        assert sim.all_hold(30_001)
    assert sum(ratios) / len(ratios) <= 1.25, ratios  # 1.34 with a fixed timer


def test_a_live_stream_at_100_per_second_is_relayed_as_it_came() -> None:
    """At 100/s the daemons relay each push as it came (storage/ahead.py) and their deltas from the
    store carry thinned checkpoints: ~1 delta of ~200 B per record per replica. The simulator used to
    batch the pushes ahead of a relay's commit into one delta with a checkpoint per record, and charged
    every step its cost from idle: 0.70 deltas per record and 2.5 x payload against the daemons' 0.98
    and 2.05."""
    sim = MeshSim(8)
    warm_up(sim)
    live(sim, 5, 20)
    part = live(sim, 100, 300)
    assert part.per_record("delta") >= 0.95
    assert part.per_record("delta_bytes") <= 210
    assert part.total_bytes_ratio() <= 2.2


def test_calls_that_wait_for_a_commit_share_the_next_and_go_out_as_one_delta() -> None:
    """The storage thread's group commit (storage/writer.py): jobs handed over while a transaction is
    under way go into the next one together, and the link's driver cuts one delta over what is durable
    when it runs. The simulator committed each job on its own, from the state when it was handed over
    (three calls at once did not even converge), so a relay behind its sender never batched."""
    sim = MeshSim(2, draws=0, costs=Costs(commit=0.02))
    warm_up(sim)
    writer, replica = sim.nodes
    commits, jobs, deltas = writer.commits, writer.committed_jobs, replica.received["delta"]
    for _ in range(3):
        sim.offer(1000, 100)
    sim.run_until(lambda: sim.all_hold(3001))
    assert writer.commits - commits == 2  # the first call alone, the two that waited for it together
    assert writer.committed_jobs - jobs == 3
    assert replica.received["delta"] - deltas == 2
    assert replica.durable[sim.key].summary() == writer.durable[sim.key].summary()


def test_the_writers_calls_share_the_box_with_the_relays() -> None:
    """A bulk call is work on the writer's event loop and storage thread, on the cores the relays use:
    the daemons' calls take 10-19 ms each in bench_mesh's bulk (~4 ms on an idle box without peers; a
    call's deltas to three peers are cut on the same event loop). The simulator paced them by a fixed
    pause (30 ms), so relays never fell behind the writer."""

    def seconds_per_call(cores: int | None) -> float:
        sim = MeshSim(8, draws=0, costs=Costs(cores=cores))
        warm_up(sim)
        calls: list[float] = []
        offer = sim.offer

        def counted(*args: Any, **kwargs: Any) -> None:
            calls.append(sim.now)
            offer(*args, **kwargs)

        sim.offer = counted  # type: ignore[method-assign]
        bulk(sim, 20_000, 100)
        return (calls[-1] - calls[0]) / (len(calls) - 1)

    alone, shared = seconds_per_call(None), seconds_per_call(2)
    assert alone <= 0.015
    assert shared >= 1.5 * alone


def test_a_bulk_on_eight_daemons_takes_as_long_and_batches_as_the_daemons_do() -> None:
    """bench_mesh's bulk at N = 8 on a quiet box: the daemons take 0.9-1.4 s, their writer sends each
    of its links one delta per call, and a relay with three children that falls behind sends the later
    of them fewer, larger deltas (0.75-0.97 DELTAs and 0.39-0.54 ACKs per 1,000 records per replica).
    The simulator took 1.65 s and sent every replica one delta per chunk (1.00 and 0.59). With the box's
    cores shared as the scheduler shares them (sim19: processor sharing, the client a process on them)
    it takes 1.34-1.38 s and sends 0.95-0.98 DELTAs and 0.52-0.55 ACKs (its relays fall behind less):
    at the top of the daemons' ranges, past the bounds of 1.3 s, 0.95 and 0.52 these had been."""
    deltas, acks, elapsed = [], [], []
    for draws in (0, 1, 2, 3):
        sim = MeshSim(8, draws=draws)
        warm_up(sim)
        sent = Counter(sim.link_deltas)
        part = bulk(sim, 50_000, 100)
        deltas.append(part.per_record("delta") * 1000)
        acks.append(part.per_record("ack") * 1000)
        elapsed.append(part.elapsed)
        from_writer = [n - sent[link] for link, n in sim.link_deltas.items() if link[0] == 0]
        assert len(from_writer) == 3 and min(from_writer) >= 45, from_writer
    assert 0.85 <= sum(elapsed) / 4 <= 1.4, elapsed
    assert sum(deltas) / 4 <= 0.97, deltas
    assert sum(acks) / 4 <= 0.54, acks
