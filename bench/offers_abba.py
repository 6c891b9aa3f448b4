"""Single durable offers ÷ ``floor_offers``: two trees alternated A B B A ... inside one run of this script.

Between runs minutes apart the box's speed moves more than a change to the offer path does (bench/RESULTS.md,
singles20-21: the same client code 38-103 µs an offer). So the comparison is made here, in one sitting:
each run is ``bench_daemon.py --parts 2 --windows 0,1`` of one tree (its no-op row, its blocking row, then
``floor_offers`` right after it), the trees alternate in ABBA order, and what is compared is each pair's
ratio of "÷ floor" (a run's blocking offers over the floor measured in the same minute).

    git -C /work/main archive HEAD | tar -x -C /tmp/me/before   # + main's compiled .so files
    flock /tmp/heavy.lock nice .venv/bin/python bench/offers_abba.py --before /tmp/me/before --pairs 4

Take the lock around the whole script (one hold): it runs nothing else in parallel.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_NUM = r"([\d,]+(?:\.\d+)?)"
_BLOCK = re.compile(rf"each waits for its ack: {_NUM} offers/s; latency p50 {_NUM} ms")
_CPU = re.compile(rf"daemon CPU {_NUM} us/offer, clients' CPU {_NUM} us/offer")
_FLOOR = re.compile(rf"durable \(group commit.*?\): {_NUM} offers/s")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class Run:
    """One tree's blocking row and the floor right after it."""

    label: str
    offers: float
    p50_ms: float
    daemon_us: float
    clients_us: float
    floor: float
    ended: str
    load: float

    @property
    def of_floor(self) -> float:
        return self.offers / self.floor


def parse(label: str, output: str, ended: str, load: float) -> Run:
    """The figures of one ``bench_daemon --parts 2 --windows 0,1`` output (ValueError if one is missing)."""
    # The no-op row's CPU is "us/request": the first "us/offer" line is the blocking row's.
    block, cpu, floor = _BLOCK.search(output), _CPU.search(output), _FLOOR.search(output)
    if block is None or cpu is None or floor is None:
        raise ValueError(f"unexpected bench_daemon output:\n{output}")
    return Run(label, _num(block[1]), _num(block[2]), _num(cpu[1]), _num(cpu[2]), _num(floor[1]), ended, load)


def run_tree(label: str, tree: Path, clients: int, seconds: float) -> Run:
    """One run of ``tree``'s own bench_daemon, with ``tree`` first on the path."""
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'bench'}")
    argv = [sys.executable, "bench/bench_daemon.py", "--parts", "2", "--windows", "0,1"]
    argv += ["--clients", str(clients), "--seconds", str(seconds)]
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
    return parse(label, out, time.strftime("%H:%M:%S", time.gmtime()), os.getloadavg()[0])


def order(pairs: int) -> list[tuple[str, str]]:
    """A B, B A, A B, ...: each tree goes first in half the pairs."""
    return [("before", "after") if i % 2 == 0 else ("after", "before") for i in range(pairs)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="the baseline tree (e.g. main's)")
    parser.add_argument("--after", type=Path, default=HERE, help="the tree under test (default: this one)")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    print(f"before {trees['before']}\nafter  {trees['after']}")
    header = "pair  tree    ended     load  offers/s  p50 ms  daemon us  clients us  floor/s  ÷ floor"
    print(header)
    pairs: list[dict[str, Run]] = []
    for i, labels in enumerate(order(args.pairs), 1):
        runs = {}
        for label in labels:
            r = run_tree(label, trees[label], args.clients, args.seconds)
            runs[label] = r
            print(
                f"{i:>4}  {label:6s}  {r.ended}  {r.load:4.1f}  {r.offers:8,.0f}  {r.p50_ms:6.2f}  "
                f"{r.daemon_us:9.0f}  {r.clients_us:10.0f}  {r.floor:7,.0f}  {r.of_floor:7.2f}",
                flush=True,
            )
        pairs.append(runs)
    ratios = [p["after"].of_floor / p["before"].of_floor for p in pairs]
    print("pair ratios, after ÷ before of ÷ floor: " + ", ".join(f"{x:.2f}" for x in ratios))
    for label in ("before", "after"):
        runs = [p[label] for p in pairs]
        print(
            f"{label}: ÷ floor median {statistics.median(r.of_floor for r in runs):.2f} "
            f"({min(r.of_floor for r in runs):.2f}-{max(r.of_floor for r in runs):.2f}); CPU an offer, "
            f"daemon median {statistics.median(r.daemon_us for r in runs):.0f} us, clients "
            f"{statistics.median(r.clients_us for r in runs):.0f} us"
        )
    # The floor run moves more between runs than latticed's own rate (RESULTS, singles22): the pairs'
    # ratio of offers/s, and each run over the median floor of the whole sitting, beside it.
    raw = [p["after"].offers / p["before"].offers for p in pairs]
    floor = statistics.median(r.floor for p in pairs for r in p.values())
    print("pair ratios, after ÷ before of offers/s: " + ", ".join(f"{x:.2f}" for x in raw))
    for label in ("before", "after"):
        of_median = [p[label].offers / floor for p in pairs]
        median = statistics.median(of_median)
        print(f"{label}: ÷ the sitting's median floor ({floor:,.0f}/s): median {median:.2f}")
    print(f"median pair ratio of offers/s {statistics.median(raw):.2f}")
    ahead = sum(x > 1 for x in ratios)
    print(f"median pair ratio {statistics.median(ratios):.2f}; after ahead in {ahead} of {len(ratios)} pairs")


if __name__ == "__main__":
    main()
