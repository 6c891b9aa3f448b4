"""Sign and verify+merge throughput of the signed queue lattice, against per-record signatures.

Usage: python bench/bench_crdt.py [--records N] [--batch B] [--size BYTES] [--core 1|2|both] [--rounds R]
Prints records/s for batched signing (one head per batch) and for verify+merge of the same batches on a
replica, next to a baseline run in the same process that signs and verifies every record on its own.

``--core 2`` / ``--core both``: the same records, batches and operations per fork core instead (commit,
delta, encode, decode, verify_delta, join_verified; core 1 is :mod:`latticed.crdt.queue`, core 2
:mod:`latticed.crdt.queue2` with its link encoding, without the steps the link may send in place of head
bodies), ``--rounds`` runs of each alternated in this process (1, 2, 1, 2...): records/s per operation,
and with ``both`` the median of each round's ratio core 2 ÷ core 1 of the time per operation.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

from latticed.crdt import queue as core
from latticed.crdt import queue2, wire
from latticed.crdt.records import Record, encode_record
from latticed.crdt.signing import Identity, verify
from latticed.protocol import core2_wire

OPS = ("commit", "delta", "encode", "decode", "verify_delta", "join_verified")


def _add(spent: dict[str, float], stamps: list[float]) -> None:
    for op, (t0, t1) in zip(OPS, itertools.pairwise(stamps), strict=True):
        spent[op] += t1 - t0


def run_core1(owner: Identity, batches: list[list[Record]]) -> tuple[dict[str, float], int]:
    """Seconds per operation over all batches, and wire bytes, on the core-1 lattice."""
    spent = dict.fromkeys(OPS, 0.0)
    state = core.empty_state(owner.public_key, "bench")
    replica = core.empty_state(owner.public_key, "bench")
    size = 0
    clock = time.perf_counter
    for index, batch in enumerate(batches):
        before = state.summary()
        t0 = clock()
        state = core.commit(state, owner, now_ms=index, records=batch)
        t1 = clock()
        d = core.delta(state, before)
        t2 = clock()
        raw = wire.encode_delta(d)
        t3 = clock()
        got = wire.decode_delta(raw)
        t4 = clock()
        v = core.verify_delta(replica, got)
        t5 = clock()
        replica = core.join_verified(replica, v)
        _add(spent, [t0, t1, t2, t3, t4, t5, clock()])
        size += len(raw)
    end = state.held_end
    assert replica.held_end == end and replica.chain_at(end) == state.chain_at(end), "core 1 diverged"
    return spent, size


def run_core2(owner: Identity, batches: list[list[Record]]) -> tuple[dict[str, float], int]:
    """Seconds per operation over all batches, and wire bytes, on the core-2 lattice."""
    spent = dict.fromkeys(OPS, 0.0)
    state = queue2.empty_state(owner.public_key, "bench")
    replica = queue2.empty_state(owner.public_key, "bench")
    size = 0
    clock = time.perf_counter
    for index, batch in enumerate(batches):
        before = queue2.summary(state)
        t0 = clock()
        state = queue2.commit(state, owner, now_ms=index, records=batch)
        t1 = clock()
        d = queue2.delta(state, before)
        t2 = clock()
        raw = wire.pack(core2_wire.delta_to_wire(d))
        t3 = clock()
        got, _ = core2_wire.delta_from_wire(wire.unpack(raw))
        t4 = clock()
        v = queue2.verify_delta(replica, got)
        t5 = clock()
        replica = queue2.join_verified(replica, v).state
        _add(spent, [t0, t1, t2, t3, t4, t5, clock()])
        size += len(raw)
    end = state.held[1]
    assert replica.held == state.held and replica.chain_at(end) == state.chain_at(end), "core 2 diverged"
    return spent, size


def compare(owner: Identity, batches: list[list[Record]], cores: str, rounds: int, size: int) -> None:
    """Each core's operations on the same batches, alternated ``rounds`` times; medians and ratios."""
    total = sum(len(b) for b in batches)
    runs: dict[str, list[dict[str, float]]] = {"1": [], "2": []}
    wire_bytes: dict[str, int] = {}
    order = ["1", "2"] if cores == "both" else [cores]
    for _ in range(rounds):
        for c in order:
            spent, wire_bytes[c] = (run_core1 if c == "1" else run_core2)(owner, batches)
            spent["total"] = sum(spent.values())
            runs[c].append(spent)
    print(f"per operation, {total:,} x {size} B in batches of {len(batches[0])}, {rounds} rounds alternated:")
    head = "operation      " + "".join(f"  core {c} records/s" for c in order)
    print(head + ("  core 2 ÷ core 1 time (median of rounds; min, max)" if len(order) == 2 else ""))
    for op in (*OPS, "total"):
        rates = [total / statistics.median(r[op] for r in runs[c]) for c in order]
        line = f"{op:<15}" + "".join(f"{rate:>18,.0f}" for rate in rates)
        if len(order) == 2:
            ratios = [b[op] / a[op] for a, b in zip(runs["1"], runs["2"], strict=True)]
            line += f"  {statistics.median(ratios):6.3f} ({min(ratios):.3f}, {max(ratios):.3f})"
        print(line)
    for c in order:
        print(f"core {c}: wire bytes per record {wire_bytes[c] / total:.1f} (payload {size})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--baseline", type=int, default=20_000, help="records for the per-record baseline")
    parser.add_argument("--core", choices=("1", "2", "both"), default=None, help="per-operation figures")
    parser.add_argument("--rounds", type=int, default=3, help="with --core: runs of each, alternated")
    args = parser.parse_args()

    owner = Identity.generate()
    payload = os.urandom(args.size)
    batches = [
        [Record(value=payload, key=None, timestamp=b) for _ in range(args.batch)]
        for b in range(args.records // args.batch)
    ]
    total = len(batches) * args.batch
    if args.core is not None:
        compare(owner, batches, args.core, args.rounds, args.size)
        return

    state = core.empty_state(owner.public_key, "bench")
    deltas = []
    started = time.perf_counter()
    for index, batch in enumerate(batches):
        before = state.summary()
        state = core.commit(state, owner, now_ms=index, records=batch)
        deltas.append(core.delta(state, before))
    sign_s = time.perf_counter() - started

    encoded = [wire.encode_delta(d) for d in deltas]
    wire_bytes = sum(len(e) for e in encoded)

    replica = core.empty_state(owner.public_key, "bench")
    started = time.perf_counter()
    for raw in encoded:
        replica = core.merge(replica, wire.decode_delta(raw))
    verify_s = time.perf_counter() - started
    assert replica == state, "replica did not converge"

    # Baseline: one Ed25519 signature per record, verified one by one.
    sample = [(Record(value=payload, timestamp=i), i) for i in range(args.baseline)]
    started = time.perf_counter()
    signatures = [owner.sign(encode_record(r, off)) for r, off in sample]
    base_sign_s = time.perf_counter() - started
    started = time.perf_counter()
    for (record, off), signature in zip(sample, signatures, strict=True):
        verify(owner.public_key, encode_record(record, off), signature)
    base_verify_s = time.perf_counter() - started

    sign_rate, verify_rate = total / sign_s, total / verify_s
    base_sign, base_verify = args.baseline / base_sign_s, args.baseline / base_verify_s
    print(f"records: {total} x {args.size} B in batches of {args.batch}")
    print(f"batched sign (hash chain + 1 signature/batch): {sign_rate:,.0f} records/s")
    print(f"decode + verify + merge on a replica:          {verify_rate:,.0f} records/s")
    print(f"wire bytes per record: {wire_bytes / total:.1f} (payload {args.size})")
    print(
        f"baseline per-record sign:   {base_sign:,.0f} records/s  -> batched is {sign_rate / base_sign:.1f}x"
    )
    ratio = verify_rate / base_verify
    print(f"baseline per-record verify: {base_verify:,.0f} records/s -> batched is {ratio:.1f}x")


if __name__ == "__main__":
    main()
