"""Turning a client's KV write into a signed-log op, given what the key holds now (pure).

The writer knows the key's current value, so it can say in the op what the join cannot know on its own:
``fresh`` when a field or member write starts a new collection, and the new total of a counter. Writes
that change nothing (deleting a missing key, removing an absent member) produce no op at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from latticed.crdt import kv
from latticed.errors import MalformedError

WRITE_OPS = ("put", "del", "incr", "hset", "hdel", "sadd", "srem")


@dataclass(frozen=True, slots=True)
class KvRequest:
    """One KV write as the API asked for it."""

    op: str
    key: str
    value: bytes | None = None
    member: bytes | None = None
    ttl_ms: int | None = None
    by: int = 1


def _live_kind(entry: kv.Entry | None, now_ms: int) -> str | None:
    return entry.kind if entry is not None and entry.live(now_ms) else None


def plan(request: KvRequest, current: kv.Entry | None, now_ms: int, hlc: int) -> tuple[kv.Op | None, Any]:
    """The op to log (or None) and the value to answer with (the new total for ``incr``)."""
    kind = _live_kind(current, now_ms)
    key = request.key
    match request.op:
        case "put":
            if request.value is None:
                raise MalformedError("put needs a value")
            # now_ms is the wall clock cut down to the millisecond, up to 1 ms behind the true time: counting
            # from the next millisecond keeps a key readable for its whole TTL, never a fraction less.
            expires = None if request.ttl_ms is None else now_ms + 1 + request.ttl_ms
            return kv.Op("put", hlc, key, request.value, expires_ms=expires), None
        case "del":
            return (kv.Op("del", hlc, key) if kind is not None else None), None
        case "incr":
            if kind not in (None, kv.COUNTER):
                raise MalformedError(f"key {key!r} holds a {kind} value, not a counter")
            total = (int(current.value) if kind == kv.COUNTER and current is not None else 0) + request.by
            if not -(2**63) <= total < 2**63:
                raise MalformedError(f"counter {key!r} would leave the signed 64-bit range")
            return kv.Op("incr", hlc, key, total), total
        case "hset" | "sadd":
            if request.member is None or (request.op == "hset" and request.value is None):
                raise MalformedError(f"{request.op} needs a field/member (and hset a value)")
            wanted = kv.HASH if request.op == "hset" else kv.SET
            fresh = kind != wanted
            if request.op == "sadd" and not fresh and _present(current, request.member):
                return None, None
            value = request.value if request.op == "hset" else None
            return kv.Op(request.op, hlc, key, value, request.member, fresh=fresh), None
        case "hdel" | "srem":
            if request.member is None:
                raise MalformedError(f"{request.op} needs a field/member")
            wanted = kv.HASH if request.op == "hdel" else kv.SET
            if kind != wanted or not _present(current, request.member):
                return None, None
            return kv.Op(request.op, hlc, key, None, request.member), None
    raise MalformedError(f"unknown KV write {request.op!r}")


def _present(entry: kv.Entry | None, member: bytes) -> bool:
    if entry is None:
        return False
    found = entry.members.get(member)
    return found is not None and found[1] is not None and found[1] is not False


# ------------------------------------------------------------------ reading the view


def visible(entry: kv.Entry | None, now_ms: int) -> tuple[str | None, Any]:
    """(kind, value) as a reader sees it now: expired and deleted keys read as (None, None)."""
    if entry is None or not entry.live(now_ms):
        return None, None
    value = kv.visible_value(entry, now_ms)
    if value is None:
        return None, None
    return entry.kind, value


def hash_field(entry: kv.Entry | None, member: bytes, now_ms: int) -> bytes | None:
    kind, value = visible(entry, now_ms)
    if kind != kv.HASH:
        return None
    found = value.get(member)
    return found if isinstance(found, bytes) else None


__all__ = ["WRITE_OPS", "KvRequest", "hash_field", "plan", "visible"]
