"""The time index: for each record segment, the highest record timestamp up to its end.

A record's timestamp is the owner's clock when its daemon accepted the offer (ms since the epoch; the
records of one offer share it). Clocks step back (NTP, a VM restored), so timestamps along a queue need
not rise. "The first offset whose timestamp is at or after T" is still one well-defined offset: the
first held record ``o`` with ``timestamp(o) >= T``. It is also the first offset where the *running
maximum* of the timestamps (from the first held record on) reaches ``T``, and the running maximum only
rises, so it can be searched in O(log n). That is what this table holds, per segment:

* ``peak``: the segment's own highest timestamp;
* ``top``: the highest timestamp of every held record of the queue up to the segment's end (the running
  maximum), indexed with the queue as ``(q, top)``.

The first segment whose ``top`` reaches ``T`` holds the answer (an index seek); the offset inside it is a
scan of that one segment's timestamps (:mod:`latticed.storage.timeseek`). The rows follow the segment
rows (:mod:`latticed.storage.segments` calls in here on every insert and delete, inside the same
transaction), so owners and replicas, whatever they hold, answer from the records they hold. When the
oldest records go (truncation, a replica's cap) the ``top`` of the rows after them is recomputed until it
agrees with what was stored (with rising timestamps: one row).

An append at the end of a queue (every commit of an owner or a relay) needs the ``top`` of the queue's
last row, and finds no row after its own: :class:`Tails` remembers that last row per queue, as this
connection's own writes left it, so such an append is one INSERT instead of two SELECTs around it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

import msgpack

#: Which element of a segment's ``data`` (msgpack of ``[keys, values, timestamps, headers]``) the
#: timestamps are.
TIMESTAMPS_COLUMN: Final = 2


def create(conn: sqlite3.Connection) -> None:
    """Create the table and its index (in the caller's transaction)."""
    conn.execute(
        """CREATE TABLE times (
            q INTEGER NOT NULL,
            first INTEGER NOT NULL,
            peak INTEGER NOT NULL,
            top INTEGER NOT NULL,
            PRIMARY KEY (q, first)
        ) WITHOUT ROWID"""
    )
    conn.execute("CREATE INDEX times_top ON times (q, top)")


def backfill(conn: sqlite3.Connection) -> None:
    """Index every stored segment (a store written before the index existed), one segment at a time."""
    rows: list[tuple[int, int, int, int]] = []
    last_q, top = None, 0
    for q, first, data in conn.execute("SELECT q, first, data FROM segments ORDER BY q, first"):
        timestamps = msgpack.unpackb(data, raw=False)[TIMESTAMPS_COLUMN]
        if not timestamps:
            continue
        peak = max(timestamps)
        top = peak if q != last_q else max(top, peak)
        last_q = q
        rows.append((q, first, peak, top))
        if len(rows) >= 1024:
            conn.executemany("INSERT INTO times (q, first, peak, top) VALUES (?, ?, ?, ?)", rows)
            rows.clear()
    conn.executemany("INSERT INTO times (q, first, peak, top) VALUES (?, ?, ?, ?)", rows)


def present(conn: sqlite3.Connection) -> bool:
    """Whether the store has the index. A store opened with fewer migrations (tests write older schemas
    the way an older release did, through the current store code) does not; the store asks once, when
    it opens, and the writes below assume the table is there."""
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'times'").fetchone()
        is not None
    )


class Tails:
    """The last row ``(first, top)`` of each queue's index as the writer connection's own statements
    left it (None: the queue has no row), so an append at the end reads nothing.

    Exact by construction: only :func:`added` sets an entry, and only with the row it just wrote when no
    row follows it; every other change to a queue's rows forgets its entry, and the store forgets them
    all when a transaction rolls back (:meth:`clear`). A queue not known here is read from the table."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, int] | None] = {}

    def __contains__(self, q: object) -> bool:
        return q in self._last

    def last(self, q: int) -> tuple[int, int] | None:
        """``q``'s last row (None: it has none); only for a queue known here."""
        return self._last[q]

    def note(self, q: int, last: tuple[int, int] | None) -> None:
        self._last[q] = last

    def forget(self, q: int) -> None:
        self._last.pop(q, None)

    def clear(self) -> None:
        self._last.clear()


def _top_before(conn: sqlite3.Connection, q: int, first: int) -> int | None:
    row = conn.execute(
        "SELECT top FROM times WHERE q = ? AND first < ? ORDER BY first DESC LIMIT 1", (q, first)
    ).fetchone()
    return None if row is None else int(row[0])


def _past_the_end(tails: Tails | None, q: int, first: int) -> tuple[bool, int | None]:
    """Whether ``tails`` knows that no row of ``q`` starts at or after ``first``, and if so the top of
    the rows below it (None: there are none)."""
    if tails is None or q not in tails:
        return False, None
    last = tails.last(q)
    if last is None:
        return True, None
    return last[0] < first, last[1]


def added(
    conn: sqlite3.Connection, q: int, parts: Sequence[tuple[int, Sequence[int]]], tails: Tails | None = None
) -> None:
    """Index new segments, given as ``(first, timestamps)`` in offset order, and bring the rows after
    them (a cut segment's upper part reinserted below the rest) up to date. With ``tails`` (the
    writer's), an append past the queue's known last row reads nothing."""
    parts = [(first, timestamps) for first, timestamps in parts if timestamps]
    if not parts:
        return
    at_end, top = _past_the_end(tails, q, parts[0][0])
    if not at_end:
        top = _top_before(conn, q, parts[0][0])
    rows, top = _rows(q, parts, top)
    conn.executemany("INSERT OR REPLACE INTO times (q, first, peak, top) VALUES (?, ?, ?, ?)", rows)
    # Past the last row: no row after the new ones to bring up to date.
    after = 0 if at_end else _retop(conn, q, parts[-1][0] + 1, top)
    if tails is not None:
        if after:
            tails.forget(q)
        else:
            tails.note(q, (parts[-1][0], top))


def added_new(
    conn: sqlite3.Connection,
    runs: Sequence[tuple[int, Sequence[tuple[int, Sequence[int]]]]],
    tails: Tails | None = None,
) -> None:
    """:func:`added` for queues that have no row yet (``runs``: each queue's new segments as ``(first,
    timestamps)`` in offset order): the same rows, one statement for all of them, and nothing read (a
    fresh replica's batch writes thousands of new queues)."""
    rows: list[tuple[int, int, int, int]] = []
    for q, all_parts in runs:
        parts = [(first, timestamps) for first, timestamps in all_parts if timestamps]
        if parts:
            mine, top = _rows(q, parts, None)
            rows += mine
            if tails is not None:
                tails.note(q, (parts[-1][0], top))
    conn.executemany("INSERT INTO times (q, first, peak, top) VALUES (?, ?, ?, ?)", rows)


def _rows(
    q: int, parts: Sequence[tuple[int, Sequence[int]]], top: int | None
) -> tuple[list[tuple[int, int, int, int]], int]:
    """The index rows of ``parts`` (each with timestamps), ``top`` the running maximum below them; and
    the maximum after them."""
    rows = []
    for first, timestamps in parts:
        peak = max(timestamps)
        top = peak if top is None else max(top, peak)
        rows.append((q, first, peak, top))
    assert top is not None
    return rows, top


def retop(conn: sqlite3.Connection, q: int, lo: int, top: int | None, tails: Tails | None = None) -> None:
    """Recompute ``top`` of the rows from offset ``lo`` on, given the running maximum below ``lo``
    (None: no held record below it); stops at the first row that already agrees."""
    if tails is not None:
        tails.forget(q)
    _retop(conn, q, lo, top)


def _retop(conn: sqlite3.Connection, q: int, lo: int, top: int | None) -> int:
    """:func:`retop`; returns how many rows from ``lo`` on it read (0: none is there)."""
    cursor = conn.execute(
        "SELECT first, peak, top FROM times WHERE q = ? AND first >= ? ORDER BY first", (q, lo)
    )
    updates = []
    seen = 0
    for first, peak, stored in cursor:
        seen += 1
        top = peak if top is None else max(top, peak)
        if top == stored:
            break
        updates.append((top, q, first))
    cursor.close()
    if updates:
        conn.executemany("UPDATE times SET top = ? WHERE q = ? AND first = ?", updates)
    return seen


def removed_below(conn: sqlite3.Connection, q: int, lo: int, tails: Tails | None = None) -> None:
    """The segments starting below ``lo`` are gone."""
    if tails is not None:
        tails.forget(q)
    conn.execute("DELETE FROM times WHERE q = ? AND first < ?", (q, lo))


def removed_from(conn: sqlite3.Connection, q: int, first: int, tails: Tails | None = None) -> None:
    """The segments starting at or above ``first`` are gone."""
    if tails is not None:
        tails.forget(q)
    conn.execute("DELETE FROM times WHERE q = ? AND first >= ?", (q, first))


def segment_reaching(conn: sqlite3.Connection, q: int, timestamp: int) -> int | None:
    """The first offset of the first segment whose running maximum reaches ``timestamp`` (an index seek
    on ``(q, top)``: the tops only rise with the offset), or None when no held record reaches it."""
    row = conn.execute(
        "SELECT first FROM times WHERE q = ? AND top >= ? ORDER BY top, first LIMIT 1", (q, timestamp)
    ).fetchone()
    return None if row is None else int(row[0])


__all__ = [
    "Tails",
    "added",
    "added_new",
    "backfill",
    "create",
    "present",
    "removed_below",
    "removed_from",
    "retop",
    "segment_reaching",
]
