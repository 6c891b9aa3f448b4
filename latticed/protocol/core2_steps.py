"""The head bodies a core-2 delta carries, sent as :mod:`latticed.crdt.leaf_codec` steps.

A chunk of records is vouched for by the bodies of the heads that end inside it (232 bytes each, one per
version: a queue of single offers sends one per record). Such a body is mostly what the records say (its
chain values at start and end) or what the version before it said, so it travels as ~3 bytes of steps
after a body the receiver already trusts: the one of the version just before the chunk's first, which
ends where the receiver's records end (it came with the previous chunk, or it is the receiver's head).
The receiver rebuilds the bodies from the records' chain values; each one must be on its verified log
(``queue2.verify_delta`` checks it, ``epoch_delta.vouches``), and the leaves of the versions its log does
not know yet go into the delta's log, whose signed head authenticates them (a changed record changes a
rebuilt body, and the fold no longer matches). Those leaves are then left out of the delta's log too.

:func:`pack_steps` is the sender's (it sends the delta as it is when it lacks that body, the versions
are not the run it expects, or the receiver does not know that version); :func:`unpack_steps` the
receiver's, before ``queue2.verify_delta``. Steps the receiver cannot rebuild from what it holds now (its
state moved since its summary) are a :class:`GapError`, as any delta that no longer fits; malformed
steps are a :class:`MalformedError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

from latticed.crdt import chain_memo, fold_index, leaf_codec, leaf_compiled, queue2, steps_memo
from latticed.crdt.core_errors import GapError, MalformedError
from latticed.crdt.epoch_delta import LogDelta, vouches
from latticed.crdt.epochs import Chains
from latticed.crdt.head2 import HeadV2, Leaf, next_log
from latticed.crdt.lazy_bodies import LazyDecoded, StepRun
from latticed.crdt.leaf_bodies import Decoded, decode_versions, in_order
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import chain_extend
from latticed.protocol.core2_wire import Steps, Summary2, link_summary

__all__ = ["Outgoing2", "outgoing", "pack_steps", "unpack_steps"]


@dataclass(frozen=True, slots=True)
class Outgoing2:
    """A delta for a peer as the link sends it: with its steps, and what the peer holds once it joined
    it along our history (None: not known; the link then waits for its ACK before the next chunk)."""

    delta: queue2.Delta
    steps: Steps | None = None
    implied: Summary2 | None = None


def outgoing(
    state: QueueState2,
    since: queue2.Summary | None,
    max_records: int,
    max_bytes: int | None = None,
    *,
    steps: bool = True,
) -> Outgoing2:
    """What a host answers a ``NeedDelta2`` with: ``queue2.delta``, its bodies as steps, and where the
    next chunk of a backlog starts (our log and the chunk's end: an unforked value the peer's log runs
    into ends up ours), so chunks stream ahead of the ACKs."""
    d = queue2.delta(state, since, max_records, max_bytes)
    implied = None
    if not state.forked and d.log is not None and d.records:
        end = d.from_offset + len(d.records)
        top = state.chain_at(end)
        if top is not None:
            ours = link_summary(state).core
            implied = Summary2(queue2.Summary(ours.log, end, top))
    packed, stepped = pack_steps(state, d, since.log.known if since else None) if steps else (d, None)
    return Outgoing2(packed, stepped, implied)


def _trusted(state: QueueState2, version: int) -> HeadV2 | None:
    """A body of ``version`` on ``state``'s log that ``state`` holds (a body, or its newest head). The
    bodies are searched from the newest: a live push's steps follow the last one, and a queue of single
    offers holds one per record (a scan from the oldest grew with the queue). Two that vouch for one
    version are one leaf, so the same body."""
    chains = state.chains
    for h in reversed(state.bodies):
        if h.version == version and vouches(chains, h):
            return h
    return next((t.head for t in chains.tips if t.head.version == version and vouches(chains, t.head)), None)


def pack_steps(
    state: QueueState2, d: queue2.Delta, known: int | None = None
) -> tuple[queue2.Delta, Steps | None]:
    """``d`` (from ``queue2.delta(state, ...)``) without the bodies that steps rebuild, nor the leaves of
    its log they rebuild, and those steps (None: ``d`` goes as it is). ``known`` is the leaf count of the
    receiver's summary (None: no summary, a whole value). The steps go after our body of the version just
    before the chunk's first when the receiver's log has it (it holds that body where its records end, or
    it answers with a GapError and the link sends our whole value), else after the chunk's first body,
    which then travels whole, if the chunk starts at the start head's start: a whole value's steps need
    nothing of the receiver (it may hold another branch's records there)."""
    log, bodies = d.log, d.bodies
    if log is None or log.value.forked or not bodies or state.forked:
        return d, None
    first, last = bodies[0].version, bodies[-1].version
    if [b.version for b in bodies] != list(range(first, last + 1)):
        return d, None  # not one run of versions
    prev = _trusted(state, first - 1) if known is not None and first - 1 <= log.base else None
    own: Sequence[HeadV2] = ()
    if prev is None:
        start = log.value.start_head
        if len(bodies) < 2 or start is None or d.from_offset != start.start:
            return d, None  # the receiver rebuilds from the start head's base: its own chain may be a fork's
        prev, own, bodies = bodies[0], bodies[:1], bodies[1:]
    lo, to = d.from_offset, d.from_offset + len(d.records)
    versions: list[HeadV2 | Leaf] = []
    kept: list[HeadV2] = list(own)
    last_start = prev.start
    for body in bodies:
        if body.start == last_start or lo <= body.start <= to:
            versions.append(body)
            last_start = body.start
        else:
            versions.append(body.leaf())
            kept.append(body)
    if len(kept) == len(d.bodies):
        return d, None
    full = log.value.shared  # versions base+1 .. the tip's version - 1
    keep = max(0, prev.version - log.base)  # versions base+1 .. prev's, sent as they are
    shared = (*full[:keep], *full[max(keep, min(last - log.base, len(full))) :])  # then past the last body's
    piece = replace(log, value=replace(log.value, shared=shared))
    return replace(d, log=piece, bodies=tuple(kept)), (prev.version, leaf_codec.encode(prev, versions))


def unpack_steps(state: QueueState2, d: queue2.Delta, steps: Steps | None) -> queue2.Delta:
    """``d`` with the bodies and leaves ``steps`` rebuild put back, against what ``state`` holds (after
    the body of the version they name: one in ``d``, else one ``state`` holds)."""
    if steps is None:
        return d
    version, raw = steps
    log = d.log
    if log is None or len(log.value.tips) != 1:
        raise MalformedError("steps come with an unforked log")
    keep = max(0, version - log.base)  # the log's leaves of versions base+1 .. version come first
    if keep > len(log.value.shared):
        raise MalformedError("steps after a version past the log's leaves")
    prev = next((b for b in d.bodies if b.version == version), None)
    own = prev is not None
    if prev is None:
        if keep:
            raise MalformedError("steps after a version the delta neither starts from nor carries")
        if state.chains.epoch != log.value.epoch:
            raise GapError("steps after a head of another epoch")
        prev = _trusted(state, version)
        if prev is None:
            raise GapError(f"steps after version {version}, which this replica does not hold")
    frm, records = d.from_offset, d.records
    base = _chain_base(state, log.value, frm, ours=not own)
    if base is None:
        raise GapError(f"records from {frm}, this replica holds {state.held}")
    # The compact decoder may have hashed them already (a head hash it rebuilt), and verify_delta
    # hashes the same records next.
    chain = (chain_memo.take(base, frm, records) or chain_extend(base, frm, records)) if records else []
    chain_memo.remember(base, frm, records, chain)
    end = frm + len(records)

    def chain_at(offset: int) -> bytes | None:
        if offset <= frm:
            return base if offset == frm else state.chain_at(offset)
        return chain[offset - frm - 1] if offset <= end else None

    leaves: list[Leaf] = []
    logs: list[bytes] = []
    alone = own and len(d.bodies) == 1  # the delta carries prev only: the run starts with it
    lazy = _lazy(prev, raw, (frm, base, chain), (leaves, logs)) if alone or not d.bodies else None
    items = (
        lazy if lazy is not None else decode_versions(prev, raw, chain_at, (frm, base, chain), (leaves, logs))
    )
    rebuilt = lazy if lazy is not None else _bodies(cast(list[HeadV2 | Leaf], items))
    run: Decoded | LazyDecoded | None = None
    if rebuilt and len(rebuilt) == len(items):
        steps_memo.remember(prev, raw, frm, rebuilt)  # the store keeps these bodies as these steps
        run_leaves = () if alone or d.bodies else (lazy.leaves if lazy is not None else tuple(leaves))
        # Verifying the log folds these leaves again: the decode's folds are each body's log.
        leaves.insert(0, prev.leaf())
        if alone:
            run_leaves = tuple(leaves)
        fold_index.folded_run(prev.log, run_leaves if alone else leaves, logs)
        del leaves[0]
        if run_leaves and lazy is not None:  # not built as bodies: read as one when read
            run = LazyDecoded(
                (prev,) if alone else (), lazy, run_leaves, first=frm, base=base, records=records
            )
        elif run_leaves:  # bodies of consecutive versions, all this decode's: verify_delta reads its claims
            run = Decoded([prev, *rebuilt] if alone else rebuilt, run_leaves, frm, base, records)
    # The leaves of versions base+1 .. up to the tip's (which is in the log as a head) go into the log.
    top = min(version + len(leaves), log.value.tips[0].head.version - 1)
    skip = max(0, log.base - version)
    full = log.value.shared
    shared = (*full[:keep], *leaves[skip : max(skip, top - version)], *full[keep:])
    bodies = in_order(d.bodies, rebuilt) if run is None else run
    v = log.value  # built directly, not by ``replace`` (three a relayed push, a third of this function)
    value = Chains(v.owner, v.queue_id, v.epoch, shared, v.tips, v.start_head, v.held_end)
    piece = LogDelta(log.base, log.base_fold, value)
    return queue2.Delta(d.owner, d.name, d.kind, piece, d.meta, d.from_offset, d.records, bodies)


def _lazy(
    prev: HeadV2, raw: bytes, window: tuple[int, bytes, Sequence[bytes]], out: tuple[list[Leaf], list[bytes]]
) -> StepRun | None:
    """The versions after ``prev`` as a run not built as bodies (``out`` filled as the full decode fills
    it), where the compiled decode reads them all as plain steps; else None."""
    compiled = leaf_compiled.load()
    if compiled is None or not isinstance(raw, bytes):
        return None
    stamps = leaf_compiled.decode_compact(compiled, prev, next_log(prev), raw, window, out=out)
    if stamps is None or not stamps:
        out[0].clear()
        out[1].clear()
        return None
    return StepRun(prev, tuple(out[0]), out[1], stamps, window)


def _bodies(items: list[HeadV2 | Leaf]) -> list[HeadV2]:
    """The bodies among ``items``: in a catch-up of single offers all of them, seen in one C-speed pass
    (their leaves come from the decode's own pass: a loop over the bodies was ~0.6 us a version)."""
    if set(map(type, items)) == {HeadV2}:
        return cast(list[HeadV2], items)
    return [i for i in items if isinstance(i, HeadV2)]


def _chain_base(state: QueueState2, value: Chains, frm: int, *, ours: bool = True) -> bytes | None:
    """The chain value at ``frm`` that verifying the delta's records starts from: ours, or, when we hold
    no records there, its start head's base (verification checks that head and the records). Steps after
    the delta's own first body (``ours`` False) come with a log we may not share: our records at ``frm``
    may be another branch's, so only the start head's base rebuilds the sender's bodies."""
    if ours and state.chains.epoch == value.epoch and state.chains.tips:
        held = state.chain_at(frm)
        if held is not None:
            return held
    start = value.start_head
    return start.base_hash if start is not None and frm == start.start else None
