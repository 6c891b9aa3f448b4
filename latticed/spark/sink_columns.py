"""A sink chunk's rows as columns, for daemons that take ``offer_batch``'s ``packed`` layout (local API
2): each column one buffer with a length per row, sliced out of the Arrow batches the rows came in, so
neither the task nor the daemon makes a Python object per row to send or take them apart
(:mod:`latticed.spark.sink_packed` builds them; :mod:`latticed.spark.sink_records` cuts them into chunks
by the same rule as every other shape of rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


class ColumnRecords:
    """A chunk's records as columns (the local API's ``packed`` layout of ``offer_batch``), in slices of
    Arrow buffers: the values' bytes and an int32 length each, the keys' likewise (-1: no key; no key
    columns at all when the rows have none). What :class:`ColumnRows` are cut into."""

    __slots__ = ("count", "key_lengths", "keys", "value_lengths", "values")

    def __init__(self) -> None:
        self.values: list[memoryview] = []
        self.value_lengths: list[np.ndarray] = []
        self.keys: list[memoryview] = []
        self.key_lengths: list[np.ndarray] | None = None
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, rows: ColumnRows, lo: int, hi: int) -> None:
        """Rows ``lo`` to ``hi`` (exclusive) of ``rows``."""
        self.values.append(rows.values[int(rows.value_offsets[lo]) : int(rows.value_offsets[hi])])
        self.value_lengths.append(np.diff(rows.value_offsets[lo : hi + 1]))
        if rows.key_lengths is not None and rows.key_offsets is not None and rows.keys is not None:
            if self.key_lengths is None:  # rows without keys before: each of those had none
                self.key_lengths = [np.full(self.count, -1, dtype=np.int32)]
            self.keys.append(rows.keys[int(rows.key_offsets[lo]) : int(rows.key_offsets[hi])])
            self.key_lengths.append(rows.key_lengths[lo:hi])
        elif self.key_lengths is not None:
            self.key_lengths.append(np.full(hi - lo, -1, dtype=np.int32))
        self.count += hi - lo

    def records(self) -> list[list[Any]]:
        """The records as lists ``[value, key, []]`` (a chunk that meets rows of another shape)."""
        values = _cut(b"".join(self.values), np.concatenate(self.value_lengths))
        if self.key_lengths is None:
            return [[v, None, []] for v in values]
        lengths = np.concatenate(self.key_lengths)
        present = iter(_cut(b"".join(self.keys), lengths[lengths >= 0]))
        return [
            [v, next(present) if k >= 0 else None, []] for v, k in zip(values, lengths.tolist(), strict=True)
        ]


def _cut(data: bytes, lengths: np.ndarray) -> list[bytes]:
    ends = np.cumsum(lengths).tolist()
    return [data[end - size : end] for end, size in zip(ends, lengths.tolist(), strict=True)]


@dataclass(slots=True)
class ColumnRows:
    """One Arrow batch's rows for one queue as columns: row ``i``'s value is
    ``values[value_offsets[i]:value_offsets[i + 1]]``, its key likewise, or none where ``key_lengths``
    is -1 (``keys`` None: no row has one); ``sizes`` as :class:`Rows`'."""

    queues: str
    values: memoryview
    value_offsets: np.ndarray
    keys: memoryview | None
    key_offsets: np.ndarray | None
    key_lengths: np.ndarray | None
    sizes: np.ndarray

    def rows(self, lo: int) -> tuple[list[list[Any]], list[int]]:
        """Rows ``lo`` on as records and their sizes (a chunk that holds rows of another shape)."""
        part = ColumnRecords()
        part.add(self, lo, len(self.sizes))
        return part.records(), self.sizes[lo:].tolist()


__all__ = ["ColumnRecords", "ColumnRows"]
