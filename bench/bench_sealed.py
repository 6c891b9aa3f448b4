"""Sealed queues against plain ones, in the same run (real daemon processes, durable).

    .venv/bin/python bench/bench_sealed.py                     # both parts, 3 rounds each
    .venv/bin/python bench/bench_sealed.py --records 200000 --parts offer --rounds 5

Parts:
  offer    ``--records`` x 100 B offered in batches of 1000 (``offer_batch``) to a plain queue and to a
           sealed one on one daemon, alternating, ``--rounds`` times each; one connection, ``--window``
           batches in flight (1: waits for each reply). Records/s, the median of each kind, and the ratio.
  catchup  ``--records`` x 100 B on daemon A in a plain queue and in a sealed one; a fresh daemon dials A
           and catches up one of them (verified and durable), the kinds alternating, a new daemon each
           time. The sealed queue's receiver is one of its readers (a relay does the same work: records
           are opened on read, not on arrival).

Figures are printed, never asserted; docs/privacy.md and bench/RESULTS.md ("Private queues") say what the
target is (sealed >= 0.7x plain).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import time
from pathlib import Path

from _daemons import cpu_s, listen_address, run_argv, scratch, start, stop, wait_end

from latticed.api.client.blocking_client import Client
from latticed.api.client.producer import Producer

VALUE = b"x" * 100
BATCH = 1000


class Node:
    """A ``latticed run`` process on a data directory of its own (restartable)."""

    def __init__(self, root: Path, name: str) -> None:
        self.data = root / name
        self.socket = root / f"{name}.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.listen = ""

    def start(self, *peers: str) -> Node:
        args = ["--data-dir", str(self.data), "--socket", str(self.socket)]
        args += ["--listen", "127.0.0.1:0", "--no-mdns", "--log-level", "WARNING"]
        for peer in peers:
            args += ["--peer", peer]
        self.proc, self.listen = start(run_argv(*args), self.socket, listen_address)
        return self

    def client(self) -> Client:
        return Client(self.socket, timeout=120)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def workspace() -> contextlib.AbstractContextManager[tuple[Path, list[Node]]]:
    return scratch("ld-sealed-", remove=True)


def fill(node: Node, queue: str, records: int, window: int) -> tuple[float, float]:
    """Offer ``records`` in batches through one connection; returns records/s and the daemon's CPU
    microseconds per record."""
    assert node.proc is not None
    batch = [(VALUE, None, ())] * BATCH
    with node.client() as c, Producer(c, queue, window) as producer:
        cpu = cpu_s(node.proc.pid)
        started = time.perf_counter()
        for start in range(0, records, BATCH):
            producer.offer_batch(batch[: min(BATCH, records - start)])
        producer.flush()
        elapsed = time.perf_counter() - started
        cpu = cpu_s(node.proc.pid) - cpu
    return records / elapsed, cpu / records * 1e6


Sample = tuple[float, float]  # records/s, daemon CPU us per record (0: not measured)


def report(label: str, plain: list[Sample], sealed: list[Sample]) -> None:
    p, s = statistics.median(r for r, _ in plain), statistics.median(r for r, _ in sealed)
    paired = statistics.median(b[0] / a[0] for a, b in zip(plain, sealed, strict=True))
    print(f"{label}: plain {p:,.0f} records/s, sealed {s:,.0f} records/s")
    print(f"    sealed/plain: {s / p:.2f} (ratio of the medians), {paired:.2f} (median of paired rounds)")
    rounds = ", ".join(f"{a[0]:,.0f} / {b[0]:,.0f}" for a, b in zip(plain, sealed, strict=True))
    print(f"    rounds, records/s (plain / sealed): {rounds}")
    if all(c for _, c in plain + sealed):
        pc, sc = statistics.median(c for _, c in plain), statistics.median(c for _, c in sealed)
        print(
            f"    daemon CPU per record: plain {pc:.2f} us, sealed {sc:.2f} us (plain/sealed {pc / sc:.2f})"
        )


def offer_part(records: int, rounds: int, window: int) -> None:
    with workspace() as (root, nodes):
        node = Node(root, "A").start()
        nodes.append(node)
        plain: list[Sample] = []
        sealed: list[Sample] = []
        with node.client() as c:
            c.queue_create("warm")
            c.queue_create("warm-sealed", readers=[])
        fill(node, "warm", 20 * BATCH, window)  # page cache, WAL, the interpreter's first paths
        fill(node, "warm-sealed", 20 * BATCH, window)
        for r in range(rounds):
            with node.client() as c:
                c.queue_create(f"plain{r}")
                c.queue_create(f"sealed{r}", readers=[])
            # Alternate which goes first, so a box that speeds up or slows down favours neither.
            for kind in ("plain", "sealed") if r % 2 == 0 else ("sealed", "plain"):
                (plain if kind == "plain" else sealed).append(fill(node, f"{kind}{r}", records, window))
        report(f"batched offer, {records:,} x 100 B, batches of {BATCH}, window {window}", plain, sealed)


def catchup_part(records: int, rounds: int) -> None:
    with workspace() as (root, nodes):
        origin = Node(root, "A").start()
        nodes.append(origin)
        receivers = []
        for r in range(rounds):  # the sealed queue's receivers exist first: the queue is shared with them
            node = Node(root, f"S{r}").start()
            with node.client() as c:
                receivers.append((node, c.identity()))
            node.stop()
        with origin.client() as c:
            plain_q = c.queue_create("plain")
            sealed_q = c.queue_create("sealed", readers=[ident for _, ident in receivers])
        fill(origin, "plain", records, 4)
        fill(origin, "sealed", records, 4)
        plain: list[Sample] = []
        sealed: list[Sample] = []
        for r in range(rounds):
            for kind, queue in ((("plain", plain_q), ("sealed", sealed_q)))[:: 1 if r % 2 == 0 else -1]:
                node = Node(root, f"P{r}") if kind == "plain" else receivers[r][0]
                nodes.append(node)
                started = time.perf_counter()
                node.start(origin.listen)
                assert node.proc is not None
                elapsed = wait_end(node, queue, records) - started
                cpu = cpu_s(node.proc.pid) / records * 1e6
                (plain if kind == "plain" else sealed).append((records / elapsed, cpu))
                node.stop()
        report(f"catch-up of {records:,} x 100 B to a fresh daemon (incl. its start)", plain, sealed)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=1, help="offer batches in flight")
    parser.add_argument("--parts", default="offer,catchup")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "offer" in parts:
        offer_part(args.records, args.rounds, args.window)
    if "catchup" in parts:
        catchup_part(args.records, args.rounds)


if __name__ == "__main__":
    main()
