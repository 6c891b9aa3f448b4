"""Wire and storage encoding of deltas, summaries and fork proofs (msgpack, strictly validated).

msgpack only carries these values; nothing is signed over msgpack bytes (signatures cover the fixed
layouts in :mod:`head` and :mod:`records`), so two encoders that differ cannot break verification.
Decoding checks every type and length and raises :class:`MalformedError`, never anything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import msgpack

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.forks import Bridge, ForkProof
from latticed.crdt.head import SignedHead
from latticed.crdt.queue import QueueDelta, Summary
from latticed.crdt.records import MAX_OFFSET, MIXED, Headers, Record, RecordRun, check_records, uniform

WIRE_VERSION = 1


def record_to_wire(record: Record) -> list[Any]:
    return [record.key, record.value, record.timestamp, [[k, v] for k, v in record.headers]]


def _headers_from_wire(raw: list[Any]) -> Headers:
    pairs = []
    for item in raw:
        if (
            type(item) not in _ARRAY
            or len(item) != 2
            or type(item[0]) is not str
            or type(item[1]) is not bytes
        ):
            raise MalformedError("a header is [name (str), value (bytes)]")
        pairs.append((item[0], item[1]))
    return tuple(pairs)


#: msgpack decodes arrays as lists; rows built in memory (``records_to_wire`` of a run) are tuples.
_ARRAY = (list, tuple)
_ARRAY_TYPES = frozenset(_ARRAY)
_RECORD_SHAPE_ERROR = "a record is [key (bytes|nil), value (bytes), timestamp (int), headers (list)]"


def records_to_wire(records: Sequence[Record]) -> list[Any]:
    """Records as ``[key, value, timestamp, headers]`` rows; a run is zipped from its columns (msgpack
    writes a tuple as the same array a list makes, so no row is built in Python)."""
    if type(records) is not RecordRun:
        return [record_to_wire(r) for r in records]
    headers: Any = records.headers
    if headers is None:
        headers = repeat((), len(records.values))
    elif (same := uniform(headers)) is not MIXED:  # a producer's stamp: converted once
        headers = repeat([[k, v] for k, v in same], len(records.values))
    else:
        headers = [[[k, v] for k, v in h] for h in headers]
    return list(zip(records.keys, records.values, records.timestamps, headers, strict=True))


def records_from_wire(raw: Any) -> RecordRun:
    """Rows of ``[key, value, timestamp, headers]`` straight into the columns of a :class:`RecordRun`:
    the rows are transposed and checked a column at a time (no Record object is built), types and size
    limits by :func:`check_records`, which marks the run checked so verification does not repeat it."""
    if type(raw) is not list:
        raise MalformedError("records must be a list")
    if not raw:
        return RecordRun((), (), ())
    if not set(map(type, raw)) <= _ARRAY_TYPES or set(map(len, raw)) != {4}:
        raise MalformedError("a record is [key, value, timestamp, headers]")
    keys, values, timestamps, headers = zip(*raw, strict=True)
    if not set(map(type, headers)) <= _ARRAY_TYPES:
        raise MalformedError(_RECORD_SHAPE_ERROR)
    header_column: Any = None
    if any(headers):
        same = uniform(headers)  # equal lists compare in C: the same stamp on each record is read once
        if same is not MIXED:
            header_column = repeat(_headers_from_wire(same), len(headers))
        else:
            header_column = [_headers_from_wire(h) if h else () for h in headers]
    records = RecordRun(values, keys, timestamps, header_column)
    check_records(records)  # value, key and timestamp types and limits, for every record
    return records


def _head(raw: Any) -> SignedHead:
    if not isinstance(raw, bytes):
        raise MalformedError("a signed head is bytes")
    head = SignedHead.from_bytes(raw)
    head.check()  # offsets past MAX_OFFSET are refused as early as they arrive
    return head


def _opt_head(raw: Any) -> SignedHead | None:
    return None if raw is None else _head(raw)


def _tip(raw: Any, head_raw: Any) -> SignedHead | None:
    if raw is True:
        if head_raw is None:
            raise MalformedError("tip refers to a missing head")
        return _head(head_raw)
    return _opt_head(raw)


def _bytes(raw: Any, size: int | None, what: str) -> bytes:
    if not isinstance(raw, bytes) or (size is not None and len(raw) != size):
        raise MalformedError(f"{what} must be {size or 'some'} bytes")
    return raw


def _int(raw: Any, what: str) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < -1 or raw >= 2**64:
        raise MalformedError(f"{what} must be an unsigned integer")
    return raw


def _offset(raw: Any, what: str) -> int:
    if type(raw) is not int or not 0 <= raw <= MAX_OFFSET:
        raise MalformedError(f"{what} must be an offset, 0 to {MAX_OFFSET}")
    return raw


def _str(raw: Any, what: str) -> str:
    if not isinstance(raw, str):
        raise MalformedError(f"{what} must be a string")
    return raw


def proof_to_wire(proof: ForkProof) -> list[Any]:
    def bridge(b: Bridge | None) -> list[Any] | None:
        return None if b is None else [b.start_hash, list(b.digests)]

    return [
        proof.owner,
        proof.name,
        proof.kind,
        proof.a.to_bytes(),
        proof.b.to_bytes(),
        proof.offset,
        bridge(proof.bridge_a),
        bridge(proof.bridge_b),
    ]


def proof_from_wire(raw: Any) -> ForkProof:
    if not isinstance(raw, list | tuple) or len(raw) != 8:
        raise MalformedError("a fork proof has 8 fields")

    def bridge(item: Any) -> Bridge | None:
        if item is None:
            return None
        if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[1], list | tuple):
            raise MalformedError("a bridge is [start_hash, digests]")
        return Bridge(
            _bytes(item[0], 32, "bridge start"), tuple(_bytes(x, 32, "bridge digest") for x in item[1])
        )

    offset = raw[5]
    if not isinstance(offset, int) or isinstance(offset, bool) or not -1 <= offset < 2**64:
        raise MalformedError("fork proof offset must be an integer")
    return ForkProof(
        owner=_bytes(raw[0], 32, "owner"),
        name=_str(raw[1], "name"),
        kind=_int(raw[2], "kind"),
        a=_head(raw[3]),
        b=_head(raw[4]),
        offset=offset,
        bridge_a=bridge(raw[6]),
        bridge_b=bridge(raw[7]),
    )


def delta_to_wire(d: QueueDelta) -> list[Any]:
    return [
        WIRE_VERSION,
        d.owner,
        d.name,
        d.kind,
        d.head.to_bytes() if d.head else None,
        None if d.meta is None else [[k, v] for k, v in d.meta],
        # The tip is usually the head itself: say so in one byte instead of repeating 248.
        True if d.tip is not None and d.tip == d.head else (d.tip.to_bytes() if d.tip else None),
        d.from_offset,
        d.from_hash,
        records_to_wire(d.records),
        [c.to_bytes() for c in d.checkpoints],
        proof_to_wire(d.fork) if d.fork else None,
    ]


def delta_from_wire(raw: Any) -> QueueDelta:
    if not isinstance(raw, list | tuple) or len(raw) != 12:
        raise MalformedError("a delta has 12 fields")
    if raw[0] != WIRE_VERSION:
        raise MalformedError(f"unknown delta version {raw[0]!r}")
    meta_raw = raw[5]
    meta: tuple[tuple[str, str], ...] | None = None
    if meta_raw is not None:
        if not isinstance(meta_raw, list | tuple):
            raise MalformedError("metadata must be a list of [key, value]")
        items = []
        for item in meta_raw:
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise MalformedError("metadata entries are [key, value]")
            items.append((_str(item[0], "metadata key"), _str(item[1], "metadata value")))
        meta = tuple(items)
    records_raw, checkpoints_raw = raw[9], raw[10]
    if not isinstance(records_raw, list | tuple) or not isinstance(checkpoints_raw, list | tuple):
        raise MalformedError("records and checkpoints must be lists")
    if type(records_raw) is not list:
        records_raw = list(records_raw)
    return QueueDelta(
        owner=_bytes(raw[1], 32, "owner"),
        name=_str(raw[2], "name"),
        kind=_int(raw[3], "kind"),
        head=_opt_head(raw[4]),
        meta=meta,
        tip=_tip(raw[6], raw[4]),
        from_offset=_offset(raw[7], "from_offset"),
        from_hash=_bytes(raw[8], None, "from_hash"),
        records=records_from_wire(records_raw),
        checkpoints=tuple(_head(c) for c in checkpoints_raw),
        fork=None if raw[11] is None else proof_from_wire(raw[11]),
    )


def summary_to_wire(s: Summary) -> list[Any]:
    """Six fields, and a seventh (the replica's own floor) only when it dropped records locally, so a
    peer of an earlier version still reads every other summary."""
    fields = [s.version, s.start, s.held_end, s.held_hash, s.meta_version, s.forked]
    if s.floor:
        fields.append(s.floor)
    return fields


def summary_from_wire(raw: Any) -> Summary:
    if not isinstance(raw, list | tuple) or len(raw) not in (6, 7) or not isinstance(raw[5], bool):
        raise MalformedError("a summary has 6 fields (7 with a floor)")
    return Summary(
        version=_int(raw[0], "version"),
        start=_offset(raw[1], "start"),
        held_end=_offset(raw[2], "held_end"),
        held_hash=_bytes(raw[3], None, "held_hash"),
        meta_version=_int(raw[4], "meta_version"),
        forked=raw[5],
        floor=_offset(raw[6], "floor") if len(raw) == 7 else 0,
    )


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes, max_bytes: int = 64 * 1024 * 1024) -> Any:
    """Decode msgpack with limits; any decoding failure is a :class:`MalformedError`."""
    if len(data) > max_bytes:
        raise MalformedError("message too large")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises many unrelated types for bad input
        raise MalformedError(f"undecodable message: {type(exc).__name__}") from exc


def encode_delta(d: QueueDelta) -> bytes:
    return pack(delta_to_wire(d))


def decode_delta(data: bytes) -> QueueDelta:
    return delta_from_wire(unpack(data))
