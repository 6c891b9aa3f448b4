"""bench_relay_turn's daemon-like options: ``--wire`` carries every message as the transport does (sealed,
written to a socket, read and opened) and ``--pause`` sleeps between pushes; a short run of each."""

from __future__ import annotations

import sys

from support.paths import ROOT

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
    assert all(us > 0 for us in spent.values()), spent
