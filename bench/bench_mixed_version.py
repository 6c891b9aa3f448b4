"""Replication between releases: the previous release (built from git, integration/releases.py) and this
build, beside this build with itself, in the same run.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_mixed_version.py --records 20000 --samples 200 --rounds 2

Pairs (writer -> receiver): ``new->new`` (the same-version reference), ``old->new`` and ``new->old``.
Each round runs every pair once, in a rotated order, so a busy host's drift falls on all of them.

  catch-up  ``--records`` x 100 B records written on the writer, then a fresh receiver dials it:
            records/s until the receiver holds them all (verified and durable there).
  live      single-record offers on the writer every ``--interval`` s, a tail on the receiver (one hop)
            and one on the writer itself (the baseline: its own durable commit, no network): latency
            p50/p99, and what the hop adds over the baseline.

The last lines give each mixed pair's figure over ``new->new``'s: catch-up rate ratio (1.00: as fast) and
live p50 ratio (1.00: as quick). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from _daemons import listen_address, scratch, start, stop, wait_end

from latticed.api.client.blocking_client import Client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "integration"))
from releases import previous_release, release_source  # noqa: E402 - integration/ is not a package

PAIRS = (("new", "new"), ("old", "new"), ("new", "old"))


class Node:
    """One daemon of ``version`` ("new": this build, "old": the previous release)."""

    def __init__(self, root: Path, name: str, version: str, peers: list[str], old_source: Path) -> None:
        self.name = name
        self.socket = root / f"{name}.sock"
        tree = ROOT if version == "new" else old_source
        argv = [sys.executable, "-m", "latticed", "run", "--data-dir", str(root / name)]
        argv += [
            "--socket",
            str(self.socket),
            "--listen",
            "127.0.0.1:0",
            "--no-mdns",
            "--log-level",
            "ERROR",
        ]
        for peer in peers:
            argv += ["--peer", peer]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc, self.listen = start(argv, self.socket, listen_address, env=env, cwd=tree)

    def client(self) -> Client:
        return Client(self.socket, timeout=60)

    def stop(self) -> None:
        stop(self.proc)


def cluster() -> contextlib.AbstractContextManager[tuple[Path, list[Node]]]:
    return scratch("ld-bench-mixed-", remove=True)


def catchup(pair: tuple[str, str], records: int, old: Path) -> float:
    """Records/s of a fresh receiver of ``pair[1]`` catching up from a writer of ``pair[0]``."""
    with cluster() as (root, nodes):
        a = Node(root, "A", pair[0], [], old)
        nodes.append(a)
        with a.client() as c:
            queue = c.queue_create("backlog")
            for first in range(0, records, 1000):
                c.offer_batch("backlog", [(b"x" * 100, None, ())] * min(1000, records - first))
        started = time.perf_counter()
        b = Node(root, "B", pair[1], [a.listen], old)
        nodes.append(b)
        return records / (wait_end(b, queue, records) - started)


def live(pair: tuple[str, str], samples: int, interval: float, old: Path) -> tuple[list[float], list[float]]:
    """Latencies in ms, sorted: a tail on the receiver (one hop), and on the writer (the baseline)."""
    with cluster() as (root, nodes):
        a = Node(root, "A", pair[0], [], old)
        nodes.append(a)
        b = Node(root, "B", pair[1], [a.listen], old)
        nodes.append(b)
        with a.client() as c:
            queue = c.queue_create("live")
            c.offer("live", b"warm-up")
        wait_end(b, queue, 1)
        sent: dict[int, float] = {}
        arrivals: dict[str, dict[int, float]] = {"A": {}, "B": {}}
        listening = threading.Barrier(3)

        def follow(node: Node) -> None:
            with node.client() as c:
                tail = iter(c.tail(queue, from_offset=0))
                next(tail)  # the warm-up record: the tail is open
                listening.wait()
                for entry in tail:
                    arrivals[node.name][entry.offset] = time.perf_counter()
                    if entry.offset >= samples:
                        return

        threads = [threading.Thread(target=follow, args=(n,), daemon=True) for n in (a, b)]
        for t in threads:
            t.start()
        listening.wait()
        with a.client() as c:
            for _ in range(samples):
                t0 = time.perf_counter()
                sent[c.offer("live", b"ping")] = t0
                time.sleep(interval)
        for t in threads:
            t.join(60)
        return tuple(  # type: ignore[return-value]
            sorted((arrivals[n][o] - sent[o]) * 1000 for o in sent if o in arrivals[n]) for n in ("B", "A")
        )


def p(lat: list[float], q: float) -> float:
    return lat[min(len(lat) - 1, int(len(lat) * q))] if lat else float("nan")


def rotations(rounds: int) -> Iterator[tuple[str, str]]:
    for r in range(rounds):
        yield from PAIRS[r % len(PAIRS) :] + PAIRS[: r % len(PAIRS)]


def label(pair: tuple[str, str], old: str) -> str:
    names = {"new": "this build", "old": old}
    return f"{names[pair[0]]} -> {names[pair[1]]}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.005)
    parser.add_argument("--rounds", type=int, default=3, help="each pair runs once per round")
    parser.add_argument("--parts", default="catchup,live")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    version = previous_release()
    old = release_source(version)
    print(f"previous release {version} from {old}; load average {os.getloadavg()[0]:.2f} at start")
    rates: dict[tuple[str, str], list[float]] = {pair: [] for pair in PAIRS}
    hop: dict[tuple[str, str], list[float]] = {pair: [] for pair in PAIRS}
    base: dict[tuple[str, str], list[float]] = {pair: [] for pair in PAIRS}
    for pair in rotations(args.rounds):
        if "catchup" in parts:
            rate = catchup(pair, args.records, old)
            rates[pair].append(rate)
            print(f"catch-up {args.records:,} x 100 B, {label(pair, version)}: {rate:,.0f} records/s")
        if "live" in parts:
            b, a = live(pair, args.samples, args.interval, old)
            hop[pair] += b
            base[pair] += a
            print(
                f"live 1 hop, {label(pair, version)}: p50 {p(b, 0.5):.2f} ms, p99 {p(b, 0.99):.2f} ms "
                f"(baseline, a tail on the writer: p50 {p(a, 0.5):.2f} ms; {len(b)} samples)"
            )
    print(f"summary over {args.rounds} rounds (load average {os.getloadavg()[0]:.2f} at the end):")
    ref = ("new", "new")
    for pair in PAIRS:
        line = f"  {label(pair, version):28}"
        if rates[pair]:
            rate = statistics.median(rates[pair])
            line += f" catch-up {rate:>9,.0f} records/s (x{rate / statistics.median(rates[ref]):.2f})"
        if hop[pair]:
            lat, a = sorted(hop[pair]), sorted(base[pair])  # pooled over the rounds
            ratio = p(lat, 0.5) / p(sorted(hop[ref]), 0.5)
            line += (
                f"  live p50 {p(lat, 0.5):.2f} ms (x{ratio:.2f}), p99 {p(lat, 0.99):.2f} ms, "
                f"hop adds p50 {p(lat, 0.5) - p(a, 0.5):+.2f} ms"
            )
        print(line)


if __name__ == "__main__":
    main()
