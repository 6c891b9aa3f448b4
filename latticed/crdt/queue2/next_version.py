"""The direct check of a live push that is exactly a replica's next version: a relay's usual push,
checked with the full path's checks minus the bookkeeping its value already answers. Anything else is
left to :func:`.replica_deltas.verify_delta`'s full path, which decides."""

from __future__ import annotations

from latticed.crdt import chain_memo, shared_prefix
from latticed.crdt.epoch_delta import LogDelta, compiled_append
from latticed.crdt.epochs import Chains
from latticed.crdt.head import canonical_meta, meta_hash
from latticed.crdt.head2 import next_log
from latticed.crdt.lazy_bodies import LazyDecoded, StepRun
from latticed.crdt.queue2.chain_state import QueueState2
from latticed.crdt.queue2.delta_values import Delta, Verified
from latticed.crdt.records import chain_extend, check_records

__all__ = ["next_version"]


def next_version(state: QueueState2, d: Delta) -> Verified | None:
    """:func:`verify_delta` of a live push that is exactly the next version of ``state`` (None: not
    one, or not confirmed here; the full path then decides and raises what it raises).

    Such a push (a relay's usual one) carries one signed head, version ``ours + 1``, no leaves, its
    log going on from our newest head, its records starting at our end and its one body a decode's run
    of one over them. It is checked as the full path checks it: the head (layout, queue, epoch,
    signature, log, version, ends) in the compiled pass of :func:`epoch_delta.merge`'s append path, the
    records' shape, their chain from our value at our end, the run's claims (its leaf is the signed
    head's, rebuilt over these very records from that chain value, so the head hash is ours), the
    metadata against the head's hash. Skipped is only what our value answers: no fold of our leaves,
    no search of the log for the body's version (it is the tip's), no rank of start heads by bytes (a
    newer head with a start no lower wins), and no metadata hash when the metadata and its hash are our
    verified ones."""
    log, run, ours_c = d.log, d.bodies, state.chains
    if type(log) is not LogDelta or type(run) is not LazyDecoded or run.head or type(run.run) is not StepRun:
        return None
    new, tips = log.value, ours_c.tips
    if len(tips) != 1 or tips[0].tail or len(new.tips) != 1 or new.tips[0].tail or new.shared:
        return None
    ours, head = tips[0].head, new.tips[0].head
    first, records, meta = d.from_offset, d.records, d.meta
    n = len(records)
    hi = state.held[1]
    if new.start_head is not head or log.base != ours.version or not n or meta is None:
        return None
    if (d.owner, d.name, d.kind) != (state.owner, state.name, state.kind) or (new.owner, new.queue_id) != (
        state.owner,
        state.queue_id,
    ):
        return None
    if new.epoch != ours_c.epoch or first != hi or ours.end != hi or head.end != hi + n or head.start >= hi:
        return None
    start = ours_c.start_head
    if start is not None and (head.start, head.version) <= (start.start, start.version):
        return None  # the start head stays ours, or a rank by bytes decides: the full path's
    if log.base_fold != next_log(ours) or not compiled_append(ours_c, log, head, (), ours):
        return None
    ours_meta = start is not None and head.meta_hash == start.meta_hash and meta == state.meta
    if not ours_meta:
        if meta_hash(dict(meta)) != head.meta_hash:
            return None
        meta = canonical_meta(meta)  # as the full path stores it
    check_records(records)
    base = state.chain_at(hi)
    if base is None or run.records is not records or run.first != hi or run.base != base:
        return None
    step = run.run
    prev = step.prev
    if len(run.leaves) != 1 or len(step.leaves) != 1 or prev.version != ours.version:
        return None
    if len(ours_c.shared) != ours.version - 1 or step.leaves[0] != head.leaf():  # the body is the tip's
        return None
    if prev.queue_id != ours_c.queue_id or prev.epoch != ours_c.epoch:
        return None
    chain = chain_memo.take(base, hi, records) or chain_extend(base, hi, records)
    shared = shared_prefix.grown(ours_c.shared, (ours.leaf(),))  # our leaves' list, appended to
    chains = Chains(ours_c.owner, ours_c.queue_id, ours_c.epoch, shared, new.tips, head, ours_c.held_end)
    return Verified(chains, meta, hi, records[0:n], tuple(chain), run)
