"""The live-push cache: what live readers and replication's pushes are served from without the store.

Per queue it keeps three things, all on the event loop and all bounded:

* the records of the last commit (so a live tail reads them, and a peer one commit behind gets them
  pushed, without a read on a reader thread);
* the records of a peer's verified live push that are on their way to the store (:mod:`.ahead`: a tail on
  this replica streams them, and replication relays the push as it came, before our own commit);
* our chain values at a few recent ends, so a peer's ``since`` can be recognised as ours and its push
  computed from the last commit's records (:meth:`LiveCache.pushed_delta`).

It also wakes the tasks waiting for a queue to move (one ``trio.Event`` per waited-on queue, no polling).
The engine feeds it (commits, submitted merges, failed merges); the local API's tails and replication
read it. It changes when the live path does, and for nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import trio

from latticed.crdt import queue as core
from latticed.crdt.head import KIND_QUEUE, SignedHead
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.crdt.records import Record
from latticed.storage.ahead import AHEAD_DELTA_RECORDS, AHEAD_MAX_RECORDS, VerifiedAhead, summary_after
from latticed.storage.jobs import Merge
from latticed.storage.reader import Columns, RawRow, columns_of
from latticed.storage.writer import Change

#: A committed batch larger than this is not kept in memory for tails (they read it back instead).
RECENT_MAX_RECORDS: Final = 8192
#: Chain values remembered per queue for serving live pushes from memory.
KNOWN_CHAINS: Final = 8


class LiveCache:
    """Recent commits, records ahead of their commit, known chain values, and the wake-ups of waiters."""

    def __init__(self) -> None:
        self._waiters: dict[int, trio.Event] = {}
        self._recent: dict[int, tuple[int, Sequence[Record]]] = {}
        #: Per replicated queue, verified records on their way to the store (for live tails and relaying).
        self._ahead: dict[int, VerifiedAhead] = {}
        #: Per queue, our chain values at a few recent ends (:meth:`pushed_delta` checks a peer's
        #: ``since`` against them to serve a live push from the last commit without reading the store).
        self._known_chains: dict[int, dict[int, bytes]] = {}

    # ------------------------------------------------------------------ fed by the engine
    def committed(self, change: Change) -> None:
        """A commit changed ``change.q``: keep its records, drop what it made no longer ahead, wake."""
        q = change.q
        ahead = self._ahead.get(q)
        if ahead is not None and (change.state.held_end >= ahead.end or change.state.forked):
            del self._ahead[q]
        if change.appended and len(change.appended) <= RECENT_MAX_RECORDS:
            self._recent[q] = (change.first, change.appended)
        else:
            self._recent.pop(q, None)
        self.wake(q)

    def lost(self, q: int) -> None:
        """Handing a commit of ``q`` to this cache failed halfway: keep nothing of ``q`` (the records
        of the commit before it, records ahead, chain values: reads go to the store) and wake its
        waiters, who look at the committed value themselves."""
        self._recent.pop(q, None)
        self._ahead.pop(q, None)
        self._known_chains.pop(q, None)
        self.wake(q)

    def reset(self) -> None:
        """Memory was read back from the store after a stale spell: :meth:`lost` for every queue."""
        self._recent.clear()
        self._ahead.clear()
        self._known_chains.clear()
        waiters, self._waiters = self._waiters, {}
        for event in waiters.values():
            event.set()

    def merge_failed(self, q: int) -> None:
        """A merge of ``q`` failed: what it showed ahead is taken back (a tail waiting on it looks again)."""
        if self._ahead.pop(q, None) is not None:
            self.wake(q)

    @property
    def any_ahead(self) -> bool:
        """Whether any queue has records ahead (a failed merge need not be looked at otherwise)."""
        return bool(self._ahead)

    @staticmethod
    def may_go_ahead(verified: core.VerifiedDelta) -> bool:
        """Whether a verified delta is a live push that could be shown ahead of its commit (a cheap
        check before looking the queue up): a catch-up chunk is not latency-bound, nor is a fork."""
        d = verified.delta
        return (
            d.kind == KIND_QUEUE
            and 0 < len(d.records) <= AHEAD_DELTA_RECORDS
            and d.fork is None
            and len(verified.chains) == len(d.records)
        )

    def note_ahead(self, q: int, state: QueueState, job: Merge) -> None:
        """Serve the records of a verified live push that extends exactly what we hold (or what is
        already ahead) to live tails and to peers, before its commit (see ahead.py); sets ``job.ahead``.
        ``state`` is ``q``'s committed value."""
        verified = job.verified
        d = verified.delta
        if not self.may_go_ahead(verified) or state.forked or state.head is None:
            return
        ahead = self._ahead.get(q)
        if ahead is not None and ahead.end > state.held_end:
            base = ahead.summary
            if len(ahead.records) + len(d.records) > AHEAD_MAX_RECORDS:
                return
        else:
            ahead = None
            base = state.summary()  # in memory (the chain value at the end is cached)
        if d.from_offset != base.held_end or d.from_hash != base.held_hash:
            return
        summary = summary_after(base, d, verified.chains[-1])
        if summary is None:
            return
        self._ahead[q] = VerifiedAhead.of(d, summary) if ahead is None else ahead.extended(d, summary)
        job.ahead = summary
        self.wake(q)

    def remember_chain(self, q: int, end: int, chain: bytes) -> None:
        """Our chain value at ``end`` (a delta read from the store told us)."""
        known = self._known_chains.get(q)
        if known is None:
            known = self._known_chains[q] = {}
        elif end not in known and len(known) >= KNOWN_CHAINS:
            del known[next(iter(known))]  # the oldest
        known[end] = chain

    def forget(self, q: int) -> None:
        """Drop the last commit's records of ``q``: the next read of them goes to the store."""
        self._recent.pop(q, None)

    # ------------------------------------------------------------------ waiting
    def wake(self, q: int) -> None:
        event = self._waiters.pop(q, None)
        if event is not None:
            event.set()

    def followed(self, q: int) -> bool:
        """Whether something here waits for ``q``'s next change (a tail, a group's source)."""
        return q in self._waiters

    def changed(self, q: int) -> trio.Event:
        """Set at the next commit of ``q``, or when records of it go ahead or are taken back."""
        event = self._waiters.get(q)
        if event is None:
            event = self._waiters[q] = trio.Event()
        return event

    # ------------------------------------------------------------------ read by tails
    def recent_columns(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns | None:
        """Committed records from ``lo`` out of the last commit, or None if it does not hold ``lo`` or
        ends before the read does. The storage thread publishes a commit's state before this cache hears
        of it on the event loop, so a reader can be told of an end past the commit kept here: that read
        goes to the store, which has the records, instead of coming back short."""
        found = self._recent.get(q)
        if found is None:
            return None
        first, records = found
        end = first + len(records)
        if not first <= lo < end or end < min(hi, lo + max_records):
            return None
        return columns_of(first, records, lo, hi, max_records=max_records, max_bytes=max_bytes)

    def recent_row(self, q: int, offset: int) -> RawRow | None:
        """The committed record at ``offset`` out of the last commit, or None if it does not hold it."""
        found = self._recent.get(q)
        if found is None or not found[0] <= offset < found[0] + len(found[1]):
            return None
        r = found[1][offset - found[0]]
        return r.key, r.value, r.timestamp, [[k, v] for k, v in r.headers] if r.headers else None

    def ahead(self, q: int) -> VerifiedAhead | None:
        """The verified records of ``q`` on their way to the store, if any."""
        return self._ahead.get(q)

    def visible_end(self, q: int, held_end: int) -> int:
        """Where a live tail may read up to: the committed end, or past it the records ahead."""
        ahead = self._ahead.get(q)
        return ahead.end if ahead is not None and ahead.end > held_end else held_end

    def ahead_columns(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Records ahead of the commit from ``lo`` (none unless they hold ``lo``), bounded like any read."""
        ahead = self._ahead.get(q)
        if ahead is None or not ahead.first <= lo < ahead.end or max_records <= 0:
            return Columns()
        return ahead.columns(lo, hi, max_records, max_bytes)

    # ------------------------------------------------------------------ read by replication
    def ahead_for(self, q: int, state: QueueState, since: Summary | None) -> VerifiedAhead | None:
        """The records ahead of our commit, if a peer summarised by ``since`` is to be served from them:
        it holds at least what we have committed (``state``), and we have more on its way to the store."""
        ahead = self._ahead.get(q)
        if ahead is None or since is None or ahead.end <= state.held_end or since.held_end < state.held_end:
            return None
        return ahead

    def pushed_delta(
        self, q: int, state: QueueState, since: Summary | None, max_records: int | None, max_bytes: int | None
    ) -> QueueDelta | None:
        """``core.delta(state, since, ...)`` computed on the event loop when it needs no read: the peer
        lacks only the head, or only records of the last commit, and ``since`` names a chain value we know
        is ours. None: compute it from the store (anything else, or any doubt)."""
        head, tip = state.head, state.tip
        if head is None or since is None or state.forked:
            return None
        held = state.summary()  # in memory: the chain value at the end is cached with the entries
        self.remember_chain(q, held.held_end, held.held_hash)
        from_offset = since.held_end
        records: Sequence[Record] = ()
        checkpoints: tuple[SignedHead, ...] = ()
        if from_offset == held.held_end:
            if since.held_hash != held.held_hash:
                return None
            tip = None
        else:
            found = self._recent.get(q)
            if found is None or tip is None:
                return None
            first, appended = found
            end = held.held_end
            if first + len(appended) != end or not max(first, state.start) <= from_offset < end:
                return None
            if self._known_chains[q].get(from_offset) != since.held_hash:
                return None
            records = appended[from_offset - first :]
            if (max_records is not None and len(records) > max_records) or (
                max_bytes is not None and core.payload_bytes(records) > max_bytes
            ):
                return None
            checkpoints = tuple(c for c in state.checkpoints if from_offset < c.end <= end and c != tip)
        return QueueDelta(
            owner=state.owner,
            name=state.name,
            kind=state.kind,
            head=head,
            meta=state.meta if since.meta_version != head.meta_version else None,
            tip=tip,
            from_offset=from_offset,
            from_hash=since.held_hash,
            records=records,
            checkpoints=checkpoints,
            fork=None,
        )


__all__ = ["KNOWN_CHAINS", "RECENT_MAX_RECORDS", "LiveCache"]
