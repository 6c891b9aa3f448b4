"""The timed mesh simulator on fork core 2 (tests/support/mesh_sim2.py): links configured as the daemons',
what a core-2 daemon does with a live push (relayed before its commit, merges lingering for company),
messages counted as the daemons count them, and the figures it was calibrated on (bench_mesh, N = 8)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from support import core2_sim
from support.core2_sim import Core2Network
from support.mesh_sim import Costs, CpuThread, bulk, counted_name, live
from support.mesh_sim2 import (
    CORE2_COSTS,
    CORE2_LOOP_COSTS,
    FSYNC_SLEEP_US,
    FSYNC_WAIT_US,
    GROUP_COMMIT_S,
    HAND_OFF_BACK_US,
    HAND_OFF_BURST_US,
    HAND_OFF_CHANCE,
    READ_CONNECTIONS,
    STALL_PER_CPU_S,
    SWITCH_INTERVAL_S,
    WAKE_PREEMPT_CHANCE,
    MeshNode2,
    MeshSim2,
    _Job2,
    _Recent,
    warm_up,
)
from support.queue2_histories import OWNER

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.net.core2_recent import RecentRows
from latticed.net.gossip import GRAFT_TIMEOUT_S, HAVE_LINGER_S
from latticed.protocol.compact import COMPACT_FEATURE
from latticed.protocol.core2_session import Core2Link
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import CORE2_NAMES, Summary2, link_summary
from latticed.protocol.versions import HEADS_V2, agree, ours

CORE2_TYPES = set(CORE2_NAMES.values())


def test_links_carry_core_2_as_daemon_links() -> None:
    """Every link has a core-2 part agreed on ``heads-v2`` and ``compact``, with the daemons' HAVE linger
    and graft timer: otherwise the counts compared with the daemons' are another protocol's."""
    sim = MeshSim2(4)
    features = agree(ours(), ours()).features
    assert {HEADS_V2, COMPACT_FEATURE} <= features
    for node in sim.nodes:
        for session in node.sessions.values():
            assert session.peer_features == features
            assert session.core2 is not None and session.core2.agreed
            assert session.core2.have_linger == HAVE_LINGER_S == session.have_linger
            assert session.graft_timeout == GRAFT_TIMEOUT_S


def test_live_records_reach_every_replica_once_counted_as_core_2_messages() -> None:
    sim = MeshSim2(8)
    warm_up(sim)
    part = live(sim, 5, 40)
    assert sim.all_hold(41)
    assert part.per_record("copies") <= 1.05
    assert part.max_hops is not None and part.max_hops <= 4
    assert set(part.types()) <= CORE2_TYPES | {"ping", "pong"}, part.types()
    assert part.per_record("delta2") <= 1.05
    final = sim.node2(0).durable2[sim.key]
    assert all(sim.node2(i).durable2[sim.key] == final for i in range(8))


def test_counted_name_is_the_daemons() -> None:
    """A core-2 message counts under its core-2 name (``net/gossip.py`` ``_count``), core 1's as before."""
    sim = MeshSim2(2)
    sent: list[bytes] = []
    send = sim._send

    def spy(x: int, y: int, messages: list[bytes], at: float) -> None:
        sent.extend(messages)
        send(x, y, messages, at)

    sim._send = spy  # type: ignore[method-assign]
    warm_up(sim)
    names = {counted_name(m) for m in sent}
    assert {"digest2", "delta2", "ack2"} <= names, names


def test_live_at_5_per_second_as_the_daemons_count_it() -> None:
    """bench_mesh --sizes 8 --core 2, live 5/s, three runs of 2026-11-30 (bench/RESULTS.md, "bulk at N = 8
    against the daemons"): per record per replica DELTA2 1.00, ACK2 0.569, 0.567, 0.569, HAVE2 0.33, PRUNE2
    and WANT2 0, 240 B. Within 10 % of the means."""
    sim = MeshSim2(8)
    warm_up(sim)
    part = live(sim, 5, 100)
    for name, daemons in (("delta2", 1.00), ("ack2", 0.568), ("have2", 0.33)):
        assert abs(part.per_record(name) / daemons - 1) <= 0.1, (name, part.per_record(name))
    assert part.per_record("prune2") + part.per_record("want2") <= 0.02
    assert abs(part.bytes_per_record() / 240 - 1) <= 0.1, part.bytes_per_record()


def test_a_relay_passes_a_live_push_on_before_its_commit() -> None:
    """A daemon verifies a small push against the value ahead and passes it on as it came while its
    merge waits for the disk (net/core2_ahead.py): with commits of 50 ms, a record reaches the node two
    hops away well within one commit of the writer's."""
    sim = MeshSim2(8, costs=Costs(commit=0.05))
    warm_up(sim)
    part = live(sim, 5, 10)
    assert max(part.last_latency) < 0.05, part.last_latency


def test_merges_of_pushes_served_ahead_linger_for_company() -> None:
    """At 100/s a relay's merges of pushes it served ahead share a transaction (storage/writer.py
    ``MERGE_LINGER_S``): fewer commits than merges; without the linger, about one each."""

    def jobs_per_commit(linger: float) -> float:
        sim = MeshSim2(8, merge_linger=linger)
        warm_up(sim)
        commits, jobs = sim.nodes[1].commits, sim.nodes[1].committed_jobs
        live(sim, 100, 200)
        return (sim.nodes[1].committed_jobs - jobs) / (sim.nodes[1].commits - commits)

    assert jobs_per_commit(0.02) >= 1.5
    assert jobs_per_commit(0.0) <= 1.2


def test_a_bulk_on_core_2_crosses_the_mesh_about_once() -> None:
    """bench_mesh's bulk on core 2 gives 1.06-1.16 x (N - 1) x payload at N = 8 (the daemons' eight runs
    of sim23: 1.119 at 50k). Since the warm-up's stalls are drawn per unit of core time (sim23c) the
    writer keeps its three links eager into the bulk in more draws and prunes one in the bulk's first
    chunks: draws 0-3 at 20k give 1.213, 1.061, 1.061, 1.061 (draw 0 alone was 1.122 before); with the
    costs measured again and the interpreter's hand-offs as runs (sim24b) 1.061 each."""
    ratios = []
    for draw in range(4):
        sim = MeshSim2(8, draws=draw)
        warm_up(sim)
        part = bulk(sim, 20_000, 100)
        assert sim.all_hold(20_001)
        ratios.append(part.total_bytes_ratio())
    assert sum(ratios) / len(ratios) <= 1.15 and max(ratios) <= 1.25, ratios


def test_a_bulk_at_n_8_as_the_daemons_run_and_count_it() -> None:
    """bench_mesh --sizes 8 --core 2 --metrics, bulk 50k, three runs of 2026-11-30 (bench/RESULTS.md,
    "bulk at N = 8 against the daemons"; a fourth, "bulk ACK2s at N = 8", agrees): 0.754 DELTA2s and
    0.329 ACK2s per 1,000 records per replica (0.70-0.82, 0.29-0.37 a run); the writer's transactions
    8.4-11.5 ms until durable, all held after 1.24-1.51 s; the writer's CPU 7-8 us a record. Over draws
    0-7 the simulated means are within 10 % of both counts and of the part's time. With a read holding up
    the loop's ready tasks and no limit on reader threads the simulated writer took 24 ms a call against
    the daemons' 21, its relays sent a bulk chunk a commit, and the ACK2s were 22 % over. With the
    switch interval the daemons set (0.5 ms, not the test process's 5 ms): DELTA2 -5.7 %, ACK2 -0.9 %,
    time +8.6 %; a draw's transactions 9.6-14.8 ms (the daemons' 8.4-11.5), its writer 5.8-7.8 us a record.

    The reference figures since the box's cores are shared as the scheduler shares them (sim19,
    bench/RESULTS.md "processor sharing"): ten runs of main's daemons (95ef1d3), 0.756 DELTA2s and 0.351
    ACK2s, all held after 1.10 s (0.96-1.50 a run). The simulated ACK2s went from 0.326 to 0.363 (+10 %
    against the three runs above, +3 % against these ten). Its bulk takes 1.44 s: not within 10 % of the
    daemons' 1.10 (+31 %): both boxes are busy through the bulk (1.6-1.9 cores), and the simulated nodes
    needed ~50 us of CPU a record between them against the daemons' ~38.

    Since ``CORE2_COSTS`` are measured per operation (sim19, bench/RESULTS.md "per-operation CPU costs
    measured"), the simulated nodes need 33.1 us a record between them (the writer 5.8) against
    35.9 us for four runs of main's daemons measured by thread (31.9-39.9; the writer 4.9-6.5): within
    10 %. The bulk then takes 0.95 s (-13 % against the ten runs' 1.10), and the relays keep up with the
    writer: about one DELTA2 a chunk per replica (0.94, +25 %) and 0.52 ACK2s (+47 %), where the
    daemons' relays fall behind and carry several chunks in one. Pinned, not met.

    Since a woken thread waits for a core (``Costs.hop``, measured from the daemons' schedstat) and the
    storage thread's work runs in switch-interval slices, each a hand-off (sim20, bench/RESULTS.md "a
    woken thread waits for a core"): the bulk takes 1.18 s (+7.5 % against the ten runs' 1.10: met), a
    simulated wake-up waits 0.79 ms (the daemons' 0.93-1.07 ms a run on an idle box), but the relays
    still pass each chunk on alone: DELTA2 0.940 (+24 %), ACK2 0.561 (+60 %); the writer's transaction
    12.6-15.9 ms a draw (the daemons' 5.6-10). Pinned, not met; draws 3 and 7 push on fewer links
    from the writer (its CPU 4.0 and 5.0 us a record).

    Since the storage thread takes its next batch at its COMMIT and the commit's callback waits on the
    loop (sim20b, bench/RESULTS.md: the relays' callback 3.5-4.0 ms after the COMMIT, the daemons'
    4.0-6.2): DELTA2 0.892 (+18 %), ACK2 0.485 (+38 %), the bulk 1.22 s (+11 %, from +7.5 %), the
    writer's transaction 10.8-14.0 ms a draw. Pinned, not met.

    With a fifth of the writer's storage CPU (chain hash, signature, SQLite's statements) run with the
    interpreter released, beside its loop (sim20c, bench/RESULTS.md: ``WRITER_GIL_FREE`` from py-spy
    --native): DELTA2 0.903 (+19 %), ACK2 0.491 (+40 %), the bulk 1.20 s (+9.1 %), the writer's
    transaction 10.9-13.4 ms a draw (mean 12.2, from 12.5: its COMMIT 6.5 ms, the daemons' 4.2-7.8, and
    ~5.7 ms before it, the daemons' 1.4-2.4). Pinned, not met.

    With the interpreter handed over as CPython 3.11 hands it (sim21, bench/RESULTS.md: the holder
    runs on until a blocking call releases it or the other asks after a switch interval; no slice
    queued behind the loop's whole ready batch): DELTA2 0.854 (+13 %), ACK2 0.448 (+28 %), HAVE2
    0.0264 (-5.6 %: met), the bulk 1.13 s (+2.3 %: met), the writer's transaction 8.8-13.7 ms a draw
    (mean 12.3: ~5.8 ms before its COMMIT against the daemons' 1.2-1.6 median). Pinned, not met.

    On a box whose threads keep their core for a burst (sim21b, bench/RESULTS.md: ``Costs.core_slice``,
    the kernel's base slice; no even share, the run-queue wait the queue's): DELTA2 0.768 (+1.6 %: met),
    ACK2 0.419 (+19 %), HAVE2 0.0239 (-15 %: one linger round in six draws of eight), the bulk 0.997 s
    (-9.4 %: met), the nodes' CPU 31.6 us a record (-12 %: fewer DELTA2s to cut and verify), the
    writer's transaction 9.3-13.5 ms a draw (mean 11.8: 5.3 ms before its COMMIT). Pinned, not met.

    With the COMMIT's CPU on the box in the storage thread's runs, only its fsync's sleep off it, and a
    thread waiting for the interpreter asking for it only once it has run twice (sim21c, bench/RESULTS.md):
    DELTA2 0.785 (+3.8 %: met), ACK2 0.406 (+16 %), HAVE2 0.0239 (-15 %), the bulk 1.03 s (-6.6 %: met),
    the nodes' CPU 35.3 us a record (-1.6 %: met), bytes 110 a record, the writer's transaction 6.7-13.0
    ms a draw (mean 10.0: 6.7 ms before its COMMIT, the daemons' 2.4-3.1). Pinned, not met.

    With the writer's storage CPU until its COMMIT as the daemons' probe measures it (1.19 us a record,
    ``offer_store_record``, was 1.645), a thread waiting behind the loop's ready tasks asking as late as
    any waiter and not at all once the storage thread took the interpreter, its wake-up no longer left to
    the loop once it took it, and the transaction timed from its work's start as the daemons time it
    (sim22, bench/RESULTS.md): the writer's transaction 5.8-9.6 ms a draw, mean 7.74 (+7.5 % against
    7.2: met; 3.83 ms before its COMMIT, the daemons' means 2.0-3.3, medians 1.1-1.24: not met), HAVE2
    0.0268 (-4.3 %: met), the bulk 1.02 s (-7.7 %), the nodes' CPU 35.5 us (-1.2 %); DELTA2 0.834
    (+10.4 %: not met, was +3.8 %), ACK2 0.406 (+15.6 %). Pinned, not met.

    With a waiter's two runs each waiting as long as the box's runs have waited (``Box.wait_a_run``; the
    queue now, which it asked by until then, reads half of it: sim22b, bench/RESULTS.md): the writer's
    held work before its COMMIT 2.68 ms (2.0-3.1 a draw; the daemons' means 2.0-3.3: met), its reads
    ending inside it 0.33 times a transaction (the daemons' 0.31; was 0.62), its transaction 7.42 ms
    (+3.1 %: met), the bulk 1.02 s (-7.0 %), the nodes' CPU 35.2 us (-1.8 %); but DELTA2 0.846 (+11.9
    %), ACK2 0.423 (+20.5 %) and HAVE2 0.0232 (-17 %): not met. The relays pass 159 DELTA2s on against
    the daemons' 135 and commit 1.01 deltas a transaction against their 1.15 (their transactions 10.7 ms
    until durable, the daemons' 15.9): an ACK2 a transaction. Pinned, not met.

    Re-pinned on the daemons since reads22 (links asking for the same rows at once share one read):
    eight runs of main's daemons (a92aa6b; sim23, bench/RESULTS.md), per 1,000 records per replica
    DELTA2 0.724 (0.591-0.900), ACK2 0.320 (0.229-0.449), HAVE2 0.0286 (0.017-0.043), all held after
    1.26 s (0.94-1.63), the nodes' CPU 33.4 us a record (29.6-37.5), the writer's 4.88 (3.94-5.84), its
    transaction 7.05 ms (5.1-9.6). With the simulated relays sharing their reads as the daemons' do
    (``MeshSim2._read2_then``'s ``request``): DELTA2 0.786 (+8.6 %: met), the nodes' CPU 32.5 us (-2.7
    %), the writer's 4.82 (-1.2 %), its transaction 6.99 ms (-0.8 %), 2.37 ms before its COMMIT; not met:
    ACK2 0.438 (+37 %), HAVE2 0.0218 (-24 %), the bulk 0.91 s (-28 %). Pinned, not met.

    With the loop's thread taking runs of its own when woken while another thread holds the interpreter
    (``MeshSim2.loop_thread_runs``) and the loop's stalls drawn per unit of core time
    (``Costs.stall_per_cpu_s``; sim23c, bench/RESULTS.md): the writer keeps its three links in seven
    draws of eight (its DELTA2s 133.5 a bulk, the daemons' 133.1); DELTA2 0.790 (+9.1 %: met), HAVE2
    0.0314 (+9.9 %: met), the nodes' CPU 32.8 us (-1.9 %), the writer's 4.89 (+0.3 %), its transaction
    6.59 ms (-6.5 %); not met: ACK2 0.384 (+20 %), the bulk 1.06 s (-16 %), the writer's held work
    before its COMMIT 3.58 ms (the daemons' means 2.0-3.3; draw 6, whose writer feeds one link, 1.9) and
    draw 6's transaction 3.9 ms (the daemons' 5.6-10 a run). Pinned, not met.

    Re-pinned on eight runs of this tree's daemons (main 5ff9f90; sim24, bench/RESULTS.md): DELTA2 0.656
    (0.523-0.763, median 0.651), ACK2 0.308 (0.243-0.360), HAVE2 0.0243 (0.017-0.034), all held after 1.18 s
    (0.70-1.78, median 1.04), the nodes' CPU 29.0 us a record (25.7-32.6), the writer's 4.26 (3.47-5.24),
    its transaction 5.49 ms (4.2-6.5). At the same DELTA2s the daemons take 3.4 us a record less than
    sim23's (a92aa6b) since relay23 and gc23, and their writer offers faster (50 calls in 0.40-0.72 s, was
    0.50-1.02), so the simulator's costs, measured on the older daemons, are over: the nodes' CPU +13 %,
    the writer's +15 %, its transaction +20 %, DELTA2 +20 %, ACK2 +25 %, HAVE2 +29 %; the bulk's time
    -9.8 % (met). Pinned, not met: the costs want measuring again on this tree.

    With the costs measured again on that tree (``bench_sim_costs.py``: the received byte 3.84 ns, was
    6.28; the signature check 45 us, was 91) and the interpreter's hand-off as a short run of the wakee
    on its waker's core (``MeshSim2.hand_offs``, ``Box.hand_off``: sim24's sched_switch measurements, the
    chance by waker and wakee, the burst and the waker's wait; sim24b, bench/RESULTS.md): the nodes' CPU
    29.3 us a record (+1.1 %), the writer's 4.42 (+3.7 %), its transaction 5.99 ms (+9.1 %), HAVE2 0.0229
    (-5.9 %): met; the writer's held work before its COMMIT 3.12 ms (the daemons' means 2.0-3.3); not met:
    DELTA2 0.901 (+37 %), ACK2 0.454 (+48 %), the bulk 0.94 s (-20 %). The simulated nodes take 98 such
    hand-offs a bulk (the daemons' ~300, ~215 of them short) and their relays, as cheap as the daemons',
    still commit a chunk a transaction (296 transactions, the daemons' 184). Pinned, not met.

    With a woken thread taking another node's running thread's core with the chance measured for that
    thread's role (``MeshSim2.wake_preempts``, ``Box.preempt``: sim24's sched_switch records, a storage
    thread 0.39, a loop 0.27, a reader 0.33; sim25, bench/RESULTS.md, whose probe found the daemons'
    relays' transactions 77-79 % run-queue wait, their storage thread losing its core 4.1-4.4 times before
    its COMMIT, the simulated 0.8, now 1.65): DELTA2 0.876 (+34 %), ACK2 0.451 (+47 %), the bulk 0.97 s
    (-17 %): not met; HAVE2 0.0254 (+4.4 %), the nodes' CPU 28.8 us (-0.9 %), the writer's 4.48 (+5.2 %),
    its transaction 5.40 ms (-1.6 %): met; ~530 such takes a bulk.

    Re-pinned on sixteen runs of main 6336607's daemons (sim25, bench/RESULTS.md; two holds of eight):
    DELTA2 0.750 (0.623-0.891, a run's standard error 3.2 %), ACK2 0.331 (0.217-0.494), HAVE2 0.0293
    (0.020-0.037), all held after 1.24 s (0.89-1.54), the nodes' CPU 31.1 us a record, the writer's 4.64,
    its transaction 7.17 ms (4.0-10.0). Met: the nodes' CPU (-7.5 %), the writer's (-3.4 %); not met:
    DELTA2 +17 %, ACK2 +36 %, HAVE2 -13 %, the bulk's time -21 %, the writer's transaction -25 %.

    With a transaction's seconds ending where the daemon's do, once the COMMIT returned holding the
    interpreter again (sim26, bench/RESULTS.md): the writer's transaction 5.48 ms (-24 %), 0.08 ms more;
    nothing else moves. (``fsync_waits``, off, is sim26's: see its test.)

    A first copy on a link just pruned grafts it back (prune26): draw 2's node 3, cut off from the eager
    tree by the warm-up's empty delta (its HAVE2s and grafts 0.043 a record, 1.17 s), is no longer, so
    HAVE2 0.0225 (-23 %), DELTA2 +17.5 %, ACK2 +38 %, the bulk -24 %, the writer's transaction -24 %.

    Re-pinned on 12 runs (two holds) of main c23de9f's daemons (note26's relays; sim27, bench/RESULTS.md):
    DELTA2 0.885, ACK2 0.503, HAVE2 0.0233, all held after 0.88 s, the nodes' CPU 28.7 us a record, the
    writer's 4.76, its transaction 8.67 ms (1.73 ms before its COMMIT). With the COMMIT's sleeps the
    daemons' drawn fsync sleep and run-queue wait (``fsync_waits``, sim26's, now on) and no loop stall
    while other threads fill the box (``stalls_on_full_box`` off: the box's run queue models that
    deschedule):
    DELTA2 +5.9 %, ACK2 -3.6 %, HAVE2 -14.3 %, the bulk -7.3 %, the nodes' CPU +0.6 %, the writer's
    -7.5 %, its transaction +5.4 %; the writer's held work before its COMMIT 2.52 ms (the daemons' 1.73:
    not met)."""
    figures: list[tuple[float, float, float, float, float, float, float, float]] = []
    hand_offs = preempted = 0
    for draw in range(8):
        sim = MeshSim2(8, draws=draw)
        warm_up(sim)
        writer = sim.node2(0)
        cpu, commits, took = writer.cpu_work, writer.commits, writer.commit_seconds
        before_commit = writer.pre_commit_seconds
        every = sum(node.cpu_work for node in sim.nodes)
        handed, taken = sim.box.hand_offs, sim.box.wake_preemptions
        part = bulk(sim, 50_000, 100)
        hand_offs += sim.box.hand_offs - handed
        preempted += sim.box.wake_preemptions - taken
        per_txn = (writer.commit_seconds - took) / (writer.commits - commits)
        pre_commit = (writer.pre_commit_seconds - before_commit) / (writer.commits - commits)
        cpu_per_record = (writer.cpu_work - cpu) / 50_000
        all_per_record = (sum(node.cpu_work for node in sim.nodes) - every) / 50_000
        counts = (part.per_record("delta2") * 1000, part.per_record("ack2") * 1000)
        haves = part.per_record("have2") * 1000
        figures.append((*counts, cpu_per_record, per_txn, part.elapsed, all_per_record, haves, pre_commit))
    deltas, acks, writer_cpu, txn, elapsed, every_node, have2s, pre = (
        sum(f[i] for f in figures) / len(figures) for i in range(8)
    )
    # the daemons: the means of 12 runs of c23de9f (sim27's holds 2, 3); the costs: 5ff9f90's (sim24b)
    assert abs(every_node / 2.8733e-05 - 1) <= 0.1, figures  # met: +0.6 %
    assert abs(deltas / 0.8855 - 1) <= 0.1, figures  # met: +5.9 %
    assert abs(acks / 0.5033 - 1) <= 0.1, figures  # met: -3.6 %
    assert 0.81 < have2s / 0.02333 <= 0.91, figures  # not met: -14.3 % (a bulk past ~1.1 s: two rounds)
    assert abs(elapsed / 0.8767 - 1) <= 0.1, figures  # met: -7.3 %
    assert abs(writer_cpu / 4.757e-06 - 1) <= 0.1, figures  # met: -7.5 %
    assert abs(txn / 0.008666667 - 1) <= 0.1, figures  # met: +5.4 %
    assert 0.0022 < pre <= 0.0029, figures  # before its COMMIT 2.52 ms: the daemons' 1.73 ms (not met)
    assert 90 * 8 <= hand_offs <= 140 * 8, hand_offs  # 113 a bulk
    assert 350 * 8 <= preempted <= 550 * 8, preempted  # wake-up preemptions, 440 a bulk
    for _, _, cpu_per_record, per_txn, _, _, _, _ in figures:
        assert 0.0000035 <= cpu_per_record <= 0.0000066, figures
        assert 0.0035 <= per_txn <= 0.011, figures  # the daemons' 5.6-10 ms; draw 6's writer (one link) 3.9


def test_reads_take_one_of_the_daemons_two_reader_connections() -> None:
    """``bridge.read`` holds one of ``Engine.open``'s ``read_connections`` (2) per read: the writer's
    third link finds none free and waits for a read to end (then behind the loop's ready tasks)."""
    assert READ_CONNECTIONS == 2
    sim = MeshSim2(8, draws=0)
    warm_up(sim)
    sim.run_for(1.0)
    node = sim.node2(0)
    state = node.durable2[sim.key]
    out = outgoing(state, None, 4096, sim.max_bytes)
    for peer in node.sessions:
        sim._read2_then(0, peer, sim.key, out)
    assert len(node.sessions) == 3
    assert node.readers == 2 and len(node.read_queue) == 1
    assert node.reading == set(node.sessions)


def test_links_asking_for_the_same_rows_at_once_share_one_read() -> None:
    """``EngineCore2Host._read2`` through ``SharedReads`` (reads22): the writer's three links asking for
    the same rows of the same value at once issue one read, on one connection; the others await it and
    each gets the answer once that read's asker ran again. A different request, or the same one after
    the read ended, reads (nothing is cached)."""
    sim = MeshSim2(8, draws=0)
    warm_up(sim)
    sim.run_for(1.0)
    node = sim.node2(0)
    state = node.durable2[sim.key]
    out = outgoing(state, None, 4096, sim.max_bytes)
    provided: list[tuple[int, float]] = []
    for peer in list(node.sessions):
        stub = SimpleNamespace(provide_delta=lambda key, delta, p=peer: provided.append((p, sim.now)))
        node.sessions[peer] = SimpleNamespace(core2=stub)  # type: ignore[assignment]
    sim._run_driver = lambda y, x: None  # type: ignore[method-assign]
    first, *others = node.sessions
    issued, shared = node.reads_issued, node.reads_shared
    for peer in node.sessions:
        sim._read2_then(0, peer, sim.key, out, (state, None, 4096))
    assert node.readers == 1 and not node.read_queue  # one connection for the three asks
    assert node.reads_issued - issued == 1
    sim.run_for(0.1)
    assert node.reads_shared - shared == 2 and node.readers == 0 and not node.shared_reads
    assert [p for p, _ in provided] == [first, *others]  # the read's asker first, then its waiters
    assert not node.reading
    sim._read2_then(0, first, sim.key, out, (state, None, 4096))  # the read ended: this one reads
    sim._read2_then(0, others[0], sim.key, out, (state, None, 2048))  # another request: its own read
    assert node.reads_issued - issued == 3 and node.readers == 2


def test_a_thread_waits_for_the_loops_ready_tasks_at_most_a_switch_interval() -> None:
    """A reader or the storage thread wanting the interpreter while the event loop has tasks ready gets
    it once they ran, or after the daemon's switch interval before those not begun yet; the simulator
    gave it at once, ahead of them (the writer's next API call waited behind all of its links' reads)."""

    def order(steps: int) -> list[str]:
        costs = Costs(jitter=0.0, cores=None, wake=0.0, stall_chance=0.0)
        sim = MeshSim2(2, costs=costs)
        sim.run_for(1.0)
        node = sim.node2(1)
        ran: list[str] = []
        task = SWITCH_INTERVAL_S * 0.4
        for i in range(steps):  # loop tasks of 0.4 switch intervals each, ready now
            sim._wake(1, ("task", i), lambda i=i: (ran.append(f"loop {i}"), sim._busy(node, task)))
        sim._interpreter(1, "reader", lambda: ran.append("reader"))
        sim.run_for(0.1)
        return ran

    assert order(0) == ["reader"]
    assert order(2) == ["loop 0", "loop 1", "reader"]
    assert order(5) == ["loop 0", "loop 1", "loop 2", "reader", "loop 3", "loop 4"]


def test_the_storage_thread_takes_what_waits_once_it_holds_the_interpreter() -> None:
    """``Writer._collect`` drains the queue running Python: a job handed over while the storage thread
    waits for the interpreter goes into the same transaction (the simulator took the first alone)."""
    costs = Costs(jitter=0.0, cores=None, wake=0.0, stall_chance=0.0)
    sim = MeshSim2(2, costs=costs, group_linger=0.0)
    sim.run_for(1.0)
    node = sim.node2(1)
    commits = node.commits
    sim._wake(1, ("task", 0), lambda: sim._busy(node, 0.001))
    sim._store(1, _Job2(1, lambda: None, lambda: None, origin=0))
    sim._store(1, _Job2(1, lambda: None, lambda: None, origin=0))
    sim.run_for(0.1)
    assert node.commits - commits == 1


#: What the host told each recording link, in order: (the link's id, (the call, the summary)).
TOLD: list[tuple[int, tuple[str, Summary2 | None]]] = []


class _Recording(Core2Link):
    """A core-2 link that logs what its host tells it."""

    def local_update(self, key: Any, summary: Summary2) -> None:
        TOLD.append((id(self), ("local_update", summary)))
        super().local_update(key, summary)

    def delta_applied(self, seq: int, summary: Summary2 | None, changed: bool) -> None:
        TOLD.append((id(self), ("delta_applied", summary)))
        super().delta_applied(seq, summary, changed)


def test_core2_sim_tells_a_merge_to_the_link_it_came_from_before_its_ack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon's store change hook tells every link of a committed change (``Gossip.local_change2``
    without a source), the link the delta came from included, before that delta's ACK2. The in-memory
    core-2 nodes skipped that link and told the others after the ACK2."""
    monkeypatch.setattr(core2_sim, "Core2Link", _Recording)
    TOLD.clear()
    net = Core2Network(features=frozenset({HEADS_V2}))
    for n in range(3):
        net.add(n)
    net.connect(0, 1)
    net.connect(1, 2)
    state = queue2.commit(queue2.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, records=[Record(b"x")])
    net.node2(0).put2(state)
    net.run_until_quiet()
    assert net.node2(2).states2[(OWNER.public_key, "q", 0)] == state
    source = net.nodes[1].sessions[0].core2
    merged = link_summary(net.node2(1).states2[(OWNER.public_key, "q", 0)])
    told = [what for link, what in TOLD if link == id(source)]
    assert told.index(("local_update", merged)) < told.index(("delta_applied", merged)), told


def test_stalls_make_relays_send_the_pushes_they_missed_together_as_the_daemons_do() -> None:
    """bench_mesh --sizes 8 --core 2 at 100/s, three runs of 2026-11-30 (bench/RESULTS.md, "bulk at N = 8
    against the daemons", load 1.4-1.9): 0.998, 0.999, 0.999 DELTA2s and 0.196, 0.199, 0.200 ACK2s per
    record per replica (a relay's pushes of one commit acked by one run): a relay whose event loop is held
    up (the process descheduled, a collection) passes the pushes that came meanwhile on as one. Without
    stalls the simulated relays never missed a turn (p99 9 ms); with :data:`CORE2_COSTS`' within 10 % of
    the daemons' means, and a tail of tens of ms (the stalls were fitted at load 3: 37-81 ms then).

    One draw was a knife's edge (the seed's: 0.970 / 0.201 before the box's run-queue waits, 0.903 /
    0.178 and a p99 of 0.80 s after, its far node fed by a HAVE2 after the linger), so the references
    are draws 0-7, measured with the waits (sim20, bench/RESULTS.md): DELTA2 0.908-0.985, mean 0.960
    (-3.9 %, met); ACK2 0.196-0.310, median 0.205 (+3.4 %), mean 0.222 (+12 %, not met: draws 3 and 7,
    0.310 and 0.250, acknowledge on more eager links); p99 21-35 ms but two draws (1 seed run) at 0.80 s
    (the linger).

    Since the commit's callback waits on the loop behind the storage thread's next batch (sim20b): DELTA2
    0.804-0.983, mean 0.918 (-8.1 %, met); ACK2 0.150-0.208, median 0.201 (+1.5 %), mean 0.192 (-2.9 %,
    met); p99 24-31 ms in four draws, 0.80 s (the linger) in four (not met: the daemons' tail is tens of
    ms).

    On a box whose threads keep their core for a burst (sim21b): DELTA2 0.900-0.982, mean 0.965 (-3.5 %,
    met); ACK2 0.200-0.315, median 0.204-0.207 (met), mean 0.225 (+13 %, not met: draws 0 and 3, 0.259
    and 0.315, acknowledge on more eager links); p99 20-38 ms in seven draws, 0.78 s (the linger) in
    one.

    With the COMMIT's CPU on the box in its runs and only its fsync's sleep off it, and a thread waiting
    for the interpreter asking only once it has run twice (sim21c): DELTA2 0.649-0.993, mean 0.901 (-9.8 %,
    met by 0.2 %); ACK2 0.101-0.262, median 0.205 (met), mean 0.195 (-1.8 %, met); p99 20-36 ms in four
    draws, 0.79-0.81 s (the linger) in four (not met: was one).

    With the writer's measured storage CPU and the interpreter's waiters asking as any waiter asks
    (sim22): DELTA2 0.679-1.000, mean 0.894 (-10.5 %, not met by 0.5 %: draws 5 and 7, 0.68 and 0.71,
    settle on eager links); ACK2 0.112-0.209, median 0.1995 (met), mean 0.180 (-9.2 %, met); p99 21-36
    ms in five draws, 0.79-0.80 s (the linger) in three.

    With a waiter's two runs waiting as the box's runs have waited (sim22b): DELTA2 0.830-0.989, mean
    0.945 (-5.4 %, met); ACK2 0.150-0.210, median 0.2045 (met), mean 0.196 (-1.2 %, met); p99 23-41 ms in
    six draws, 0.79-0.80 s (the linger) in two.

    With links asking for the same rows at once sharing one read (sim23, bench/RESULTS.md; reads22's
    ``SharedReads``): DELTA2 0.793-0.982, mean 0.924 (-7.5 %, met); ACK2 0.149-0.313, median 0.2067
    (met), mean 0.212 (+7.2 %, met); p99 23-37 ms in five draws, 0.79-0.80 s (the linger) in three."""
    delta2, ack2, p99 = [], [], []
    for draw in range(8):
        sim = MeshSim2(8, draws=draw)
        warm_up(sim)
        part = live(sim, 100, 150)
        delta2.append(part.per_record("delta2"))
        ack2.append(part.per_record("ack2"))
        p99.append(sorted(part.last_latency)[148])
    assert abs(sum(delta2) / 8 / 0.999 - 1) <= 0.1, delta2  # met: -7.5 %
    assert all(abs(a / 0.198 - 1) <= 0.1 for a in sorted(ack2)[3:5]), ack2  # the median's two: met
    assert abs(sum(ack2) / 8 / 0.198 - 1) <= 0.1, ack2  # the mean: met, +7.2 %
    assert sum(0.015 < p < 0.1 for p in p99) >= 5 and max(p99) < 1.0, p99  # three at the linger


def test_a_nodes_storage_and_reader_threads_hold_its_interpreter() -> None:
    """A daemon's storage thread and readers run Python under the interpreter lock its event loop needs:
    while a commit does its records' work, the node's one interpreter is taken (its loop's work goes
    between the storage thread's slices, never beside them). The simulator gave each its own core, so a
    relay of a bulk never fell behind its sender (more DELTA2s and ACK2s than the daemons'). The writer's
    part that releases it (``WRITER_GIL_FREE``: py-spy --native, bench/RESULTS.md sim20c) comes in
    releases between its held slices; with nobody waiting, the thread takes it back at once."""

    def interpreter_taken(gil: bool) -> list[tuple[bool, bool]]:
        costs = Costs(commit_record=0.001, jitter=0.0, cores=None, wake=0.0, stall_chance=0.0)
        sim = MeshSim2(2, costs=costs, gil=gil)
        warm_up(sim)
        sim.run_for(1.0)
        sim.offer(100, 100)  # 0.1 s of the storage thread's work
        taken = []
        for _ in range(9):  # every 10 ms while it works: (the interpreter taken, the storage thread busy)
            sim.run_for(0.01)
            taken.append((sim.nodes[0].cpu.busy, sim.nodes[0].disk_cpu.busy))
        return taken

    with_gil = interpreter_taken(True)
    assert all(cpu and not disk for cpu, disk in with_gil), with_gil
    assert not any(cpu for cpu, _ in interpreter_taken(False))


def test_recent_rows_as_the_daemons_note_them() -> None:
    """A merge's rows noted as ``RecentRows.note`` notes them, its arithmetic included: a merge of more
    than ``RECENT_RECORDS`` after another moves the run's start past its rows (``matches`` then refuses
    it), so the daemons' relays read every chunk of a bulk (measured, bench/RESULTS.md); live records
    extend one run, cut from memory."""
    real, node = RecentRows(), MeshNode2(1)
    key = (OWNER.public_key, "q", 0)
    for lo, hi in ((0, 1), (1, 1001), (1001, 2001), (2001, 2002), (2002, 2003), (2003, 3003), (3003, 3004)):
        real.note(7, _Rows(hi), hi - lo)  # type: ignore[arg-type]
        MeshSim2._note_recent(node, key, lo, hi)
        run, modelled = real._runs[7], node.recent[key]
        assert (run.lo, run.hi, run.records[0]) == (modelled.lo, modelled.hi, modelled.rows_lo), (lo, hi)

    def covers(held_end: int, since_end: int) -> bool:
        return MeshSim2._recent_covers(node, key, _Rows(held_end), since_end)  # type: ignore[arg-type]

    node.recent[key] = _Recent(1001, 1000, 1001)  # one chunk merged after a run that ended elsewhere
    assert not covers(2001, 1001)  # the chain at 1001 is row 1000's: not in memory, a read
    node.recent[key] = _Recent(1937, 1000, 1001)  # a chunk merged right after another: lo moved past
    assert not covers(2001, 1001) and not covers(2001, 1937)
    node.recent[key] = _Recent(2001, 3, 2001)  # live records after a chunk
    assert covers(2004, 2002) and covers(2004, 2003) and not covers(2004, 2001)


class _Rows:
    """What ``RecentRows.note`` reads of a value holding rows ``[0, hi)``: row i's record is i."""

    def __init__(self, hi: int) -> None:
        self.held = (0, hi)
        self.entries = self

    def records(self, lo: int, hi: int) -> list[int]:
        return list(range(lo, hi))

    def chain(self, index: int) -> bytes:
        return b"%d" % index

    def chain_at(self, offset: int) -> bytes:
        return b"%d" % (offset - 1)


def test_a_batch_waits_for_as_many_writers_as_the_last_ones_held() -> None:
    """``storage/writer.py`` ``_collect``: once a transaction held two peers' merges, a batch of one
    peer's within ``_RECENT_S`` waits up to ``group_commit_ms`` (2 ms) for another's; the simulated
    storage thread committed it at once, and its relays of a bulk acknowledged more runs than the
    daemons' (bench/RESULTS.md, "bulk at N = 8 against the daemons")."""

    def began_after(linger: float) -> float:
        costs = Costs(jitter=0.0, cores=None, wake=0.0, commit_record=0.0, commit=0.001)
        sim = MeshSim2(2, costs=costs, group_linger=linger)
        sim.run_for(1.0)
        done: list[float] = []

        def job(origin: int) -> _Job2:
            return _Job2(1, lambda: None, lambda: done.append(sim.now), origin=origin)

        sim._store(1, job(0))  # committing: the next two wait, then go in one transaction
        sim._store(1, job(0))
        sim._store(1, job(5))
        sim.run_for(0.01)
        assert len(done) == 3
        stored = sim.now
        sim._store(1, job(0))
        sim.run_for(0.01)
        return done[-1] - stored - costs.commit

    assert began_after(GROUP_COMMIT_S) >= GROUP_COMMIT_S - 1e-9 and GROUP_COMMIT_S == 0.002
    assert began_after(0.0) <= 0.0001


def test_a_bulks_have2s_are_its_lazy_links_announcing_once_a_linger() -> None:
    """What the daemons do in bench_mesh's bulk (each daemon's sent messages logged per link, two runs;
    bench/RESULTS.md, "... where a bulk's HAVE2s come from"): the warm-up's record prunes links off its
    spanning tree; during the bulk each pruned pair carries one end's HAVE2 once a HAVE linger (the end
    whose incarnation is higher waits, and the other's word covers what it had to say: its HAVE2s are
    held back), and no link the bulk flows on carries one. So the bulk's HAVE2s are the lazy pairs times
    the lingers with news it lasts, a count that follows the part's time (the daemons: 6-7 pairs a
    linger, 1-3 lingers a run)."""
    sim = MeshSim2(8, draws=0)
    haves: list[tuple[float, int, int]] = []
    send = sim._send

    def spy(x: int, y: int, messages: list[bytes], at: float) -> None:
        haves.extend((at, x, y) for m in messages if counted_name(m) == "have2")
        send(x, y, messages, at)

    warm_up(sim)
    sim.run_for(1.0)
    lazy = {
        frozenset((x, y))
        for x, node in enumerate(sim.nodes)
        for y, session in node.sessions.items()
        if session.core2 is not None and not session.core2._links[sim.key].eager
    }
    sim._send = spy  # type: ignore[method-assign]
    part = bulk(sim, 50_000, 100)
    start = sim.now - part.elapsed
    during = [(at - start, x, y) for at, x, y in haves if start <= at <= sim.now]
    links = {(x, y) for _, x, y in during}
    assert len(lazy) >= 5, lazy
    assert all(frozenset(link) in lazy for link in links), (links, lazy)  # none where the bulk flows
    assert len({frozenset(link) for link in links}) == len(links)  # one end of a pair announces
    for x, y in links:
        assert sim.nodes[x].sessions[y].incarnation < sim.nodes[y].sessions[x].incarnation  # x: not waiting
        times = sorted(t for t, a, b in during if (a, b) == (x, y))
        assert all(b - a >= HAVE_LINGER_S * 0.9 for a, b in itertools.pairwise(times)), times
        assert len(times) <= part.elapsed // HAVE_LINGER_S + 1, times
    assert len(during) >= len(links) * (part.elapsed // HAVE_LINGER_S - 1)
    assert round(part.per_record("have2") * 7 * 50_000) == len(during)  # sent within the part, all received


def test_the_storage_thread_takes_its_next_batch_at_its_commit_and_the_loop_runs_the_callback() -> None:
    """``Writer._main``: the COMMIT returns, ``process`` hands the completion to the loop
    (``run_sync_soon``) and the thread takes its next batch at once, holding the interpreter; so the
    loop's callback waits for its work. The daemons' relays took their next batch 0.05 ms after the
    COMMIT and ran the callback 4.0-6.2 ms after it (sim19b's traces, bench/RESULTS.md sim20b); the
    simulated relays ran the callback first (1.0-1.25 ms) and began the next batch only then. The loop
    then takes the interpreter as CPython hands it over: after asking, a switch interval on."""
    costs = Costs(jitter=0.0, cores=2, wake=0.0, stall_chance=0.0, commit=0.001, commit_record=0.0)
    sim = MeshSim2(2, costs=costs, group_linger=0.0)
    sim.run_for(1.0)
    node = sim.node2(1)
    done: list[float] = []
    work = 2 * SWITCH_INTERVAL_S  # each transaction's CPU: two slices

    def job() -> _Job2:
        return _Job2(1, lambda: None, lambda: done.append(sim.now), cpu=work, origin=0)

    start = sim.now
    sim._store(1, job())
    sim._at(start + 0.0001, lambda: sim._store(1, job()))  # waits for the first's commit
    sim.run_for(0.1)
    durable = start + work + costs.commit
    assert node.commits == 2 and len(done) == 2
    assert node.commit_seconds == pytest.approx(2 * (work + costs.commit))  # the second began at once
    # the loop, woken at the COMMIT, asks for the interpreter a switch interval later: in the middle of
    # the second's work, not after it
    assert done[0] == pytest.approx(durable + SWITCH_INTERVAL_S)
    assert node.storage_hand_offs == 1
    assert done[1] == pytest.approx(durable + work + costs.commit)  # the loop idle: at its COMMIT


def _sliced_costs(**costs: float) -> Costs:
    """Two cores whose runs end at 1.5 ms slices, no jitter, wake-up or stall: so a test's timings are
    its own ``costs`` and the box's slices alone."""
    return dataclasses.replace(
        Costs(jitter=0.0, cores=2, wake=0.0, stall_chance=0.0, core_slice=0.0015), **costs
    )


def _pauses_of_busy_steps(sim: MeshSim2, node: MeshNode2, step: float, steps: int = 2000) -> int:
    """How many of ``steps`` loop steps of ``step`` s on ``node`` the box pauses (a drawn stall each)."""
    paused = [0]
    pause = sim.box.pause

    def counted(thread: CpuThread, seconds: float) -> None:
        paused[0] += thread is node.cpu
        pause(thread, seconds)

    sim.box.pause = counted  # type: ignore[method-assign]
    for _ in range(steps):
        sim._busy(node, step)
    return paused[0]


def _keep_both_cores_busy(sim: MeshSim2) -> None:
    """Two threads of another process keep both of ``sim``'s cores 50 ms: what the node asks for next
    waits in the run queue for a slice's end."""
    for _ in range(2):
        sim.box.work(CpuThread(), 0.05)


def test_the_commits_cpu_runs_on_the_box_in_its_runs_and_its_fsync_off_it() -> None:
    """The daemons' storage threads run 3 times inside a COMMIT (median; 0.42 ms of CPU for the writer's
    1,000 records, 0.21-0.24 ms for a live record's), and the rest of its wall is run-queue wait and the
    fsync's sleep (bench/RESULTS.md sim21c): so the COMMIT's CPU is a burst in the run it began in and
    one in each of ``commit_runs`` runs after a sleep, on the storage thread's own core, counted in the
    node's CPU. On an idle box the transaction takes its work, the COMMIT's CPU and its sleeps; with both
    cores busy its runs wait in the run queue for the others' slices to end, as the daemons' did (the
    first, before its work, outside the transaction's time, as the daemons count it)."""
    costs = _sliced_costs(commit=0.0003, commit_record=0.0, commit_cpu=0.0004, commit_runs=3)
    took: list[float] = []
    queued: list[float] = []
    for busy in (False, True):
        sim = MeshSim2(2, costs=costs, group_linger=0.0, fsync_waits=False)  # the modelled sleeps
        sim.run_for(1.0)
        node = sim.node2(1)
        if busy:
            _keep_both_cores_busy(sim)
        cpu, runs, waited = node.cpu_work, sim.box.runs, sim.box.waited
        start = sim.now
        sim._store(1, _Job2(1, lambda: None, lambda: None, cpu=0.001, origin=0))
        sim.run_for(0.1)
        assert node.commits == 1
        assert node.cpu_work - cpu == pytest.approx(0.001 + 0.0004)
        took.append(node.commit_seconds)
        if not busy:
            assert node.commit_seconds == pytest.approx(0.001 + 0.0004 + 0.0003)
            assert sim.box.waited == pytest.approx(waited)
        else:
            assert sim.box.runs - runs >= 4  # its work's run and the COMMIT's three
            queued.append(sim.box.waited - waited)
        assert start < sim.now
    # the busy box adds run-queue waits (its threads' and the two others'): its wait for a core before
    # its work is not the transaction's (the daemons' commit seconds count from ``Writer._attempt``, its
    # thread running; sim22), a slice's end inside its COMMIT's runs is
    assert took[1] - took[0] == pytest.approx(0.0015), took
    assert queued[0] > took[1] - took[0]


def test_with_fsync_waits_the_commits_sleeps_are_the_daemons_drawn_fsync_and_run_queue_wait() -> None:
    """``fsync_waits``: each of the COMMIT's ``commit_runs`` sleeps is a drawn fsync sleep and the drawn
    run-queue wait after it (the daemons' storage threads' ``D`` sleeps, bench/RESULTS.md sim26), off the
    box, in place of ``commit`` / ``sync_record`` and the box's wake-up: on an idle box the transaction
    takes its work, the COMMIT's CPU and three such draws (each within the ventiles' bounds, their sum
    not the modelled sleep), and its runs after them take no wake-up of the box's. Off, as before."""
    costs = _sliced_costs(commit=0.0003, commit_record=0.0, commit_cpu=0.0004, commit_runs=3)
    lo = min(FSYNC_SLEEP_US) + min(FSYNC_WAIT_US)
    hi = max(FSYNC_SLEEP_US) + max(FSYNC_WAIT_US)
    took: dict[bool, list[float]] = {}
    for waits in (False, True):
        took[waits] = []
        for draws in range(6):
            sim = MeshSim2(2, costs=costs, group_linger=0.0, fsync_waits=waits, draws=draws)
            sim.run_for(1.0)
            node = sim.node2(1)
            wakes = sim.box.wakes
            sim._store(1, _Job2(1, lambda: None, lambda: None, cpu=0.001, origin=0))
            sim.run_for(0.1)
            assert node.commits == 1
            took[waits].append(node.commit_seconds)
            if waits:
                assert sim.box.wakes - wakes <= 1  # the hand-over's, none of the COMMIT's three
            else:
                assert sim.box.wakes - wakes >= 3
    assert took[False] == pytest.approx([0.001 + 0.0004 + 0.0003] * 6)
    for seconds in took[True]:
        slept = seconds - 0.001 - 0.0004
        assert 3 * lo * 1e-6 - 1e-9 <= slept <= 3 * hi * 1e-6 + 1e-9
    assert len(set(took[True])) > 1  # drawn per draw, not one figure
    assert max(took[True]) > 0.001 + 0.0004 + 0.0003  # the tail's waits: longer than the modelled sleep


def _sliced_pair() -> MeshSim2:
    """Two nodes a second in, on two cores whose runs end at 1.5 ms slices (no jitter, wake-up or
    stall): the box the interpreter-asking tests below share."""
    sim = MeshSim2(2, costs=_sliced_costs())
    sim.run_for(1.0)
    return sim


def test_a_thread_waiting_for_the_interpreter_asks_for_it_once_it_has_run_twice() -> None:
    """``take_gil``: a thread wanting the interpreter must run to begin its timed wait (a switch interval)
    and run again at its timeout to ask the holder to drop it. On an idle box it asks a switch interval
    after it was woken; with both cores busy for a slice, each of its two runs waits in the run queue
    first (the daemons' writer's readers waited for a core and did not cut its held work, bench/RESULTS.md
    sim21c)."""
    sim = _sliced_pair()
    assert sim._asks_at() == pytest.approx(sim.now + SWITCH_INTERVAL_S)
    for _ in range(2):
        sim.box.work(CpuThread(), 0.05)
    wait = sim.box.wait_now()
    assert wait == pytest.approx(0.0015)  # until a slice ends
    assert sim._asks_at() == pytest.approx(sim.now + 2 * wait + SWITCH_INTERVAL_S)


def test_a_loop_woken_while_the_storage_thread_holds_the_interpreter_runs_to_find_it_held() -> None:
    """The daemon's loop thread, woken from epoll while its storage thread holds the interpreter, is a run
    of its own on the box (it blocks in ``take_gil``), and another at its timeout if the interpreter is
    held still (it asks); a task woken while one waits already is not a wake-up from epoll (bench/RESULTS.md
    sim23c: the daemons' leaf relays' loops ran 1.1 times a chunk to find it held). Without
    ``loop_thread_runs`` the wait was a wait only."""

    def waits(runs: bool) -> tuple[int, int, int]:
        sim = _sliced_pair()
        sim.loop_thread_runs = runs
        node = sim.node2(1)
        sim._storage_work(1, 0.01, lambda: None)  # 10 ms held, nothing released
        before = sim.box.runs
        sim._wake(1, ("read", 0), lambda: None)
        sim._wake(1, ("drive", 0), lambda: None)  # the loop waits for the interpreter already
        at_once = node.loop_thread_waits
        sim.run_for(0.1)
        return at_once, node.loop_thread_waits, sim.box.runs - before

    assert waits(True)[:2] == (1, 2)
    assert waits(False)[:2] == (0, 0)
    assert waits(True)[2] == waits(False)[2] + 2  # two runs more on the box


class _HandDraws:
    """The hand-off's draws: every uniform ``u``, every pick the last (the longest burst and wait)."""

    def __init__(self, u: float) -> None:
        self.u, self.calls = u, 0

    def random(self) -> float:
        self.calls += 1
        return self.u

    def choice(self, seq: Sequence[float]) -> float:
        return seq[-1]


def test_a_thread_its_nodes_loop_wakes_on_a_full_box_may_take_the_loops_core_for_a_burst() -> None:
    """sim24's sched_switch records (bench/RESULTS.md sim24, sim24b): a daemon's loop waking its storage
    thread with the other core busy lost its core to it 27 % of the times, the taker mostly running a
    burst of ~10-20 us and blocking on the interpreter the loop holds, the loop back on a core after a
    measured wait. So the node's thread gives its core to the burst and resumes its work after the
    wait; no take (and no draw) with a core free or in another role; none on a miss."""

    def run(u: float, busy: bool = True, role: str = "loop") -> tuple[float, int, float, int]:
        sim = _sliced_pair()
        node = sim.node2(1)
        draws = _HandDraws(u)
        sim._hand_rng = draws  # type: ignore[assignment]
        if busy:
            sim.box.work(CpuThread(), 0.05)
        sim._busy(node, 0.001)
        ends: list[float] = []
        sim.box.then(node.cpu, lambda: ends.append(sim.now))
        start, cpu = sim.now, node.cpu_work
        sim._hand_off(1, role, "storage" if role == "loop" else "loop")
        sim.run_for(0.1)
        return ends[0] - start, node.hand_offs, node.cpu_work - cpu, draws.calls

    back, burst = HAND_OFF_BACK_US[-1] * 1e-6, HAND_OFF_BURST_US[-1] * 1e-6
    took = run(0.0)
    assert took[0] == pytest.approx(0.001 + back) and took[1:] == (1, pytest.approx(burst), 1)
    assert run(HAND_OFF_CHANCE[("loop", "storage")])[:2] == (pytest.approx(0.001), 0)  # a miss
    assert run(0.0, busy=False) == (pytest.approx(0.001), 0, 0.0, 0)  # a core free: no take
    assert run(0.0, role="storage") == (pytest.approx(0.001), 0, 0.0, 0)  # the loop is not the storage
    assert 0.15 < HAND_OFF_CHANCE[("loop", "storage")] < 0.25 and HAND_OFF_CHANCE[("loop", "reader")] < 0.2


def test_the_loop_a_commit_wakes_may_take_the_storage_threads_core_and_wait_for_it_back() -> None:
    """sim24's records (bench/RESULTS.md sim24b): a daemon's storage thread waking its loop with the other
    core busy (the COMMIT returned, ``run_sync_soon``) lost its core to it 33 % of the times; holding the
    interpreter off the cores, it hands the callback over (and takes its next batch) only once back. So
    a take delays the loop's callback by the waker's wait, and counts the burst in the node's CPU."""

    def callback_at(u: float) -> tuple[float, int, float]:
        costs = _sliced_costs(commit=0.0003, commit_record=0.0, commit_cpu=0.0004, commit_runs=3)
        sim = MeshSim2(2, costs=costs, group_linger=0.0)
        sim.run_for(1.0)
        node = sim.node2(1)
        sim._hand_rng = _HandDraws(u)  # type: ignore[assignment]
        sim.box.work(CpuThread(), 0.05)  # another process's thread keeps one core
        done: list[float] = []
        start, cpu = sim.now, node.cpu_work
        sim._store(1, _Job2(1, lambda: None, lambda: done.append(sim.now), cpu=0.001, origin=0))
        sim.run_for(0.1)
        assert node.commits == 1 and len(done) == 1
        return done[0] - start, node.hand_offs, node.cpu_work - cpu

    missed, taken = callback_at(1.0), callback_at(0.0)
    assert missed[1] == 0 and taken[1] == 1
    assert taken[0] - missed[0] == pytest.approx(HAND_OFF_BACK_US[-1] * 1e-6)
    assert taken[2] - missed[2] == pytest.approx(HAND_OFF_BURST_US[-1] * 1e-6)


def test_a_loop_step_stalls_with_a_chance_per_unit_of_its_core_time() -> None:
    """A process is descheduled per time on a core: with ``stall_per_cpu_s`` a step of 8 us (one of a
    loop pass's sends) stalls ~0.3 % of the time, one of 400 us ~14 %; per step both stalled 1.5 %, so
    the warm-up's stall fell between the writer's sends to its links as often as anywhere (sim23b)."""

    def stalls(step: float, rate: float | None) -> int:
        costs = Costs(jitter=0.0, cores=None, wake=0.0, stall_chance=0.015, stall=0.01, stall_per_cpu_s=rate)
        sim = MeshSim2(2, costs=costs)
        return _pauses_of_busy_steps(sim, sim.node2(1), step)

    assert stalls(0.000008, STALL_PER_CPU_S) < 15  # expected 6
    assert 220 < stalls(0.0004, STALL_PER_CPU_S) < 340  # expected 277
    assert 15 < stalls(0.000008, None) < 50 and 15 < stalls(0.0004, None) < 50  # expected 30 each


def test_with_stalls_on_full_box_off_a_step_stalls_only_where_the_box_has_a_core_for_it() -> None:
    """``stalls_on_full_box`` off: a loop step (and a storage transaction) of a node whose box is filled by
    other threads draws no stall - it waits in the box's run queue, which models its descheduling - and
    stalls as before while a core is free for it (the live parts the stalls were fitted to; sim27). On,
    as before: it stalls either way."""

    def stalls(full: bool, on_full: bool) -> int:
        costs = _sliced_costs(stall_per_cpu_s=STALL_PER_CPU_S, stall=0.01)
        sim = MeshSim2(2, costs=costs, stalls_on_full_box=on_full)
        sim.run_for(1.0)
        node = sim.node2(1)
        if full:
            _keep_both_cores_busy(sim)
        assert sim._box_full_without(node.cpu) is full
        return _pauses_of_busy_steps(sim, node, 0.0004)

    assert 220 < stalls(full=False, on_full=False) < 340  # expected 277, as on
    assert stalls(full=True, on_full=False) == 0
    assert 220 < stalls(full=True, on_full=True) < 340


def test_a_queued_threads_wait_grows_with_the_burst_ahead_of_it_after_it_was_queued() -> None:
    """What :meth:`Box.wait_now` cannot see: a thread running when another is queued gets more work in the
    same run (the loop's next task), so the queued thread waits for the slice's end, not for the work
    that was planned when it was queued (sim22b: at the bulk's wake-ups the queue then read 0.43-0.57 ms,
    the waits were 0.82-1.11 ms)."""
    sim = _sliced_pair()
    box = sim.box
    first, second, queued = CpuThread(), CpuThread(), CpuThread()
    for thread in (first, second):
        box.work(thread, 0.0005)
    box.then(first, lambda: box.work(first, 0.005))  # its next task, in the same run
    box.then(second, lambda: box.work(second, 0.005))
    expected = box.wait_now()
    runs, waited = box.runs, box.waited
    began: list[float] = []
    start = sim.now
    box.work(queued, 0.0001)
    box.then(queued, lambda: began.append(sim.now))
    sim.run_for(0.1)
    assert expected == pytest.approx(0.0005)
    assert began == [pytest.approx(start + 0.0015 + 0.0001)]  # its work, after the slice's end
    assert box.waited - waited >= 0.0015 - 1e-9 and box.runs > runs


def test_a_waiter_asks_after_two_runs_that_wait_as_the_boxs_runs_have() -> None:
    """A thread wanting the interpreter asks once it has run twice, each run after the wait a run has
    had on this box (:meth:`Box.wait_a_run`, schedstat's measure), or the queue's now if longer: so on a
    box whose runs have waited, it does not ask a bare switch interval after it began waiting though no
    thread is queued at this instant (sim22b: with the queue now alone, twice, waiters asked inside the
    writer's held work 2.0-3.2 times a transaction and its reads ended there 0.62 times a transaction,
    the daemons' 0.31)."""
    sim = _sliced_pair()
    box = sim.box
    runs, waited = box.runs, box.waited
    for _ in range(3):  # three threads on two cores: one waits a burst
        box.work(CpuThread(), 0.001)
    sim.run_for(0.1)
    assert box.wait_now() == 0.0 and box.runs == runs + 3
    assert box.waited == pytest.approx(waited + 0.001)
    assert box.wait_a_run() == pytest.approx(box.waited / box.runs) and box.wait_a_run() > 0
    assert sim._asks_at() == pytest.approx(sim.now + 2 * box.wait_a_run() + SWITCH_INTERVAL_S)


def test_a_thread_behind_the_loops_ready_tasks_asks_as_late_as_any_waiter_on_a_full_box() -> None:
    """The storage thread or a reader waiting behind the loop's ready tasks asks for the interpreter as the
    loop asks the storage thread for it (``take_gil``: it runs to begin its timed wait and again at its
    timeout, each run after a wait for a core): with both cores busy, two slices' ends and a switch
    interval after it began waiting, not the switch interval alone (sim22: the storage thread took the
    interpreter ahead of the loop's backlog, which then cut its held work)."""
    sim = _sliced_pair()
    node = sim.node2(1)
    _keep_both_cores_busy(sim)
    for i in range(20):  # the loop's ready tasks, 0.4 switch intervals each
        sim._wake(1, ("task", i), lambda: sim._busy(node, SWITCH_INTERVAL_S * 0.4))
    start = sim.now
    ran: list[float] = []
    sim._interpreter(1, "reader", lambda: ran.append(sim.now))
    sim.run_for(0.1)
    assert ran == [pytest.approx(start + 2 * 0.0015 + SWITCH_INTERVAL_S)]


def test_a_thread_that_took_the_interpreter_at_its_timeout_leaves_the_loop_nothing_to_ask_for() -> None:
    """A storage thread waiting behind the loop's long task takes the interpreter at its switch interval's
    timeout; its wake-up task is then no longer the loop's, so nothing asks it to drop the interpreter:
    its work runs through (sim22: the simulated writer dropped it for that task, a no-op, 0.4-0.7 times
    a transaction, each a hand-off and two run-queue waits; the daemons' writer runs its median
    transaction without a run). Its transaction counts from its work's start, as ``Writer._attempt``
    counts the daemons' commit seconds, not from its wait for the loop."""
    costs = Costs(jitter=0.0, cores=None, wake=0.0, stall_chance=0.0, commit=0.001, commit_record=0.0)
    sim = MeshSim2(2, costs=costs, group_linger=0.0)
    sim.run_for(1.0)
    node = sim.node2(1)
    sim._wake(1, ("task", 0), lambda: sim._busy(node, 2 * SWITCH_INTERVAL_S))
    sim.run_for(0.0001)  # the loop's task has begun
    sim._store(1, _Job2(1, lambda: None, lambda: None, cpu=4 * SWITCH_INTERVAL_S, origin=0))
    sim.run_for(0.1)
    assert node.commits == 1 and not node.runq and node.storage_hand_offs == 0
    # its work alone until its COMMIT (the simulator gave the loop a switch interval for the no-op)
    assert node.pre_commit_seconds == pytest.approx(4 * SWITCH_INTERVAL_S)
    assert node.commit_seconds == pytest.approx(4 * SWITCH_INTERVAL_S + costs.commit)


def test_a_thread_whose_timeout_comes_after_the_storage_thread_took_the_interpreter_asks_it() -> None:
    """``take_gil`` asks the holder to drop the interpreter only after a switch interval with no switch
    of holder: a reader that began waiting behind the loop, the storage thread taking the interpreter
    meanwhile, runs only once the storage thread dropped it at the loop's request (a hand-off), not at
    its own timeout beside the storage thread's held work (sim22; the simulator ran it then)."""
    costs = Costs(jitter=0.0, cores=None, wake=0.0, stall_chance=0.0, commit=0.001, commit_record=0.0)
    sim = MeshSim2(2, costs=costs, group_linger=0.0)
    sim.run_for(1.0)
    node = sim.node2(1)
    sim._store(1, _Job2(1, lambda: None, lambda: None, cpu=4 * SWITCH_INTERVAL_S, origin=0))
    assert node.storage_holds
    sim.run_for(0.0001)
    ran: list[tuple[bool, int]] = []
    sim._interpreter(1, "reader", lambda: ran.append((node.storage_holds, node.storage_hand_offs)))
    sim.run_for(0.1)
    assert ran == [(False, 1)]
    assert node.commits == 1


def test_the_writers_transaction_costs_its_measured_cpu_until_its_commit() -> None:
    """The daemons' writer spends 1.12-1.29 ms of CPU a 1,000-record call from ``Writer.process`` to
    ``Store.commit`` (four probe runs, bench/RESULTS.md sim22); the simulator charged ``queue2.commit``'s
    0.835 us a record plus a replica's ``commit_record`` (a verified delta's join in it): 1.645 ms. With
    ``offer_store_record`` an API call's records cost that alone; without it, the two as before."""
    for whole in (None, 0.000001):
        costs = Costs(
            jitter=0.0,
            cores=None,
            wake=0.0,
            stall_chance=0.0,
            offer=0.0,
            offer_record=0.0,
            message=0.0,
            cut=0.0,
            cut_record=0.0,
            read=0.0,
            read_record=0.0,
            sign_record=0.000002,
            commit_record=0.000003,
            offer_store_record=whole,
        )
        sim = MeshSim2(2, costs=costs, group_linger=0.0)
        warm_up(sim)
        sim.run_for(1.0)
        writer = sim.node2(0)
        cpu, commits = writer.cpu_work, writer.commits
        sim.offer(1000, 100)
        sim.run_for(0.1)
        assert writer.commits == commits + 1
        assert writer.cpu_work - cpu == pytest.approx(0.001 if whole else 0.005)


def test_a_read_takes_the_interpreter_only_once_its_reader_thread_is_on_a_core() -> None:
    """A daemon's read runs on a worker thread (``bridge.read``: ``trio.to_thread``) that is woken and
    must get a core before it can take the interpreter: the daemons' writer's reads waited 2.8 ms (median
    1.7) from their request to their body, then ran it 0.39 ms of CPU mostly in one run (bench/RESULTS.md
    sim21d). So on an idle box the read's CPU follows its request at once, on the core its thread was
    given (no second run), and with both cores busy its thread waits in the run queue (a slice's end)
    while the node's interpreter stays free for its loop and storage thread. Without ``reader_threads``
    (the default, main's model) the read holds the interpreter from its request."""
    costs = _sliced_costs(read=0.0005, read_record=0.0, cut=0.0, cut_record=0.0)
    took: list[float] = []
    for busy, threads in ((False, True), (True, True), (True, False)):
        sim = MeshSim2(2, costs=costs, reader_threads=threads)
        warm_up(sim)
        sim.run_for(1.0)
        node = sim.node2(0)
        out = outgoing(node.durable2[sim.key], None, 4096, sim.max_bytes)
        provided: list[float] = []  # when the delta reached link 1's session (a stub here)
        stub = SimpleNamespace(provide_delta=lambda key, delta: provided.append(sim.now))
        node.sessions[1] = SimpleNamespace(core2=stub)  # type: ignore[assignment]
        sim._run_driver = lambda y, x: None  # type: ignore[method-assign]
        if busy:
            _keep_both_cores_busy(sim)
        runs, start = sim.box.runs, sim.now
        sim._read2_then(0, 1, sim.key, out)
        assert node.readers == 1 and len(node.read_threads) == READ_CONNECTIONS - threads
        sim.run_for(0.00025)  # half its CPU on an idle box; on the busy one it waits for a core
        # waiting for a core, the reader does not hold the interpreter (without ``reader_threads`` it did)
        assert node.cpu.busy is (not busy or not threads)
        sim.run_for(0.1)
        assert len(provided) == 1 and node.readers == 0
        assert len(node.read_threads) == READ_CONNECTIONS
        took.append(provided[0] - start)
        if not busy:
            assert took[0] == pytest.approx(0.0005)  # its CPU on the core it was woken on
            assert sim.box.runs - runs == 2  # the reader's run, the loop's for the delta
    assert took[1] >= 0.0015 + 0.0005  # a slice's end, then its CPU
    assert took[2] >= 0.0015 + 0.0005  # held from its request: the node's thread waits for a core


@pytest.mark.parametrize("wakes", [True, False])
def test_an_idle_storage_thread_takes_its_batch_once_it_has_a_core(wakes: bool) -> None:
    """``Writer._collect`` drains the queue once its ``get`` returned, running: a chunk the loop hands to
    the idle storage thread waits for that thread's wake-up (its core) while the loop reads on, and what
    the loop hands over meanwhile joins the same transaction (the daemons' relays took a chunk handed to
    an idle storage thread a median 0.9-2.4 ms later; sim24c, bench/RESULTS.md). sim24b's model took the
    batch as the interpreter was granted: the second chunk waited for a transaction of its own."""
    sim = _sliced_pair()
    sim.hand_offs, sim.storage_wakes, sim.group_linger = False, wakes, 0.0
    node = sim.node2(1)
    _keep_both_cores_busy(sim)  # the woken storage thread waits for a slice's end (1.5 ms)
    commits = node.commits
    sim._store(1, _Job2(1, lambda: None, lambda: None, cpu=0.0001, origin=0))
    sim._at(
        sim.now + 0.0005, lambda: sim._store(1, _Job2(1, lambda: None, lambda: None, cpu=0.0001, origin=0))
    )
    sim.run_for(0.1)
    assert node.committed_jobs >= 2 and not node.waiting
    assert node.commits - commits == (1 if wakes else 2)


def test_a_woken_thread_takes_another_nodes_running_thread_with_its_roles_measured_chance() -> None:
    """``MeshSim2._wake_victim`` (bench/RESULTS.md sim25): a thread woken on a full box targets either
    core (a draw) and takes it from another node's thread with ``WAKE_PREEMPT_CHANCE`` for that thread's
    role (a storage thread 0.39), never from a thread of its own node (the hand-off's) nor from a
    hand-off's burst; the option off, the box has no ``preempt``."""
    sim = MeshSim2(8, draws=0)
    assert sim.wake_preempts and sim.box.preempt is not None
    mine, theirs = sim.node2(0), sim.node2(1)
    sim.box.work(mine.cpu, 1.0)
    sim.box.work(theirs.disk_cpu, 1.0)
    victims = [sim._wake_victim(mine.read_threads[0]) for _ in range(4000)]
    assert mine.cpu not in victims
    taken = sum(1 for v in victims if v is theirs.disk_cpu) / len(victims)
    assert taken == pytest.approx(WAKE_PREEMPT_CHANCE["storage"] / 2, abs=0.03)
    assert all(sim._wake_victim(CpuThread()) is None for _ in range(100))  # a burst's thread: no role
    off = MeshSim2(8, draws=0, wake_preempts=False)
    assert off.box.preempt is None


def test_latency_from_the_call_adds_the_writers_call_and_commit_to_each_record() -> None:
    """``latency_from_call``: bench_mesh times a record from its client's ``offer`` to the last daemon's
    tail; the same draw measured so is each record's latency from its commit plus the writer's API call
    and transaction (the draw is otherwise the same: the same records, hops and counts)."""
    parts = []
    for from_call in (False, True):
        sim = MeshSim2(8, draws=0, latency_from_call=from_call)
        warm_up(sim)
        parts.append(live(sim, 5, 20))
    committed, called = parts
    assert committed.received == called.received
    assert all(c > k for c, k in zip(called.last_latency, committed.last_latency, strict=True))
    assert min(c - k for c, k in zip(called.last_latency, committed.last_latency, strict=True)) > 0.0003


def test_with_fsync_waits_on_full_box_off_an_idle_boxs_commit_waits_no_drawn_run_queue_wait() -> None:
    """``fsync_waits_on_full_box`` off: the drawn run-queue wait after each fsync sleep (recorded in
    bulks, a mean of 1.2 ms) is waited only on a full box; at 5/s the writer's COMMIT is then its drawn
    sleeps (at most 0.2 ms each) and CPU, with no wait of a full box in it."""
    seconds = []
    for on_full_box in (True, False):
        sim = MeshSim2(8, draws=0, fsync_waits_on_full_box=on_full_box)
        warm_up(sim)
        writer = sim.node2(0)
        began, commits = writer.commit_seconds - writer.pre_commit_seconds, writer.commits
        live(sim, 5, 30)
        took = writer.commit_seconds - writer.pre_commit_seconds - began
        seconds.append(took / (writer.commits - commits))
    always, full_only = seconds
    assert full_only < 0.0015, seconds  # 3 sleeps of <= 0.2 ms, the COMMIT's CPU, wake-ups on a free box
    assert always > full_only + 0.001, seconds  # three drawn waits, 1.2 ms each on average


def test_the_loop_pays_its_own_work_a_delta2_received_and_sent_whatever_its_size() -> None:
    """``Costs.delta_loop``/``send_loop``: a daemon's event loop spends about as much a DELTA2 around the
    timed sans-IO parts (trio's wake-up and steps, the socket, the ahead check's and completion's Python)
    whatever its records (bench/RESULTS.md sim27c). Each node's CPU over a live part then holds that much a
    DELTA2 it received and sent; without them it does not."""
    charge = 0.002
    for cost in (0.0, charge):
        costs = dataclasses.replace(CORE2_COSTS, delta_loop=cost, send_loop=cost)
        sim = MeshSim2(8, draws=0, costs=costs)
        warm_up(sim)
        work = [node.cpu_work for node in sim.nodes]
        got = [node.received["delta2"] for node in sim.nodes]
        sent = dict(sim.link_deltas)
        live(sim, 5, 20)
        owed = []
        for node, before, had in zip(sim.nodes, work, got, strict=True):
            passed = sum(n - sent.get(link, 0) for link, n in sim.link_deltas.items() if link[0] == node.name)
            owed.append((node.cpu_work - before, charge * (node.received["delta2"] - had + passed)))
        assert all(delta2s > 0 for _, delta2s in owed), owed
        if cost:
            assert all(spent >= delta2s for spent, delta2s in owed), owed
        else:
            assert all(spent < delta2s for spent, delta2s in owed), owed


def test_with_the_loops_costed_a_relays_loop_spends_what_the_daemons_do_a_live_record() -> None:
    """bench_mesh ``--metrics`` at N = 8, live 100/s: a relay's event loop spent 0.77-1.14 ms of CPU a record
    (bench/RESULTS.md sim27b, sim27c; eight runs), where ``CORE2_COSTS`` charge its steps ~0.07 ms. With
    ``CORE2_LOOP_COSTS`` the simulated relays' loops spend 0.6-1.2 ms a record."""
    means = []
    for costs in (CORE2_COSTS, CORE2_LOOP_COSTS):
        sim = MeshSim2(8, draws=0, costs=costs)
        warm_up(sim)
        spent = [0.0] * 8
        busy = sim._busy

        def counted(node: Any, cost: float, role: str = "loop", busy: Any = busy, spent: Any = spent) -> None:
            before = node.cpu_work
            busy(node, cost, role)
            if role == "loop":
                spent[node.name] += node.cpu_work - before

        sim._busy = counted  # type: ignore[method-assign]
        live(sim, 100, 200)
        means.append(sum(spent[1:]) / 7 / 200)
    sans_io, costed = means
    assert sans_io < 0.00015, means
    assert 0.0006 <= costed <= 0.0012, means
