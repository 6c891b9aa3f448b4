"""Signed single-writer KV namespaces (CAD037, one writer per namespace).

A namespace is an owner-signed op log (the queue lattice with ``kind=KIND_KV``: one signature per batch,
hash-chained ops, deltas and fork proofs for free) folded into a view by a per-key join. The per-key join
orders writes by a hybrid logical clock with a total tie-break, so folding ops in any order, or joining
views of two replicas, gives the same map: commutative, associative and idempotent even on HLC ties
(CAD037's reference breaks commutativity there).

Value kinds: plain value (optional expiry), tombstone, counter, hash (per-field), set (per-member).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from latticed.crdt.core_errors import MalformedError

HLC_LOGICAL_BITS = 16
PLAIN, TOMBSTONE, COUNTER, HASH, SET = "plain", "tombstone", "counter", "hash", "set"
_KIND_RANK = {TOMBSTONE: 0, PLAIN: 1, COUNTER: 2, HASH: 3, SET: 4}
OPS = ("put", "del", "incr", "hset", "hdel", "sadd", "srem")


def hlc_next(last: int, now_ms: int) -> int:
    """Next hybrid logical clock value: wall time in the high bits, a counter for same-ms writes, and
    never behind the last value even if the wall clock steps back."""
    return max(last + 1, now_ms << HLC_LOGICAL_BITS)


@dataclass(frozen=True, slots=True)
class Op:
    """One owner write. ``hlc`` orders it; ``tiebreak`` (a digest of the op) makes equal HLCs total.

    ``fresh`` marks a field/member write that starts a new collection (the key held another kind): the
    writer knows that when it writes, and saying so in the op keeps the join free of context.
    """

    op: str
    hlc: int
    key: str
    value: Any = None  # bytes for put/hset, int for incr (the new total), None otherwise
    member: bytes | None = None  # hash field or set member
    expires_ms: int | None = None
    fresh: bool = False

    def encode(self) -> bytes:
        fields = [self.op, self.hlc, self.key, self.value, self.member, self.expires_ms, self.fresh]
        return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]

    @property
    def tiebreak(self) -> bytes:
        return hashlib.blake2b(self.encode(), digest_size=16).digest()


def decode_op(raw: bytes) -> Op:
    try:
        items = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise MalformedError("undecodable KV op") from exc
    if not isinstance(items, list) or len(items) != 7:
        raise MalformedError("a KV op has 7 fields")
    op, hlc, key, value, member, expires, fresh = items
    if op not in OPS or not isinstance(hlc, int) or not isinstance(key, str) or not isinstance(fresh, bool):
        raise MalformedError("bad KV op")
    if member is not None and not isinstance(member, bytes):
        raise MalformedError("KV member must be bytes")
    if expires is not None and not isinstance(expires, int):
        raise MalformedError("KV expiry must be an integer (ms)")
    if op in ("put", "hset") and not isinstance(value, bytes):
        raise MalformedError(f"{op} needs a bytes value")
    if op == "incr" and (not isinstance(value, int) or isinstance(value, bool)):
        raise MalformedError("incr carries the new total")
    if op in ("hset", "hdel", "sadd", "srem") and member is None:
        raise MalformedError(f"{op} needs a field or member")
    return Op(op, hlc, key, value, member, expires, fresh)


def decode_ops(raws: Iterable[bytes]) -> tuple[list[Op], int]:
    """The ops among signed op-log entries, and how many entries are not ops.

    An entry the owner signed that does not decode (a newer writer's op, a bug) stays in the log, which
    is the owner's to vouch for, but changes no key. Skipping it on every replica keeps the views equal
    and a merge whole; refusing it would stall every replica at that entry for good, since every later
    delta carries it again (the daemon's fold skips it the same way)."""
    ops: list[Op] = []
    skipped = 0
    for raw in raws:
        try:
            ops.append(decode_op(raw))
        except MalformedError:
            skipped += 1
    return ops, skipped


Stamp = tuple[int, bytes]  # (hlc, tiebreak): a total order on writes
NO_STAMP: Stamp = (-1, b"")


@dataclass(frozen=True, slots=True)
class Entry:
    """The joined value of one key.

    ``reset`` is the stamp of the last whole-key write (put, delete, counter, or a fresh collection); it
    decides ``kind``/``value``. ``members`` maps a hash field or set member to (stamp, value-or-None);
    members older than ``reset`` belong to a previous life of the key and are dropped.
    """

    kind: str
    reset: Stamp
    value: Any = None
    expires_ms: int | None = None
    members: Mapping[bytes, tuple[Stamp, Any]] = field(default_factory=dict)

    def live(self, now_ms: int) -> bool:
        if self.kind == TOMBSTONE:
            return False
        return self.expires_ms is None or now_ms < self.expires_ms


def op_entry(op: Op) -> Entry:
    stamp = (op.hlc, op.tiebreak)
    if op.op == "put":
        return Entry(PLAIN, stamp, op.value, op.expires_ms)
    if op.op == "del":
        return Entry(TOMBSTONE, stamp)
    if op.op == "incr":
        return Entry(COUNTER, stamp, int(op.value))
    assert op.member is not None
    kind = HASH if op.op in ("hset", "hdel") else SET
    present: Any = op.value if op.op == "hset" else (op.op == "sadd")
    if op.op == "hdel":
        present = None
    return Entry(kind, stamp if op.fresh else NO_STAMP, members={op.member: (stamp, present)})


def _scalar_key(entry: Entry) -> tuple[Stamp, int, bytes]:
    value = entry.value if isinstance(entry.value, bytes) else str(entry.value).encode()
    return (entry.reset, _KIND_RANK[entry.kind], value)


def join_entry(a: Entry, b: Entry) -> Entry:
    """Per-key join: the later reset decides kind and value; members join by stamp above that reset."""
    top = a if _scalar_key(a) >= _scalar_key(b) else b
    members = dict(a.members)
    for member, (stamp, value) in b.members.items():
        current = members.get(member)
        if current is None or (stamp, _rank(value)) > (current[0], _rank(current[1])):
            members[member] = (stamp, value)
    live_members = {m: sv for m, sv in members.items() if sv[0] >= top.reset}
    return Entry(top.kind, top.reset, top.value, top.expires_ms, live_members)


def _rank(value: Any) -> tuple[int, bytes]:
    if value is None or value is False:
        return (0, b"")
    if value is True:
        return (1, b"")
    return (2, value if isinstance(value, bytes) else b"")


View = dict[str, Entry]


def apply_ops(view: View, ops: Iterable[Op]) -> View:
    """Fold ops into a view in place (any order gives the same view: see module docstring)."""
    for op in ops:
        entry = op_entry(op)
        current = view.get(op.key)
        view[op.key] = entry if current is None else join_entry(current, entry)
    return view


def join_views(a: Mapping[str, Entry], b: Mapping[str, Entry]) -> View:
    out = dict(a)
    for key, entry in b.items():
        current = out.get(key)
        out[key] = entry if current is None else join_entry(current, entry)
    return out


def visible_value(entry: Entry, now_ms: int) -> Any:
    """What a reader sees: bytes, an int, a dict of fields, a set of members, or None."""
    if not entry.live(now_ms):
        return None
    if entry.kind == HASH:
        fields = {m: v for m, (_, v) in entry.members.items() if v is not None}
        return fields or None
    if entry.kind == SET:
        members = {m for m, (_, v) in entry.members.items() if v}
        return members or None
    return entry.value
