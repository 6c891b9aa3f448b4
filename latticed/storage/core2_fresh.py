"""A fresh replica's new core-2 queues, placed straight from their verified first delta and written
together (issue 28, "many queues": a replica catching up thousands of queues it holds none of).

The generic merge (:class:`~latticed.storage.core2_jobs.Merge2`) joins a delta into the empty value of a
queue it does not hold, creates the queue, joins again against the created value, and writes the
difference queue by queue. A delta that is :func:`placeable` (verified against that empty value exactly
as before: nothing here skips or weakens a check) is the new queue's value once laid on it
(:func:`as_queue`: the same value that join gives, built once), and a group commit writes such queues
together (:func:`write_new`: one statement a table for all of them, in the batch's transaction), where
the generic path wrote each through :func:`core2_store.persist`. What is stored is what that path stores.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import replace
from typing import cast

from latticed.crdt.epochs import Chains
from latticed.crdt.head2 import HeadV2
from latticed.crdt.lazy_bodies import LazyDecoded, appended
from latticed.crdt.queue.state import EntryView
from latticed.crdt.queue2 import QueueState2, Verified
from latticed.crdt.queue2.chain_state import bodies_between
from latticed.crdt.records import Record
from latticed.storage import core2_bodies, core2_leaves, core2_store
from latticed.storage.entries import RowSource, StoredEntries
from latticed.storage.store import Store

__all__ = ["as_queue", "placeable", "writable", "write_new"]


def placeable(state: QueueState2, v: Verified) -> bool:
    """Whether ``v`` (verified against ``state``, the empty value of a queue this replica holds none of)
    is placed as the new queue's value as it is: records from the owner's start on, of ``state``'s epoch,
    on one unforked branch (so the join keeps none of ours and sets nothing aside as evidence)."""
    chains = v.chains
    return (
        len(state.entries) == 0
        and not state.chains.tips
        and bool(v.records)
        and len(chains.tips) == 1
        and not chains.forked
        and chains.epoch == state.chains.epoch
        and v.from_offset == chains.start
        and v.from_offset + len(v.records) <= chains.tips[0].head.end
    )


def _between(bodies: Sequence[HeadV2], lo: int, hi: int) -> Sequence[HeadV2]:
    """The bodies ending in ``(lo, hi]``; a decode's run inside them kept whole (as the join keeps it)."""
    if type(bodies) is LazyDecoded and len(bodies) and bodies[0].end > lo and bodies[-1].end <= hi:
        return bodies
    return bodies_between(bodies, lo, hi)


def as_queue(rows: RowSource, q: int, state: QueueState2, v: Verified) -> QueueState2:
    """The new queue ``q``'s value from a :func:`placeable` ``v``: ``join_verified(state, v).state``,
    its records a stored run of ``q`` (empty on disk) with ``v``'s records appended, built without a join."""
    c = v.chains
    lo, end = v.from_offset, v.from_offset + len(v.records)
    entries = StoredEntries(rows, q, lo, 0).extend(v.records, v.chain)
    chains = Chains(c.owner, c.queue_id, c.epoch, c.shared, c.tips, c.start_head, end)
    bodies = appended((), _between(v.bodies, lo, end))
    return QueueState2(state.owner, state.name, state.kind, chains, v.meta, cast(EntryView, entries), bodies)


def writable(store: Store, q: int, state: QueueState2) -> bool:
    """Whether :func:`write_new` writes ``state`` as new queue ``q``'s value: its records a run of ``q``
    on this store with nothing on disk yet, one unforked branch (later jobs of the batch may have changed
    what :func:`as_queue` staged: anything else is written by the generic path)."""
    entries: object = state.entries
    chains = state.chains
    return (
        type(entries) is StoredEntries
        and entries.source is store.rows
        and entries.q == q
        and entries.stored == 0
        and entries.lo == chains.start
        and len(chains.tips) == 1
        and not chains.forked
    )


def write_new(
    store: Store, new: Sequence[tuple[int, QueueState2, int]], appended: Container[int]
) -> list[QueueState2]:
    """Write new queues (``new``: q, a :func:`writable` value, created ms) in the caller's transaction:
    their rows, records (with the time index), bodies and leaves, one statement a table for all of them
    (the rows :func:`core2_store.persist` writes for each from an empty value); returns each value
    reading its records from the store. ``appended``: the queues whose first value was placed from
    where their empty run begins (:meth:`Store.append_new`: the generic path appended their records to
    that run, and replaced it for the others: what the store compacts next depends on which)."""
    core2_store.insert_many(store, new)
    bodies: list[tuple[object, ...]] = []
    leaves: list[tuple[object, ...]] = []
    runs: list[tuple[int, int, Sequence[Record], tuple[bytes, ...], bool]] = []
    for q, state, _ in new:
        used: core2_bodies.Used = []  # bodies stored as steps: their leaves too
        # (slices from 0, as persist's diff against no bodies and no leaves hands them on)
        bodies += [(q, *row) for row in core2_bodies.runs(state.bodies[0:], state.chain_at, used)]
        leaves += [(q, *row) for row in core2_leaves.rows(0, state.chains.shared[0:], used)]
        entries = cast(StoredEntries, state.entries)
        runs.append((q, entries.lo, *entries.overlay, q in appended))
    conn = store.connection
    conn.executemany(
        "INSERT INTO bodies2 (q, end_off, version, last_end, last_version, steps_from, bodies) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        bodies,
    )
    conn.executemany(
        "INSERT INTO leaves2 (q, idx, steps_from, steps_to, leaves) VALUES (?, ?, ?, ?, ?)", leaves
    )
    store.append_new(runs)
    return [
        replace(state, entries=cast(EntryView, cast(StoredEntries, state.entries).flushed()))
        for _, state, _ in new
    ]
