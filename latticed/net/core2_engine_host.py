"""The daemon's store as the :class:`~latticed.net.core2_host.Core2Host` of replication: core-2 queues'
link summaries, the deltas a peer lacks (read on a reader connection, one snapshot of chains, bodies and
records), and a peer's delta rebuilt from its steps, verified and joined inside the storage thread's writer
against the value it joins (:class:`MergeSteps2`).

A core-2 delta of a queue this daemon holds on core 1 converts it (:class:`ConvertMerge2`) when its head
is of a later epoch than core 1's history (the owner's ``queue upgrade`` or ``recover``); one of epoch 0
is refused per queue (nothing stored, the link stays up): the same owner cannot have meant both, and
closing the link would stop every other queue.

A relay answers the next link's ``NeedDelta2`` for a push it just merged from the records that merge
appended (:class:`RecentRows`), on the event loop, instead of a reader thread's read transaction per relayed
record; they are used only while the held value's chain at its end is the one they end with. The reads
it does issue are shared by the links that ask for the same rows of the same value at once
(:class:`~latticed.net.shared_reads.SharedReads`): a chunk passed on to several links is read once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from latticed.crdt import queue2
from latticed.crdt.core_errors import GapError
from latticed.crdt.head import QueueKind, queue_id
from latticed.crdt.queue.deltas import payload_bytes
from latticed.crdt.queue2 import Delta, QueueState2
from latticed.crdt.queue2.from_core1 import CONVERTED_EPOCH, seeded
from latticed.errors import MalformedError
from latticed.net.core2_ahead import AheadPushes
from latticed.net.core2_ahead import Miss as _Miss
from latticed.net.core2_host import OWN_RACES, PendingMerge2
from latticed.net.core2_recent import RecentRows
from latticed.net.shared_reads import SharedReads
from latticed.process.logs import get_logger, log_event
from latticed.protocol.core2_steps import Outgoing2, outgoing, unpack_steps
from latticed.protocol.core2_wire import Steps, Summary2, link_summary
from latticed.protocol.replication_messages import QueueKey
from latticed.storage.batch import Batch
from latticed.storage.bridge import StorageBridge
from latticed.storage.core1_convert import ConversionBusyError, committed_core1, stage_conversion
from latticed.storage.core2_engine import reading_through
from latticed.storage.core2_jobs import Merge2, Merged2
from latticed.storage.core2_queues import core2_of
from latticed.storage.core2_view import Core2View
from latticed.storage.corruption import CorruptQueueError
from latticed.storage.jobs import WriterView
from latticed.storage.reader import StoreReader

__all__ = ["ConvertMerge2", "EngineCore2Host", "MergeSteps2"]

log = get_logger(__name__)


class Core2Store(Protocol):
    """What the host uses of the :class:`~latticed.storage.engine.Engine`."""

    @property
    def bridge(self) -> StorageBridge: ...

    @property
    def core2(self) -> Core2View: ...

    def find(self, owner: bytes, name: str, kind: int = ...) -> int | None: ...


class MergeSteps2(Merge2):
    """A peer's delta as it came (its bodies as steps) joined durably: the steps are rebuilt against the
    value current on the storage thread, then verified and joined there (:class:`Merge2`: or as the event
    loop did). What it appended is noted in ``recent`` (the next link's delta is built from it)."""

    __slots__ = ("recent", "steps")

    def __init__(
        self,
        delta: Delta,
        steps: Steps | None,
        recent: RecentRows | None = None,
        *,
        verified: queue2.Verified | None = None,
        against: QueueState2 | None = None,
        joined: QueueState2 | None = None,
    ) -> None:
        super().__init__(delta, verified, against, joined)
        self.steps = steps
        self.recent = recent

    def apply(self, batch: Batch, writer: WriterView) -> None:
        d = self.delta
        if self.steps is not None:
            if not isinstance(d, Delta) or not isinstance(d.owner, bytes) or not isinstance(d.name, str):
                raise MalformedError("not a v2 queue delta")
            core2 = core2_of(writer)
            q = core2.find(queue_id(d.owner, d.name, d.kind))
            state = queue2.empty_state(d.owner, d.name, d.kind) if q is None else core2.state(q)
            self.delta = unpack_steps(state, d, self.steps)
            self.steps = None  # applied again (after a failed group commit), it is as it now stands
        super().apply(batch, writer)
        if self.recent is not None and self.added and self.result.q >= 0:
            self.recent.note(self.result.q, core2_of(writer).state(self.result.q), len(self.added))


#: Queues whose core-2 delta of epoch 0 was refused here (logged once each; the storage thread's).
_REFUSED: set[bytes] = set()


class ConvertMerge2(MergeSteps2):
    """A peer's core-2 delta of a queue this daemon holds on core 1: the owner converted it, so a head of
    a later epoch (verified with the owner's key) supersedes the core-1 history; the queue turns to core
    2 here, keeping its records up to the furthest head of the log they reach (the rest arrive as any
    catch-up). A delta of epoch 0 (the owner cannot have meant both) is refused and nothing stored."""

    __slots__ = ()

    def apply(self, batch: Batch, writer: WriterView) -> None:
        d = self.delta
        if not isinstance(d, Delta) or not isinstance(d.owner, bytes) or not isinstance(d.name, str):
            raise MalformedError("not a v2 queue delta")
        qid = queue_id(d.owner, d.name, d.kind)
        q = writer.lookup(qid)
        core2 = core2_of(writer)
        if q is None or core2.find(qid) is not None:
            super().apply(batch, writer)
            return
        try:
            state = committed_core1(batch, q)
        except ConversionBusyError as exc:
            raise GapError(str(exc)) from None  # stores nothing; the peer sends it again
        empty = queue2.empty_state(d.owner, d.name, d.kind)
        if self.steps is not None:
            d = self.delta = unpack_steps(empty, d, self.steps)
            self.steps = None
        first = queue2.verify_delta(empty, d)
        if first.chains.epoch < CONVERTED_EPOCH or not first.chains.tips:
            if qid in _REFUSED or len(_REFUSED) >= 4096:  # said once per queue
                self.result = Merged2(q, False, 0)
                return
            _REFUSED.add(qid)
            log_event(
                log,
                "replication.other_core",
                level=logging.WARNING,
                queue=f"{d.owner.hex()}/{d.name}",
                reason="a core-2 delta of epoch 0 of a queue held here on core 1: refused, nothing stored",
            )
            self.result = Merged2(q, False, 0)
            return
        seed = seeded(state, first.chains, first.meta, first.bodies)
        merged = queue2.join_verified(seed, queue2.verify_delta(seed, d))
        stage_conversion(batch, core2, q, state, merged.state)
        self.result = Merged2(q, True, 0)
        log_event(log, "queue.converted", queue=f"{d.owner.hex()}/{d.name}", end=merged.state.held[1])


class _Merging:
    """A :class:`MergeSteps2` on the storage thread, awaited once its transaction committed. ``ahead``:
    what we hold once it is stored, if it was verified on the event loop (the other links are served
    it now; see :mod:`latticed.net.core2_ahead`)."""

    def __init__(
        self, host: EngineCore2Host, key: QueueKey, job: MergeSteps2, ahead: Summary2 | None = None
    ) -> None:
        self._host, self._key, self._job, self.ahead = host, key, job, ahead

    async def result(self) -> tuple[Summary2 | None, bool]:
        try:
            await self._host.store.bridge.outcome(self._job)
        except (GapError, CorruptQueueError):  # it no longer fits what we hold, or our copy is found
            return self._host.summary2(self._key), False  # corrupt (the peer is not at fault): nothing stored
        return self._host.summary2(self._key), bool(self._job.result.changed)

    def when_settled(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` on the event loop once the job committed or failed (the link's ACKs)."""
        job = self._job
        if job.notify is not None:
            return False
        job.notify = callback
        return True

    def settled(self) -> tuple[Summary2 | None, bool] | None:
        """:meth:`result` once stored, without waiting (None: not yet, or failed: :meth:`result` raises)."""
        job = self._job
        if job.done is None or not job.done.is_set():
            return None
        if isinstance(job.error, GapError | CorruptQueueError):
            return self._host.summary2(self._key), False
        if job.error is not None:
            return None
        return self._host.summary2(self._key), bool(job.result.changed)


#: A delta read's request: the value's identity, the peer's summary, the bounds.
_ReadKey = tuple[int, queue2.Summary | None, int, int]


class EngineCore2Host:
    """The engine's core-2 queues as replication sees them (see the module docstring)."""

    def __init__(self, store: Core2Store) -> None:
        self.store = store
        #: The records the latest merges appended, per queue: a relayed push's delta needs no read.
        self.recent = RecentRows()
        #: Live pushes verified on the event loop, their merge pending: relayed and shown to tails now.
        self.ahead = AheadPushes()
        store.core2.ahead = self.ahead
        #: Deltas being read, by value (its identity: the read holds it), summary and bounds: links
        #: asking for the same rows of the same value at once share one read.
        self.reads: SharedReads[_ReadKey, Outgoing2] = SharedReads()

    async def load(self) -> None:
        """Load every core-2 queue's committed value (on the storage thread), so that
        :meth:`summaries2` names them all; later ones load as they commit."""
        await self.store.core2.load_all()  # a corrupt queue left out: never named, never served

    def _value(self, key: QueueKey) -> QueueState2 | None:
        core2 = self.store.core2
        q = core2.lookup(*key)
        return None if q is None else core2.loaded(q)

    def summary2(self, key: QueueKey) -> Summary2 | None:
        value = self._value(key)
        return None if value is None else link_summary(value)

    def summaries2(self) -> Mapping[QueueKey, Summary2]:
        core2 = self.store.core2
        out: dict[QueueKey, Summary2] = {}
        for kind in QueueKind:
            for q in core2.queues(kind):
                value = core2.loaded(q)
                if value is not None:
                    out[(value.owner, value.name, value.kind)] = link_summary(value)
        return out

    async def delta2_for(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        core2 = self.store.core2
        q = core2.lookup(*key)
        if q is None:
            return None
        try:
            state = await core2.value(q)
        except CorruptQueueError:  # never named to a peer (summaries2), so not served if asked for
            return None
        now = self._from_ahead(q, state, since, max_records, max_bytes)
        if now is None:
            now = self._from_recent(q, state, since, max_records, max_bytes)
        if now is not None:
            return now
        # A commit of ours between the value's load and the read (a fork freeze moving rows aside, a
        # truncation) raises GapError here: the caller's to handle (gossip reads again, from the newer
        # value, or leaves it to that commit's change), as for any host.
        return await self._read2(state, since, max_records, max_bytes)

    async def _read2(
        self, state: QueueState2, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2:
        def read(reader: StoreReader) -> Outgoing2:
            return outgoing(reading_through(state, reader.rows), since, max_records, max_bytes)

        async def run() -> Outgoing2:
            result: Outgoing2 = await self.store.bridge.read(read)
            return result

        # id(state) names the value while the read runs: ``read`` holds it, so the id is not reused.
        return await self.reads.read((id(state), since, max_records, max_bytes), run)

    async def delta2_many(
        self, asks: Sequence[tuple[QueueKey, queue2.Summary | None, int]], max_bytes: int
    ) -> list[Outgoing2 | Exception | None]:
        """:meth:`delta2_for` of several queues (``(key, since, max_records)``), in order, with one read
        transaction on one reader thread for those that need a read: a fresh replica of many small
        queues asks a window of them at once, and a thread hand-off and transaction per queue was the
        writer's serve cost that grew past the queue count (the window pass's profile). A queue whose
        rows a commit of ours took meanwhile answers its ``GapError`` / ``NotFoundError`` in its place
        (the caller reads it again alone); a read shared with another link, or a value not loaded,
        goes :meth:`delta2_for`'s way. The answers are those of a prefix of ``asks`` (at least one):
        once the deltas read reach ``max_bytes`` (one ask's most) the rest are not read, and the caller
        asks them again, so a batch holds at most about twice one delta, not one per ask (review27)."""
        core2 = self.store.core2
        answers: list[Outgoing2 | Exception | None] = [None] * len(asks)
        reads: list[tuple[int, QueueState2, queue2.Summary | None, int]] = []
        for i, (key, since, max_records) in enumerate(asks):
            q = core2.lookup(*key)
            state = None if q is None else core2.loaded(q)
            if q is None or state is None or self.reads.reading((id(state), since, max_records, max_bytes)):
                try:
                    answers[i] = await self.delta2_for(key, since, max_records, max_bytes)
                except OWN_RACES as exc:
                    answers[i] = exc
                continue
            now = self._from_ahead(q, state, since, max_records, max_bytes)
            if now is None:
                now = self._from_recent(q, state, since, max_records, max_bytes)
            if now is not None:
                answers[i] = now
            else:
                reads.append((i, state, since, max_records))
        if not reads:
            return answers

        def read(reader: StoreReader) -> list[Outgoing2 | Exception]:
            out: list[Outgoing2 | Exception] = []
            size = 0
            for _, state, since, max_records in reads:
                if out and size >= max_bytes:  # the byte budget of one batch: the rest asked again
                    break
                try:
                    got = outgoing(reading_through(state, reader.rows), since, max_records, max_bytes)
                except OWN_RACES as exc:
                    out.append(exc)
                    continue
                size += payload_bytes(got.delta.records)
                out.append(got)
            return out

        got: list[Outgoing2 | Exception] = await self.store.bridge.read(read)
        for (i, *_), answer in zip(reads, got, strict=False):
            answers[i] = answer
        return answers if len(got) == len(reads) else answers[: reads[len(got)][0]]

    def delta2_now(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        """:meth:`delta2_for`'s answer when it needs no read nor load: the delta of a push just merged,
        built from its records right here (None: ask :meth:`delta2_for`)."""
        core2 = self.store.core2
        q = core2.lookup(*key)
        state = None if q is None else core2.loaded(q)
        if q is None or state is None:
            return None
        now = self._from_ahead(q, state, since, max_records, max_bytes)
        return now if now is not None else self._from_recent(q, state, since, max_records, max_bytes)

    def _from_ahead(
        self, q: int, loaded: QueueState2, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        """The delta from the value ahead of its commit (pushes verified here): their records are in
        memory, and older ones come from :class:`RecentRows` when they are ``loaded``'s."""
        if (relayed := self.ahead.relay(q, since, max_records, max_bytes, loaded)) is not None:
            return relayed  # the peer holds what the newest pending push was checked against: as it came
        ahead = self.ahead.value(q, loaded)
        if ahead is None or since is None:
            return None
        if since.held_end < loaded.held[1] and self.recent.matches(q, loaded, since.held_end):
            ahead = reading_through(ahead, self.recent)
        try:
            return outgoing(ahead, since, max_records, max_bytes)
        except _Miss:
            return None

    def _from_recent(
        self, q: int, state: QueueState2, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        if since is None or not self.recent.matches(q, state, since.held_end):
            return None
        try:
            return outgoing(reading_through(state, self.recent), since, max_records, max_bytes)
        except _Miss:  # it needs older rows (a summary the peer's log runs into): a read does
            return None

    def submit_merge2(self, delta: Delta, steps: Steps | None, peer: bytes) -> PendingMerge2:
        key = (delta.owner, delta.name, delta.kind)
        if isinstance(delta.owner, bytes) and self.store.find(*key) is not None:
            job: MergeSteps2 = ConvertMerge2(delta, steps)  # held here on core 1: the owner converted it?
            job.origin = peer
            self.store.bridge.start(job)
            return _Merging(self, key, job)
        core2 = self.store.core2
        q = core2.lookup(*key) if isinstance(delta.owner, bytes) and isinstance(delta.name, str) else None
        loaded = None if q is None else core2.loaded(q)
        push = None if q is None or loaded is None else self.ahead.check(q, loaded, delta, steps)
        if push is None or q is None:
            job = MergeSteps2(delta, steps, self.recent)
        else:  # verified here: relayed and shown to tails now, so its commit may wait for company
            job = MergeSteps2(
                push.delta, None, self.recent, verified=push.verified, against=push.against, joined=push.value
            )
            job.may_linger = True
        job.origin = peer
        self.store.bridge.start(job)
        if push is None or q is None:
            return _Merging(self, key, job)
        after = self.ahead.note_push(q, push, job, delta, steps)
        core2.went_ahead(q)
        return _Merging(self, key, job, after)
