"""bench_relay_turn's daemon-like options: ``--wire`` carries every message as the transport does (sealed,
written to a socket, read and opened), ``--pause`` sleeps between pushes and ``--storage`` commits them on
a real storage thread; a short run of each."""

from __future__ import annotations

import sys

from support.paths import ROOT

from latticed.crdt import queue2

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import bench_relay_turn


def test_the_wire_carries_a_message_sealed() -> None:
    wire = bench_relay_turn.Wire()
    try:
        wire.send(b"a delta")
        wire.send(b"an ack")
        assert wire.receive() == b"a delta"
        assert wire.receive() == b"an ack"
    finally:
        wire.close()


def test_a_paced_turn_over_the_wire_times_every_part() -> None:
    states = bench_relay_turn.line(10)
    spent = bench_relay_turn.turn(states, warmup=2, every=4, pause=0.0005, wire=True)
    assert set(spent) == set(bench_relay_turn.PARTS)
    assert all(us > 0 for part, us in spent.items() if part != "storage"), spent
    assert spent["storage"] == 0  # no storage thread asked for


def test_a_turn_with_a_storage_thread_commits_every_push_and_times_it() -> None:
    states = bench_relay_turn.line(9)
    spent = bench_relay_turn.turn(states, warmup=1, every=4, storage=True)
    assert spent["storage"] > 0, spent


def test_the_storage_thread_commits_what_it_is_given() -> None:
    states = bench_relay_turn.line(2)
    store = bench_relay_turn.Storage(states[0])
    try:
        assert store.loaded().held == states[0].held
        since = queue2.summary(store.loaded())
        out = bench_relay_turn.outgoing(states[2], since, 16, bench_relay_turn.MAX_BYTES)
        store.wait([store.submit(bench_relay_turn.MergeSteps2(out.delta, out.steps))])
        assert store.loaded().held == states[2].held
    finally:
        store.close()


def test_a_turn_paced_past_the_linger_learns_each_commit_before_the_next_push() -> None:
    """Paced slower than the storage thread's merge linger, each push commits alone before the next:
    the relay learns it first (as the daemon does from the commit), and checks the next push against
    the committed value."""
    states = bench_relay_turn.line(6)
    spent = bench_relay_turn.turn(states, warmup=1, every=4, pause=0.025, storage=True)
    assert spent["storage"] > 0 and spent["complete"] > 0, spent
