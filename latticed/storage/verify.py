"""Re-verifying stored data: everything on disk can be checked again against the owner's signatures.

The store keeps the signed heads (head, tip, checkpoints) and every record's chain value, so a queue can
be re-checked at any time, from any connection: every head against the owner's key, and the hash chain
recomputed from the signed base hash through every record up to the signed tip.
"""

from __future__ import annotations

import sqlite3

from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record, chain_extend
from latticed.errors import StorageError
from latticed.storage import segments

CHUNK = 10_000


def verify_queue(conn: sqlite3.Connection, q: int, state: QueueState, chunk: int = CHUNK) -> int:
    """Raise IntegrityError (a head) or StorageError (the records) unless queue ``q`` as stored matches
    ``state``'s signed heads; returns how many records were checked. Reads ``chunk`` records at a time."""
    label = f"queue {state.owner.hex()}/{state.name}"
    qid = state.queue_id
    for head in (state.head, state.tip, *state.checkpoints):
        if head is not None:
            head.verify(state.owner, qid)
    current = state.base_hash
    offset = state.start
    ends = {c.end: c.head_hash for c in state.checkpoints}
    end = state.held_end
    while offset < end:
        hi = min(offset + chunk, end)
        batch: list[Record] = []
        stored_chains: list[bytes] = []
        for segment in segments.scan(conn, q, offset, hi):
            part = segment.slice(offset, hi)
            batch.extend(part.records(part.first, part.end))
            stored_chains.extend(part.chain(o) for o in range(part.first, part.end))
        chains = chain_extend(current, offset, batch)
        if len(batch) != hi - offset or chains != stored_chains:
            raise StorageError(f"{label}: records [{offset}, {hi}) do not match their stored chain values")
        for i, value in enumerate(chains):
            expected = ends.get(offset + i + 1)
            if expected is not None and expected != value:
                raise StorageError(f"{label}: the signed checkpoint at {offset + i + 1} does not match")
        current = chains[-1]
        offset = hi
    if state.tip is not None and current != state.tip.head_hash:
        raise StorageError(f"{label}: records do not hash to the signed tip")
    return end - state.start


__all__ = ["verify_queue"]
