"""Records are stored in *segments*: one row holds a run of consecutive offsets of one queue.

Why not one row per record: a B-tree insert costs ~5 µs of SQLite CPU per row here, which caps a
durable writer near 170k records/s before any other work; one row per run of up to
:data:`SEGMENT_MAX_RECORDS` records costs well under 1 µs per record, and a bulk read decodes whole runs
with one msgpack call. Reads stay lazy: a lookup by offset reads the one segment that contains it.

A segment row is ``(q, first, count, chains, data)``: ``chains`` is the 32-byte chain value after each
record, concatenated (so any offset's chain value is one ``substr`` away), and ``data`` is msgpack of the
columns ``[keys, values, timestamps, headers]`` (a record's headers equal to the record's before stored as
one byte: :mod:`.header_column`). A small commit (single-record offers) writes a small
segment; the store merges each run of :data:`COMPACT_EVERY` small segments of a queue into one
(:func:`compact`), so a stream of tiny commits neither leaves a row per record nor rewrites a growing row
on every commit. Every change here keeps the time index (:mod:`latticed.storage.timeindex`) in step,
in the same transaction. Truncation deletes whole segments below the new start and rewrites the one it cuts
through, so truncated records are really gone.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add
from typing import Any, Final, cast

import msgpack

from latticed.crdt import columns_compiled
from latticed.crdt.records import MIXED, Record, RecordRun, uniform
from latticed.storage import timeindex
from latticed.storage.header_column import array_head as _array_head
from latticed.storage.header_column import headers_nbytes, pack_headers, stored_headers, unpack_headers
from latticed.storage.header_column import pack_item as _pack

SEGMENT_MAX_RECORDS: Final = 2048
SEGMENT_MAX_BYTES: Final = 1 << 20
#: Segments with fewer records than this are "small"; every COMPACT_EVERY of them in a row get merged.
SMALL_SEGMENT_RECORDS: Final = 256
COMPACT_EVERY: Final = 32
CHAIN_SIZE: Final = 32

HeaderColumn = list[list[Any]] | None


def _record_bytes(key: bytes | None, value: bytes, headers: HeaderColumn) -> int:
    """About what a record costs on the wire and in memory (the limits are approximate by design)."""
    size = len(value) + 16
    if key:
        size += len(key)
    if headers:
        size += sum(len(k) + len(v) for k, v in headers)
    return size


@dataclass(slots=True)
class Segment:
    """A run of records ``[first, first + len)`` as columns, with their chain values."""

    first: int
    keys: list[bytes | None]
    values: list[bytes]
    timestamps: list[int]
    headers: list[HeaderColumn]
    chains: bytes

    def __len__(self) -> int:
        return len(self.values)

    @property
    def end(self) -> int:
        return self.first + len(self.values)

    @classmethod
    def from_records(cls, first: int, records: Sequence[Record], chains: Sequence[bytes]) -> Segment:
        if type(records) is RecordRun:
            return cls(
                first,
                list(records.keys),
                list(records.values),
                list(records.timestamps),
                stored_headers(records.headers, len(records)),
                b"".join(chains),
            )
        return cls(
            first,
            [r.key for r in records],
            [r.value for r in records],
            [r.timestamp for r in records],
            [[[k, v] for k, v in r.headers] if r.headers else None for r in records],
            b"".join(chains),
        )

    @classmethod
    def decode(cls, first: int, count: int, chains: bytes, data: bytes) -> Segment:
        keys, values, timestamps, stored = msgpack.unpackb(data, raw=False, use_list=True)
        headers = unpack_headers(stored)
        if (
            not len(values)
            == len(keys)
            == len(timestamps)
            == len(headers)
            == count
            == len(chains) // CHAIN_SIZE
        ):
            raise ValueError(f"segment at {first} is inconsistent")
        return cls(first, keys, values, timestamps, headers, bytes(chains))

    def encode(self) -> tuple[int, bytes, bytes]:
        """msgpack of ``[keys, values, timestamps, headers]``, a column at a time: the same bytes. Where
        the column passes are built, keys and values are packed straight into the one buffer returned
        (a bulk append's largest copy, made once)."""
        tail = _pack_same(self.timestamps) + pack_headers(self.headers)
        columns = columns_compiled.load()
        data = None if columns is None else columns.segment_data(self.keys, self.values, tail)
        if data is None:
            data = b"".join((_FOUR, _pack(self.keys), _pack(self.values), tail))
        return len(self.values), self.chains, data

    def nbytes(self) -> int:
        size = sum(map(len, self.values)) + 16 * len(self.values)
        size += sum(len(k) for k in self.keys if k)
        return size + headers_nbytes(self.headers)

    def record(self, offset: int) -> Record:
        i = offset - self.first
        headers = self.headers[i]
        return Record(
            self.values[i],
            self.keys[i],
            self.timestamps[i],
            tuple((k, v) for k, v in headers) if headers else (),
        )

    def records(self, lo: int, hi: int) -> list[Record]:
        a, b = max(lo, self.first) - self.first, min(hi, self.end) - self.first
        return [
            Record(v, k, ts, tuple((hk, hv) for hk, hv in h) if h else ())
            for k, v, ts, h in zip(
                self.keys[a:b], self.values[a:b], self.timestamps[a:b], self.headers[a:b], strict=True
            )
        ]

    def chain(self, offset: int) -> bytes:
        i = (offset - self.first) * CHAIN_SIZE
        return self.chains[i : i + CHAIN_SIZE]

    def slice(self, lo: int, hi: int) -> Segment:
        a, b = max(lo, self.first) - self.first, min(hi, self.end) - self.first
        return Segment(
            self.first + a,
            self.keys[a:b],
            self.values[a:b],
            self.timestamps[a:b],
            self.headers[a:b],
            self.chains[a * CHAIN_SIZE : b * CHAIN_SIZE],
        )

    def extend(self, other: Segment) -> None:
        if other.first != self.end:
            raise ValueError(f"segment at {other.first} does not follow the one ending at {self.end}")
        self.keys += other.keys
        self.values += other.values
        self.timestamps += other.timestamps
        self.headers += other.headers
        self.chains += other.chains


_FOUR: Final = b"\x94"  # msgpack: an array of four items


def _pack_same(column: list[Any]) -> bytes:
    """msgpack of ``column``; one whose items are all the same (a producer's header on every record, the
    owner's clock on every timestamp) is packed by packing the item once: msgpack writes equal items of
    one type as equal bytes."""
    first = column[0] if column else None
    same_int = type(first) is int and columns_compiled.same_int(column)  # True == 1, packed otherwise
    if same_int or (type(first) is list and column.count(first) == len(column)):
        return _array_head(len(column)) + _pack(first) * len(column)
    return _pack(column)


def split(segment: Segment) -> Iterator[Segment]:
    """Cut a run into segments of at most SEGMENT_MAX_RECORDS records and about SEGMENT_MAX_BYTES."""
    n = len(segment)
    if n <= SEGMENT_MAX_RECORDS and segment.nbytes() <= SEGMENT_MAX_BYTES:
        yield segment
        return
    if _largest_record(segment) * SEGMENT_MAX_RECORDS <= SEGMENT_MAX_BYTES:
        # No SEGMENT_MAX_RECORDS records can reach SEGMENT_MAX_BYTES: the cut is by count alone.
        for start in range(0, n, SEGMENT_MAX_RECORDS):
            yield segment.slice(segment.first + start, segment.first + min(n, start + SEGMENT_MAX_RECORDS))
        return
    # A segment ends before the record that makes it SEGMENT_MAX_RECORDS records or more than
    # SEGMENT_MAX_BYTES (each holds one record at least): found by bisecting running sums of the
    # records' sizes, computed a column at a time, not by a Python step per record.
    running = [0, *accumulate(_sizes(segment))]
    start = 0
    while True:
        over = bisect_right(running, running[start] + SEGMENT_MAX_BYTES, lo=start + 1)
        cut = min(max(over - 1, start + 1), start + SEGMENT_MAX_RECORDS)
        if cut >= n:
            yield segment.slice(segment.first + start, segment.first + n)
            return
        yield segment.slice(segment.first + start, segment.first + cut)
        start = cut


def _largest_record(segment: Segment) -> int:
    """At least the largest :func:`_record_bytes` of the segment's records (a bound, from column maxima;
    SEGMENT_MAX_BYTES when the headers differ between records, which sends the caller the exact way)."""
    keys, headers = segment.keys, segment.headers
    longest_value, longest_key = columns_compiled.widest(segment.values, keys)
    largest = longest_value + longest_key + 16
    if any(headers):
        same = uniform(headers)
        if same is MIXED:
            return SEGMENT_MAX_BYTES
        largest += sum(len(k) + len(v) for k, v in same)
    return largest


def _sizes(segment: Segment) -> Iterator[int]:
    """:func:`_record_bytes` of each record, a column at a time."""
    keys, headers = segment.keys, segment.headers
    sizes: Iterator[int] = map(add, map(len, segment.values), repeat(16))
    if keys.count(None) != len(keys):
        present = cast("list[bytes]", keys)
        sizes = map(add, sizes, map(len, present) if None not in keys else (len(k) if k else 0 for k in keys))
    if any(headers):
        same = uniform(headers)
        per = (
            repeat(sum(len(k) + len(v) for k, v in same))
            if same is not MIXED
            else (sum(len(k) + len(v) for k, v in h) if h else 0 for h in headers)
        )
        sizes = map(add, sizes, per)
    return sizes


# ------------------------------------------------------------------ SQL (any connection, its own thread)

_SELECT = "SELECT first, count, chains, data FROM segments"


def containing(conn: sqlite3.Connection, q: int, offset: int) -> Segment | None:
    """The segment holding ``offset``, if any."""
    row = conn.execute(
        f"{_SELECT} WHERE q = ? AND first <= ? ORDER BY first DESC LIMIT 1", (q, offset)
    ).fetchone()
    if row is None or offset >= row[0] + row[1]:
        return None
    return Segment.decode(*row)


def chain_at(conn: sqlite3.Connection, q: int, offset: int) -> bytes | None:
    """The chain value after the record at ``offset`` (reads only that slice of the segment)."""
    row = conn.execute(
        "SELECT first, count, substr(chains, (? - first) * 32 + 1, 32) FROM segments "
        "WHERE q = ? AND first <= ? ORDER BY first DESC LIMIT 1",
        (offset, q, offset),
    ).fetchone()
    if row is None or offset >= row[0] + row[1]:
        return None
    return bytes(row[2])


def scan(conn: sqlite3.Connection, q: int, lo: int, hi: int) -> Iterator[Segment]:
    """Segments overlapping ``[lo, hi)``, in order (decoded lazily, one at a time).

    One statement, so it reads one snapshot even beside a concurrent compaction. It starts at the last
    segment that begins at or before ``lo`` (an index seek), never earlier: with big records, every
    segment read before ``lo`` would be a blob read for nothing.
    """
    if hi <= lo:
        return
    cursor = conn.execute(
        f"{_SELECT} WHERE q = ?1 AND first < ?3 AND first >= "
        "coalesce((SELECT max(first) FROM segments WHERE q = ?1 AND first <= ?2), ?2) ORDER BY first",
        (q, lo, hi),
    )
    for first, count, chains, data in cursor:
        if first + count > lo:
            yield Segment.decode(first, count, chains, data)


def bounds(conn: sqlite3.Connection, q: int) -> tuple[int, int] | None:
    """``(first offset, end offset)`` stored for a queue, or None when it holds no records."""
    lo = conn.execute("SELECT first FROM segments WHERE q = ? ORDER BY first LIMIT 1", (q,)).fetchone()
    if lo is None:
        return None
    hi = conn.execute(
        "SELECT first + count FROM segments WHERE q = ? ORDER BY first DESC LIMIT 1", (q,)
    ).fetchone()
    return int(lo[0]), int(hi[0])


def insert(
    conn: sqlite3.Connection,
    q: int,
    segment: Segment,
    *,
    timed: bool = True,
    tails: timeindex.Tails | None = None,
) -> None:
    """Store ``segment`` (split into full-size rows); ``timed``: the store has the time index (the
    functions here take it from the store, which looks once when it opens, not on every write);
    ``tails``: the writer's memory of the index's last rows (:class:`timeindex.Tails`), kept in step."""
    parts = list(split(segment))
    conn.executemany(
        "INSERT INTO segments (q, first, count, chains, data) VALUES (?, ?, ?, ?, ?)",
        ((q, part.first, *part.encode()) for part in parts),
    )
    if timed:
        timeindex.added(conn, q, [(part.first, part.timestamps) for part in parts], tails)


def compact(
    conn: sqlite3.Connection, q: int, lo: int, *, timed: bool = True, tails: timeindex.Tails | None = None
) -> None:
    """Merge the queue's segments from offset ``lo`` on (a run of small ones) into as few as fit."""
    rows = conn.execute(f"{_SELECT} WHERE q = ? AND first >= ? ORDER BY first", (q, lo)).fetchall()
    if len(rows) < 2:
        return
    merged = Segment.decode(*rows[0])
    for row in rows[1:]:
        merged.extend(Segment.decode(*row))
    conn.execute("DELETE FROM segments WHERE q = ? AND first >= ?", (q, lo))
    if timed:
        timeindex.removed_from(conn, q, lo, tails)
    insert(conn, q, merged, timed=timed, tails=tails)


def delete_below(
    conn: sqlite3.Connection, q: int, lo: int, *, timed: bool = True, tails: timeindex.Tails | None = None
) -> None:
    """Remove every record below ``lo``; the segment cut in two keeps only its upper part."""
    cut = containing(conn, q, lo)
    conn.execute("DELETE FROM segments WHERE q = ? AND first < ?", (q, lo))
    if timed:
        timeindex.removed_below(conn, q, lo, tails)
    if cut is not None and cut.first < lo:
        insert(conn, q, cut.slice(lo, cut.end), timed=timed, tails=tails)
    elif timed:
        timeindex.retop(conn, q, lo, None, tails)


def delete_from(
    conn: sqlite3.Connection, q: int, hi: int, *, timed: bool = True, tails: timeindex.Tails | None = None
) -> None:
    """Remove every record at or above ``hi`` (a join that kept a shorter run)."""
    cut = containing(conn, q, hi - 1) if hi > 0 else None
    conn.execute("DELETE FROM segments WHERE q = ? AND first + count > ?", (q, hi))
    if timed:
        timeindex.removed_from(conn, q, cut.first if cut is not None and cut.end > hi else hi, tails)
    if cut is not None and cut.end > hi:
        insert(conn, q, cut.slice(cut.first, hi), timed=timed, tails=tails)


def delete_all(
    conn: sqlite3.Connection, q: int, *, timed: bool = True, tails: timeindex.Tails | None = None
) -> None:
    conn.execute("DELETE FROM segments WHERE q = ?", (q,))
    if timed:
        timeindex.removed_from(conn, q, -1, tails)


__all__ = [
    "CHAIN_SIZE",
    "COMPACT_EVERY",
    "SEGMENT_MAX_BYTES",
    "SEGMENT_MAX_RECORDS",
    "SMALL_SEGMENT_RECORDS",
    "Segment",
    "compact",
    "bounds",
    "chain_at",
    "containing",
    "delete_all",
    "delete_below",
    "delete_from",
    "insert",
    "scan",
]
