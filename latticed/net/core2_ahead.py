"""Live core-2 pushes verified on the event loop, ahead of their commit, so that a relay passes them on
at once and their merges share a group commit (as core 1's live pushes do: storage/ahead.py).

A core-2 delta is verified against the value it joins. For a live push (a few records) that value is
known here without a read: the queue's loaded committed value, or the value after the pushes verified
here whose merges are still on their way to the disk (:class:`AheadPushes`). The push is verified and
joined against it on the event loop; the joined value is what the next links are served from, and the
storage thread takes the verification as it is when the value it joins has the same chains, metadata and
chain value where the push starts (``Merge2``), and verifies again otherwise; it takes the joined value
too (writing the verified records onto its own rows) when the value it extends is that very value (the
same chains, metadata and bodies objects), and joins again otherwise. A link whose peer holds what the
newest push was checked against is passed that push as it came (:class:`Relay`), as core 1's relays
do. Anything that needs a read, does not fit, is forked or fails verification goes to the storage thread
as before (which refuses a forged push and ends its link): nothing is passed on before it verified.
Only the sender's ACK waits for the commit, and a tail or a group following the queue here (core-2 tails
show committed records only): then the commit does not wait for company.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from latticed.crdt import queue2
from latticed.crdt.queue.state import EntryView
from latticed.crdt.queue2 import Delta, QueueState2, Verified
from latticed.crdt.records import Record, RecordRun
from latticed.errors import LatticedError
from latticed.protocol.core2_live import next_push
from latticed.protocol.core2_steps import Outgoing2, unpack_steps
from latticed.protocol.core2_wire import Steps, Summary2, link_summary
from latticed.storage.ahead import AHEAD_DELTA_RECORDS
from latticed.storage.entries import StoredEntries
from latticed.storage.jobs import Job

__all__ = ["NO_ROWS", "AheadPush", "AheadPushes", "Miss", "Relay", "unbound"]

#: For how many queues a value ahead of its commit is kept (the ones pushed to last).
AHEAD_QUEUES = 256


def _pending(job: Job) -> bool:
    done = job.done
    return done is not None and not done.is_set()


class Miss(Exception):
    """A row that is not at hand on the event loop: the read goes to a reader thread (or the storage)."""


class NoRows:
    """A row source that holds nothing (what a value knows without reading, or :class:`Miss`)."""

    def record(self, q: int, off: int) -> Record | None:
        raise Miss

    def chain(self, q: int, off: int) -> bytes | None:
        raise Miss

    def records(self, q: int, lo: int, hi: int) -> list[Record]:
        raise Miss

    def run(self, q: int, lo: int, hi: int) -> RecordRun:
        raise Miss


NO_ROWS = NoRows()


def unbound(state: QueueState2) -> QueueState2:
    """``state`` reading nothing from the store (its storage thread's connection is not ours)."""
    entries = state.entries
    if not isinstance(entries, StoredEntries):
        return state
    return replace(state, entries=cast(EntryView, entries.rebind(NO_ROWS)))


@dataclass(frozen=True, slots=True)
class AheadPush:
    """A live push checked here: the delta rebuilt from its steps, verified against ``against``, and
    ``value``, the two joined (reading nothing from the store)."""

    delta: Delta
    verified: Verified
    against: QueueState2
    value: QueueState2


@dataclass(frozen=True, slots=True)
class Relay:
    """A live push as it came (``delta`` and ``steps`` as received), passed on as it is to a link whose
    peer holds what the push was verified against (``before``): it is what ``outgoing`` would build from
    the value ahead for that peer (an unforked value's summary fixes its log, start head, metadata and
    end, all the push was checked against), without building it. ``after``: that peer once it joined."""

    before: queue2.Summary
    delta: Delta
    steps: Steps | None
    after: Summary2

    def answer(self, since: queue2.Summary | None, max_records: int, max_bytes: int) -> Outgoing2 | None:
        """The push for a peer holding ``since`` (None: it is not where the push starts, or too big)."""
        d, before = self.delta, self.before
        if since is not before and since != before:  # (the peer's summary is often ours, as we sent it)
            return None
        records = d.records
        if type(records) is RecordRun:  # (its columns' lengths: no ``__len__`` call)
            if d.from_offset != since.held_end or len(records.values) > max_records:
                return None
            size = sum(map(len, records.values)) + sum(map(len, filter(None, records.keys)))
        else:
            if d.from_offset != since.held_end or len(records) > max_records:
                return None
            size = sum(len(r.value) + len(r.key or b"") for r in records)
        return Outgoing2(d, self.steps, self.after) if size <= max_bytes else None


def _stored_as(entry: _Pending, loaded: QueueState2 | None) -> bool:
    """Whether ``entry``'s push committed and ``loaded`` is the value it brought (whose summary, an
    unforked value's, is that of every value with the same newest head, metadata and end)."""
    job, relay = entry.job, entry.relay
    done = job.done
    if loaded is None or relay is None or done is None or not done.is_set() or job.error is not None:
        return False
    return not loaded.forked and link_summary(loaded) == relay.after


@dataclass(frozen=True, slots=True)
class _Pending:
    value: QueueState2
    job: Job
    relay: Relay | None = None  #: the push that brings the queue to ``value``, as it came


class AheadPushes:
    """Per queue, the value after the live pushes verified here whose merge has not finished yet."""

    def __init__(self) -> None:
        self._by_q: dict[int, _Pending] = {}

    def value(self, q: int, loaded: QueueState2 | None = None) -> QueueState2 | None:
        """The queue's value ahead of its commit (None: no merge of a push checked here is pending, or
        the ``loaded`` value is as far: another merge committed meanwhile)."""
        entry = self._by_q.get(q)
        if entry is None:
            return None
        done = entry.job.done
        if done is None or done.is_set():  # committed (the loaded value has it) or failed
            del self._by_q[q]
            return None
        if loaded is not None and entry.value.held[1] <= loaded.held[1]:
            return None
        return entry.value

    def check(self, q: int, loaded: QueueState2, delta: Delta, steps: Steps | None) -> AheadPush | None:
        """``delta`` verified and joined here, against the value ahead or else ``loaded`` (None: the
        storage thread's to verify: it is not a small push that adds records and joins plainly, it needs
        a read, or it does not verify here, in which case the storage thread refuses it). A relay's usual
        push (one version, our next) is checked in one pass (``core2_live.next_push``: the same checks
        and results); anything else, or anything that pass raises, takes the generic path, which decides."""
        records = delta.records
        n = len(records.values) if type(records) is RecordRun else len(records)  # (no ``__len__`` frame)
        if not 0 < n <= AHEAD_DELTA_RECORDS:
            return None
        against = self.value(q, loaded) or unbound(loaded)
        try:  # a relay's usual push in one pass; anything else (or raised) takes the generic path below
            fast = next_push(against, delta, steps)
        except Exception:  # refusals and odd input are the generic path's to decide
            fast = None
        if fast is not None:
            return AheadPush(fast[0], fast[1], against, fast[2])
        try:
            d = unpack_steps(against, delta, steps)
            verified = queue2.verify_delta(against, d)
            chains = verified.chains
            if not verified.records or chains.forked or chains.epoch != against.chains.epoch:
                return None
            merged = queue2.join_verified(against, verified)
        except (Miss, LatticedError):
            return None
        if merged.evidence:
            return None
        return AheadPush(d, verified, against, merged.state)

    def relay(
        self,
        q: int,
        since: queue2.Summary | None,
        max_records: int,
        max_bytes: int,
        loaded: QueueState2 | None = None,
    ) -> Outgoing2 | None:
        """The newest push of ``q`` checked here, as it came, for a peer that holds ``since`` (None: it
        does not start there; a peer further behind is sent the value ahead, all it lacks at once).
        Pending, or committed when the ``loaded`` value is the one it brought (the same summary: the
        same log, start head, metadata and end), so that a link asking after the commit (its window was
        full, its driver slept) is passed the push as it came too, not one rebuilt from the value."""
        entry = self._by_q.get(q)
        if entry is None or entry.relay is None or since is None:
            return None
        if not _pending(entry.job) and not _stored_as(entry, loaded):
            return None
        return entry.relay.answer(since, max_records, max_bytes)

    def before(self, q: int, against: QueueState2) -> queue2.Summary:
        """What a peer holding ``against`` (a value checked here against) summarises: the newest pending
        push's ``after`` when ``against`` is its value (nothing to compute), else computed."""
        entry = self._by_q.get(q)
        if entry is not None and entry.value is against and entry.relay is not None:
            return entry.relay.after.core
        return link_summary(against).core

    def note_push(self, q: int, push: AheadPush, job: Job, delta: Delta, steps: Steps | None) -> Summary2:
        """:meth:`note` for ``push``, kept as it came (``delta``, ``steps``: :class:`Relay`) unless what
        it was checked against needs a read to summarise; returns what we hold once it is stored."""
        after = link_summary(push.value)
        try:
            relay: Relay | None = Relay(self.before(q, push.against), delta, steps, after)
        except Miss:
            relay = None
        self.note(q, push.value, job, relay)
        return after

    def note(self, q: int, value: QueueState2, job: Job, relay: Relay | None = None) -> None:
        """``job`` (started) merges the push that brings ``q`` to ``value``; ``relay``: that push as it
        came."""
        by_q = self._by_q
        by_q.pop(q, None)
        if len(by_q) >= AHEAD_QUEUES:
            for stale in [k for k, e in by_q.items() if e.job.done is None or e.job.done.is_set()]:
                del by_q[stale]
            while len(by_q) >= AHEAD_QUEUES:
                by_q.pop(next(iter(by_q)))
        by_q[q] = _Pending(value, job, relay)
