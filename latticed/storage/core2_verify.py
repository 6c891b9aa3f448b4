"""Re-verifying a stored core-2 queue: its heads and leaves against the owner's key, and its records'
hash chain, recomputed from the start head's base, against every stored chain value and every head body
that ends inside the held range (what a ``latticed verify`` or ``doctor`` pass will run on core 2)."""

from __future__ import annotations

import sqlite3

from latticed.crdt import epochs
from latticed.crdt.epoch_delta import vouches
from latticed.crdt.queue2 import QueueState2
from latticed.errors import StorageError
from latticed.storage.verify import chain_walk

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
    missed = "records do not hash to the head ending at {}"
    chain_walk(
        conn, q, label=label, held=(state.base_hash, offset, end), ends=ends, chunk=chunk, missed=missed
    )
    return end - offset
