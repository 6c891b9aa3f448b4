"""The chain values of a run of records, handed from the step that computed them to the next one that
needs the same: a peer's delta rebuilds its head bodies from its records' chain values
(``core2_steps.unpack_steps``), then ``queue2.verify_delta`` hashes the same records from the same base
again, the costliest part of a catch-up after decoding.

One entry (the newest), keyed by the base, the first offset and the identity of the records' immutable
columns (a :class:`~latticed.crdt.records.RecordRun`'s, or a tuple of records), which it keeps alive so
an identity is never another run's. :func:`take` removes it: a chain is handed over at most once, and a
chunk is not kept past its verification. Chain values are a function of exactly these inputs, so a hit
is what :func:`~latticed.crdt.records.chain_extend` would compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import is_

from latticed.crdt.records import Record, RecordRun

__all__ = ["remember", "take"]

_Key = tuple[bytes, int, tuple[object, ...]]
#: One slot, read and replaced whole (threads may share it: no partial entry is ever seen).
_slot: list[tuple[_Key, list[bytes]] | None] = [None]


def _key(base: bytes, first: int, records: Sequence[Record]) -> _Key | None:
    if type(records) is RecordRun:
        return base, first, (records.values, records.keys, records.timestamps, records.headers)
    if type(records) is tuple:
        return base, first, (records,)
    return None  # a list may change: not remembered


def _count(records: Sequence[Record]) -> int:
    """``len(records)``; a run's by its column (no ``RecordRun.__len__`` frame)."""
    return len(records.values) if type(records) is RecordRun else len(records)


def _same(a: _Key, b: _Key) -> bool:
    # (``map(is_, ...)``: the columns compared by identity with no generator frame resumed per column)
    x, y = a[2], b[2]
    return a[0] == b[0] and a[1] == b[1] and len(x) == len(y) and all(map(is_, x, y))


def remember(base: bytes, first: int, records: Sequence[Record], chain: list[bytes]) -> None:
    """Keep ``chain`` (``chain_extend(base, first, records)``) for the next :func:`take` of the same."""
    key = _key(base, first, records)
    if key is not None and len(chain) == _count(records):
        _slot[0] = (key, list(chain))


def take(base: bytes, first: int, records: Sequence[Record]) -> list[bytes] | None:
    """``chain_extend(base, first, records)`` if it was remembered (and forget it), else None."""
    key = _key(base, first, records)
    entry = _slot[0]
    if key is None or entry is None or len(entry[1]) != _count(records) or not _same(entry[0], key):
        return None
    _slot[0] = None
    return entry[1]
