"""Stores of an older schema holding core-2 queues as that schema laid them, for the migration tests:
the queue's row and its entries are the same in every schema since core 2 came; the leaves and bodies
rows are each schema's own and stay in its test."""

from __future__ import annotations

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.storage import core2_store
from latticed.storage.entries import StoredEntries
from latticed.storage.store import Store


def queue_rows(store: Store, q: int, state: QueueState2, now_ms: int) -> None:
    """Begin a transaction and write ``state``'s queue row (number ``q``) and entries into it."""
    empty = queue2.empty_state(state.owner, state.name, state.kind)
    store.begin()
    core2_store.insert_many(store, [(q, empty, now_ms)])
    store.write_entries(q, StoredEntries(store.rows, q, 0, 0), state.entries, state.held[0])
    c = state.chains
    assert c.start_head is not None
    store.connection.execute(
        "UPDATE queue2 SET epoch = ?, held_end = ?, start_head = ?, tips = ?, meta = ? WHERE q = ?",
        (
            c.epoch,
            c.held_end,
            c.start_head.to_bytes(),
            core2_store._encode_tips(c.tips),
            core2_store.encode_meta(state.meta),
            q,
        ),
    )
