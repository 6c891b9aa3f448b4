"""A relay's usual push checked in one pass: one version's records, their body as steps, the replica's
next version, unforked. ``AheadPushes.check`` asks :func:`next_push` first and takes the generic path
(``unpack_steps`` → ``queue2.verify_delta`` → ``queue2.join_verified``) whenever it answers None.

The generic path costs ~300 Python calls a push (bench/RESULTS.md, relay25), most of them its generic
machinery asking what this case already answers: which body the steps follow, which runs and leaves to
fold, which bodies lie between two offsets. Here the case is recognised up front by its shape, and every
check the generic path makes on it is made once, with the same helpers where they verify something.

Invariants (each one a condition below; any other input is answered None, never refused here):

- Accepted only: ``steps`` is ``(version, bytes)``; the delta carries no bodies, records as a
  :class:`RecordRun`, a log of one tip with no tail and no shared leaves whose start head is that tip's
  head, at base ``version``, our newest head's version, that head being version ``version + 1`` and
  starting at our held start (a truncation is the generic path's); our value is unforked (one tip, no
  tail), of the same epoch, and holds records up to our head's end, where the delta's records start.
- The same checks as the generic path, by the same code where it verifies: the body the steps follow is
  ``core2_steps._trusted``'s; the records' chain from our chain value at our end (``chain_memo`` or
  ``chain_extend``); the steps rebuilt by the same compiled decode (``leaf_compiled.decode_compact``),
  giving exactly one leaf, equal to the signed head's; the head (layout, queue, epoch, ed25519 signature
  over the same bytes, log, version, ends) by ``epoch_delta.compiled_append`` with ``next_log`` of our
  head as the fold it goes on from; the start head's rank; the metadata against the signed hash (unless
  it is our verified metadata under our start head's very hash); the delta's shape
  (``replica_deltas._check_shape``) and the records' (``check_records``).
- The same results: the rebuilt delta, the :class:`Verified` and the joined value are the ones the
  generic path builds for this input (field for field; the log is the received one, whose rebuilt copy
  the generic path builds equal to it), and the same memo effects (``chain_memo``'s slot taken and left
  empty, ``steps_memo`` told the run; ``fold_index.folded_run``, which the generic path calls with
  the run's leaves and logs, keeps nothing below ``fold_index.STRIDE`` of them, checked here).
- Anything raised here (a malformed record, a row not at hand) is the caller's cue to run the generic
  path, which decides; nothing is kept or passed on before this returns (the steps memo is told last;
  ``chain_memo``'s slot, taken, only costs the generic path a rehash; our leaves' list may be appended
  to past our value's length, which no view of it reads).
"""

from __future__ import annotations

from latticed.crdt import chain_memo, fold_index, leaf_compiled, shared_prefix, steps_memo
from latticed.crdt.epoch_delta import LogDelta, compiled_append
from latticed.crdt.epochs import Chains
from latticed.crdt.head import canonical_meta, meta_hash
from latticed.crdt.head2 import Leaf, next_log
from latticed.crdt.lazy_bodies import LazyDecoded, StepRun, appended
from latticed.crdt.queue2 import Delta, QueueState2, Verified
from latticed.crdt.queue2.chain_state import nothing_at
from latticed.crdt.queue2.replica_deltas import _check_shape
from latticed.crdt.records import RecordRun, chain_extend, check_records
from latticed.protocol.core2_steps import _trusted
from latticed.protocol.core2_wire import Steps

__all__ = ["next_push"]


def next_push(
    state: QueueState2, d: Delta, steps: Steps | None
) -> tuple[Delta, Verified, QueueState2] | None:
    """``unpack_steps(state, d, steps)``, its ``verify_delta`` against ``state`` and the joined value, for
    a one-version live push that is ``state``'s next version (None: not that case; the generic path then
    decides, and refuses what it refuses). See the module's invariants."""
    if type(d) is not Delta or type(steps) is not tuple or len(steps) != 2:
        return None
    version, raw = steps
    log, records, meta = d.log, d.records, d.meta
    if type(version) is not int or type(raw) is not bytes or type(records) is not RecordRun:
        return None
    if type(log) is not LogDelta or type(d.bodies) is not tuple or d.bodies or type(meta) is not tuple:
        return None
    new, ours_c = log.value, state.chains
    if type(new) is not Chains or type(new.shared) is not tuple or new.shared or len(new.tips) != 1:
        return None
    tips = ours_c.tips
    if len(tips) != 1 or tips[0].tail or new.tips[0].tail:
        return None
    ours, head = tips[0].head, new.tips[0].head
    lo, hi = ours_c.held  # (``state.held`` is its chains': one property frame, asked once)
    n = len(records.values)  # (a run's column: no ``__len__`` frame)
    if not n or new.start_head is not head or version != log.base or log.base != ours.version:
        return None
    if head.version != version + 1 or new.epoch != ours_c.epoch:
        return None
    if (d.owner, d.name, d.kind) != (state.owner, state.name, state.kind) or (new.owner, new.queue_id) != (
        state.owner,
        state.queue_id,
    ):
        return None
    first = d.from_offset
    if type(first) is not int or first != hi or ours.end != hi or head.end != hi + n or head.start >= hi:
        return None
    if head.start != lo:  # the merged value's start is the new head's: a truncation is the generic path's
        return None
    start = ours_c.start_head
    if start is not None and (head.start, head.version) <= (start.start, start.version):
        return None  # the start head stays ours, or a rank by bytes decides: the generic path's
    prev = _trusted(state, version)
    base = state.entries.chain(hi - lo - 1)  # ``state.chain_at(hi)``: ``lo < hi`` here (head.start)
    compiled = leaf_compiled.load()
    if prev is None or base is None or compiled is None or prev.version != ours.version:
        return None
    if prev.queue_id != ours_c.queue_id or prev.epoch != ours_c.epoch:
        return None
    chain = chain_memo.take(base, hi, records) or chain_extend(base, hi, records)
    leaves: list[Leaf] = []
    logs: list[bytes] = []
    window = (hi, base, chain)
    stamps = leaf_compiled.decode_compact(compiled, prev, next_log(prev), raw, window, out=(leaves, logs))
    if not stamps or len(leaves) != 1 or len(logs) >= fold_index.STRIDE or leaves[0] != head.leaf():
        return None
    if len(ours_c.shared) != ours.version - 1 or log.base_fold != next_log(ours):
        return None
    if not compiled_append(ours_c, log, head, (), ours):  # the signature, as the generic path checks it
        return None
    step = StepRun(prev, tuple(leaves), logs, stamps, window)
    run = LazyDecoded((), step, step.leaves, first=hi, base=base, records=records)
    out = Delta(d.owner, d.name, d.kind, log, meta, first, records, run)
    _check_shape(out)
    if not (start is not None and head.meta_hash == start.meta_hash and meta == state.meta):
        if meta_hash(dict(meta)) != head.meta_hash:
            return None
        meta = canonical_meta(meta)  # as the generic path stores it
    check_records(records)
    shared = shared_prefix.grown(ours_c.shared, (ours.leaf(),))  # our leaves' list, appended to
    chains = Chains(ours_c.owner, ours_c.queue_id, ours_c.epoch, shared, new.tips, head, ours_c.held_end)
    verified = Verified(chains, meta, hi, records, tuple(chain), run)  # (``records[0:n]``: equal, immutable)
    end = hi + n
    entries = (state.entries if hi > lo else nothing_at(state, lo)).extend(verified.records, verified.chain)
    extended = Chains(chains.owner, chains.queue_id, chains.epoch, chains.shared, chains.tips, head, end)
    joined = QueueState2(
        state.owner, state.name, state.kind, extended, meta, entries, appended(state.bodies, run)
    )
    steps_memo.remember(prev, raw, hi, step)  # the store keeps these bodies as these steps (kept last)
    return out, verified, joined
