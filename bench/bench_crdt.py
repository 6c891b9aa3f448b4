"""Sign and verify+merge throughput of the signed queue lattice, against per-record signatures.

Usage: python bench/bench_crdt.py [--records N] [--batch B] [--size BYTES]
Prints records/s for batched signing (one head per batch) and for verify+merge of the same batches on a
replica, next to a baseline run in the same process that signs and verifies every record on its own.
"""

from __future__ import annotations

import argparse
import os
import time

from latticed.crdt import queue as core
from latticed.crdt import wire
from latticed.crdt.records import Record, encode_record
from latticed.crdt.signing import Identity, verify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--baseline", type=int, default=20_000, help="records for the per-record baseline")
    args = parser.parse_args()

    owner = Identity.generate()
    payload = os.urandom(args.size)
    batches = [
        [Record(value=payload, key=None, timestamp=b) for _ in range(args.batch)]
        for b in range(args.records // args.batch)
    ]
    total = len(batches) * args.batch

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
