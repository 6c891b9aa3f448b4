"""A segment's header column as stored (schema 9): a record whose headers equal the record's before is
stored as ``true`` (one byte), not as the headers again.

Records forwarded into a queue each carry the owner's producer stamp (``lattice.producer`` and the
forwarder's 64-hex identity, ~84 bytes): stored whole, a 100-byte record's row grows by ~80 % and the
store's writes, its fsyncs and every read of the records back grow with it. Stored as ``true`` after the
first, the run costs its payload. A column stored before schema 9 holds no ``true`` and reads as it did;
a decoded column is the same list of ``[[name, value], ...]`` (or None) as ever, equal entries sharing one
list (never mutated).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any, Final

import msgpack

from latticed.crdt.records import MIXED, Headers, uniform

__all__ = ["array_head", "headers_nbytes", "pack_headers", "pack_item", "stored_headers", "unpack_headers"]

#: What a stored entry equal to the one before is written as.
SAME: Final = True
_TRUE: Final = b"\xc3"  # msgpack's true


def array_head(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


def pack_headers(column: list[Any]) -> bytes:
    """msgpack of a segment's header column (entries None or ``[[name, value], ...]``), each entry that
    equals the one before it (and is not None) written as ``true``."""
    first = column[0] if column else None
    if first is None and column.count(None) == len(column):
        return array_head(len(column)) + b"\xc0" * len(column)  # no record has headers
    if type(first) is list and column.count(first) == len(column):  # a producer's stamp on each
        return array_head(len(column)) + pack_item(first) + _TRUE * (len(column) - 1)
    out: list[Any] = [first]
    out += [SAME if h is not None and h == before else h for before, h in pairwise(column)]
    return pack_item(out)


def pack_item(item: Any) -> bytes:
    return msgpack.packb(item, use_bin_type=True)  # type: ignore[no-any-return]


def unpack_headers(column: list[Any]) -> list[Any]:
    """The column :func:`pack_headers` wrote (or one written before schema 9), each ``true`` replaced by
    the entry before it. A ``true`` with no entry before it, or after None, is a :class:`ValueError`."""
    if SAME not in column:
        return column
    n = len(column)
    first = column[0]
    if type(first) is list and column.count(SAME) == n - 1:
        return [first] * n
    out: list[Any] = []
    before: Any = None
    for entry in column:
        if entry is SAME:
            if before is None:
                raise ValueError("a header entry repeats none before it")
        else:
            before = entry
        out.append(before)
    return out


def stored_headers(headers: Sequence[Headers] | None, n: int) -> list[list[list[Any]] | None]:
    """A run's header column as a segment stores it (``[[name, value], ...]``, None for none): headers
    every record shares (a producer's stamp) are converted once, the lists shared (never mutated)."""
    if headers is None:
        return [None] * n
    same = uniform(headers)
    if same is not MIXED:
        return [[[k, v] for k, v in same] if same else None] * n
    return [[[k, v] for k, v in h] if h else None for h in headers]


def headers_nbytes(headers: Sequence[Any]) -> int:
    """Bytes of a segment's header column as :meth:`Segment.nbytes` counts them (names and values)."""
    if not any(headers):
        return 0
    same = uniform(headers)
    if same is not MIXED:
        return len(headers) * sum(len(k) + len(v) for k, v in same)
    return sum(len(k) + len(v) for h in headers if h for k, v in h)
