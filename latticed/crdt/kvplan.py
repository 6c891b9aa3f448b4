"""Turning an owner's KV write into a signed-log op, given what the key holds now (pure).

The one planner of the project: the library's ``KvNamespace`` and the daemon's storage thread both call
:func:`plan`, so a rule about writes (TTLs, no-op writes, counters) is written and tested once. Time and
the HLC come in as arguments; nothing here reads a clock or touches a store.

The writer knows the key's current value, so it can say in the op what the join cannot know on its own:
``fresh`` when a field or member write starts a new collection, and the new total of a counter. Writes
that change nothing a reader can see (deleting a missing key, removing an absent field or member, adding
a member already there) produce no op at all, so they sign nothing and cost replicas nothing.

What a key holds is judged as a reader sees it now: an expired, deleted or emptied key counts as absent.
``put`` replaces whatever the key holds; a field or member write on a key of another kind starts a new
hash or set (``fresh``); ``incr`` reads the old total, so on a key holding a plain value, a hash or a set
it is refused with :class:`WrongTypeError` (Redis's WRONGTYPE) and nothing is written.

Every op planned here decodes again with :func:`latticed.crdt.kv.decode_op`: requests with the wrong
types are refused before anything is signed, since an op the log cannot decode would be signed for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from latticed.crdt import kv
from latticed.crdt.core_errors import MalformedError, WrongTypeError

WRITE_OPS = kv.OPS  # one list: what the planner writes is what the log decodes
#: A TTL is 1 ms up to (not including) 10**10 s, the bound the daemon's API puts on ``--ttl``.
MAX_TTL_MS = 10**13
#: Counters are signed 64-bit, like Redis's.
COUNTER_MIN, COUNTER_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class KvRequest:
    """One KV write as the API or the library asked for it."""

    op: str
    key: str
    value: bytes | None = None
    member: bytes | None = None
    ttl_ms: int | None = None
    by: int = 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(request: KvRequest) -> None:
    """Refuse a request whose op would not decode (or would mean something else) before it is signed."""
    op = request.op
    if op not in WRITE_OPS:
        raise MalformedError(f"unknown KV write {op!r}")
    if not isinstance(request.key, str):
        raise MalformedError(f"a KV key is a string, not {type(request.key).__name__}")
    if op in ("put", "hset") and not isinstance(request.value, bytes):
        raise MalformedError(f"{op} needs a bytes value")
    if op in ("hset", "hdel", "sadd", "srem") and not isinstance(request.member, bytes):
        raise MalformedError(f"{op} needs a bytes {'field' if op in ('hset', 'hdel') else 'member'}")
    if request.ttl_ms is not None and (not _is_int(request.ttl_ms) or not 0 < request.ttl_ms < MAX_TTL_MS):
        raise MalformedError(f"a TTL is a whole number of ms, 1 to {MAX_TTL_MS - 1}, not {request.ttl_ms!r}")
    if op == "incr" and not _is_int(request.by):
        raise MalformedError(f"incr adds an integer, not {type(request.by).__name__}")


def plan(request: KvRequest, current: kv.Entry | None, now_ms: int, hlc: int) -> tuple[kv.Op | None, Any]:
    """The op to log (None: the write changes nothing) and the value to answer with (``incr``'s new total).

    ``current`` is the key's joined entry, ``now_ms`` the writer's clock, ``hlc`` the writer's next HLC
    value (used only if an op is returned). Raises MalformedError or WrongTypeError, having planned nothing.
    """
    _check(request)
    kind, value = visible(current, now_ms)
    key = request.key
    match request.op:
        case "put":
            # now_ms is the wall clock cut down to the millisecond, up to 1 ms behind the true time: counting
            # from the next millisecond keeps a key readable for its whole TTL, never a fraction less.
            expires = None if request.ttl_ms is None else now_ms + 1 + request.ttl_ms
            return kv.Op("put", hlc, key, request.value, expires_ms=expires), None
        case "del":
            return (kv.Op("del", hlc, key) if kind is not None else None), None
        case "incr":
            if kind not in (None, kv.COUNTER):
                raise WrongTypeError(f"key {key!r} holds a {kind} value, not a counter")
            total = (int(value) if kind == kv.COUNTER else 0) + request.by
            if not COUNTER_MIN <= total <= COUNTER_MAX:
                raise MalformedError(f"counter {key!r} would leave the signed 64-bit range")
            return kv.Op("incr", hlc, key, total), total
        case "hset" | "sadd":
            assert request.member is not None  # _check
            wanted = kv.HASH if request.op == "hset" else kv.SET
            fresh = kind != wanted
            if request.op == "sadd" and not fresh and request.member in value:
                return None, None
            stored = request.value if request.op == "hset" else None
            return kv.Op(request.op, hlc, key, stored, request.member, fresh=fresh), None
        case _:  # hdel, srem
            wanted = kv.HASH if request.op == "hdel" else kv.SET
            if kind != wanted or request.member not in value:
                return None, None
            return kv.Op(request.op, hlc, key, None, request.member), None


# ------------------------------------------------------------------ reading the view


def visible(entry: kv.Entry | None, now_ms: int) -> tuple[str | None, Any]:
    """(kind, value) as a reader sees it now: expired, deleted and emptied keys read as (None, None)."""
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


__all__ = [
    "COUNTER_MAX",
    "COUNTER_MIN",
    "MAX_TTL_MS",
    "WRITE_OPS",
    "KvRequest",
    "hash_field",
    "plan",
    "visible",
]
