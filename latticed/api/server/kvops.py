"""The KV operations of the local API, one row each.

The one list the request handlers, the blocking client and ``latticectl kv`` are checked against
(tests/test_kv_planner.py): an op added, renamed or given another argument in one of them and not in the
others fails a test instead of reaching a user. Each write names the planner op it becomes
(:data:`latticed.crdt.kvplan.WRITE_OPS`), which the library's ``KvNamespace`` offers too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class KvOperation:
    """One KV operation: ``latticectl kv NAME``, ``Client.kv_NAME(...)`` and the API op ``kv_NAME``."""

    name: str
    #: Required request arguments, in the order the CLI and the client take them.
    args: tuple[str, ...]
    #: Optional request arguments (client keywords with defaults).
    options: tuple[str, ...] = ()
    #: The planner op a write becomes; None for a read.
    write: str | None = None

    @property
    def api_op(self) -> str:
        return f"kv_{self.name}"


KV_OPERATIONS: Final = (
    # Sealing comes first: a namespace is sealed when it is created, before its first write.
    KvOperation("seal", (), ("readers",)),
    KvOperation("put", ("key", "value"), ("ttl",), write="put"),
    KvOperation("get", ("key",), ("owner",)),
    KvOperation("del", ("key",), write="del"),
    KvOperation("list", (), ("prefix", "owner")),
    KvOperation("hset", ("key", "field", "value"), write="hset"),
    KvOperation("hget", ("key", "field"), ("owner",)),
    KvOperation("hgetall", ("key",), ("owner",)),
    KvOperation("hdel", ("key", "field"), write="hdel"),
    KvOperation("sadd", ("key", "member"), write="sadd"),
    KvOperation("srem", ("key", "member"), write="srem"),
    KvOperation("smembers", ("key",), ("owner",)),
    KvOperation("incr", ("key",), ("by",), write="incr"),
    KvOperation("share", ("reader",)),
    KvOperation("unshare", ("reader",)),
)

__all__ = ["KV_OPERATIONS", "KvOperation"]
