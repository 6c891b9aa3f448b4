"""What retention reads from the store to decide a cut, on a reader connection (never the writer's).

Sizes come from the segment rows' lengths (SQLite keeps a blob's length in the row header, so this reads
no record), newest first and only as far back as a limit needs; timestamps are read from the oldest
segments only until a record young enough turns up, and only their timestamp column is decoded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack

from latticed.host.retention_policy import Extent, cut_for_bytes, cut_for_records, expired_prefix


def extents_newest_first(conn: sqlite3.Connection, q: int) -> Iterator[Extent]:
    """The queue's segments from the newest back, with the bytes each takes (records and chain values)."""
    cursor = conn.execute(
        "SELECT first, count, length(chains) + length(data) FROM segments WHERE q = ? ORDER BY first DESC",
        (q,),
    )
    for first, count, nbytes in cursor:
        yield Extent(int(first), int(count), int(nbytes))


def stored_bytes(conn: sqlite3.Connection, q: int) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(length(chains) + length(data)), 0) FROM segments WHERE q = ?", (q,)
    ).fetchone()
    return int(row[0])


def bytes_between(conn: sqlite3.Connection, q: int, lo: int, hi: int) -> int:
    """Bytes the records ``[lo, hi)`` take (segments cut through counted pro rata): what a cut at ``hi``
    frees, read from the segments it covers only."""
    cursor = conn.execute(
        "SELECT first, count, length(chains) + length(data) FROM segments WHERE q = ?1 AND first < ?3 AND "
        "first >= coalesce((SELECT max(first) FROM segments WHERE q = ?1 AND first <= ?2), ?2)",
        (q, lo, hi),
    )
    total = 0
    for first, count, nbytes in cursor:
        inside = min(hi, first + count) - max(lo, first)
        if inside > 0 and count:
            total += nbytes * inside // count
    return total


def boundaries(conn: sqlite3.Connection, q: int, lo: int, hi: int) -> list[int]:
    """Segment starts strictly inside ``(lo, hi)``, ascending."""
    rows = conn.execute(
        "SELECT first FROM segments WHERE q = ? AND first > ? AND first < ? ORDER BY first", (q, lo, hi)
    )
    return [int(first) for (first,) in rows]


def segment_timestamps(data: bytes) -> list[int]:
    """The timestamp column of a segment's data (``[keys, values, timestamps, headers]``), skipping the
    others without building them."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    unpacker.read_array_header()
    unpacker.skip()
    unpacker.skip()
    timestamps: list[int] = unpacker.unpack()
    return timestamps


def expired_end(conn: sqlite3.Connection, q: int, start: int, end: int, cutoff_ms: int) -> int:
    """The end of the run of records from ``start`` stamped before ``cutoff_ms`` (see
    :func:`latticed.host.retention_policy.expired_prefix`)."""
    cursor = conn.execute(
        "SELECT first, count, data FROM segments WHERE q = ?1 AND first < ?3 AND first >= "
        "coalesce((SELECT max(first) FROM segments WHERE q = ?1 AND first <= ?2), ?2) ORDER BY first",
        (q, start, end),
    )
    position = start
    for first, count, data in cursor:
        if first + count <= position:
            continue
        timestamps = segment_timestamps(bytes(data))[position - first : min(end, first + count) - first]
        reached = expired_prefix(position, timestamps, cutoff_ms)
        if reached < position + len(timestamps):
            return reached
        position = reached
    return position


@dataclass(frozen=True, slots=True)
class Plan:
    """Where retention would cut a queue (None: nowhere), why, and what it then holds."""

    cut: int | None
    reason: str
    held_bytes: int
    held_records: int


def plan(
    conn: sqlite3.Connection,
    q: int,
    start: int,
    end: int,
    *,
    max_bytes: int | None = None,
    max_records: int | None = None,
    cutoff_ms: int | None = None,
) -> Plan:
    """The furthest cut any of the limits asks for (records below ``cutoff_ms`` are too old)."""
    cut, reason = start, ""
    held_bytes: int | None = None
    if max_bytes is not None:
        by_bytes, held_bytes = cut_for_bytes(extents_newest_first(conn, q), start, max_bytes)
        if by_bytes is not None:
            cut, reason = max(by_bytes, start), "max_bytes"
    if max_records is not None and end - start > max_records:
        by_records = cut_for_records(start, end, max_records, boundaries(conn, q, start, end))
        if by_records is not None and by_records > cut:
            cut, reason, held_bytes = by_records, "max_records", None
    if cutoff_ms is not None:
        by_age = expired_end(conn, q, start, end, cutoff_ms)
        if by_age > cut:
            cut, reason, held_bytes = by_age, "max_age", None
    if held_bytes is None:
        held_bytes = _bytes_from(conn, q, cut)
    return Plan(cut if cut > start else None, reason, held_bytes, end - cut)


def _bytes_from(conn: sqlite3.Connection, q: int, offset: int) -> int:
    """Bytes the records from ``offset`` on take (the segment it cuts through, pro rata)."""
    total = 0
    for extent in extents_newest_first(conn, q):
        if extent.end <= offset:
            break
        count = extent.end - max(extent.first, offset)
        total += extent.nbytes * count // extent.count if extent.count else 0
    return total


__all__ = [
    "Plan",
    "boundaries",
    "expired_end",
    "extents_newest_first",
    "plan",
    "segment_timestamps",
    "stored_bytes",
]
