"""The versions :mod:`latticed.crdt.leaf_codec` steps encode, rebuilt as head bodies rather than leaves.

A delta that carries records and the log's leaves of the versions ending inside them sends those
versions as steps; the receiver needs each one's body too (a chunk of records is vouched for by the
bodies that end inside it, :func:`latticed.crdt.epoch_delta.vouches`), so this decodes the same steps to
bodies. It reads exactly what :func:`leaf_codec.decode` reads (tests check both give the same leaves); a
step over records this replica does not hold is a :class:`GapError` here (the sender's view of us was
stale), not malformed input. Where the optional C extension is built, its loop (:mod:`.leaf_compiled`)
rebuilds plain steps over the chain values the caller names; this loop reads anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from latticed.crdt import leaf_compiled
from latticed.crdt.core_errors import GapError, MalformedError
from latticed.crdt.head2 import HeadV2, Leaf, fold_one, next_log
from latticed.crdt.leaf_codec import _LEAF, _META, _START, _read_varint, _take
from latticed.crdt.records import MAX_OFFSET

__all__ = ["Decoded", "decode_versions", "in_order"]


class Decoded(tuple[HeadV2, ...]):
    """Head bodies as one decode of steps rebuilt them (``core2_steps.unpack_steps`` builds it, nothing
    else): consecutive versions from the first's, sorted by ``(end, version)``, each one's leaf (what it
    hashed to) the same object as ``leaves``' item, their head hashes the chain values after ``base`` at
    ``first`` of ``records`` (the delta's, by identity). ``queue2.verify_delta`` checks what these claims
    are checked against (the merged log's leaves, its base, its records) in one tuple comparison instead
    of walking the bodies (their types, ends, leaves and chain values: ~1.5 us a version of a catch-up of
    single offers); anything that does not hold sends it down the walk. It is a tuple of the bodies."""

    leaves: tuple[Leaf, ...]
    first: int
    base: bytes
    records: object

    def __new__(
        cls, bodies: Iterable[HeadV2], leaves: tuple[Leaf, ...], first: int, base: bytes, records: object
    ) -> Decoded:
        run = super().__new__(cls, bodies)
        run.leaves, run.first, run.base, run.records = leaves, first, base, records
        return run


def _key(body: HeadV2) -> tuple[int, int]:
    return body.end, body.version


def in_order(carried: Sequence[HeadV2], rebuilt: Sequence[HeadV2]) -> tuple[HeadV2, ...]:
    """``(*carried, *rebuilt)`` sorted (stably) by ``(end, version)``, where ``rebuilt`` are the bodies
    :func:`decode_versions` gave, in that order already (each step's version is one past the last, its
    end no lower): only the few ``carried`` are sorted when they all go before or after them (a catch-up
    of single offers sorted a body per record)."""
    if not rebuilt:
        return tuple(sorted(carried, key=_key))
    ours = sorted(carried, key=_key)
    if not ours or _key(ours[-1]) <= _key(rebuilt[0]):
        return (*ours, *rebuilt)
    if _key(ours[0]) > _key(rebuilt[-1]):
        return (*rebuilt, *ours)
    return tuple(sorted((*carried, *rebuilt), key=_key))


def decode_versions(
    prev: HeadV2,
    raw: bytes,
    chain_at: Callable[[int], bytes | None],
    window: tuple[int, bytes, Sequence[bytes]] | None = None,
    out: tuple[list[Leaf], list[bytes]] | None = None,
) -> list[HeadV2 | Leaf]:
    """The versions after ``prev`` (a body this replica trusts) in ``raw``: an unsigned body for each
    stepped version (rebuilt from the chain values ``chain_at`` gives), the leaf for each sent as is.
    ``window``: ``(first, base, chain)``, the values ``chain_at`` gives for offsets ``first ..
    first + len(chain)`` (``base``, then ``chain``'s), which the compiled loop reads directly.
    ``out``: two empty lists filled in the same pass with each version's leaf, and the log before each
    version then the last log (the caller's fold index takes them: no second walk over the bodies)."""
    if not isinstance(raw, bytes):
        raise MalformedError("a log's steps are bytes")
    if out is not None and (out[0] or out[1]):
        raise ValueError("decode_versions fills empty lists")
    log = next_log(prev)
    compiled = leaf_compiled.load() if window is not None else None
    if compiled is not None and window is not None:
        found = leaf_compiled.decode(compiled, prev, log, raw, window, out=out)
        if found is not None:
            return found
    return _decode(prev, log, raw, chain_at, out)


def _decode(
    prev: HeadV2,
    log: bytes,
    raw: bytes,
    chain_at: Callable[[int], bytes | None],
    lists: tuple[list[Leaf], list[bytes]] | None = None,
) -> list[HeadV2 | Leaf]:
    out: list[HeadV2 | Leaf] = []
    leaves, logs = lists if lists is not None else ([], [])
    at, size = 0, len(raw)
    version, start, end, base = prev.version, prev.start, prev.end, prev.base_hash
    timestamp, meta_version, meta_hash = prev.timestamp, prev.meta_version, prev.meta_hash
    queue_id, epoch, append = prev.queue_id, prev.epoch, out.append
    while at < size:
        flags = raw[at]
        if at + 2 < size and raw[at + 1] < 0x80 and raw[at + 2] < 0x80:  # both steps one byte: most
            step, zigzag, at = raw[at + 1], raw[at + 2], at + 3
        else:
            step, at = _read_varint(raw, at + 1)
            zigzag = -1
        end, version = end + step, version + 1
        if flags & ~(_START | _META | _LEAF) or (flags & _LEAF and flags != _LEAF) or end > MAX_OFFSET:
            raise MalformedError("a log step with unknown flags or past the last offset")
        if flags & _LEAF:
            if zigzag >= 0:
                at -= 1  # the second byte read was the digest's first
            leaf = (_take(raw, at, 32), end)
            at += 32
            append(leaf)
            leaves.append(leaf)
            logs.append(log)
            log = fold_one(log, *leaf)
            continue
        if zigzag < 0:
            zigzag, at = _read_varint(raw, at)
        timestamp += -((zigzag + 1) >> 1) if zigzag & 1 else zigzag >> 1
        if flags & _START:
            step, at = _read_varint(raw, at)
            start += step
            base = chain_at(start) or b""
        if flags & _META:
            meta_version, at = _read_varint(raw, at)
            meta_hash, at = _take(raw, at, 32), at + 32
        if start > end:
            raise MalformedError("a head whose start is past its end")
        if not 0 <= timestamp < 2**64 or meta_version >= 2**64 or version >= 2**64:
            raise MalformedError("a head's counters are unsigned 64-bit integers")
        top = chain_at(end)
        if len(base) != 32 or top is None:
            raise GapError(f"a head over records this replica does not hold ([{start}, {end}))")
        body = HeadV2(
            queue_id, epoch, version, log, start, end, base, top, meta_version, meta_hash, timestamp
        )
        append(body)
        leaves.append(body.leaf())
        logs.append(log)
        log = fold_one(log, *leaves[-1])
    logs.append(log)
    return out
