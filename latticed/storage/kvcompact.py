"""Compaction of our own KV namespace's signed op log, so it grows with the keys, not with the writes.

Every KV write is an op appended to an owner-signed log (that log is what replicates). A counter bumped a
million times would keep a million ops although one decides its value. A compaction step takes the oldest
ops, appends again, byte for byte, the ones that still decide some key (its last whole-key write, and the
last write of each hash field or set member, deletions included), then truncates the step away with an
owner-signed new start. The copies carry the same bytes, so the same HLC stamps: joining them changes no
view anywhere (the join is idempotent), and a replica that only ever sees the suffix still learns every
key, tombstones included.

A plain value whose TTL has passed decides nothing any more (every reader sees the key absent), so its op
is dropped, not copied, and retention purges the key from the view
(:mod:`latticed.services.retention_service`).
A replica that missed that op may still hold the older value it replaced; the log it receives next then
starts past what it held (the truncation jumped over its end), and a replica folds its view again from
the log whenever that happens (:meth:`latticed.storage.writer.Writer._write`), so the older value cannot
resurface. Tombstones are kept: which writes they hide is not known without a horizon.

Steps are bounded (:data:`STEP_OPS` ops read, one transaction) and run as writer maintenance only while
the log holds at least :data:`MIN_OPS` ops and :data:`RATIO` times as many ops as keys.
"""

from __future__ import annotations

from typing import Final

from latticed.crdt import kv
from latticed.crdt.records import Record
from latticed.errors import LatticedError, MalformedError
from latticed.privacy.meta import is_sealed
from latticed.storage.batch import Batch
from latticed.storage.jobs import Job, WriterView

MIN_OPS: Final = 4096
RATIO: Final = 2
STEP_OPS: Final = 1024


def worth_compacting(ops: int, keys: int) -> bool:
    """Whether a log of ``ops`` ops for ``keys`` keys is mostly superseded writes."""
    return ops >= MIN_OPS and ops >= RATIO * keys


class CompactKv(Job):
    """One compaction step of KV namespace ``ns`` (ours); ``result`` is the number of ops dropped."""

    __slots__ = ("ns", "step")

    def __init__(self, ns: int, step: int = STEP_OPS) -> None:
        super().__init__()
        self.ns = ns
        self.step = step

    def apply(self, batch: Batch, writer: WriterView) -> None:
        state = batch.require_owner(self.ns, "compact")
        lo = state.start
        hi = min(state.held_end, lo + self.step)
        if hi <= lo:
            self.result = 0
            return
        records = writer.store.rows.records(self.ns, lo, hi)
        if writer.kv_sealing is not None:
            opened = writer.kv_sealing.open_ops(self.ns, state, records)
        elif is_sealed(state.meta_dict):  # its ops would not decode: every one would look droppable
            raise LatticedError("a sealed KV namespace is compacted only by a daemon that can open its ops")
        else:
            opened = list(records)
        # An op that does not open (never, for its owner) is kept: what cannot be judged is not dropped.
        kept = [
            r for r, op in zip(records, opened, strict=True) if op is None or _decides(batch, self.ns, op)
        ]
        if kept:
            batch.append(self.ns, kept)
        batch.truncate(self.ns, hi)
        self.result = (hi - lo) - len(kept)


def _decides(batch: Batch, ns: int, record: Record) -> bool:
    """Whether this op's stamp is one the key's joined entry still holds."""
    try:
        op = kv.decode_op(record.value)
    except MalformedError:
        return False  # never written by us; nothing can depend on it
    entry = batch.kv_entry(ns, op.key)
    if entry is None or (entry.kind == kv.PLAIN and not entry.live(batch.now_ms)):
        return False  # gone, or a value whose TTL has passed
    stamp = (op.hlc, op.tiebreak)
    return entry.reset == stamp or any(held == stamp for held, _ in entry.members.values())


__all__ = ["MIN_OPS", "RATIO", "STEP_OPS", "CompactKv", "worth_compacting"]
