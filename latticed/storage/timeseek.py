"""Look an offset up by time: the first held record whose timestamp is at or after ``T``.

One statement, a bisection of the time index's key (:func:`latticed.storage.timeindex.segment_reaching`),
finds the segment, one segment read finds the record in it. What a timestamp is and what timestamps that
go back do: see :mod:`latticed.storage.timeindex`.
"""

from __future__ import annotations

import sqlite3

from latticed.storage import segments, timeindex


def offset_for_time(conn: sqlite3.Connection, q: int, timestamp: int) -> tuple[int, int] | None:
    """``(offset, its timestamp)`` of the first held record of queue ``q`` whose timestamp is at or after
    ``timestamp``, or None when no held record's is (Kafka's ``offsetsForTimes``)."""
    first = timeindex.segment_reaching(conn, q, timestamp)
    if first is None:
        return None
    segment = segments.containing(conn, q, first)
    if segment is None:
        return None
    for i, ts in enumerate(segment.timestamps):
        if ts >= timestamp:
            return segment.first + i, int(ts)
    return None


__all__ = ["offset_for_time"]
