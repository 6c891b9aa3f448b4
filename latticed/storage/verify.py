"""Re-verifying stored data: everything on disk can be checked again against the owner's signatures.

The store keeps the signed heads (head, tip, checkpoints) and every record's chain value, so a queue can
be re-checked at any time, from any connection: every head against the owner's key, and the hash chain
recomputed from the signed base hash through every record up to the signed tip.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

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
    ends = {c.end: c.head_hash for c in state.checkpoints}
    held = (state.base_hash, state.start, state.held_end)
    missed = "the signed checkpoint at {} does not match"
    current = chain_walk(conn, q, label=label, held=held, ends=ends, chunk=chunk, missed=missed)
    if state.tip is not None and current != state.tip.head_hash:
        raise StorageError(f"{label}: records do not hash to the signed tip")
    return state.held_end - state.start


def chain_walk(
    conn: sqlite3.Connection,
    q: int,
    *,
    label: str,
    held: tuple[bytes, int, int],
    ends: Mapping[int, bytes],
    chunk: int,
    missed: str,
) -> bytes:
    """Recompute the hash chain of queue ``q``'s stored records from ``held`` (the base's chain value,
    the first offset, the end), ``chunk`` records at a time, and raise StorageError (``label``: what) where
    it is not the stored chain values or misses a signed head's value in ``ends`` (by the offset it ends
    at; ``missed`` says so, formatted with that offset). The chain value at the end (the base's if none).
    One walk for both queue versions: only which heads sign ends differs."""
    current, offset, end = held
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
                raise StorageError(f"{label}: {missed.format(offset + i + 1)}")
        current, offset = chain[-1], hi
    return current


__all__ = ["chain_walk", "verify_queue"]
