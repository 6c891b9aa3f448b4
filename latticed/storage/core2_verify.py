"""Re-verifying a stored core-2 queue: its heads and leaves against the owner's key, and its records'
hash chain, recomputed from the start head's base, against every stored chain value and every head body
that ends inside the held range (what a ``latticed verify`` or ``doctor`` pass will run on core 2)."""

from __future__ import annotations

import sqlite3

from latticed.crdt import epochs
from latticed.crdt.epoch_delta import vouches
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, chain_extend
from latticed.errors import StorageError
from latticed.storage import segments

__all__ = ["verify_queue2"]

CHUNK = 10_000


def verify_queue2(conn: sqlite3.Connection, q: int, state: QueueState2, chunk: int = CHUNK) -> int:
    """Raise IntegrityError (heads, leaves) or StorageError (records, bodies) unless queue ``q`` as
    stored matches ``state``; returns how many records were checked. Reads ``chunk`` records at a time."""
    label = f"queue {state.owner.hex()}/{state.name}"
    epochs.verify(state.chains)
    ends: dict[int, bytes] = {}
    for body in state.bodies:
        if not vouches(state.chains, body):
            raise StorageError(f"{label}: a stored head body (version {body.version}) is not on its log")
        ends[body.end] = body.head_hash
    offset, end = state.held
    current = state.base_hash
    while offset < end:
        hi = min(offset + chunk, end)
        batch: list[Record] = []
        stored: list[bytes] = []
        for segment in segments.scan(conn, q, offset, hi):
            part = segment.slice(offset, hi)
            batch.extend(part.records(part.first, part.end))
            stored.extend(part.chain(o) for o in range(part.first, part.end))
        chain = chain_extend(current, offset, batch)
        if len(batch) != hi - offset or chain != stored:
            raise StorageError(f"{label}: records [{offset}, {hi}) do not match their stored chain values")
        for i, value in enumerate(chain):
            if ends.get(offset + i + 1, value) != value:
                raise StorageError(f"{label}: records do not hash to the head ending at {offset + i + 1}")
        current, offset = chain[-1], hi
    return end - state.held[0]
