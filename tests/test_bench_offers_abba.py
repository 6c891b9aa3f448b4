"""bench/offers_abba.py alternates two trees and compares each pair's "÷ floor": its parsing of
bench_daemon's output and its order are checked here on fixed text, no daemons."""

from __future__ import annotations

import sys

import pytest
from support.paths import ROOT

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import offers_abba

#: What bench_daemon --parts 2 --windows 0,1 prints (its format strings, figures made up).
OUTPUT = (
    "daemon pid 1, data in /tmp/x, group_commit_ms=2.0\n"
    "[2] single-record offers, 16 concurrent client processes, 5s each:\n"
    "    baseline, a no-op request (id) instead, each waits for its reply: 30,100 requests/s; latency p50 "
    "0.50 ms, p99 1.00 ms\n"
    "        daemon CPU 20 us/request, clients' CPU 25 us/request\n"
    "    each waits for its ack: 9,602 offers/s; latency p50 1.70 ms, p99 3.10 ms\n"
    "        daemon CPU 84 us/offer, clients' CPU 41 us/offer, 15.9 offers/commit\n"
    "floor, a bare trio server, 16 clients each waiting for its reply:\n"
    "    no-op: 40,000 req/s, server CPU 20 us/req, clients' CPU 15 us/req\n"
    "    durable (group commit, one fdatasync per batch): 19,204 offers/s, server CPU 40 us/offer, clients' "
    "CPU 18 us/offer; durable / no-op 0.48\n"
    "    blocking offers / no-op: latticed 0.32, the bare floor 0.48; latticed's offers ÷ the floor's 0.50\n"
)


def test_a_run_is_the_blocking_row_its_cpu_and_the_floor_after_it() -> None:
    run = offers_abba.parse("after", OUTPUT, "12:00:00", 1.5)
    assert (run.offers, run.p50_ms, run.daemon_us, run.clients_us, run.floor) == (9602, 1.7, 84, 41, 19204)
    assert run.of_floor == pytest.approx(0.5)


def test_output_without_the_floor_is_refused() -> None:
    with pytest.raises(ValueError, match="unexpected bench_daemon output"):
        offers_abba.parse("after", OUTPUT.split("floor, a bare", maxsplit=1)[0], "12:00:00", 1.5)


def test_each_tree_goes_first_in_half_the_pairs() -> None:
    assert offers_abba.order(4) == [
        ("before", "after"),
        ("after", "before"),
        ("before", "after"),
        ("after", "before"),
    ]
