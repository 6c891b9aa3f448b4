"""bench_many_queues' ``--rounds`` (each catch-up printed, then the median) and bench_fresh_merge (the
generic path against the batched one, in one process): short runs that print real figures."""

from __future__ import annotations

import re
import sys

import pytest
from support.paths import ROOT

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import bench_fresh_merge
import bench_many_queues

NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"


def test_rounds_are_parsed_and_checked() -> None:
    args, sizes, cores = bench_many_queues.parse(["--sizes", "10,20", "--rounds", "3", "--core", "2"])
    assert (args.rounds, sizes, cores) == (3, [10, 20], [2])
    assert bench_many_queues.parse([])[0].rounds == 1
    with pytest.raises(SystemExit):
        bench_many_queues.parse(["--rounds", "0"])


def test_the_median_of_rounds_is_printed_with_each(capsys: pytest.CaptureFixture[str]) -> None:
    runs = [{"took": 3.0, "cpu": 2.0}, {"took": 1.0, "cpu": 4.0}, {"took": 2.0, "cpu": 3.0}]
    assert bench_many_queues.median_of(100, 2, runs) == {"took": 2.0, "cpu": 3.0}
    out = capsys.readouterr().out
    assert (
        "100 queues, median of 3 rounds: holds all after 2.0 s (3.0, 1.0, 2.0), CPU 3.0 s (2.0, 4.0, 3.0)"
        in out
    )
    assert bench_many_queues.median_of(100, 2, runs[:1]) == {"took": 3.0, "cpu": 2.0}
    assert capsys.readouterr().out == ""  # one round: its own line says it all


def test_a_tiny_catch_up_twice_prints_each_and_the_median(capsys: pytest.CaptureFixture[str]) -> None:
    bench_many_queues.main(
        ["--sizes", "10", "--records", "2", "--rounds", "2", "--core", "2", "--sample", "0.05"]
    )
    out = capsys.readouterr().out
    each = re.findall(
        rf"10 queues x 2 records on fork core 2 .*holds all after ({NUMBER}) s, CPU ({NUMBER}) s", out
    )
    assert len(each) == 2, out
    median = re.search(rf"10 queues, median of 2 rounds: holds all after ({NUMBER}) s", out)
    assert median is not None, out
    assert 0 < float(median.group(1)) < 60


def test_the_fresh_merge_bench_prints_each_rounds_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    ratios = bench_fresh_merge.run(queues=24, records=5, rounds=2, batch=8)
    out = capsys.readouterr().out
    assert len(ratios) == 2 and all(0 < r[part] < 100 for r in ratios for part in bench_fresh_merge.PARTS)
    rounds = re.findall(
        rf"round [12] \((old, new|new, old)\): merge\+commit {NUMBER} -> {NUMBER} us a queue", out
    )
    assert rounds == ["old, new", "new, old"], out
    assert re.search(
        rf"median new / old over 2 rounds: merge\+commit {NUMBER}x, Core2Queues.write {NUMBER}x, "
        rf"group commit {NUMBER}x",
        out,
    ), out
    with pytest.raises(SystemExit):
        bench_fresh_merge.main(["--rounds", "0"])
