"""The store's schema and its migrations: ``PRAGMA user_version`` counts the migrations applied.

Each migration is a function run in its own transaction together with the version bump, so a crash
mid-upgrade leaves the file at the previous version, and an upgrade is re-run on the next start. Never
edit a released migration; append a new one.

Layout notes (why it looks like this):

* Queues get a small integer id ``q``; the 32-byte queue id appears once, in ``queues``, instead of in
  every record row.
* Records live in ``segments`` (see :mod:`latticed.storage.segments`): one row per run of consecutive
  offsets, clustered on ``(q, first)``, so reading a run of offsets is one range scan. Small columns come
  first and ``data`` last: SQLite walks overflow pages to reach a column stored after a large one.
* ``chains`` holds the hash-chain value after every record, so any suffix can be re-verified against a
  signed head and the lattice reads a chain value without hashing.
* ``checkpoints`` keeps a thinned list of older signed heads (transport aids for chunked deltas).
* ``kv`` is the materialized view of KV namespaces: one joined entry per key; ``expires`` (a plain value's
  expiry, else NULL) is indexed so expired keys are purged without reading the others.
* ``queues.floor``/``floor_hash``: a replica's own low-watermark after it dropped its oldest records
  (retention's replica cap; 0 when it dropped none) and the chain value there.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from latticed.crdt import kv
from latticed.errors import StorageError
from latticed.storage.codec import decode_kv_entry
from latticed.storage.sqlite import storage_error

Migration = Callable[[sqlite3.Connection], None]


def _v1_queues_and_records(conn: sqlite3.Connection) -> None:
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
    conn.execute(
        """CREATE TABLE kv (
            ns INTEGER NOT NULL,
            key TEXT NOT NULL,
            entry BLOB NOT NULL,
            PRIMARY KEY (ns, key)
        ) WITHOUT ROWID"""
    )


def _v3_retention(conn: sqlite3.Connection) -> None:
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


def entry_expiry(entry: kv.Entry) -> int | None:
    """When a key's joined entry stops being visible by itself (a plain value with a TTL), else None."""
    return entry.expires_ms if entry.kind == kv.PLAIN else None


MIGRATIONS: tuple[Migration, ...] = (_v1_queues_and_records, _v2_kv_view, _v3_retention)
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the file up to ``len(migrations)``; returns the version it was at before."""
    try:
        before = user_version(conn)
    except sqlite3.Error as exc:
        raise storage_error(exc, "read the schema version of", path) from exc
    if before > len(migrations):
        raise StorageError(
            f"store {path} has schema version {before}, newer than this latticed understands "
            f"({len(migrations)}); upgrade latticed or restore a backup"
        )
    for version in range(before, len(migrations)):
        try:
            conn.execute("BEGIN IMMEDIATE")
            migrations[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise storage_error(exc, f"migrate (to schema version {version + 1})", path) from exc
    return before


__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Migration", "entry_expiry", "migrate", "user_version"]
