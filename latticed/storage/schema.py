"""The store's schema and its migrations: ``PRAGMA user_version`` counts the migrations applied.

Each migration is a function run in its own transaction together with the version bump, so a crash
mid-upgrade leaves the file at the last completed step, and the upgrade resumes from there on the next
start. Before the first step a copy of the store is kept (:mod:`latticed.storage.precopy`). A function's
docstring's first line is what ``latticed migrate --dry-run`` says the step does. Never edit a released
migration; append a new one.

The ``settings`` row ``written_by`` names the release that last opened the store for writing, so a
release that finds a schema newer than its own can say which release wrote it; ``upgrading_from`` is
there while an upgrade is unfinished, so a resumed one keeps the copy the first attempt made. They are
rows, not a schema change: every release since the first ignores rows it does not know.

Why one module: the migrations are one ordered list, each step written against the schema the steps
before it left; kept together, that order is read in one place.

Layout notes (why it looks like this):

* Queues get a small integer id ``q``; the 32-byte queue id appears once, in ``queues``, instead of in
  every record row.
* Records live in ``segments`` (see :mod:`latticed.storage.segments`): one row per run of consecutive
  offsets, keyed ``(q, first)``, so reading a run of offsets is one range scan of that key. Small columns
  come first and ``data`` last: SQLite walks overflow pages to reach a column stored after a large one.
  Since schema 8 a rowid table with its key as an index: a segment row is hundreds of KiB, and clustering
  it in the key's b-tree (``WITHOUT ROWID``) made its insert ~3x a rowid table's.
* ``chains`` holds the hash-chain value after every record, so any suffix can be re-verified against a
  signed head and the lattice reads a chain value without hashing.
* ``checkpoints`` keeps a thinned list of older signed heads (transport aids for chunked deltas).
* ``kv`` is the materialized view of KV namespaces: one joined entry per key; ``expires`` (a plain value's
  expiry, else NULL) is indexed so expired keys are purged without reading the others.
* ``queues.floor``/``floor_hash``: a replica's own low-watermark after it dropped its oldest records
  (retention's replica cap; 0 when it dropped none) and the chain value there.
* ``times`` is the time index: per segment, the running maximum of the record timestamps, so "the first
  offset at or after T" is a bisection of its key (:mod:`latticed.storage.timeindex`; until schema 10
  an index on the maximum was seeked, one more page every commit wrote).
* ``queues.core`` is a queue's fork core (1: v1 heads, 2: v2 heads; fixed per queue). A core-2 queue keeps
  its records in ``segments`` like any other and the rest of its value in ``queue2`` (one row: epoch,
  tips, start head, metadata, held end), ``leaves2`` (its shared leaves) and ``bodies2`` (the unsigned
  heads vouching for held records), both in runs of up to 4,096 per row since schema 6 (a replica's
  catch-up writes a row per chunk, the owner's commit one small row: :mod:`latticed.storage.core2_runs`),
  since schema 7 a run's bodies may be the steps a replica rebuilt them from (``steps_from``: the lowest
  offset they read a chain value at; :mod:`latticed.storage.core2_bodies`), since schema 8 a run of
  shared leaves too (``steps_from``, ``steps_to``; :mod:`latticed.storage.core2_leaves`);
  ``evidence2`` is what it held past a fork point it learned of, kept aside
  (:mod:`latticed.storage.core2_store`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from latticed.crdt import kv
from latticed.errors import StorageError
from latticed.storage import core2_runs
from latticed.storage.codec import decode_kv_entry
from latticed.storage.precopy import copy_path, keep_copy, pause_point
from latticed.storage.sqlite import storage_error
from latticed.storage.timeindex import backfill as backfill_time_index
from latticed.storage.timeindex import create as create_time_index
from latticed.version import RELEASE

Migration = Callable[[sqlite3.Connection], None]

#: The ``settings`` row naming the release that last opened the store for writing.
WRITTEN_BY: Final = "written_by"
#: The ``settings`` row an upgrade in progress keeps: the schema it started from (removed when it ends).
UPGRADING_FROM: Final = "upgrading_from"


def _v1_queues_and_records(conn: sqlite3.Connection) -> None:
    """Create the settings, queues, record segments and checkpoints tables."""
    conn.execute(
        """CREATE TABLE settings (
            name TEXT PRIMARY KEY,
            value BLOB
        ) WITHOUT ROWID"""
    )
    conn.execute(
        """CREATE TABLE queues (
            q INTEGER PRIMARY KEY,
            qid BLOB NOT NULL UNIQUE,
            owner BLOB NOT NULL,
            name TEXT NOT NULL,
            kind INTEGER NOT NULL,
            head BLOB,
            tip BLOB,
            meta BLOB,
            forked INTEGER NOT NULL DEFAULT 0,
            proof BLOB,
            created_ms INTEGER NOT NULL
        )"""
    )
    conn.execute(
        """CREATE TABLE segments (
            q INTEGER NOT NULL,
            first INTEGER NOT NULL,
            count INTEGER NOT NULL,
            chains BLOB NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (q, first)
        ) WITHOUT ROWID"""
    )
    conn.execute(
        """CREATE TABLE checkpoints (
            q INTEGER NOT NULL,
            end_off INTEGER NOT NULL,
            head BLOB NOT NULL,
            PRIMARY KEY (q, end_off)
        ) WITHOUT ROWID"""
    )


def _v2_kv_view(conn: sqlite3.Connection) -> None:
    """Add the KV view table (one joined entry per key)."""
    conn.execute(
        """CREATE TABLE kv (
            ns INTEGER NOT NULL,
            key TEXT NOT NULL,
            entry BLOB NOT NULL,
            PRIMARY KEY (ns, key)
        ) WITHOUT ROWID"""
    )


def _v3_retention(conn: sqlite3.Connection) -> None:
    """Add replica floors to queues and an indexed expiry to KV entries (filled in for existing keys)."""
    conn.execute("ALTER TABLE queues ADD COLUMN floor INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE queues ADD COLUMN floor_hash BLOB")
    conn.execute("ALTER TABLE kv ADD COLUMN expires INTEGER")
    update = []
    for ns, key, raw in conn.execute("SELECT ns, key, entry FROM kv"):
        expires = entry_expiry(decode_kv_entry(bytes(raw)))
        if expires is not None:
            update.append((expires, ns, key))
    conn.executemany("UPDATE kv SET expires = ? WHERE ns = ? AND key = ?", update)
    conn.execute("CREATE INDEX kv_expiry ON kv (ns, expires) WHERE expires IS NOT NULL")


def _v4_time_index(conn: sqlite3.Connection) -> None:
    """Add the time index (each segment's running maximum timestamp), filled in for stored records."""
    create_time_index(conn)
    backfill_time_index(conn)


def _v5_core2(conn: sqlite3.Connection) -> None:
    """Add the fork core per queue (existing queues: core 1) and the tables of core-2 queues."""
    conn.execute("ALTER TABLE queues ADD COLUMN core INTEGER NOT NULL DEFAULT 1")
    conn.execute(
        """CREATE TABLE queue2 (
            q INTEGER PRIMARY KEY,
            epoch INTEGER NOT NULL,
            held_end INTEGER NOT NULL,
            start_head BLOB,
            tips BLOB NOT NULL,
            meta BLOB,
            evidence_dropped INTEGER NOT NULL DEFAULT 0
        )"""
    )
    conn.execute(
        """CREATE TABLE leaves2 (
            q INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            digest BLOB NOT NULL,
            end_off INTEGER NOT NULL,
            PRIMARY KEY (q, idx)
        ) WITHOUT ROWID"""
    )
    conn.execute(
        """CREATE TABLE bodies2 (
            q INTEGER NOT NULL,
            end_off INTEGER NOT NULL,
            version INTEGER NOT NULL,
            body BLOB NOT NULL,
            PRIMARY KEY (q, end_off, version)
        ) WITHOUT ROWID"""
    )
    conn.execute(
        """CREATE TABLE evidence2 (
            q INTEGER NOT NULL,
            first INTEGER NOT NULL,
            epoch INTEGER NOT NULL,
            count INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (q, first)
        ) WITHOUT ROWID"""
    )


def _v6_core2_runs(conn: sqlite3.Connection) -> None:
    """Store core-2 queues' leaves and head bodies in runs of up to 4,096 per row, not one row each."""
    conn.execute("ALTER TABLE leaves2 RENAME TO leaves2_v5")
    conn.execute("ALTER TABLE bodies2 RENAME TO bodies2_v5")
    _create_core2_runs(conn)
    for (q,) in conn.execute("SELECT DISTINCT q FROM leaves2_v5").fetchall():
        leaves = [
            (bytes(d), e)
            for d, e in conn.execute("SELECT digest, end_off FROM leaves2_v5 WHERE q = ? ORDER BY idx", (q,))
        ]
        conn.executemany(
            "INSERT INTO leaves2 (q, idx, leaves) VALUES (?, ?, ?)",
            [(q, *row) for row in core2_runs.leaf_runs(0, leaves)],
        )
    for (q,) in conn.execute("SELECT DISTINCT q FROM bodies2_v5").fetchall():
        bodies = [
            bytes(raw)
            for (raw,) in conn.execute(
                "SELECT body FROM bodies2_v5 WHERE q = ? ORDER BY end_off, version", (q,)
            )
        ]
        conn.executemany(
            "INSERT INTO bodies2 (q, end_off, version, last_end, last_version, bodies) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(q, *row) for row in core2_runs.body_runs(bodies)],
        )
    conn.execute("DROP TABLE leaves2_v5")
    conn.execute("DROP TABLE bodies2_v5")


def _create_core2_runs(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE leaves2 (
            q INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            leaves BLOB NOT NULL,
            PRIMARY KEY (q, idx)
        ) WITHOUT ROWID"""
    )
    # A rowid table: two runs may start at one (end, version) (bodies of two branches of a fork).
    conn.execute(
        """CREATE TABLE bodies2 (
            q INTEGER NOT NULL,
            end_off INTEGER NOT NULL,
            version INTEGER NOT NULL,
            last_end INTEGER NOT NULL,
            last_version INTEGER NOT NULL,
            bodies BLOB NOT NULL
        )"""
    )
    conn.execute("CREATE INDEX bodies2_first ON bodies2 (q, end_off, version)")


def _v7_core2_steps(conn: sqlite3.Connection) -> None:
    """Let a core-2 queue's runs of head bodies hold the steps that rebuild them (bodies stay as stored)."""
    conn.execute("ALTER TABLE bodies2 ADD COLUMN steps_from INTEGER")


def _v8_segments_rowid(conn: sqlite3.Connection) -> None:
    """Copy record segments into a rowid table, and let core-2 shared leaves be held as steps.

    A segment row is too large to cluster in its key's b-tree; the key becomes an index. A run of shared
    leaves may hold the steps of the bodies they are the leaves of (``steps_from`` .. ``steps_to``: the
    chain offsets those read; both NULL: leaves whole, as every existing run stays)."""
    conn.execute("ALTER TABLE segments RENAME TO segments_v7")
    conn.execute(
        """CREATE TABLE segments (
            q INTEGER NOT NULL,
            first INTEGER NOT NULL,
            count INTEGER NOT NULL,
            chains BLOB NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (q, first)
        )"""
    )
    conn.execute(
        "INSERT INTO segments (q, first, count, chains, data) "
        "SELECT q, first, count, chains, data FROM segments_v7 ORDER BY q, first"
    )
    conn.execute("DROP TABLE segments_v7")
    conn.execute("ALTER TABLE leaves2 ADD COLUMN steps_from INTEGER")
    conn.execute("ALTER TABLE leaves2 ADD COLUMN steps_to INTEGER")


def _v9_header_runs(conn: sqlite3.Connection) -> None:
    """Store a record's headers equal to the record's before as one byte (:mod:`.header_column`).

    Nothing is rewritten: older segments read as they are. The version keeps an older build, which would
    read the byte as a record's headers, from opening the store."""


def _v10_time_index_keyed(conn: sqlite3.Connection) -> None:
    """Drop the time index's own index on (q, top): a lookup by time bisects the table's key instead.

    Why: every commit of records wrote a page of that b-tree (one of the ~12 WAL pages a batch of single
    offers writes, for a lookup a reader makes once a read by time). The tops only rise with the offset,
    so a bisection of ``times``'s own key ``(q, first)`` finds the row the index was seeked for
    (:func:`latticed.storage.timeindex.segment_reaching`). No row of any table is read or rewritten.

    Crash safety: the step is one ``DROP INDEX``, which :func:`migrate` runs inside the same ``BEGIN
    IMMEDIATE`` transaction as ``PRAGMA user_version = 10``, in WAL mode with the writer's
    ``synchronous`` setting, after the copy of the schema-9 file was kept. SQLite's DDL is
    transactional: the freed pages, the root pages ``auto_vacuum`` moves into the dropped b-tree's place
    and the ``sqlite_schema`` rows naming them are all frames of that one transaction, so after a
    ``kill -9`` or a power cut at any point the file opens either as schema 9 as it was (no commit frame
    reached the disk: the index is there and this build runs the step again) or as schema 10 complete
    (the commit frame is durable), never between. A schema-9 build would read the result correctly but
    look times up in a scan of a queue's rows; it refuses it as newer (:func:`newer_store_message`, by
    ``user_version``), and its operator restores the ``.pre-9`` copy."""
    conn.execute("DROP INDEX times_top")


def entry_expiry(entry: kv.Entry) -> int | None:
    """When a key's joined entry stops being visible by itself (a plain value with a TTL), else None."""
    return entry.expires_ms if entry.kind == kv.PLAIN else None


MIGRATIONS: tuple[Migration, ...] = (
    _v1_queues_and_records,
    _v2_kv_view,
    _v3_retention,
    _v4_time_index,
    _v5_core2,
    _v6_core2_runs,
    _v7_core2_steps,
    _v8_segments_rowid,
    _v9_header_runs,
    _v10_time_index_keyed,
)
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(
    conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS
) -> tuple[int, Path | None]:
    """Bring the file up to ``len(migrations)``, keeping a copy first if it held an older schema, and
    record this release as its writer; returns the version it was at before and the copy kept (None:
    nothing to migrate). An upgrade resumed after a crash keeps the copy its first attempt made."""
    try:
        before = user_version(conn)
    except sqlite3.Error as exc:
        raise storage_error(exc, "read the schema version of", path) from exc
    if before > len(migrations):
        raise StorageError(newer_store_message(path, before, written_by(conn), len(migrations)))
    copy = None
    if 0 < before < len(migrations):
        started = upgrading_from(conn)
        if started is not None and started < before and copy_path(path, started).exists():
            copy = copy_path(path, started)
        else:
            started, copy = before, keep_copy(conn, path, before)
    for version in range(before, len(migrations)):
        try:
            conn.execute("BEGIN IMMEDIATE")
            migrations[version](conn)
            if version == before and copy is not None:
                _set(conn, UPGRADING_FROM, str(started))
            pause_point(str(version + 1), path)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise storage_error(exc, f"migrate (to schema version {version + 1})", path) from exc
    try:
        conn.execute("DELETE FROM settings WHERE name = ?", (UPGRADING_FROM,))
        if written_by(conn) != RELEASE:
            _set(conn, WRITTEN_BY, RELEASE)
    except sqlite3.Error as exc:
        raise storage_error(exc, "record the release writing", path) from exc
    return before, copy


def _set(conn: sqlite3.Connection, name: str, value: str) -> None:
    conn.execute(
        "INSERT INTO settings (name, value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        (name, value),
    )


def _setting(conn: sqlite3.Connection, name: str) -> str | None:
    try:
        row = conn.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
    except sqlite3.Error:  # no settings table (a new file), or a newer layout: unknown
        return None
    if row is None:
        return None
    value = row[0]
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def upgrading_from(conn: sqlite3.Connection) -> int | None:
    """The schema an unfinished upgrade started from (its copy is ``.pre-`` that), else None."""
    value = _setting(conn, UPGRADING_FROM)
    return int(value) if value is not None and value.isdigit() else None


def written_by(conn: sqlite3.Connection) -> str | None:
    """The release that last opened this store for writing; None before releases recorded it (0.2.0)."""
    return _setting(conn, WRITTEN_BY)


def newer_store_message(path: Path, schema: int, writer: str | None, ours: int = SCHEMA_VERSION) -> str:
    """Why a store of a newer schema is refused, which release wrote it, and what the operator can do."""
    who = f"latticed {writer}" if writer is not None else "a release newer than this one"
    upgrade = f"upgrade latticed to {writer} or newer" if writer is not None else "upgrade latticed"
    copy = copy_path(path, ours)
    restore = (
        f"restore {copy} (the copy kept when it was upgraded from schema {ours})"
        if copy.exists()
        else f"restore a copy of the store from before that upgrade ({copy.name}, or a backup)"
    )
    return (
        f"store {path} has schema version {schema}, written by {who}: newer than this latticed "
        f"({RELEASE}, schema {ours} and older) can read; {upgrade}, or {restore} to run this release"
    )


def describe(migration: Migration) -> str:
    """What a migration step does, in one line (its docstring's first)."""
    doc = (migration.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else migration.__name__


__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "UPGRADING_FROM",
    "WRITTEN_BY",
    "Migration",
    "describe",
    "entry_expiry",
    "migrate",
    "newer_store_message",
    "upgrading_from",
    "user_version",
    "written_by",
]
