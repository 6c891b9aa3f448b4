"""bench_sim_costs on a short bulk: every message sent is timed once (a DELTA2 packed by ``provide_delta``'s
``encode_delta`` too, which sim27's run missed: its ``cut_record`` read 1,853 us), and the split of the cut
into a fixed part and a per-record part is positive and adds up to the whole it was taken from."""

from __future__ import annotations

import sys

from support.paths import ROOT

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import bench_sim_costs


def test_the_cut_splits_into_a_positive_fixed_and_per_record_part_within_the_whole() -> None:
    samples, received = bench_sim_costs.measure(0, records=5_000)
    sent = sum(n for n, _ in samples["encode"])
    # every message received was encoded once, and the encoded bytes are those sealed and received
    assert len(samples["encode"]) == len(samples["seal"]) == len(received)
    assert sent == sum(n for n, _ in samples["seal"]) == sum(len(m) for m in received)
    found = bench_sim_costs.costs(samples)
    whole = sum(s for _, s in samples["encode"]) + sum(s for _, s in samples["seal"])
    records = sum(n for n, _ in samples["verify"])  # every record carried, as received
    assert records >= 5_000 * 7  # each of the seven replicas received the bulk
    assert found["cut"] > 0 and found["cut_record"] > 0, found
    per_record_part = found["cut_record"] * records
    assert per_record_part < whole, (per_record_part, whole)
    assert abs(len(received) * found["cut"] + per_record_part - whole) <= 1e-9 * len(received) + 1e-6 * whole
