"""What v2 heads' log costs (docs/lattice.md, "Forks"), against today's catch-up of the same queue.

Usage: python bench/bench_fork_log.py [--records N] [--batch B ...] [--size BYTES] [--chunk R]
For each batch size: the owner signs N records in batches of B (one head per batch, and one per MiB),
a fresh replica catches up through today's deltas (``max_records`` per chunk, full wire layouts), and
the script prints those bytes next to what v2 adds: the log a replica keeps (one 40-byte leaf per
version), the leaves a fresh replica receives once, the larger head in every delta, and the time to
fold (verify) the whole log.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from latticed.crdt import queue as core
from latticed.crdt import wire
from latticed.crdt.head import queue_id
from latticed.crdt.head2 import HEAD2_SIZE, LEAF_SIZE, fold, genesis
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.storage.batch import thin_checkpoints

HEAD_V1_SIZE = 256


def catch_up(state: core.QueueState, chunk: int) -> tuple[int, int]:
    """Bytes and deltas a fresh replica receives from ``state`` (full wire layouts)."""
    replica = core.empty_state(state.owner, state.name)
    wire_bytes = deltas = 0
    while replica.summary() != state.summary():
        d = core.delta(state, replica.summary(), max_records=chunk)
        wire_bytes += len(wire.encode_delta(d))
        deltas += 1
        replica = core.merge(replica, d)
    return wire_bytes, deltas


def measure(records: int, batch: int, size: int, chunk: int) -> dict[str, float]:
    owner = Identity.generate()
    payload = os.urandom(size)
    state = core.empty_state(owner.public_key, "bench")
    for index in range(records // batch):
        batch_records = [Record(value=payload, timestamp=index) for _ in range(batch)]
        state = core.commit(state, owner, now_ms=index, records=batch_records)
        # The daemon's store keeps checkpoints ~1000 records apart (storage/batch.py): so does this.
        thinned = thin_checkpoints(state.checkpoints, state.held_end - state.start, float(size))
        state = dataclasses.replace(state, checkpoints=thinned)
    versions = state.version
    wire_bytes, deltas = catch_up(state, chunk)

    qid = queue_id(owner.public_key, "bench")
    leaves = [(os.urandom(32), i) for i in range(versions)]
    started = time.perf_counter()
    fold(genesis(qid, 0), leaves)
    fold_s = time.perf_counter() - started

    log_bytes = LEAF_SIZE * versions
    extra = LEAF_SIZE * max(versions - 1, 0) + (HEAD2_SIZE - HEAD_V1_SIZE) * deltas
    return {
        "versions": versions,
        "deltas": deltas,
        "catch_up_bytes": wire_bytes,
        "log_kept_bytes": log_bytes,
        "v2_extra_catch_up_bytes": extra,
        "extra_pct": 100.0 * extra / wire_bytes,
        "fold_ms": fold_s * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[10_000, 1])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--chunk", type=int, default=4096, help="records per catch-up chunk (replication)")
    args = parser.parse_args()
    for batch in args.batch:
        result = measure(args.records, batch, args.size, args.chunk)
        print(f"{args.records} records of {args.size} B in batches of {batch}:")
        for name, value in result.items():
            print(f"  {name:26} {value:,.1f}" if isinstance(value, float) else f"  {name:26} {value:,}")


if __name__ == "__main__":
    main()
