"""KV upkeep that runs on the storage thread for the retention service: purging expired keys from a
namespace's view, and one compaction step of our own namespace's op log
(:mod:`latticed.storage.kvcompact`).

Both are functions of the storage thread's batch and writer, run through
:meth:`latticed.storage.engine.Engine.purge_expired_kv` and
:meth:`~latticed.storage.engine.Engine.compact_kv_step`, so callers above storage see only those two
methods and :class:`~latticed.errors.StorageError`, never SQLite.
"""

from __future__ import annotations

import sqlite3

from latticed.storage.batch import Batch
from latticed.storage.jobs import WriterView
from latticed.storage.kvcompact import CompactKv


def purge_expired(batch: Batch, writer: WriterView, *, ns: int, now_ms: int) -> int:
    """Delete namespace ``ns``'s keys expired by ``now_ms``; returns how many. Its own transaction, taken
    between batches (see :meth:`latticed.storage.store.Store.purge_expired_kv`)."""
    store = writer.store
    try:
        return store.purge_expired_kv(ns, now_ms)
    except sqlite3.Error as exc:  # a full or read-only disk: the same StorageError as any failed write
        raise store.error(exc, "purge expired keys in") from exc


def compact_step(batch: Batch, writer: WriterView, *, ns: int) -> int:
    """One bounded compaction step of our KV namespace ``ns`` in this batch; returns the ops dropped."""
    job = CompactKv(ns)
    job.apply(batch, writer)
    return int(job.result)


__all__ = ["compact_step", "purge_expired"]
