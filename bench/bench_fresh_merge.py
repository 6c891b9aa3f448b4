"""A fresh replica's merge of many new core-2 queues, the generic path against the batched one
(:mod:`latticed.storage.core2_fresh`), in one process (issue 28, "many queues").

    PYTHONPATH=$PWD .venv/bin/python bench/bench_fresh_merge.py                     # 10,000 queues, 3 rounds
    PYTHONPATH=$PWD .venv/bin/python bench/bench_fresh_merge.py --queues 30000 --rounds 5 --batch 512

An owner's ``--queues`` queues of ``--records`` 100-byte records (a create head, then one offer of them:
what bench_many_queues.py fills) are encoded as a link sends a replica that holds none of them (bodies as
steps), once. Each round a fresh replica store takes their decoded deltas in group commits of ``--batch``
merges, once with ``Core2Queues.fresh_batched`` off (the old path: join, create, join again, persist each)
and once with it on, in alternating order (old, new; new, old; ...). Timed per queue, wall clock
(``perf_counter``; the wire decode is not timed): merge+commit (``Writer.process``: the jobs'
verification, joins and the group commit, fsync included), ``Core2Queues.write`` (what it writes in the
batch's transaction) and the whole group commit (``Writer._write``: from BEGIN to the COMMIT and the
values published). Printed: each round's figures and the new / old ratio of each, then the median ratios
over the rounds. Both stores are checked to hold every queue's records.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from latticed.crdt import queue2, wire
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.net.core2_engine_host import MergeSteps2
from latticed.protocol import core2_wire
from latticed.protocol.core2_steps import outgoing
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

OWNER = Identity.from_seed(b"o" * 32)
REPLICA = Identity.from_seed(b"r" * 32)
#: What each round measures, in the order printed.
PARTS = ("merge+commit", "Core2Queues.write", "group commit")


def owner_deltas(queues: int, records: int) -> list[bytes]:
    """Each queue's delta to a replica that holds nothing, as the wire carries it."""
    batch = [make_record(b"x" * 100, timestamp=1_700_000_000_000 + i) for i in range(records)]
    out = []
    for i in range(queues):
        state = queue2.commit(queue2.empty_state(OWNER.public_key, f"q{i:06d}"), OWNER, now_ms=1)
        state = queue2.commit(state, OWNER, now_ms=2, records=batch)
        sent = outgoing(state, None, 4096, 1 << 20)
        out.append(wire.pack(core2_wire.delta_to_wire(sent.delta, sent.steps)))
    return out


def _timed(into: list[float], call: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return call(*args)
        finally:
            into.append(time.perf_counter() - t0)

    return timed


def merge_all(root: Path, raw: Sequence[bytes], batch: int, *, batched: bool) -> dict[str, float]:
    """A fresh replica store at ``root`` takes every delta (``batched``: the batched path on); the seconds
    a queue of each part."""
    root.mkdir()
    w = Writer(db_path(root), REPLICA)
    w.open()
    try:
        w.core2.fresh_batched = batched
        writes: list[float] = []
        commits: list[float] = []
        w.core2.write = _timed(writes, w.core2.write)  # type: ignore[method-assign]
        w._write = _timed(commits, w._write)  # type: ignore[method-assign]
        merged = 0.0
        for lo in range(0, len(raw), batch):
            jobs = [MergeSteps2(*core2_wire.delta_from_wire(wire.unpack(r))) for r in raw[lo : lo + batch]]
            t0 = time.perf_counter()
            w.process(list(jobs))
            merged += time.perf_counter() - t0
            failed = [job.error for job in jobs if job.error is not None]
            if failed:
                raise RuntimeError(f"a merge failed: {failed[0]}")
        held = [w.core2.committed(q).held for q in w.core2.queues()]
        if len(held) != len(raw) or any(hi <= lo for lo, hi in held):
            raise RuntimeError(f"the replica holds {len(held)} queues of {len(raw)}, or some empty")
        n = len(raw)
        return {
            "merge+commit": merged / n,
            "Core2Queues.write": sum(writes) / n,
            "group commit": sum(commits) / n,
        }
    finally:
        w.stop()


def run(queues: int, records: int, rounds: int, batch: int) -> list[dict[str, float]]:
    """Each round's new ÷ old ratio of each part (printed with the round's figures as it goes)."""
    t0 = time.perf_counter()
    raw = owner_deltas(queues, records)
    print(f"{queues:,} queues x {records} records encoded in {time.perf_counter() - t0:.1f} s", flush=True)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-fresh-merge-") as tmp:
        for k in range(rounds):
            figures = {}
            for batched in (False, True) if k % 2 == 0 else (True, False):
                name = "new" if batched else "old"
                figures[name] = merge_all(Path(tmp) / f"{name}{k}", raw, batch, batched=batched)
            ratio = {part: figures["new"][part] / figures["old"][part] for part in PARTS}
            ratios.append(ratio)
            print(
                f"round {k + 1} ({'old, new' if k % 2 == 0 else 'new, old'}): "
                + "; ".join(
                    f"{part} {figures['old'][part] * 1e6:,.0f} -> {figures['new'][part] * 1e6:,.0f} us a "
                    f"queue ({ratio[part]:.2f}x)"
                    for part in PARTS
                ),
                flush=True,
            )
    print(
        f"median new / old over {rounds} rounds: "
        + ", ".join(f"{part} {statistics.median(r[part] for r in ratios):.2f}x" for part in PARTS),
        flush=True,
    )
    return ratios


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name, default in (("queues", 10_000), ("records", 5), ("rounds", 3), ("batch", 256)):
        parser.add_argument(f"--{name}", type=int, default=default)  # --batch: merges a group commit
    args = parser.parse_args(argv)
    if min(args.queues, args.records, args.rounds, args.batch) < 1:
        parser.error("--queues, --records, --rounds and --batch are at least 1")
    run(args.queues, args.records, args.rounds, args.batch)


if __name__ == "__main__":
    main()
