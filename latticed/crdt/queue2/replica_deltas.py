"""What travels between replicas of a queue under v2 heads, and how it is checked and appended.

A :class:`Summary` names the leaves a replica knows (:class:`~latticed.crdt.epoch_delta.LogSummary`)
and how far it holds records (end and chain value there). :func:`delta` answers with the leaves it lacks
and, only if our chain passes through its held end, the records after it up to a head body: a chunk
ends where a body on the log ends, and every body ending inside the chunk travels with it (the receiver
checks each against the records' chain values, so no head of the log disagrees with the records it
holds, and it can serve any chunk end again). A peer whose records we cannot extend gets the leaves only;
after joining them it holds a prefix of ours (or nothing, on a new epoch) and asks again.

:func:`verify_delta` merges the leaves (:func:`latticed.crdt.epoch_delta.merge`: appended when they go on
from ours) and checks the records against the merged log, and :func:`join_verified` cuts our records
to the merged value and appends the new ones: neither compares whole logs or whole runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace
from operator import attrgetter, itemgetter
from typing import Protocol, cast

from latticed.crdt import chain_memo, epoch_delta, leaf_compiled, shared_prefix
from latticed.crdt.core_errors import GapError, MalformedError, TamperedError, WrongOwnerError
from latticed.crdt.epoch_delta import LogDelta
from latticed.crdt.epochs import Chains
from latticed.crdt.head import canonical_meta, meta_hash
from latticed.crdt.head2 import HeadV2
from latticed.crdt.lazy_bodies import LazyDecoded, appended
from latticed.crdt.leaf_bodies import Decoded
from latticed.crdt.queue2.chain_state import QueueState2, bodies_between, cut, keep_bodies, nothing_at
from latticed.crdt.queue2.delta_values import Delta, Merged, Summary, Verified
from latticed.crdt.queue2.next_version import next_version as _next_version
from latticed.crdt.records import Record, RecordRun, chain_extend, check_records

__all__ = ["Delta", "Merged", "Summary", "Verified", "delta", "join_verified", "summary", "verify_delta"]

_BODY_END = attrgetter("end")
#: A decode's runs, whose claims ``verify_delta`` checks instead of walking the bodies.
_RUNS = (Decoded, LazyDecoded)
_LEAF_END = itemgetter(1)
#: A value's shared leaves that are no tuple are copied into one for the compiled check of more bodies
#: than this (a catch-up chunk); fewer are checked in Python.
_FEW_BODIES = 2


def summary(state: QueueState2) -> Summary:
    end = state.held[1]
    return Summary(epoch_delta.summary(state.chains), end, state.chain_at(end) or b"")


def delta(
    state: QueueState2, since: Summary | None, max_records: int | None = None, max_bytes: int | None = None
) -> Delta:
    """What a replica summarised by ``since`` lacks (None: a replica that holds nothing), records bounded
    by ``max_records`` / ``max_bytes`` at a body's end (the first one past ``from`` if none fits)."""
    log = epoch_delta.delta(state.chains, since.log if since else None)
    lo, hi = state.held
    start = lo
    if since is not None:
        same = since.log.epoch == state.chains.epoch and state.chain_at(since.held_end) == since.held_hash
        start = since.held_end if same else hi
    to, read = _chunk_end(state, start, hi, max_records, max_bytes)
    records: Sequence[Record] = ()
    if to > start:
        if len(read) < to - start:  # read once: sizing the chunk read them already
            read = _read(state, start - lo, to - lo)
        records = read[: to - start] if type(read) is RecordRun else tuple(read[: to - start])
    bodies = bodies_between(state.bodies, start, to) if records else ()
    meta = state.meta if log is not None else None
    return Delta(state.owner, state.name, state.kind, log, meta, start, records, bodies)


class _Runs(Protocol):
    def run(self, lo: int = 0, hi: int | None = None) -> Sequence[Record]: ...


def _read(state: QueueState2, lo: int, hi: int) -> Sequence[Record]:
    """Entries ``[lo, hi)``: a run read a column at a time where the store's view can (a delta sends
    columns; building a Record per row was most of a catch-up sender's time), else records."""
    entries = state.entries
    run = getattr(entries, "run", None)
    if run is not None:
        return cast(_Runs, entries).run(lo, hi)
    return entries.records(lo, hi)


def _chunk_end(
    state: QueueState2, start: int, hi: int, max_records: int | None, max_bytes: int | None
) -> tuple[int, Sequence[Record]]:
    """The end of the longest chunk from ``start`` that ends at a body and fits the bounds (at least the
    first body past ``start``; ``start`` itself if there is none), and the records from ``start`` it read
    to size the chunk (the delta sends them: a chunk's records are read once). Reads only what may fit."""
    limit = hi if max_records is None else min(hi, start + max_records)
    ends = sorted({b.end for b in bodies_between(state.bodies, start, limit)})
    read: Sequence[Record] = ()
    if max_bytes is not None and ends:
        lo = state.held[0]
        read = _read(state, start - lo, ends[-1] - lo)
        if type(read) is RecordRun:
            sizes = map(len, read.values), (len(k or b"") for k in read.keys)
            total = list(itertools.accumulate(map(int.__add__, *sizes)))
        else:
            total = list(itertools.accumulate(len(r.value) + len(r.key or b"") for r in read))
        ends = [e for e in ends if total[e - start - 1] <= max_bytes]
    if ends:
        return ends[-1], read
    later = bodies_between(state.bodies, start, hi)
    return (later[0].end if later else start), read


def _check_shape(d: Delta) -> None:
    if not isinstance(d, Delta) or not isinstance(d.owner, bytes) or not isinstance(d.name, str):
        raise MalformedError("not a v2 queue delta")
    if d.log is not None and not isinstance(d.log, LogDelta):
        raise MalformedError("a delta's log is a LogDelta")
    if type(d.from_offset) is not int or d.from_offset < 0:
        raise MalformedError("a delta's first offset is a non-negative integer")
    if type(d.records) not in (tuple, RecordRun) or not isinstance(d.bodies, tuple | LazyDecoded):
        raise MalformedError("a delta's records are a tuple or a run, its bodies a tuple")
    if type(d.bodies) not in _RUNS and not all(map(isinstance, d.bodies, itertools.repeat(HeadV2))):
        raise MalformedError("a delta's bodies are v2 heads")
    if d.meta is not None and (
        not isinstance(d.meta, tuple)
        or not all(type(i) is tuple and len(i) == 2 and all(isinstance(x, str) for x in i) for i in d.meta)
    ):
        raise MalformedError("metadata is a tuple of (str, str) pairs")


def verify_delta(state: QueueState2, d: Delta) -> Verified:
    """Check everything ``d`` claims against ``state`` before any of it is joined. Leaves whose base
    this replica does not hold, or records that do not start inside what it holds after joining the
    leaves, raise :class:`GapError` (the sender then sends from a fresh summary, or whole)."""
    _check_shape(d)
    direct = _next_version(state, d)  # a live push that is our next version (a relay's usual one)
    if direct is not None:
        return direct
    if (d.owner, d.name, d.kind) != (state.owner, state.name, state.kind):
        raise WrongOwnerError("delta belongs to another queue (another owner, name or kind)")
    chains = state.chains
    if d.log is not None:
        if d.log.value.owner != state.owner or d.log.value.queue_id != state.queue_id:
            raise WrongOwnerError("leaves of another queue")
        try:
            chains = epoch_delta.merge(chains, d.log)
        except ValueError as exc:
            raise GapError(str(exc)) from exc
    meta = state.meta
    if chains.start_head is not None and chains.start_head != state.chains.start_head:
        if d.meta is None or meta_hash(dict(d.meta)) != chains.start_head.meta_hash:
            raise TamperedError("metadata does not match the signed start head")
        meta = canonical_meta(d.meta)  # the pairs may repeat a key (0.2.0 peers send them on as they came)
    empty = Verified(chains, meta, d.from_offset, (), (), ())
    if not d.records or (d.log is not None and d.log.value.epoch != chains.epoch):
        return empty  # a sender of a superseded epoch: its bodies cannot vouch for records of ours
    check_records(d.records)
    lo, hi = _held_after(state, chains)
    first = max(d.from_offset, lo)  # records below our start are not needed, nor checkable
    end = min(d.from_offset + len(d.records), max(lo, chains.upper))
    if first > hi:
        raise GapError(f"records from {d.from_offset}, this replica holds [{lo}, {hi})")
    if end <= hi:
        return empty
    base = state.chain_at(first) if first > lo else _base(chains, state)
    assert base is not None
    records = d.records[first - d.from_offset : end - d.from_offset]
    chain = chain_memo.take(base, first, records) or chain_extend(base, first, records)
    run = d.bodies
    if type(run) in _RUNS and _holds(cast(Decoded, run), chains, d, first=first, base=base, end=end):
        return Verified(chains, meta, first, records, tuple(chain), run)
    carried = tuple(run)  # (a run not built as bodies is built here: the walk reads each one)
    # A catch-up of single offers carries a body per record: their ends are read once, as a set.
    ends = set(map(_BODY_END, carried))
    if ends and first < min(ends) and max(ends) <= end:
        bodies = carried  # all of them end inside the records: the usual chunk
    else:
        bodies = tuple(b for b in carried if first < b.end <= end)
    if chains.forked:  # heads past the first branching of a branch the frozen value does not keep
        bodies = tuple(b for b in bodies if epoch_delta.vouches(chains, b))
    for body in _unconfirmed(chains, bodies, chain, first):
        if not epoch_delta.vouches(chains, body) or body.head_hash != chain[body.end - first - 1]:
            raise TamperedError("records that do not hash to the heads on the log")
    if bodies is not carried:
        ends = {b.end for b in bodies}
    if end not in ends or not ends.issuperset(_every_end(chains, first, end)):
        raise TamperedError("a chunk of records without the head bodies that end inside it")
    return Verified(chains, meta, first, records, tuple(chain), bodies)


def _holds(
    run: Decoded | LazyDecoded, chains: Chains, d: Delta, *, first: int, base: bytes, end: int
) -> bool:
    """Whether a decode's ``run`` (all of ``d``'s bodies) is what the walk below would accept, from its
    claims: rebuilt over ``d``'s very records from our ``base`` at ``first`` (so each head hash is our
    chain value at its end), ending inside ``(first, end]`` with the last at ``end``, and its leaves the
    merged log's of those versions (one tuple comparison; the version past the shared leaves, a tip's,
    checked as the walk does). Its versions are consecutive and its ends ordered, so the log's ends in
    ``(first, end)`` are all its ones when the leaf before its first ends at or below ``first``."""
    if run.records is not d.records or run.first != first or first != d.from_offset or run.base != base:
        return False
    if chains.forked or not run or run[0].end <= first or run[-1].end != end:
        return False
    head = run[0]
    if head.queue_id != chains.queue_id or head.epoch != chains.epoch or head.version < 1:
        return False
    shared, at = chains.shared, head.version - 1
    held = max(0, min(len(run), len(shared) - at))
    if shared[at : at + held] != run.leaves[:held] or len(run.leaves) != len(run):
        return False
    if not all(epoch_delta.vouches(chains, body) for body in run[held:]):
        return False
    return at == 0 or at > len(shared) or shared[at - 1][1] <= first


def _unconfirmed(
    chains: Chains, bodies: tuple[HeadV2, ...], chain: Sequence[bytes], first: int
) -> Sequence[HeadV2]:
    """The ``bodies`` a compiled pass did not confirm as on the log and hashing to ``chain`` (a catch-up
    of single offers checks one per record): all of them where it is not built. The pass takes the
    shared leaves as a tuple: a live push's one or two bodies are checked in Python rather than copy them."""
    shared = chains.shared
    if type(shared) is not tuple:
        if len(bodies) <= _FEW_BODIES:
            return bodies
        shared = tuple(shared)
    left = leaf_compiled.unvouched(bodies, shared, chains.queue_id, chains.epoch, chain=chain, first=first)
    return bodies if left is None else [bodies[i] for i in left]


def _held_after(state: QueueState2, chains: Chains) -> tuple[int, int]:
    """What ``state`` still holds under the merged ``chains``: nothing of another epoch. (``chains.held``
    with our held end, computed without building that value: twice a push on a relay's event loop.)"""
    lo = chains.start
    if chains.epoch != state.chains.epoch:
        return lo, lo
    return lo, max(lo, min(state.held[1], chains.upper))


def _base(chains: Chains, state: QueueState2) -> bytes | None:
    head = chains.start_head
    return state.base_hash if head is None else head.base_hash


def _every_end(chains: Chains, lo: int, hi: int) -> Iterator[int]:
    """The ends of the log's heads in ``(lo, hi)``, one chain below the fork point (an iterator: the
    caller tests them against a set it holds, without building a second one)."""
    leaves = chains.shared
    first = shared_prefix.bisect_right(leaves, lo, key=_LEAF_END)
    last = shared_prefix.bisect_left(leaves, hi, key=_LEAF_END)
    return map(_LEAF_END, leaves[first:last])


def join_verified(state: QueueState2, v: Verified) -> Merged:
    """``state`` joined with a verified delta: our records cut to the merged value, then the new ones
    appended. Records we held past a fork point now known come back as evidence."""
    appended = _appended(state, v)
    return _joined(state, v) if appended is None else Merged(appended)


def _joined(state: QueueState2, v: Verified) -> Merged:
    """:func:`join_verified`'s general path: any fork, truncation, epoch or overlap."""
    chains = v.chains
    same_epoch = chains.epoch == state.chains.epoch
    lo, hi = _held_after(state, chains)
    evidence: tuple[Record, ...] = ()
    if same_epoch:
        own_lo, own_hi = state.held
        if chains.forked and own_hi > hi:
            evidence = tuple(state.entries.records(max(hi, own_lo) - own_lo))
        kept = cut(state, replace(chains, held_end=hi))
        bodies = kept.bodies
        # A truncation, a fork point below what we held, or branches changed: some bodies may be off the log.
        if (lo, hi) != (own_lo, own_hi) or (chains.forked and chains.tips != state.chains.tips):
            bodies = keep_bodies(kept.chains, bodies, check=chains.forked)
    else:
        kept = replace(state, chains=replace(chains, held_end=lo), entries=nothing_at(state, lo))
        bodies = ()
    end = v.from_offset + len(v.records)
    if v.records and end > hi:
        skip = hi - v.from_offset
        entries = kept.entries.extend(v.records[skip:], v.chain[skip:])
        bodies = (*bodies, *bodies_between(v.bodies, hi, end))
        kept = replace(kept, chains=replace(kept.chains, held_end=end), entries=entries)
    return Merged(replace(kept, meta=v.meta, bodies=bodies), evidence)


def _between(bodies: Sequence[HeadV2], lo: int, hi: int) -> Sequence[HeadV2]:
    """:func:`bodies_between`, a decode's run that lies inside ``(lo, hi]`` kept whole (not built)."""
    if type(bodies) is LazyDecoded and len(bodies) and bodies[0].end > lo and bodies[-1].end <= hi:
        return bodies
    return bodies_between(bodies, lo, hi)


def _appended(state: QueueState2, v: Verified) -> QueueState2 | None:
    """:func:`join_verified` of a plain append, built at once (None: not one). A live push's usual case:
    neither value forked, the same epoch and start, and records past all we hold, so nothing of ours is
    cut and no body leaves the log; the result is the general path's, without its intermediate values."""
    chains, ours = v.chains, state.chains
    if len(chains.tips) != 1 or len(ours.tips) > 1 or chains.epoch != ours.epoch or not v.records:
        return None
    lo, hi = state.held
    if chains.start != lo or hi > chains.tips[0].head.end:  # then the merged value holds ours as it is
        return None
    first, end = v.from_offset, v.from_offset + len(v.records)
    if not first <= hi < end:
        return None
    skip = hi - first
    kept = state.entries if hi > lo else nothing_at(state, lo)
    entries = kept.extend(v.records[skip:], v.chain[skip:])
    bodies = appended(state.bodies, _between(v.bodies, hi, end))  # our bodies' list, appended to
    extended = Chains(
        chains.owner, chains.queue_id, chains.epoch, chains.shared, chains.tips, chains.start_head, end
    )
    return QueueState2(state.owner, state.name, state.kind, extended, v.meta, entries, bodies)
