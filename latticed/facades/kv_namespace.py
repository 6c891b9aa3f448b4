"""``KvNamespace``: a signed single-writer KV namespace (CAD037) as a library object.

Writes become ops in the owner's signed op log (one signature per batch, like queue offers); reads come
from the view, the per-key join of all ops. Replicas merge deltas of the op log and fold the new ops in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Self

from latticed.crdt import kv as kvcore
from latticed.crdt import kvplan
from latticed.crdt import queue as core
from latticed.crdt.core_errors import NotOwnerError
from latticed.crdt.head import KIND_KV
from latticed.crdt.kvplan import KvRequest
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.facades.lattice_queue import LatticeQueue
from latticed.process.clock import Clock, wall_ms
from latticed.process.logs import get_logger, log_event

log = get_logger(__name__)


class KvNamespace:
    """One owner's namespace: put/get/delete, hashes, sets and counters, with optional TTLs."""

    def __init__(self, log: LatticeQueue, clock: Clock = wall_ms):
        self._log = log
        self._clock = clock
        self._view: kvcore.View = {}
        self._hlc = 0
        self._applied_end = log.start_offset
        self._fold(log.range_entries(log.start_offset, log.end_offset))

    @classmethod
    def create(cls, identity: Identity, name: str = "kv", clock: Clock = wall_ms) -> Self:
        state = core.empty_state(identity.public_key, name, KIND_KV)
        return cls(LatticeQueue(state, identity, clock), clock)

    @classmethod
    def replica(cls, owner: bytes, name: str = "kv", clock: Clock = wall_ms) -> Self:
        return cls(LatticeQueue.replica(core.empty_state(owner, name, KIND_KV), clock), clock)

    # ------------------------------------------------------------------ writes
    def _write(self, request: KvRequest) -> Any:
        """Plan the write with the daemon's planner (:mod:`latticed.crdt.kvplan`) and log its op, if any."""
        if not self._log.is_owner:
            raise NotOwnerError(f"cannot write: not the owner of the namespace {self._log.owner.hex()}")
        now = self._clock()
        hlc = kvcore.hlc_next(self._hlc, now)
        op, result = kvplan.plan(request, self._view.get(request.key), now, hlc)
        if op is not None:
            self._log.offer(op.encode(), key=request.key.encode())
            self._fold_pending()
        return result

    def put(self, key: str, value: bytes, ttl_ms: int | None = None) -> None:
        """Set a plain value; a TTL counts from the next millisecond (the clock reads whole ms)."""
        self._write(KvRequest("put", key, value=_as_bytes(value), ttl_ms=ttl_ms))

    def delete(self, key: str) -> None:
        self._write(KvRequest("del", key))

    def incr(self, key: str, by: int = 1) -> int:
        """Add to a counter (a missing key counts as 0) and return the new total.

        Raises WrongTypeError if the key holds a plain value, a hash or a set, MalformedError if the total
        would leave the signed 64-bit range; either way nothing is written."""
        total: int = self._write(KvRequest("incr", key, by=by))
        return total

    def hset(self, key: str, field: bytes, value: bytes) -> None:
        self._write(KvRequest("hset", key, value=_as_bytes(value), member=_as_bytes(field)))

    def hdel(self, key: str, field: bytes) -> None:
        self._write(KvRequest("hdel", key, member=_as_bytes(field)))

    def sadd(self, key: str, member: bytes) -> None:
        self._write(KvRequest("sadd", key, member=_as_bytes(member)))

    def srem(self, key: str, member: bytes) -> None:
        self._write(KvRequest("srem", key, member=_as_bytes(member)))

    # ------------------------------------------------------------------ reads
    def get(self, key: str) -> Any:
        entry = self._view.get(key)
        return None if entry is None else kvcore.visible_value(entry, self._clock())

    def items(self, prefix: str = "") -> dict[str, Any]:
        now = self._clock()
        out = {}
        for key in sorted(self._view):
            if key.startswith(prefix):
                value = kvcore.visible_value(self._view[key], now)
                if value is not None:
                    out[key] = value
        return out

    @property
    def view(self) -> dict[str, kvcore.Entry]:
        return dict(self._view)

    # ------------------------------------------------------------------ lattice
    @property
    def state(self) -> QueueState:
        return self._log.state

    def summary(self) -> Summary:
        return self._log.summary()

    def delta(self, since: Summary | None = None) -> QueueDelta:
        return self._log.delta(since)

    def merge(self, incoming: QueueState | QueueDelta) -> None:
        """Verify and join the op log, then fold the ops that arrived into the view.

        A join that no longer extends the log the view was folded from (a fork's other history replaced
        our ops, or the log jumped past them) folds the view again from the log, as the daemon does: else
        replicas holding the same ops would keep different views for good. So does a fork (the log stops
        where this replica stands, and the view holds only its ops up to the visible end)."""
        log, end = self._log, self._applied_end
        folded = log.state.chain_at(end)
        forked = log.state.forked
        log.merge(incoming)
        if log.state.chain_at(end) != folded or log.state.forked != forked:
            self._view = {}
            self._applied_end = log.start_offset
        self._fold_pending()

    def _fold_pending(self) -> None:
        log = self._log
        self._applied_end = max(self._applied_end, log.start_offset)
        self._fold(log.range_entries(self._applied_end, log.end_offset - 1))

    def _fold(self, records: Iterable[Record]) -> None:
        # Undecodable entries are skipped (see decode_ops): a merge applies whole, and never leaves the
        # log ahead of the view, which would make every later fold raise again.
        ops, skipped = kvcore.decode_ops(r.value for r in records)
        if skipped:
            log_event(
                log,
                "kv.bad_op",
                logging.WARNING,
                owner=self._log.owner.hex(),
                name=self._log.name,
                skipped=skipped,
            )
        kvcore.apply_ops(self._view, ops)
        for op in ops:
            self._hlc = max(self._hlc, op.hlc)
        self._applied_end = self._log.end_offset


def _as_bytes(value: Any) -> Any:
    """A bytes-like value as bytes; anything else goes to the planner as it is, to be refused there."""
    return bytes(value) if isinstance(value, bytearray | memoryview) else value
