"""The sink's records packed straight from Arrow columns (no Python object per row).

A task's rows reach the daemon as the ``records`` of ``offer_batch`` requests: ``[value, key, []]`` each
when the rows have no headers and no timestamp, the sink's common shape. Turning each row into a Python
list, then msgpack walking those lists, cost the executor more per row than the rest of its work. Here
each row's msgpack bytes come from a few Arrow kernels over whole columns (lengths, the bin headers, a
join) into one buffer, which stays one: chunks are cut over its size column with numpy and take slices
of it, and a request's ``records`` is those slices after one array header, spliced into the request as
they are (:class:`~latticed.api.messages.Packed`). No Python object is made per row, and the bytes are
byte for byte what packing the records would give (tests/spark/test_sink_packed.py), so the owner's
checks, digests and verdicts are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from latticed.api.messages import Packed
from latticed.spark.sink_columns import ColumnRecords, ColumnRows
from latticed.spark.sink_records import RECORD_OVERHEAD, PackedRecords, PackedRows
from latticed.spark.sink_send import Spliced

#: Column types whose rows become bytes as they are (strings by their UTF-8 bytes, as Arrow casts them).
_SHORT = (pa.binary(), pa.string())


def _bin_headers(lengths: np.ndarray, lead: bytes) -> pa.Array:
    """Per row, ``lead`` then msgpack's bin header for a blob of that length (bin 8, 16 or 32)."""
    lengths = lengths.astype(np.int64)
    k = len(lead)
    n = len(lengths)
    if not n or int(lengths.max()) < 1 << 8:  # all bin 8: one fixed-width header a row
        rows = np.empty((n, k + 2), dtype=np.uint8)
        rows[:, :k] = np.frombuffer(lead, dtype=np.uint8)
        rows[:, k] = 0xC4
        rows[:, k + 1] = lengths
        offsets = np.arange(0, (n + 1) * (k + 2), k + 2, dtype=np.int32)
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rows)])
    sizes = np.where(lengths < 1 << 8, k + 2, np.where(lengths < 1 << 16, k + 3, k + 5))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    starts = offsets[:-1].astype(np.int64)
    for i, byte in enumerate(lead):
        data[starts + i] = byte
    for marker, width, mask in (
        (0xC4, 1, lengths < 1 << 8),
        (0xC5, 2, (lengths >= 1 << 8) & (lengths < 1 << 16)),
        (0xC6, 4, lengths >= 1 << 16),
    ):
        at, sized = starts[mask] + k, lengths[mask]
        data[at] = marker
        for j in range(width):  # big-endian length
            data[at + 1 + j] = (sized >> (8 * (width - 1 - j))) & 0xFF
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _plain_columns(batch: pa.RecordBatch, queue: str | None) -> tuple[pa.Array, pa.Array | None] | None:
    """The value and key columns of a batch both fast forms take (one queue, no headers, no timestamps,
    short binary or string columns, no null value); None for any other batch."""
    names = batch.schema.names
    if queue is None or "headers" in names or "timestamp" in names:
        return None
    values = batch.column(names.index("value"))
    keys = batch.column(names.index("key")) if "key" in names else None
    if values.type not in _SHORT or (keys is not None and keys.type not in _SHORT) or values.null_count:
        return None
    return values, keys


def packed_rows(batch: pa.RecordBatch, queue: str | None, resolve: Any) -> PackedRows | None:
    """The rows of ``batch`` for one queue (the ``queue`` option) as the msgpack bytes of each record
    ``[value, key, []]``, with the same sizes as :func:`~latticed.spark.sink_records.batch_rows`; None
    when the batch is not of that shape (headers, timestamps, a ``queue`` column, large strings): then
    ``batch_rows`` builds the records."""
    plain = _plain_columns(batch, queue)
    if plain is None:
        return None
    values, keys = plain
    values = values.cast(pa.binary())
    value_lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
    parts = [_bin_headers(value_lengths, b"\x93"), values]
    sizes = value_lengths.astype(np.int64) + RECORD_OVERHEAD
    if keys is None:
        parts.append(pa.scalar(b"\xc0", pa.binary()))
    else:
        keys = keys.cast(pa.binary())
        key_lengths = pc.fill_null(pc.binary_length(keys), 0).to_numpy(zero_copy_only=False)
        heads = _bin_headers(key_lengths, b"")
        nil = pa.scalar(b"\xc0", pa.binary())
        parts += [pc.if_else(pc.is_null(keys), nil, heads), pc.fill_null(keys, b"")]
        sizes += key_lengths
    parts.append(pa.scalar(b"\x90", pa.binary()))
    encoded = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))
    _, offsets, data = encoded.buffers()
    n = len(encoded)
    starts = np.frombuffer(offsets, dtype=np.int32)[encoded.offset : encoded.offset + n + 1]
    return PackedRows(resolve(queue), memoryview(data), starts, sizes)


def column_rows(batch: pa.RecordBatch, queue: str | None, resolve: Any) -> ColumnRows | None:
    """The rows of ``batch`` for one queue as columns, for a daemon that takes ``offer_batch``'s
    ``packed`` layout: the Arrow buffers as they are, sliced, with the same sizes as
    :func:`packed_rows`; None when the batch is not of that shape (as for :func:`packed_rows`)."""
    plain = _plain_columns(batch, queue)
    if plain is None:
        return None
    values, keys = plain
    data, value_offsets = _buffers(values.cast(pa.binary()))
    sizes = np.diff(value_offsets) + RECORD_OVERHEAD
    key_data = key_offsets = key_lengths = None
    if keys is not None:
        keys = keys.cast(pa.binary())
        missing = pc.is_null(keys).to_numpy(zero_copy_only=False) if keys.null_count else None
        if missing is not None:  # a null's slot may hold bytes: made empty, its length -1
            keys = pc.fill_null(keys, b"")
        key_data, key_offsets = _buffers(keys)
        lengths = np.diff(key_offsets)
        sizes += lengths
        key_lengths = lengths.astype(np.int32)
        if missing is not None:
            key_lengths[missing] = -1
    return ColumnRows(resolve(queue), data, value_offsets, key_data, key_offsets, key_lengths, sizes)


def _buffers(column: pa.Array) -> tuple[memoryview, np.ndarray]:
    """A binary array's data buffer and its ``n + 1`` offsets into it (int64)."""
    _, offsets, data = column.buffers()
    n = len(column)
    starts = np.frombuffer(offsets, dtype=np.int32)[column.offset : column.offset + n + 1].astype(np.int64)
    return memoryview(data if data is not None else b""), starts


def _bin(parts: list[memoryview]) -> Spliced:
    """Bytes in parts as one msgpack bin (bin 8, 16 or 32), the parts kept as they are (not joined)."""
    size = sum(map(len, parts))
    head = (
        b"\xc4" + size.to_bytes(1, "big")
        if size < 1 << 8
        else b"\xc5" + size.to_bytes(2, "big")
        if size < 1 << 16
        else b"\xc6" + size.to_bytes(4, "big")
    )
    return Spliced([head, *parts])


def column_request(records: ColumnRecords) -> dict[str, Any]:
    """A chunk's records as the fields of a ``packed`` ``offer_batch`` (local API 2); the values and keys
    as :class:`~latticed.spark.sink_send.Spliced` slices of the Arrow buffers, written to the socket as
    they are."""
    key_lengths = records.key_lengths
    return {
        "layout": "packed",
        "count": len(records),
        "values": _bin(records.values),
        "value_lengths": np.concatenate(records.value_lengths).astype("<i4").tobytes(),
        "keys": _bin(records.keys),
        "key_lengths": None if key_lengths is None else np.concatenate(key_lengths).astype("<i4").tobytes(),
    }


def packed_records(records: Sequence[Any] | PackedRecords) -> Any:
    """A chunk's ``records`` for the request: rows packed by :func:`packed_rows` spliced into one msgpack
    array, or the records themselves (built by ``batch_rows``)."""
    if type(records) is not PackedRecords:
        return records
    n = len(records)
    header = (
        bytes((0x90 | n,))
        if n < 16
        else b"\xdc" + n.to_bytes(2, "big")
        if n < 1 << 16
        else b"\xdd" + n.to_bytes(4, "big")
    )
    return Packed(b"".join([header, *records.parts]))


__all__ = ["column_request", "column_rows", "packed_records", "packed_rows"]
