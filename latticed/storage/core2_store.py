"""Core-2 queues (:mod:`latticed.crdt.queue2`) in the store: loading a value and writing what changed.

A core-2 queue has a ``queues`` row (``core = 2``: its number, id, owner, name and kind, as any queue) and
its records in ``segments`` (the record chain is the same in both cores, so they are read through
:class:`~latticed.storage.entries.StoredEntries` and written by :meth:`Store.write_entries`). The rest of
its value:

* ``queue2``: one row, rewritten by each change: epoch, held end, the start head, the tips (each branch's
  newest head and, when forked, its leaves past the shared ones) and the start head's metadata.
* ``leaves2``: the shared leaves, in runs keyed ``(q, index of the first)``
  (:mod:`latticed.storage.core2_runs`): a commit adds one run of one leaf (the previous head's), a
  replica's merge one run per 4,096, since schema 8 the steps of its bodies where those give them
  (:mod:`latticed.storage.core2_leaves`); truncation keeps them (the log vouches for every version). They are
  diffed by their common prefix: two verified logs that hold the same leaf at one index hold the same
  leaves below it (the leaf's body signs the fold of them), so the prefix is found by a binary search, and
  an append costs one comparison and one insert (:func:`core2_leaves.common`: none where the new leaves
  extend the stored value's own list, :func:`~latticed.crdt.shared_prefix.extends`); a cut inside a run
  rewrites that run.
* ``bodies2``: the unsigned heads vouching for held records, in runs ordered by ``(end, version)``; a
  commit adds a run of one, a merge a run per 4,096, a truncation deletes the runs below the new start
  (and rewrites the one it cuts).
* ``evidence2``: records this replica held past a fork point it learned of, kept aside (never part of
  the value), at most :data:`EVIDENCE_MAX_RECORDS` records and :data:`EVIDENCE_MAX_BYTES` bytes per queue:
  the ones nearest the fork point are kept, the rest are counted in ``queue2.evidence_dropped``.

Opening the store reads only each core-2 queue's ``queues`` row (:func:`index`); its leaves and bodies
are read when the queue is first used (:func:`load`), by one range scan each.
"""

from __future__ import annotations

import bisect
import functools
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final, cast

from latticed.crdt import lazy_bodies
from latticed.crdt.epochs import Chains, Tip
from latticed.crdt.head import genesis_hash
from latticed.crdt.head2 import HEAD2_BODY, HEAD2_NAMESPACE, HeadV2
from latticed.crdt.queue.state import EntryView, empty_entries
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.wire import records_from_wire, records_to_wire
from latticed.errors import StorageError
from latticed.storage import core2_bodies, core2_leaves, core2_runs, segments
from latticed.storage.codec import encode_meta, pack, unpack
from latticed.storage.core2_bodies import decode_body
from latticed.storage.corruption import StoreFile, check_held, decode_signed_meta
from latticed.storage.entries import StoredEntries
from latticed.storage.store import Store

__all__ = [
    "CORE2",
    "EVIDENCE_MAX_BYTES",
    "EVIDENCE_MAX_RECORDS",
    "Evidence",
    "Queue2Row",
    "add_evidence",
    "adopt",
    "drop",
    "evidence",
    "index",
    "insert_many",
    "load",
    "persist",
]

#: ``queues.core`` of a queue on the v2 fork core.
CORE2: Final = 2
#: Evidence kept per queue at most (records, and bytes of keys and values).
EVIDENCE_MAX_RECORDS: Final = 10_000
EVIDENCE_MAX_BYTES: Final = 16 << 20
_BODY_SIZE: Final = len(HEAD2_NAMESPACE) + HEAD2_BODY.size


@dataclass(frozen=True, slots=True)
class Queue2Row:
    """What opening the store reads of a core-2 queue (its value is loaded on first use)."""

    q: int
    queue_id: bytes
    owner: bytes
    name: str
    kind: int
    created_ms: int


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a queue's replica held past fork points it learned of: ``(epoch, first offset, records)``
    pieces by offset, and how many records the bound left out."""

    pieces: tuple[tuple[int, int, tuple[Record, ...]], ...]
    dropped: int

    def records(self, epoch: int) -> list[Record]:
        """The kept records of ``epoch`` in offset order (what ``recover --keep-mine`` offers again)."""
        return [r for e, _, records in self.pieces if e == epoch for r in records]


# ---------------------------------------------------------------------- encodings
def encode_body(body: HeadV2) -> bytes:
    """A head as stored: its signed bytes, and its signature when it has one."""
    return body.to_bytes()


def _encode_tips(tips: tuple[Tip, ...]) -> bytes:
    return pack([[tip.head.to_bytes(), [[digest, end] for digest, end in tip.tail]] for tip in tips])


def _decode_tips(raw: bytes) -> tuple[Tip, ...]:
    return tuple(
        Tip(HeadV2.from_bytes(bytes(head)), tuple((bytes(d), int(e)) for d, e in tail))
        for head, tail in unpack(raw)
    )


# ---------------------------------------------------------------------- reading
def index(store: StoreFile) -> list[Queue2Row]:
    """Every core-2 queue's row (none before schema 5)."""
    if not store.has_cores:
        return []
    try:
        rows = store.connection.execute(
            "SELECT q, qid, owner, name, kind, created_ms FROM queues WHERE core = ? ORDER BY q", (CORE2,)
        ).fetchall()
    except sqlite3.Error as exc:
        raise store.error(exc, "load the queues from") from exc
    return [Queue2Row(r[0], bytes(r[1]), bytes(r[2]), r[3], r[4], r[5]) for r in rows]


def load(store: StoreFile, row: Queue2Row) -> QueueState2:
    """Queue ``row``'s value as stored, its records read lazily from the store."""
    conn, q = store.connection, row.q
    try:
        found = conn.execute(
            "SELECT epoch, held_end, start_head, tips, meta FROM queue2 WHERE q = ?", (q,)
        ).fetchone()
        if found is None:
            raise StorageError(f"store {store.path}: core-2 queue #{q} has no queue2 row")
        epoch, held_end, start_raw, tips_raw, meta = found
        runs = conn.execute(
            "SELECT bodies, steps_from, last_end FROM bodies2 WHERE q = ? ORDER BY end_off, version", (q,)
        ).fetchall()
        stored = segments.bounds(conn, q)
    except sqlite3.Error as exc:
        raise store.error(exc, "load a core-2 queue from") from exc
    start_head = None if start_raw is None else HeadV2.from_bytes(bytes(start_raw))
    label = f"store {store.path}: queue {row.owner.hex()}/{row.name}"
    stored_meta = decode_signed_meta(meta, start_head, label)
    lo = start_head.start if start_head is not None else 0
    base_hash = start_head.base_hash if start_head is not None else genesis_hash(row.queue_id)
    window = core2_bodies.chain_window(conn, q, lo, base_hash)
    memo: core2_bodies.Rebuilt = {}  # runs of leaves and of bodies of the same steps: decoded once
    try:
        shared = core2_leaves.load(conn, q, window, memo)
    except sqlite3.Error as exc:
        raise store.error(exc, "load a core-2 queue from") from exc
    chains = Chains(
        row.owner, row.queue_id, epoch, shared, _decode_tips(bytes(tips_raw)), start_head, held_end
    )
    lo, hi = chains.held
    check_held(stored, (lo, hi), label)
    last = store.rows.chain(q, hi - 1) if hi > lo else None
    entries = StoredEntries(store.rows, q, lo, hi - lo, last)
    # QueueState2 names the in-memory EntryView; the stored view answers the same Entries protocol.
    state = QueueState2(row.owner, row.name, row.kind, chains, stored_meta, cast(EntryView, entries))
    bodies: list[HeadV2] = []
    try:
        for raw, steps_from, last_end in runs:
            if steps_from is None:
                bodies += map(decode_body, core2_runs.read_bodies(bytes(raw)))
            else:
                bodies += core2_bodies.read_run(
                    bytes(raw), functools.partial(window, steps_from, last_end), memo
                )
    except sqlite3.Error as exc:
        raise store.error(exc, "load a core-2 queue from") from exc
    # Runs may interleave (bodies of two branches): sorted (stable, linear when they do not).
    return replace(state, bodies=tuple(sorted(bodies, key=_key)))


def evidence(conn: sqlite3.Connection, q: int) -> Evidence:
    """What queue ``q`` holds as evidence (any connection: a reader's too)."""
    pieces = tuple(
        (epoch, first, tuple(records_from_wire(unpack(bytes(data)))))
        for epoch, first, data in conn.execute(
            "SELECT epoch, first, data FROM evidence2 WHERE q = ? ORDER BY first", (q,)
        )
    )
    row = conn.execute("SELECT evidence_dropped FROM queue2 WHERE q = ?", (q,)).fetchone()
    return Evidence(pieces, 0 if row is None else int(row[0]))


# ---------------------------------------------------------------------- writing (caller's transaction)
def insert_many(store: Store, new: Sequence[tuple[int, QueueState2, int]]) -> None:
    """Add new core-2 queues' rows (``new``: q, value, created ms; the rest written by :func:`persist` or
    :func:`core2_fresh.write_new`): one statement a table, as a fresh replica's batch creates thousands."""
    conn = store.connection
    conn.executemany(
        "INSERT INTO queues (q, qid, owner, name, kind, created_ms, core) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(q, s.queue_id, s.owner, s.name, s.kind, created_ms, CORE2) for q, s, created_ms in new],
    )
    rows = [(q, s.chains, s.chains.start_head, encode_meta(s.meta)) for q, s, _ in new]
    conn.executemany(
        "INSERT INTO queue2 (q, epoch, held_end, start_head, tips, meta) VALUES (?, ?, ?, ?, ?, ?)",
        [(q, c.epoch, c.held_end, h and h.to_bytes(), _encode_tips(c.tips), m) for q, c, h, m in rows],
    )


def adopt(store: Store, q: int, state: QueueState2) -> None:
    """Make core-1 queue ``q`` a core-2 one holding nothing yet (``state`` empty, its entries the core-1
    records as stored): its core-1 heads and checkpoints go, its records stay for :func:`persist` to keep
    or cut. In the caller's transaction with that persist, so a crash leaves either core, never neither."""
    conn = store.connection
    conn.execute(
        "UPDATE queues SET core = ?, head = NULL, tip = NULL, forked = 0, proof = NULL, floor = 0, "
        "floor_hash = NULL WHERE q = ? AND core = 1",
        (CORE2, q),
    )
    conn.execute("DELETE FROM checkpoints WHERE q = ?", (q,))
    c = state.chains
    conn.execute(
        "INSERT INTO queue2 (q, epoch, held_end, start_head, tips, meta) VALUES (?, ?, ?, ?, ?, ?)",
        (q, c.epoch, c.held_end, None, _encode_tips(c.tips), encode_meta(state.meta)),
    )


def persist(store: Store, q: int, old: QueueState2, new: QueueState2) -> tuple[QueueState2, bool]:
    """Write what changed from ``old`` (as stored) to ``new``; returns ``new`` reading its records from
    the store, and whether records were deleted (so space can be reclaimed)."""
    conn = store.connection
    changed = _changed_bodies(old.bodies, new.bodies) if old.bodies is not new.bodies else None
    gone = changed[0] if changed is not None else []
    a, b = old.chains, new.chains
    common = core2_leaves.common(a, b) if a.shared is not b.shared else len(a.shared)
    if old.entries is not new.entries or gone or common < len(a.shared):  # runs of steps read records:
        kept = core2_bodies.appended(old, new)  # rewritten whole while held
        core2_bodies.before_write(conn, q, old, new, gone, kept=kept)
        core2_leaves.before_write(conn, q, old, new, common, kept=kept)
    entries, deleted = store.write_entries(q, old.entries, new.entries, new.held[0])
    written = replace(new, entries=cast(EntryView, entries))
    if a is not b or old.meta is not new.meta:  # by identity: comparing would walk every leaf
        start = None if b.start_head is None else b.start_head.to_bytes()
        conn.execute(
            "UPDATE queue2 SET epoch = ?, held_end = ?, start_head = ?, tips = ?, meta = ? WHERE q = ?",
            (b.epoch, b.held_end, start, _encode_tips(b.tips), encode_meta(new.meta), q),
        )
    used: core2_bodies.Used = []  # bodies stored as steps: their leaves too
    if changed is not None:
        # ``new``'s chain is what was just stored, and answers the records it appended from memory (its
        # overlay), where ``written``'s would read each back from the segment row (a SELECT a body).
        _persist_bodies(conn, q, old.bodies, new.bodies, new.chain_at, used=used, changed=changed)
    if a.shared is not b.shared:
        _persist_leaves(conn, q, a, b, common=common, used=used)
    return written, deleted


def _persist_leaves(
    conn: sqlite3.Connection,
    q: int,
    a: Chains,
    b: Chains,
    *,
    common: int | None = None,
    used: core2_bodies.UsedRuns = (),
) -> None:
    """Cut the old leaves to ``common`` (a run of steps cut is whole already: ``core2_leaves.before_write``)
    and add the new ones, as the steps ``used`` for their bodies where those give them."""
    common = core2_leaves.common(a, b) if common is None else common
    if len(a.shared) > common:
        cut = conn.execute(
            "SELECT idx, leaves, steps_from FROM leaves2 WHERE q = ? AND idx < ? ORDER BY idx DESC LIMIT 1",
            (q, common),
        ).fetchone()
        if cut is not None and cut[2] is not None:
            raise StorageError(f"core-2 queue #{q}: a run of leaves as steps cut before it was rewritten")
        if cut is not None and cut[0] + len(cut[1]) // core2_runs.LEAF_BYTES > common:  # a run cut inside
            keep = bytes(cut[1])[: (common - cut[0]) * core2_runs.LEAF_BYTES]
            conn.execute("UPDATE leaves2 SET leaves = ? WHERE q = ? AND idx = ?", (keep, q, cut[0]))
        conn.execute("DELETE FROM leaves2 WHERE q = ? AND idx >= ?", (q, common))
    if len(b.shared) > common:
        conn.executemany(
            "INSERT INTO leaves2 (q, idx, steps_from, steps_to, leaves) VALUES (?, ?, ?, ?, ?)",
            [(q, *row) for row in core2_leaves.rows(common, b.shared[common:], used)],
        )


def _key(body: HeadV2) -> tuple[int, int]:
    return body.end, body.version


def _changed_bodies(old: Sequence[HeadV2], new: Sequence[HeadV2]) -> tuple[list[HeadV2], Sequence[HeadV2]]:
    """The bodies to delete and to insert. Usual shapes: some dropped at the front (truncation), some
    added or cut at the back (a commit, a merge, a fork point); anything else compares keys. ``new``
    extending ``old``'s very list (:func:`shared_prefix.extends`: a commit's or a live push's bodies)
    is answered without reading what both hold."""
    if lazy_bodies.extends(old, new):  # (a value holding runs not built: a slice keeps them so)
        return [], new[len(old) :]
    at = bisect.bisect_left(old, _key(new[0]), key=_key) if new else len(old)
    m = min(len(old) - at, len(new))
    if new and tuple(old[at : at + m]) == tuple(new[:m]):
        return [*old[:at], *old[at + m :]], new[m:]
    keep = {(_key(b), b.leaf()) for b in new}
    had = {(_key(b), b.leaf()) for b in old}
    return [b for b in old if (_key(b), b.leaf()) not in keep], [
        b for b in new if (_key(b), b.leaf()) not in had
    ]


def _persist_bodies(
    conn: sqlite3.Connection,
    q: int,
    old: Sequence[HeadV2],
    new: Sequence[HeadV2],
    chain_at: Callable[[int], bytes | None] = lambda offset: None,
    *,
    used: core2_bodies.Used | None = None,
    changed: tuple[list[HeadV2], Sequence[HeadV2]] | None = None,
) -> None:
    """Delete and insert the bodies that changed (runs of steps among them rewritten whole already:
    :func:`core2_bodies.before_write`); added ones are stored as their steps where those are certain to
    rebuild them over the queue's chain ``chain_at`` (by default none are). ``changed``: what
    :func:`_changed_bodies` found for these two, if the caller has it (it compares every body held)."""
    gone, added = _changed_bodies(old, new) if changed is None else changed
    if gone:
        _drop_bodies(conn, q, gone)
    if added:
        _insert_bodies(conn, q, core2_bodies.runs(added, chain_at, used))


def _insert_bodies(conn: sqlite3.Connection, q: int, rows: Sequence[core2_bodies.Row]) -> None:
    conn.executemany(
        "INSERT INTO bodies2 (q, end_off, version, last_end, last_version, steps_from, bodies) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(q, *row) for row in rows],
    )


def _drop_bodies(conn: sqlite3.Connection, q: int, gone: Sequence[HeadV2]) -> None:
    """Delete ``gone`` (in key order) from the runs holding them: a run whose bodies all go is deleted,
    one that keeps some is written again without them. Bodies are matched by their signed bytes (the
    leaf names a body by those and its end, which they hold)."""
    dead = {b.body() for b in gone}
    (lo_end, lo_version), (hi_end, hi_version) = min(map(_key, gone)), max(map(_key, gone))
    runs = conn.execute(
        "SELECT rowid, bodies FROM bodies2 WHERE q = ? AND (end_off, version) <= (?, ?) "
        "AND (last_end, last_version) >= (?, ?)",
        (q, hi_end, hi_version, lo_end, lo_version),
    ).fetchall()
    for rowid, raw in runs:
        stored = core2_runs.read_bodies(bytes(raw))
        kept = [body for body in stored if body[:_BODY_SIZE] not in dead]
        if len(kept) < len(stored):
            conn.execute("DELETE FROM bodies2 WHERE rowid = ?", (rowid,))
            if kept:
                _insert_bodies(conn, q, [(*row[:4], None, row[4]) for row in core2_runs.body_runs(kept)])


def add_evidence(store: Store, q: int, epoch: int, first: int, records: Sequence[Record]) -> int:
    """Keep ``records`` (from offset ``first`` of ``epoch``) as evidence within the bound; returns how many
    were kept (the rest are counted as dropped)."""
    conn = store.connection
    count, size = conn.execute(
        "SELECT coalesce(sum(count), 0), coalesce(sum(length(data)), 0) FROM evidence2 WHERE q = ?", (q,)
    ).fetchone()
    room_records, room_bytes = EVIDENCE_MAX_RECORDS - count, EVIDENCE_MAX_BYTES - size
    kept = 0
    for record in records:
        cost = (
            len(record.value) + len(record.key or b"") + sum(len(k) + len(v) for k, v in record.headers) + 16
        )
        if kept >= room_records or cost > room_bytes:
            break
        kept, room_bytes = kept + 1, room_bytes - cost
    if kept:
        data = pack(records_to_wire(list(records[:kept])))
        conn.execute(
            "INSERT OR REPLACE INTO evidence2 (q, first, epoch, count, data) VALUES (?, ?, ?, ?, ?)",
            (q, first, epoch, kept, data),
        )
    if kept < len(records):
        conn.execute(
            "UPDATE queue2 SET evidence_dropped = evidence_dropped + ? WHERE q = ?", (len(records) - kept, q)
        )
    return kept


def drop(store: Store, q: int, state: QueueState2 | None) -> None:
    """Delete core-2 queue ``q`` (stored as ``state``; None: found corrupt, its records as they lie) and
    everything of it: records, leaves, bodies, evidence."""
    conn = store.connection
    lo, hi = segments.bounds(conn, q) or (0, 0) if state is None else state.held
    entries = StoredEntries(store.rows, q, lo, hi - lo) if state is None else state.entries
    store.write_entries(q, entries, empty_entries(), lo)
    for table in ("leaves2", "bodies2", "evidence2", "queue2", "queues"):
        conn.execute(f"DELETE FROM {table} WHERE q = ?", (q,))
