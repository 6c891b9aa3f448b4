"""What the time index costs the storage thread: the owner's ``Writer`` appending records in batches of
1000 (as ``offer_batch`` does), with the index kept and with it switched off, alternated in one process.

    .venv/bin/python bench/bench_time_index.py                       # 200,000 records, 10 rounds
    .venv/bin/python bench/bench_time_index.py --records 1000000 --rounds 4

Both runs use the same code on a store of the current schema; "off" only tells the store it has no index
(as a store of an older schema is written), so the difference is the index alone. Printed: process CPU
per record (the storage work: commit, sign, encode, SQLite) and, of that, the time spent inside the
index's own functions. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.storage import timeindex
from latticed.storage.jobs import Append, CreateQueue
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

BATCH = 1000
IDENTITY = Identity.from_seed(b"t" * 32)
_inside = [0.0]


def _timing(fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _inside[0] += time.perf_counter() - start

    return timed


def run(records: int, *, indexed: bool, parent: Path | None) -> tuple[float, float]:
    """(process CPU, time inside the index functions), both in µs per record."""
    with tempfile.TemporaryDirectory(dir=parent) as scratch:
        writer = Writer(db_path(Path(scratch)), IDENTITY)
        writer.open()
        writer.store._timed = indexed  # the one switch between the two runs
        create = CreateQueue("q")
        writer.process([create])
        assert isinstance(create.result, int)
        t0 = 1_700_000_000_000
        batches = [
            [make_record(b"v" * 100, key=b"k", timestamp=t0 + b * BATCH + i) for i in range(BATCH)]
            for b in range(records // BATCH)
        ]
        _inside[0] = 0.0
        cpu = time.process_time()
        for batch in batches:
            job = Append(create.result, batch)
            writer.process([job])
            assert job.error is None, job.error
        cpu = time.process_time() - cpu
        writer.stop()
        n = len(batches) * BATCH
        return cpu / n * 1e6, _inside[0] / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary data directories")
    args = parser.parse_args()
    for name in ("added", "retop", "removed_below", "removed_from"):
        setattr(timeindex, name, _timing(getattr(timeindex, name)))
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for round_ in range(args.rounds):
        for indexed in (True, False) if round_ % 2 == 0 else (False, True):
            results[indexed].append(run(args.records, indexed=indexed, parent=args.dir))
    medians = {}
    for indexed in (False, True):
        cpu = [c for c, _ in results[indexed]]
        medians[indexed] = statistics.median(cpu)
        inside = statistics.median(s for _, s in results[indexed])
        print(
            f"index {'on ' if indexed else 'off'}: CPU {medians[indexed]:.3f} µs/record (median; runs "
            f"{', '.join(f'{c:.2f}' for c in cpu)}), inside the index functions {inside:.4f} µs/record"
        )
    print(f"on / off: {100 * (medians[True] / medians[False] - 1):+.1f}%")


if __name__ == "__main__":
    main()
