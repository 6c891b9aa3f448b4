"""What v2 heads' log costs (docs/lattice.md, "Forks"), against today's catch-up of the same queue.

Usage: python bench/bench_fork_log.py [--records N] [--batch B ...] [--size BYTES] [--chunk R]
For each batch size: the owner signs N records in batches of B (one head per batch, and one per MiB),
a fresh replica catches up through today's deltas (``max_records`` per chunk, full wire layouts), and
the script prints those bytes next to what v2 adds: the log a replica keeps (one 40-byte leaf per
version), what a fresh replica receives once (the leaves; or, since it holds the records, only each
head's end and timestamp steps, from which it rebuilds the bodies: :func:`compact_log`), the larger
head in every delta, and the time to rebuild and fold the whole log.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import os
import struct
import time

from latticed.crdt import queue as core
from latticed.crdt import wire
from latticed.crdt.head2 import HEAD2_BODY, HEAD2_NAMESPACE, HEAD2_SIZE, LEAF_SIZE, HeadV2, next_log
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


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def compact_log(heads: list[HeadV2]) -> bytes:
    """What a delta carries per version past the first when the receiver holds the records: the end and
    timestamp steps, and a flag byte (with the new start, or metadata version and hash, when they change).
    The receiver takes the chain values at start and end from the records it verified."""
    out = bytearray()
    for prev, head in itertools.pairwise(heads):
        flags = (head.start != prev.start) | (head.meta_version != prev.meta_version) << 1
        out += bytes([flags]) + _varint(head.end - prev.end) + _varint(head.timestamp - prev.timestamp)
        if flags & 1:
            out += _varint(head.start - prev.start)
        if flags & 2:
            out += _varint(head.meta_version) + head.meta_hash
    return bytes(out)


def _steps(raw: bytes) -> list[tuple[int, int, int]]:
    """Decode :func:`compact_log`: (end step, timestamp step, start step) per version."""
    out, at = [], 0
    while at < len(raw):
        flags, at = raw[at], at + 1
        fields = []
        for _ in range(2 + (flags & 1)):
            value = shift = 0
            while True:
                byte, at = raw[at], at + 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            fields.append(value)
        if flags & 2:  # not taken by this bench's queues (no metadata changes)
            raise NotImplementedError
        out.append((fields[0], fields[1], fields[2] if flags & 1 else 0))
    return out


def rebuild(first: HeadV2, raw: bytes, state: core.QueueState) -> bytes:
    """The newest head's ``log``, rebuilt from the first head, :func:`compact_log` and the records: the
    body of each version packed from the steps and the chain values, hashed, and folded in."""
    pack, end_bytes, blake = HEAD2_BODY.pack, struct.Struct(">Q").pack, hashlib.blake2b
    qid, epoch, version, log = first.queue_id, first.epoch, first.version, first.log
    start, end, timestamp = first.start, first.end, first.timestamp
    base, mv, mh = first.base_hash, first.meta_version, first.meta_hash
    top = first.head_hash
    for end_step, time_step, start_step in _steps(raw):
        body = HEAD2_NAMESPACE + pack(qid, epoch, version, log, start, end, base, top, mv, mh, timestamp)
        digest = blake(body, digest_size=32, person=b"latticed.hd2.v1").digest()
        log = blake(log + digest + end_bytes(end), digest_size=32, person=b"latticed.log.v1").digest()
        version, end, timestamp = version + 1, end + end_step, timestamp + time_step
        if start_step:
            start += start_step
            base = state.chain_at(start) or b""
        top = state.chain_at(end) or b""
    return next_log(HeadV2(qid, epoch, version, log, start, end, base, top, mv, mh, timestamp))


def measure(records: int, batch: int, size: int, chunk: int) -> dict[str, float]:
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
    wire_bytes, deltas, merge_s = catch_up(state, chunk)

    # The v2 heads mirror one head per commit (a batch over 1 MiB has more v1 heads: counted as leaves).
    raw = compact_log(heads)
    started = time.perf_counter()
    assert rebuild(heads[0], raw, state) == next_log(heads[-1])
    rebuild_s = time.perf_counter() - started
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
    args = parser.parse_args()
    for batch in args.batch:
        result = measure(args.records, batch, args.size, args.chunk)
        print(f"{args.records} records of {args.size} B in batches of {batch}:")
        for name, value in result.items():
            print(f"  {name:28} {value:,.1f}" if isinstance(value, float) else f"  {name:28} {value:,}")


if __name__ == "__main__":
    main()
