"""The v2 log in a few bytes a version: what a replica that holds the records needs to rebuild each head.

A head's body is mostly what the records already say (its start and end chain values) or what the head
before it said (queue, epoch, version + 1, ``log``, metadata), so a version travels as its steps (end,
timestamp, and start or metadata when they change): ~3 bytes for a single offer, instead of its 40-byte
leaf. A version whose records neither side holds any more travels as its leaf. Per version::

    flags      u8      1 start moved, 2 metadata changed, 4 leaf as is
    end step   varint
    [not 4]    timestamp step, zigzag varint; [1] start step, varint; [2] meta version varint, hash 32
    [4]        digest 32

The receiver rebuilds the leaves from the body it already trusts and the records' chain values; they are
authenticated only by folding into a signed head's ``log`` (:func:`latticed.crdt.epochs.verify`): a changed
record changes a rebuilt body, and the fold no longer matches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head2 import HEAD2_BODY, HEAD2_NAMESPACE, HeadV2, Leaf, body_digest, fold_one, next_log
from latticed.crdt.records import MAX_OFFSET

__all__ = ["decode", "encode"]

_START, _META, _LEAF = 1, 2, 4


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def encode(prev: HeadV2, versions: Sequence[HeadV2 | Leaf]) -> bytes:
    """The versions after ``prev``, each a body (rebuilt by the receiver) or a leaf (sent as is)."""
    out, last = bytearray(), prev
    for item in versions:
        if isinstance(item, tuple):
            digest, end = item
            out += bytes([_LEAF]) + _varint(end - last.end) + digest
            last = dataclasses.replace(last, end=end)
            continue
        flags = (_START if item.start != last.start else 0) | (
            _META if item.meta_version != last.meta_version else 0
        )
        step = item.timestamp - last.timestamp
        out += (
            bytes([flags]) + _varint(item.end - last.end) + _varint(step * 2 if step >= 0 else -step * 2 - 1)
        )
        if flags & _START:
            out += _varint(item.start - last.start)
        if flags & _META:
            out += _varint(item.meta_version) + item.meta_hash
        last = item
    return bytes(out)


def _take(raw: bytes, at: int, n: int) -> bytes:
    if at + n > len(raw):
        raise MalformedError("a log's steps end early")
    return raw[at : at + n]


def _read_varint(raw: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` and where the next field starts."""
    if at < len(raw) and raw[at] < 0x80:
        return raw[at], at + 1  # a step under 128: nearly all of them
    value = shift = 0
    while shift < 64:
        byte = _take(raw, at, 1)[0]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise MalformedError("a log step is not a 64-bit varint")


def decode(prev: HeadV2, raw: bytes, chain_at: Callable[[int], bytes | None]) -> list[Leaf]:
    """The leaves of the versions after ``prev`` (a body this replica trusts), rebuilt from ``raw`` and
    the chain values ``chain_at`` gives (None: not held). Malformed steps raise :class:`MalformedError`.

    Fields are packed here rather than through :class:`HeadV2` (a catch-up rebuilds one per record of a
    queue of single offers); what they may hold is checked as :meth:`HeadV2.check` would."""
    if not isinstance(raw, bytes):
        raise MalformedError("a log's steps are bytes")
    leaves: list[Leaf] = []
    at, log, pack = 0, next_log(prev), HEAD2_BODY.pack
    qid, epoch, version = prev.queue_id, prev.epoch, prev.version
    start, end, base, timestamp = prev.start, prev.end, prev.base_hash, prev.timestamp
    meta_version, meta_hash = prev.meta_version, prev.meta_hash
    while at < len(raw):
        flags = raw[at]
        step, at = _read_varint(raw, at + 1)
        end, version = end + step, version + 1
        if flags & ~(_START | _META | _LEAF) or (flags & _LEAF and flags != _LEAF) or end > MAX_OFFSET:
            raise MalformedError("a log step with unknown flags or past the last offset")
        if flags & _LEAF:
            digest, at = _take(raw, at, 32), at + 32
        else:
            zigzag, at = _read_varint(raw, at)
            timestamp += -((zigzag + 1) >> 1) if zigzag & 1 else zigzag >> 1
            if flags & _START:
                step, at = _read_varint(raw, at)
                start += step
                base = chain_at(start) or b""
            if flags & _META:
                meta_version, at = _read_varint(raw, at)
                meta_hash, at = _take(raw, at, 32), at + 32
            top = chain_at(end)
            if len(base) != 32 or top is None or start > end:
                raise MalformedError(f"a head over records this replica does not hold ([{start}, {end}))")
            if not 0 <= timestamp < 2**64 or meta_version >= 2**64 or version >= 2**64:
                raise MalformedError("a head's counters are unsigned 64-bit integers")
            body = pack(qid, epoch, version, log, start, end, base, top, meta_version, meta_hash, timestamp)
            digest = body_digest(HEAD2_NAMESPACE + body)
        leaves.append((digest, end))
        log = fold_one(log, digest, end)
    return leaves
