"""Read connections: WAL lets them run beside the writer, so reads and tails never wait for a commit.

A :class:`ReadPool` hands out one :class:`StoreReader` per worker thread at a time; the async side runs
reads through ``trio.to_thread`` with a limiter the size of the pool.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latticed.crdt import kv
from latticed.crdt.records import Record, RecordRun
from latticed.storage import header_column, segments
from latticed.storage.codec import decode_kv_entry
from latticed.storage.entries import SqlRows
from latticed.storage.sqlite import connect, storage_error

#: What a read of one record returns: (key, value, timestamp, headers as [[name, value], ...] or None).
RawRow = tuple[bytes | None, bytes, int, list[list[Any]] | None]


@dataclass(slots=True)
class Columns:
    """A run of records as parallel lists: cheap to send and to turn into Arrow arrays."""

    offsets: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[list[list[Any]] | None] = field(default_factory=list)
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.offsets)


class StoreReader:
    """One read-only connection; use it from one thread at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = connect(path, writer=False)
        self.rows = SqlRows(self._conn)

    def close(self) -> None:
        self._conn.close()

    @property
    def conn(self) -> sqlite3.Connection:
        return self._conn

    def begin(self) -> None:
        self._conn.execute("BEGIN")

    def end(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("COMMIT")

    def columns(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Records ``[lo, hi)``, at most ``max_records`` of them and about ``max_bytes`` (at least one)."""
        out = Columns()
        if hi <= lo or max_records <= 0:
            return out
        hi = min(hi, lo + max_records)
        size = 0
        for segment in segments.scan(self._conn, q, lo, hi):
            part = segment.slice(lo, hi) if segment.first < lo or segment.end > hi else segment
            part_size = _nbytes(part)
            if size + part_size > max_bytes:
                # Take records one by one up to the byte budget (always at least one overall).
                n = 0
                for value in part.values:
                    size += len(value) + 16
                    if size > max_bytes and (out.offsets or n):
                        break
                    n += 1
                part = part.slice(part.first, part.first + n)
                _add(out, part)
                break
            size += part_size
            _add(out, part)
        out.nbytes = size
        return out

    def row(self, q: int, off: int) -> RawRow | None:
        segment = segments.containing(self._conn, q, off)
        if segment is None:
            return None
        i = off - segment.first
        return segment.keys[i], segment.values[i], segment.timestamps[i], segment.headers[i]

    def kv_entry(self, ns: int, key: str) -> kv.Entry | None:
        row = self._conn.execute("SELECT entry FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
        return None if row is None else decode_kv_entry(bytes(row[0]))

    def kv_scan(self, ns: int, prefix: str) -> Iterator[tuple[str, kv.Entry]]:
        """Keys starting with ``prefix``, in order (a range scan from ``prefix``, not a table scan)."""
        cursor = self._conn.execute(
            "SELECT key, entry FROM kv WHERE ns = ? AND key >= ? ORDER BY key", (ns, prefix)
        )
        for key, raw in cursor:
            if not key.startswith(prefix):
                break
            yield key, decode_kv_entry(bytes(raw))


def columns_of(
    first: int, records: Sequence[Record], lo: int, hi: int, *, max_records: int, max_bytes: int
) -> Columns:
    """In-memory records ``[first, first + len)`` as a read would return them from ``lo`` (which they
    must hold) below ``hi``: at most ``max_records``, about ``max_bytes`` (always at least one)."""
    a, b = lo - first, min(hi, first + len(records), lo + max_records) - first
    part = records[a:b]
    run = part if type(part) is RecordRun else RecordRun.of(part)
    values, keys = run.values, run.keys
    size = sum(map(len, values)) + 16 * len(values)
    if keys.count(None) != len(keys):
        size += sum(len(k) for k in keys if k)
    if size > max_bytes:
        # Take records one by one up to the byte budget (always at least one).
        size, count = 0, 0
        for value, key in zip(values, keys, strict=True):
            size += len(value) + (len(key) if key else 0) + 16
            if size > max_bytes and count:
                break
            count += 1
        run = run[:count]
    return Columns(
        offsets=list(range(lo, lo + len(run))),
        keys=list(run.keys),
        values=list(run.values),
        timestamps=list(run.timestamps),
        headers=header_column.stored_headers(run.headers, len(run)),
        nbytes=size,
    )


def _nbytes(part: segments.Segment) -> int:
    """``part.nbytes()`` without a Python step per record in the common cases (every record has a key,
    none has headers): bulk reads size every segment they return."""
    size = sum(map(len, part.values)) + 16 * len(part.values)
    try:
        size += sum(map(len, part.keys))  # type: ignore[arg-type]
    except TypeError:  # some records have no key
        size += sum(len(k) for k in part.keys if k)
    return size + header_column.headers_nbytes(part.headers)


def _add(out: Columns, part: segments.Segment) -> None:
    out.offsets.extend(range(part.first, part.end))
    out.keys.extend(part.keys)
    out.values.extend(part.values)
    out.timestamps.extend(part.timestamps)
    out.headers.extend(part.headers)


class ReadPool:
    """A fixed set of readers shared by worker threads."""

    def __init__(self, path: Path, size: int = 2) -> None:
        self.path = path
        self.size = size
        self._free: queue.SimpleQueue[StoreReader] = queue.SimpleQueue()
        self._all: list[StoreReader] = []
        try:
            for _ in range(size):
                reader = StoreReader(path)
                self._all.append(reader)
                self._free.put(reader)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def reader(self) -> Iterator[StoreReader]:
        """A reader inside one read transaction: everything read through it is one snapshot, even
        while the writer commits (a truncation or a compaction cannot show up half-way through)."""
        reader = self._free.get()
        try:
            reader.begin()
            try:
                yield reader
            finally:
                reader.end()
        except sqlite3.Error as exc:
            raise storage_error(exc, "read from the store", self.path) from exc
        finally:
            self._free.put(reader)

    def close(self) -> None:
        for reader in self._all:
            reader.close()
        self._all.clear()


__all__ = ["Columns", "RawRow", "ReadPool", "StoreReader"]
