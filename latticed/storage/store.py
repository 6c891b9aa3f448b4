"""The SQLite store: one file (``data_dir/latticed.db``) holding every queue, KV view and setting.

A :class:`Store` owns the *writer* connection and must be used from one thread (the storage thread);
readers open their own connections (:mod:`latticed.storage.reader`). It does not decide anything: the
lattice computes new :class:`QueueState` values, and :meth:`Store.persist` writes the difference between
the old and the new value inside the caller's transaction.

Why one module: every write here goes through the one writer connection and shares its per-queue state
(the run of small segments awaiting compaction, whether the file has the time index and fork cores).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latticed.crdt import kv
from latticed.crdt.head import SignedHead
from latticed.crdt.queue import Entries, QueueState
from latticed.crdt.records import Record
from latticed.errors import StorageError
from latticed.process.logs import get_logger, log_event
from latticed.storage import segments, timeindex
from latticed.storage.codec import (
    decode_kv_entry,
    decode_meta,
    decode_proof,
    encode_kv_entry,
    encode_meta,
    encode_proof,
)
from latticed.storage.entries import SqlRows, StoredEntries
from latticed.storage.schema import MIGRATIONS, Migration, entry_expiry, migrate
from latticed.storage.sqlite import DB_NAME, connect, preallocate_wal, storage_error
from latticed.storage.verify import verify_queue

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class StoredQueue:
    """A queue as loaded at start-up: its row id, lattice value and creation time."""

    q: int
    state: QueueState
    created_ms: int


def db_path(data_dir: Path) -> Path:
    return data_dir / DB_NAME


class Store:
    """The writer side of the store; every method runs on the thread that opened it."""

    def __init__(
        self,
        path: Path,
        *,
        max_page_count: int | None = None,
        migrations: Sequence[Migration] = MIGRATIONS,
    ) -> None:
        """Open (creating if needed) and migrate the file at ``path``.

        ``max_page_count`` caps the file's size in pages: a quota, and how tests simulate a full disk.
        """
        self.path = path
        self._conn = connect(path, writer=True)
        try:
            #: The schema the file had, and the copy of it kept before migrating (None: nothing migrated).
            self.migrated_from, self.kept_copy = migrate(self._conn, path, migrations)
            if max_page_count is not None:
                self.set_max_page_count(max_page_count)
        except BaseException:
            self._conn.close()
            raise
        try:
            preallocate_wal(self._conn, path)
        except (OSError, sqlite3.Error) as exc:
            # Only speed is lost: commits then grow the WAL as they would without this.
            log_event(log, "store.wal_preallocation_failed", level=30, error=str(exc))
        self.rows = SqlRows(self._conn)
        #: Whether the file has the time index, looked up once (only an older schema's lacks it).
        self._timed = timeindex.present(self._conn)
        #: The time index's last row of each queue this connection wrote (an append reads none).
        self._tails = timeindex.Tails()
        #: Whether queues have a fork core column (schema 5 on; an older schema's queues are all core 1).
        self.has_cores = any(row[1] == "core" for row in self._conn.execute("PRAGMA table_info(queues)"))
        #: Per queue, the run of small segments written since its last compaction: (first offset, count).
        self._small: dict[int, tuple[int, int]] = {}

    @classmethod
    def open(cls, data_dir: Path, *, max_page_count: int | None = None) -> Store:
        return cls(db_path(data_dir), max_page_count=max_page_count)

    def close(self) -> None:
        try:
            self._conn.close()
        except sqlite3.Error as exc:  # pragma: no cover - close of a healthy connection
            log_event(log, "store.close_failed", error=str(exc))

    @property
    def connection(self) -> sqlite3.Connection:
        """The writer connection, for maintenance outside transactions (:mod:`latticed.storage.space`)."""
        return self._conn

    def set_max_page_count(self, pages: int) -> int:
        """Cap the file at ``pages`` pages (never below its current size); returns the cap in force."""
        return int(self._conn.execute(f"PRAGMA max_page_count = {int(pages)}").fetchone()[0])

    def page_count(self) -> int:
        return int(self._conn.execute("PRAGMA page_count").fetchone()[0])

    # ------------------------------------------------------------------ transactions
    def begin(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        self._small.clear()  # it may describe rows that were just rolled back
        self._tails.clear()  # and so may this
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                # SQLite may have rolled back on its own (e.g. after SQLITE_FULL); nothing is left to undo.
                log_event(log, "store.rollback_failed", error=str(exc))

    def reclaim(self, pages: int, keep: int = 0) -> int:
        """Give up to ``pages`` free pages back to the file system (auto_vacuum=INCREMENTAL), outside any
        transaction, but leave ``keep`` free for the next writes; returns how many free pages remain.

        ``executescript`` steps the pragma to completion (``execute`` frees one page per call)."""
        free = int(self._conn.execute("PRAGMA freelist_count").fetchone()[0])
        step = min(int(pages), free - int(keep))
        if step <= 0:
            return free
        self._conn.executescript(f"PRAGMA incremental_vacuum({step});")
        return int(self._conn.execute("PRAGMA freelist_count").fetchone()[0])

    def error(self, exc: BaseException, what: str) -> StorageError:
        return storage_error(exc, what, self.path)

    # ------------------------------------------------------------------ queues
    def load(self) -> list[StoredQueue]:
        """Every queue's small state (heads, meta, thinned checkpoints); no record is read."""
        out: list[StoredQueue] = []
        try:
            # Core-2 queues (schema 5 on) are loaded by :mod:`latticed.storage.core2_store`.
            only_core1 = " WHERE core = 1" if self.has_cores else ""
            rows = self._conn.execute(
                "SELECT q, owner, name, kind, head, tip, meta, forked, proof, floor, floor_hash, created_ms "
                f"FROM queues{only_core1} ORDER BY q"
            ).fetchall()
            for row in rows:
                out.append(StoredQueue(row[0], self._load_state(row[:11]), row[11]))
        except sqlite3.Error as exc:
            raise self.error(exc, "load the queues from") from exc
        return out

    def _load_state(self, row: tuple[Any, ...]) -> QueueState:
        q, owner, name, kind, head_raw, tip_raw, meta, forked, proof, floor, floor_hash = row
        head = None if head_raw is None else SignedHead.from_bytes(bytes(head_raw))
        tip = None if tip_raw is None else SignedHead.from_bytes(bytes(tip_raw))
        start = head.start if head else 0
        if head is None or floor <= start or floor_hash is None:
            floor, floor_hash = 0, b""
        else:
            start, floor_hash = floor, bytes(floor_hash)
        stored = segments.bounds(self._conn, q)
        held_end = start
        last_chain = None
        if stored is not None:
            if stored[0] != start or (tip is not None and stored[1] != tip.end):
                held = f"[{stored[0]}, {stored[1]})"
                signed = f"[{start}, {tip.end if tip else start})"
                raise StorageError(
                    f"store {self.path}: queue {bytes(owner).hex()}/{name} holds records {held} but its "
                    f"heads say {signed}; the file was changed behind latticed's back"
                )
            held_end = stored[1]
            last_chain = self.rows.chain(q, held_end - 1)
        checkpoints = tuple(
            SignedHead.from_bytes(bytes(raw))
            for (raw,) in self._conn.execute(
                "SELECT head FROM checkpoints WHERE q = ? ORDER BY end_off", (q,)
            )
        )
        if tip is not None and held_end > start and (not checkpoints or checkpoints[-1].end < tip.end):
            checkpoints += (tip,)  # the latest checkpoint is the tip, stored once (see persist)
        return QueueState(
            owner=bytes(owner),
            name=name,
            kind=kind,
            head=head,
            tip=tip if held_end > start else None,
            entries=StoredEntries(self.rows, q, start, held_end - start, last_chain),
            meta=decode_meta(meta),
            checkpoints=checkpoints,
            forked=bool(forked),
            fork=decode_proof(proof),
            floor=floor,
            floor_hash=floor_hash,
        )

    def next_queue_number(self) -> int:
        row = self._conn.execute("SELECT max(q) FROM queues").fetchone()
        return 1 if row[0] is None else int(row[0]) + 1

    def empty_view(self, q: int, state: QueueState) -> QueueState:
        """``state`` (a new, empty queue) reading its rows from this store as queue ``q``."""
        return with_entries(state, StoredEntries(self.rows, q, state.start, 0))

    def insert_queue(self, q: int, state: QueueState, created_ms: int) -> None:
        """Add a queue's row (inside the caller's transaction); its value is then written by persist."""
        self._conn.execute(
            "INSERT INTO queues (q, qid, owner, name, kind, created_ms) VALUES (?, ?, ?, ?, ?, ?)",
            (q, state.queue_id, state.owner, state.name, state.kind, created_ms),
        )

    def persist(self, q: int, old: QueueState, new: QueueState) -> tuple[QueueState, bool]:
        """Write what changed from ``old`` (as stored) to ``new``; returns ``new`` with its rows now on
        disk, and whether rows were deleted (so space can be reclaimed)."""
        conn = self._conn
        stored, deleted = self.write_entries(q, old.entries, new.entries, new.start)
        if (
            new.head is not old.head
            or new.tip is not old.tip
            or new.meta != old.meta
            or new.fork is not old.fork
        ):
            head = new.head.to_bytes() if new.head else None
            tip = head if new.tip is new.head else new.tip.to_bytes() if new.tip else None
            if new.meta is old.meta and new.fork is old.fork:
                conn.execute(
                    "UPDATE queues SET head = ?, tip = ?, forked = ? WHERE q = ?",
                    (head, tip, int(new.forked), q),
                )
            else:
                conn.execute(
                    "UPDATE queues SET head = ?, tip = ?, meta = ?, forked = ?, proof = ? WHERE q = ?",
                    (head, tip, encode_meta(new.meta), int(new.forked), encode_proof(new.fork), q),
                )
        elif new.forked != old.forked:
            conn.execute("UPDATE queues SET forked = ? WHERE q = ?", (int(new.forked), q))
        if new.floor != old.floor:
            conn.execute(
                "UPDATE queues SET floor = ?, floor_hash = ? WHERE q = ?",
                (new.floor, new.floor_hash or None, q),
            )
        self._persist_checkpoints(q, old, new)
        return with_entries(new, stored), deleted

    def write_entries(self, q: int, before: Entries, after: Entries, at: int) -> tuple[StoredEntries, bool]:
        """Write what changed from queue ``q``'s stored records ``before`` to ``after`` (which begin at
        offset ``at``) in the caller's transaction; returns ``after`` as stored rows, and whether rows were
        deleted. Both fork cores store records alike."""
        conn = self._conn
        assert isinstance(before, StoredEntries) and not before.overlay[0], "old state must be stored"
        disk_lo, disk_hi = before.lo, before.lo + before.stored
        deleted = False
        if isinstance(after, StoredEntries) and after.source is self.rows and after.q == q:
            keep_lo, keep_hi = after.lo, after.lo + after.stored
            if disk_hi > disk_lo and keep_lo > disk_lo:
                segments.delete_below(conn, q, keep_lo, timed=self._timed, tails=self._tails)
                deleted = True
            if disk_hi > keep_hi and disk_hi > disk_lo:
                segments.delete_from(conn, q, keep_hi, timed=self._timed, tails=self._tails)
                deleted = True
            records, chains = after.overlay
            if records:
                self._append(q, segments.Segment.from_records(keep_hi, records, chains))
            return after.flushed(), deleted
        # The join kept another run than ours (e.g. a replica that adopted a delta wholesale) or a
        # truncation emptied the queue: replace the records.
        self._small.pop(q, None)
        if disk_hi > disk_lo:
            segments.delete_all(conn, q, timed=self._timed, tails=self._tails)
            deleted = True
        n = len(after)
        if n:
            all_chains = [after.chain(i) for i in range(n)]
            run = segments.Segment.from_records(at, after.records(), all_chains)
            segments.insert(conn, q, run, timed=self._timed, tails=self._tails)
        return StoredEntries(self.rows, q, at, n, after.chain(n - 1) if n else None), deleted

    def append_new(self, runs: Sequence[tuple[int, int, Sequence[Record], Sequence[bytes], bool]]) -> None:
        """Write the records of queues that hold none yet (``runs``: q, first offset, records, their chain
        values, and whether they are appended to the queue's stored empty run) in the caller's
        transaction: the rows :meth:`write_entries` writes for each (and their time index rows), one
        statement for all of them (a fresh replica's batch writes thousands)."""
        rows: list[tuple[int, int, int, bytes, bytes]] = []
        times: list[tuple[int, list[tuple[int, list[int]]]]] = []
        for q, first, records, chains, appended in runs:
            if not records:
                continue
            segment = segments.Segment.from_records(first, records, chains)
            parts = list(segments.split(segment))
            rows += [(q, part.first, *part.encode()) for part in parts]
            times.append((q, [(part.first, part.timestamps) for part in parts]))
            # As the generic path wrote them: records appended to the queue's empty run begin a run of
            # small segments (_append: from wherever they start, a truncation in the same batch may have
            # moved it past 0), records that replaced it (placed past its start) none.
            if appended and len(segment) < segments.SMALL_SEGMENT_RECORDS:
                self._small[q] = (first, 1)
            else:
                self._small.pop(q, None)
        self._conn.executemany(
            "INSERT INTO segments (q, first, count, chains, data) VALUES (?, ?, ?, ?, ?)", rows
        )
        if self._timed:
            timeindex.added_new(self._conn, times, self._tails)

    def _append(self, q: int, segment: segments.Segment) -> None:
        """Insert appended records; every COMPACT_EVERY small segments in a row are merged into one, so
        single-record commits cost one small insert each and still end up in full-size rows."""
        segments.insert(self._conn, q, segment, timed=self._timed, tails=self._tails)
        if len(segment) >= segments.SMALL_SEGMENT_RECORDS:
            self._small.pop(q, None)
            return
        first, count = self._small.get(q, (segment.first, 0))
        if count + 1 >= segments.COMPACT_EVERY:
            segments.compact(self._conn, q, first, timed=self._timed, tails=self._tails)
            self._small.pop(q, None)
        else:
            self._small[q] = (first, count + 1)

    def _persist_checkpoints(self, q: int, old_state: QueueState, new_state: QueueState) -> None:
        """Checkpoints other than the tip: the newest checkpoint is normally the tip itself, which the
        queue row holds already, so a commit usually changes no checkpoint row at all."""
        old, new = old_state.checkpoints, new_state.checkpoints
        if old is new and old_state.tip is new_state.tip:
            return
        if old and old[-1] is old_state.tip:
            old = old[:-1]
        if new and new[-1] is new_state.tip:
            new = new[:-1]
        gone, added = checkpoint_changes(old, new)
        if gone:
            self._conn.executemany(
                "DELETE FROM checkpoints WHERE q = ? AND end_off = ?", [(q, c.end) for c in gone]
            )
        if added:
            self._conn.executemany(
                "INSERT OR REPLACE INTO checkpoints (q, end_off, head) VALUES (?, ?, ?)",
                [(q, c.end, c.to_bytes()) for c in added],
            )

    # ------------------------------------------------------------------ KV view
    def kv_entry(self, ns: int, key: str) -> kv.Entry | None:
        row = self._conn.execute("SELECT entry FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
        return None if row is None else decode_kv_entry(bytes(row[0]))

    def kv_count(self, ns: int) -> int:
        """Keys in a namespace's view (tombstones included: their ops are kept too)."""
        return int(self._conn.execute("SELECT count(*) FROM kv WHERE ns = ?", (ns,)).fetchone()[0])

    def put_kv(self, ns: int, entries: Iterable[tuple[str, kv.Entry]]) -> None:
        self._conn.executemany(
            "INSERT OR REPLACE INTO kv (ns, key, entry, expires) VALUES (?, ?, ?, ?)",
            ((ns, key, encode_kv_entry(entry), entry_expiry(entry)) for key, entry in entries),
        )

    def clear_kv(self, ns: int) -> None:
        """Forget a namespace's view (inside the caller's transaction), to fold it again from its log."""
        self._conn.execute("DELETE FROM kv WHERE ns = ?", (ns,))

    def purge_expired_kv(self, ns: int, now_ms: int) -> int:
        """Delete the keys whose plain value expired by ``now_ms`` (a reader sees them absent already), in a
        transaction of its own; returns how many. Run between batches, never inside one."""
        self.begin()
        try:
            cursor = self._conn.execute(
                "DELETE FROM kv WHERE ns = ? AND expires IS NOT NULL AND expires <= ?", (ns, now_ms)
            )
            self.commit()
        except BaseException:
            self.rollback()
            raise
        return int(cursor.rowcount)

    # ------------------------------------------------------------------ verification
    def verify_queue(self, q: int, state: QueueState) -> int:
        """Re-check a stored queue end to end (see :func:`latticed.storage.verify.verify_queue`)."""
        return verify_queue(self._conn, q, state)


def with_entries(state: QueueState, entries: Entries) -> QueueState:
    """``dataclasses.replace`` is slow on the hot path; this builds the same value directly."""
    return QueueState(
        state.owner,
        state.name,
        state.kind,
        state.head,
        state.tip,
        entries,
        state.meta,
        state.checkpoints,
        state.forked,
        state.fork,
        state.floor,
        state.floor_hash,
    )


def checkpoint_changes(
    old: tuple[SignedHead, ...], new: tuple[SignedHead, ...]
) -> tuple[list[SignedHead], list[SignedHead]]:
    """Which checkpoints to delete and to insert, found cheaply for the usual shapes of change.

    Both tuples are sorted by ``end``; a commit drops some from the front (truncation) and changes the
    last one or two (a new head, thinning). Tuple slices compare by identity first, in C, so the shared
    middle costs next to nothing; anything else falls back to comparing by signature."""
    if not new:
        return list(old), []
    k = 0
    first_end = new[0].end
    while k < len(old) and old[k].end < first_end:
        k += 1
    common = min(len(old) - k, len(new))
    for _ in range(4):
        if common <= 0 or old[k : k + common] == new[:common]:
            gone, added = [*old[:k], *old[k + common :]], list(new[common:])
            both = {id(c) for c in gone} & {id(c) for c in added}
            if both:
                gone = [c for c in gone if id(c) not in both]
                added = [c for c in added if id(c) not in both]
            return gone, added
        common -= 1
    old_sigs = {c.signature for c in old}
    new_sigs = {c.signature for c in new}
    return [c for c in old if c.signature not in new_sigs], [c for c in new if c.signature not in old_sigs]


__all__ = ["Store", "StoredQueue", "checkpoint_changes", "db_path"]
