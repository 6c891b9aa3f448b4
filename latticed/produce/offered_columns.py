"""An offer's records sent as columns (the local API's ``packed`` layout of ``offer_batch``), split into
the value and key columns the owner's append takes.

Sent as a list of ``[value, key, headers]``, each record cost the daemon's event loop a list, its items
and msgpack's walk over them before the owner took its columns apart again (about half a microsecond a
record, more than the rest of the loop's work on a sink's batch). Sent as columns (each one buffer, with
a length per record), the records are cut straight into the tuples of bytes a :class:`RecordRun` holds,
in one C pass where :mod:`latticed.crdt.columns_compiled` was built (``unpacked``), a few Python passes
where not (the same result, tests/produce/test_offered_columns.py). That pass also lays out the bytes
msgpack would pack the same records into as a list (``[value, key, []]`` each), so an owner's digest of
a producer's records (:func:`latticed.produce.dedup.offered_digest`) is the same whichever form a
producer sent: a retry in the other form is still a retry.

Records with headers or timestamps keep the list form's checks: :meth:`OfferedColumns.rows` gives them
as the list form would have sent them, and its path judges them. The limits are the list form's.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final

import msgpack

from latticed.crdt import columns_compiled
from latticed.crdt.records import MAX_KEY_BYTES, MAX_VALUE_BYTES
from latticed.errors import MalformedError

#: The ``layout`` of an ``offer_batch`` whose records are columns.
PACKED_LAYOUT: Final = "packed"
#: Fields of that layout (besides ``layout``).
PACKED_FIELDS: Final = ("count", "values", "value_lengths", "keys", "key_lengths", "timestamps", "headers")
#: The fields of that layout a ``produce`` request over the peer link carries (``headers``, a map keyed
#: by record index, is not among them: the link's msgpack takes text keys only; such records go as a list).
LINK_FIELDS: Final = PACKED_FIELDS[:-1]


@dataclass(frozen=True, slots=True)
class OfferedColumns:
    """Records an offer sent as columns: ``values``, ``keys`` (None: no key), and ``packed``, the bytes
    msgpack packs the records ``[value, key, []]`` into as a list (what a digest of them hashes).
    ``stamps`` (None: none sent; an item None: the owner's clock) and ``headers`` (record index to the
    headers it was sent with; None: none has any) are as sent, unchecked."""

    values: tuple[bytes, ...]
    keys: tuple[bytes | None, ...]
    packed: bytes
    stamps: tuple[int | None, ...] | None = None
    headers: dict[int, Any] | None = None

    def __len__(self) -> int:
        return len(self.values)

    @property
    def plain(self) -> bool:
        """No timestamps and no headers: the columns are the whole of it (checked already)."""
        return self.stamps is None and self.headers is None

    def rows(self) -> list[list[Any]]:
        """The records as the list form sends them: ``[value, key, headers]``, with ``timestamp`` fourth
        when any was sent."""
        headers = self.headers or {}
        rows = [
            [v, k, headers.get(i, [])] for i, (v, k) in enumerate(zip(self.values, self.keys, strict=True))
        ]
        if self.stamps is not None:
            for row, stamp in zip(rows, self.stamps, strict=True):
                row.append(stamp)
        return rows


def _blob(fields: Mapping[str, Any], name: str, *, optional: bool = False) -> bytes | None:
    value = fields.get(name)
    if value is None and optional:
        return None
    if type(value) is not bytes:
        raise MalformedError(f"packed offer: {name!r} is bytes, got {type(value).__name__}")
    return value


def _lengths(blob: bytes, count: int, name: str) -> tuple[int, ...]:
    if len(blob) != 4 * count:
        raise MalformedError(f"packed offer: {name!r} is {count} little-endian int32, got {len(blob)} bytes")
    return struct.unpack(f"<{count}i", blob)


def _split(data: bytes, lengths: Sequence[int], name: str) -> list[bytes]:
    """``data`` cut at ``lengths`` (each non-negative), which must cover it exactly."""
    ends = list(accumulate(lengths))
    if (ends[-1] if ends else 0) != len(data):
        raise MalformedError(
            f"packed offer: the lengths of {name!r} add up to {ends[-1]}, not its {len(data)} bytes"
        )
    return [data[end - size : end] for end, size in zip(ends, lengths, strict=True)]


def unpacked_pure(
    values: bytes, value_lengths: bytes, keys: bytes, key_lengths: bytes | None, count: int
) -> tuple[tuple[bytes, ...], tuple[bytes | None, ...], bytes]:
    """The columns of :func:`offered_columns` without the compiled pass (MalformedError saying what is
    wrong where the compiled pass answers None)."""
    vlens = _lengths(value_lengths, count, "value_lengths")
    if min(vlens) < 0 or max(vlens) > MAX_VALUE_BYTES:
        raise MalformedError(f"packed offer: record values are 0-{MAX_VALUE_BYTES} bytes")
    out_values = tuple(_split(values, vlens, "values"))
    out_keys: tuple[bytes | None, ...]
    if key_lengths is None:
        if keys:
            raise MalformedError("packed offer: 'keys' without 'key_lengths'")
        out_keys = (None,) * count
    else:
        klens = _lengths(key_lengths, count, "key_lengths")
        if min(klens) < -1 or max(klens) > MAX_KEY_BYTES:
            raise MalformedError(f"packed offer: record keys are 0-{MAX_KEY_BYTES} bytes, or -1 for none")
        present = iter(_split(keys, [k for k in klens if k >= 0], "keys"))
        out_keys = tuple(None if k < 0 else next(present) for k in klens)
    records: list[list[Any]] = [[v, k, []] for v, k in zip(out_values, out_keys, strict=True)]
    return out_values, out_keys, msgpack.packb(records, use_bin_type=True)


def _stamps(blob: bytes | None, count: int) -> tuple[int | None, ...] | None:
    if blob is None:
        return None
    if len(blob) != 8 * count:
        raise MalformedError(
            f"packed offer: 'timestamps' is {count} little-endian int64, got {len(blob)} bytes"
        )
    stamps = struct.unpack(f"<{count}q", blob)
    if min(stamps) < -1:
        raise MalformedError(
            "packed offer: a timestamp is milliseconds since the epoch, or -1 for the owner's clock"
        )
    return tuple(None if ts == -1 else ts for ts in stamps)


def _headers(raw: Any, count: int) -> dict[int, Any] | None:
    if raw is None:
        return None
    if type(raw) is not dict or not all(type(i) is int and 0 <= i < count for i in raw):
        raise MalformedError("packed offer: 'headers' is a map from record index to that record's headers")
    return raw or None


def offered_columns(fields: Mapping[str, Any], max_records: int) -> OfferedColumns:
    """The records of a ``packed`` request (its :data:`PACKED_FIELDS`): ``count`` records (1 to
    ``max_records``); ``values`` the values one after another, ``value_lengths`` one little-endian int32
    each; ``keys`` and ``key_lengths`` likewise (-1: no key; ``key_lengths`` nil: none has one);
    ``timestamps`` nil or one little-endian int64 each (-1: the owner's clock); ``headers`` nil or a map
    from record index to its headers. MalformedError, saying what, for anything else."""
    count = fields.get("count")
    if type(count) is not int or not 0 < count <= max_records:
        raise MalformedError(f"packed offer: 'count' is an integer in 1-{max_records}, got {count!r}")
    values = _blob(fields, "values")
    value_lengths = _blob(fields, "value_lengths")
    keys = _blob(fields, "keys", optional=True) or b""
    key_lengths = _blob(fields, "key_lengths", optional=True)
    assert values is not None and value_lengths is not None
    compiled = columns_compiled.load()
    split = None
    if compiled is not None and len(value_lengths) == 4 * count:
        split = compiled.unpacked(values, value_lengths, keys, key_lengths, MAX_VALUE_BYTES, MAX_KEY_BYTES)
    if split is None:  # not built, or something is wrong: the pure path says what
        split = unpacked_pure(values, value_lengths, keys, key_lengths, count)
    out_values, out_keys, packed = split
    stamps = _stamps(_blob(fields, "timestamps", optional=True), count)
    return OfferedColumns(out_values, out_keys, packed, stamps, _headers(fields.get("headers"), count))


__all__ = [
    "LINK_FIELDS",
    "PACKED_FIELDS",
    "PACKED_LAYOUT",
    "OfferedColumns",
    "offered_columns",
    "unpacked_pure",
]
