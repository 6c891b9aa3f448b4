"""What v2 heads' log costs (docs/lattice.md, "Forks"), against today's catch-up of the same queue.

Usage: python bench/bench_fork_log.py [--records N] [--batch B ...] [--size BYTES] [--chunk R]
For each batch size: the owner signs N records in batches of B (one head per batch, and one per MiB),
a fresh replica catches up through today's deltas (``max_records`` per chunk, full wire layouts), and
the script prints those bytes next to what v2 adds: the log a replica keeps (one 40-byte leaf per
version), what a fresh replica receives once (the leaves; or, since it holds the records, only each
head's steps, from which it rebuilds the bodies: ``crdt/leaf_codec.py``), the larger head in every
delta, and the time to rebuild and fold the whole log.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from latticed.crdt import leaf_codec, wire
from latticed.crdt import queue as core
from latticed.crdt.head2 import HEAD2_SIZE, LEAF_SIZE, HeadV2, fold, next_log
from latticed.crdt.queue.v2heads import sign_v2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.storage.batch import thin_checkpoints

HEAD_V1_SIZE = 256


def catch_up(state: core.QueueState, chunk: int) -> tuple[int, int, float]:
    """Bytes and deltas a fresh replica receives from ``state`` (full wire layouts), and the seconds it
    takes to decode, verify and merge them."""
    replica = core.empty_state(state.owner, state.name)
    wire_bytes = deltas = 0
    spent = 0.0
    while replica.summary() != state.summary():
        raw = wire.encode_delta(core.delta(state, replica.summary(), max_records=chunk))
        wire_bytes += len(raw)
        deltas += 1
        started = time.perf_counter()
        replica = core.merge(replica, wire.decode_delta(raw))
        spent += time.perf_counter() - started
    return wire_bytes, deltas, spent


def measure(records: int, batch: int, size: int, chunk: int, repeat: int) -> dict[str, float]:
    owner = Identity.generate()
    payload = os.urandom(size)
    state = core.empty_state(owner.public_key, "bench")
    heads: list[HeadV2] = []
    for index in range(records // batch):
        batch_records = [Record(value=payload, timestamp=index) for _ in range(batch)]
        state = core.commit(state, owner, now_ms=index, records=batch_records)
        heads.append(sign_v2(state, owner, heads[-1] if heads else None))
        # The daemon's store keeps checkpoints ~1000 records apart (storage/batch.py): so does this.
        thinned = thin_checkpoints(state.checkpoints, state.held_end - state.start, float(size))
        state = dataclasses.replace(state, checkpoints=thinned)
    versions = state.version
    runs = [catch_up(state, chunk) for _ in range(repeat)]
    wire_bytes, deltas, merge_s = runs[0][0], runs[0][1], min(run[2] for run in runs)

    # The v2 heads mirror one head per commit (a batch over 1 MiB has more v1 heads: counted as leaves).
    raw = leaf_codec.encode(heads[0], heads[1:-1])
    # The receiver has the chain values of the records it just verified (chain_extend returns them).
    lo, hi = state.start, state.held_end
    chains = [state.chain_at(offset) for offset in range(lo, hi + 1)]

    def chain_at(offset: int) -> bytes | None:
        return chains[offset - lo] if lo <= offset <= hi else None

    rebuild_s = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        leaves = leaf_codec.decode(heads[0], raw, chain_at)
        assert fold(next_log(heads[0]), leaves) == heads[-1].log
        rebuild_s = min(rebuild_s, time.perf_counter() - started)
    per_version = len(raw) / max(len(heads) - 1, 1)

    plain = LEAF_SIZE * max(versions - 1, 0) + (HEAD2_SIZE - HEAD_V1_SIZE) * deltas
    compact = int(per_version * max(versions - 1, 0)) + (HEAD2_SIZE - HEAD_V1_SIZE) * deltas
    return {
        "versions": versions,
        "deltas": deltas,
        "catch_up_bytes": wire_bytes,
        "catch_up merge ms": merge_s * 1000,
        "log_kept_bytes (40 B/leaf)": LEAF_SIZE * versions,
        "v2_extra, leaves sent": plain,
        "v2_extra, leaves sent %": 100.0 * plain / wire_bytes,
        "v2_extra, bodies rebuilt": compact,
        "v2_extra, bodies rebuilt %": 100.0 * compact / wire_bytes,
        "rebuild+fold ms": rebuild_s * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[10_000, 1])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--chunk", type=int, default=4096, help="records per catch-up chunk (replication)")
    parser.add_argument("--repeat", type=int, default=3, help="timings are the best of this many runs")
    args = parser.parse_args()
    for batch in args.batch:
        result = measure(args.records, batch, args.size, args.chunk, args.repeat)
        print(f"{args.records} records of {args.size} B in batches of {batch}:")
        for name, value in result.items():
            print(f"  {name:28} {value:,.1f}" if isinstance(value, float) else f"  {name:28} {value:,}")


if __name__ == "__main__":
    main()
