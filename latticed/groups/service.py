"""The work-queue service: runs the consumer groups this daemon owns, on top of the store (a
:class:`~latticed.groups.ports.GroupStore`).

* **Start-up**: every group log (a ``KIND_GROUP`` queue) we own is loaded: its definition from the
  signed metadata, its progress by folding its ops, then its sources (and DLQ) are read from their ack
  floors in bounded batches into a fresh :class:`~latticed.leases.dispatch.Dispatcher`. Leases were local,
  so everything unsettled is available again.
* **Intake**: while it runs, the service listens to the daemon's change fan-out (given at construction)
  and marks sources that changed (our appends and replicated arrivals alike); one feeder task reads their
  new records from the store and offers them, then wakes the group's waiting consumers (a ``trio.Event``
  per group, no polling).
* **Durability**: ack, nack, redrive, purge and ``ack_up_to`` reply only after their changes are
  committed (:class:`~latticed.groups.committer.Committer`); intake floor moves and expiries are written
  in the background (losing one to a crash only redelivers).
* **Time**: one timer task sleeps until the earliest lease expiry or retry time across groups (woken
  early when a new, earlier deadline appears) and then expires leases and promotes retries.

Consumers are identified by the API (one id per client connection). A consumer whose connection closes
keeps its ``dequeue`` leases (a script may ack them from another process) and is forgotten once they end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import trio

from latticed.crdt.group import (
    GroupProgress,
    GroupSpec,
    apply_progress_ops,
    decode_progress_op,
    dlq_name,
    source_id,
    spec_from_meta,
    spec_to_meta,
)
from latticed.crdt.head import KIND_GROUP, KIND_QUEUE
from latticed.crdt.queue import QueueState
from latticed.errors import (
    AlreadyExistsError,
    CapacityError,
    LatticedError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
)
from latticed.groups.committer import Committer, Flight
from latticed.groups.ports import GroupStore
from latticed.groups.runtime import CATCH_UP_BYTES, CATCH_UP_RECORDS, GroupRuntime
from latticed.leases.dispatch import Changes, DeadLetter, Lease
from latticed.leases.filters import compile_filter
from latticed.logs import get_logger, log_event
from latticed.storage.wiring import ChangeFanout

log = get_logger(__name__)

DLQ_META_KEY = "dlq_of"


class GroupService:
    """Every group this daemon runs; all methods run on the daemon's trio thread."""

    def __init__(self, engine: GroupStore, changes: ChangeFanout) -> None:
        self.engine = engine
        self._changes = changes
        self._groups: dict[str, GroupRuntime] = {}
        self._by_source: dict[str, list[GroupRuntime]] = {}
        self._dirty: set[str] = set()
        self._feed = trio.Event()
        self._timer_wake = trio.Event()
        self._timer_until = math.inf
        self.committer = Committer(engine, self._catch_up_dlq)

    def now(self) -> float:
        """Wall-clock seconds (dead-letter history is durable, so not a monotonic clock)."""
        return self.engine.clock() / 1000.0

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[GroupService] = trio.TASK_STATUS_IGNORED) -> None:
        engine = self.engine
        with self._changes.subscribed(self._on_change):
            async with trio.open_nursery() as nursery:
                await nursery.start(self.committer.run)
                for q in engine.queues(KIND_GROUP):
                    if engine.owned(q):
                        await self._load(q)
                nursery.start_soon(self._feeder)
                nursery.start_soon(self._timer)
                log_event(log, "groups.started", groups=len(self._groups))
                task_status.started(self)

    async def _load(self, q: int) -> None:
        state = self.engine.state(q)
        try:
            spec = spec_from_meta(state.meta_dict)
            if spec.name != state.name:
                raise MalformedError("the group definition names another group")
            progress = await self._fold(q)
            dlq_q = await self._dlq_queue(spec.name)
            await self._start(q, dlq_q, spec, progress)
        except LatticedError as exc:
            log_event(log, "group.load_failed", level=40, group=state.name, error=str(exc))

    async def _fold(self, q: int) -> dict[str, GroupProgress]:
        """The progress a group log holds: the join of its ops (read in bounded batches)."""
        engine, progress = self.engine, dict[str, GroupProgress]()
        pos = engine.state(q).start
        while pos < engine.state(q).held_end:
            columns = await engine.read(q, pos, engine.state(q).held_end, CATCH_UP_RECORDS, CATCH_UP_BYTES)
            if not columns.offsets:
                break
            ops = []
            for offset, value in zip(columns.offsets, columns.values, strict=True):
                try:
                    ops.append(decode_progress_op(value))
                except MalformedError as exc:
                    log_event(
                        log, "group.bad_op", level=30, queue=engine.address(q), offset=offset, error=str(exc)
                    )
            progress = apply_progress_ops(progress, ops)
            pos = columns.offsets[-1] + 1
        return progress

    async def _start(self, q: int, dlq_q: int, spec: GroupSpec, progress: dict[str, GroupProgress]) -> None:
        rt = GroupRuntime(self.engine, q, dlq_q, spec, progress)
        self._groups[spec.name] = rt
        for sid in rt.sources:
            self._by_source.setdefault(sid, []).append(rt)
        for sid in rt.sources:
            await rt.catch_up(sid, self._background)
        stats = rt.dispatcher.stats(self.now())
        log_event(
            log,
            "group.running",
            group=spec.name,
            available=stats.available,
            failed=stats.failed,
            dead=stats.dead,
        )

    async def _dlq_queue(self, group: str) -> int:
        """The group's DLQ: ours if it exists (and is this group's, or empty), else a new one."""
        engine, name = self.engine, dlq_name(group)
        q = engine.find(engine.public_key, name, KIND_QUEUE)
        if q is None:
            return await engine.create_queue(name, {DLQ_META_KEY: group})
        state = engine.state(q)
        if state.meta_dict.get(DLQ_META_KEY) != group and state.held_end > 0:
            raise AlreadyExistsError(f"queue {name} exists and is not the dead-letter queue of group {group}")
        return q

    # ------------------------------------------------------------------ intake
    def _on_change(self, state: QueueState) -> None:
        """Change listener (trio thread, after each commit): note sources with new records."""
        if state.kind != KIND_QUEUE or not self._by_source:
            return
        sid = f"{state.owner.hex()}/{state.name}"
        if sid in self._by_source:
            self._dirty.add(sid)
            self._feed.set()

    async def _feeder(self) -> None:
        while True:
            await self._feed.wait()
            self._feed = trio.Event()
            dirty, self._dirty = self._dirty, set()
            for sid in dirty:
                for rt in self._by_source.get(sid, ()):
                    try:
                        if await rt.catch_up(sid, self._background):
                            rt.notify()
                    except LatticedError as exc:  # the next change of that source retries
                        log_event(
                            log, "group.intake_failed", level=40, group=rt.name, source=sid, error=str(exc)
                        )

    async def _catch_up_dlq(self, rt: GroupRuntime) -> None:
        await rt.catch_up(rt.dlq, self._background)

    def _background(self, rt: GroupRuntime, changes: Changes) -> None:
        self.committer.submit(rt, changes)

    # ------------------------------------------------------------------ time
    async def _timer(self) -> None:
        """Expire leases and promote retries when they are due; sleeps until the next deadline."""
        while True:
            now = self.now()
            earliest = math.inf
            for rt in list(self._groups.values()):
                deadline = rt.dispatcher.next_deadline()
                if deadline is not None and deadline <= now:
                    self._settled(rt, rt.dispatcher.expire(now))
                    rt.dispatcher.promote(now)
                    rt.notify()
                    deadline = rt.dispatcher.next_deadline()
                if deadline is not None:
                    earliest = min(earliest, deadline)
            self._timer_until = earliest
            self._timer_wake = trio.Event()
            # At least a millisecond: a deadline that is somehow still due must not make this spin.
            with trio.move_on_after(max(earliest - self.now(), 0.001) if earliest < math.inf else math.inf):
                await self._timer_wake.wait()

    def _deadline_moved(self, rt: GroupRuntime) -> None:
        deadline = rt.dispatcher.next_deadline()
        if deadline is not None and deadline < self._timer_until:
            self._timer_until = deadline
            self._timer_wake.set()

    def _settled(self, rt: GroupRuntime, changes: Changes) -> None:
        """After leases ended: persist in the background, forget detached consumers with none left."""
        self.committer.submit(rt, changes)
        self._sweep_detached(rt)

    def _sweep_detached(self, rt: GroupRuntime) -> None:
        if rt.detached:
            now = self.now()
            for consumer in [c for c in rt.detached if rt.dispatcher.in_flight(c) == 0]:
                rt.dispatcher.release_consumer(consumer, now)
                rt.detached.discard(consumer)

    # ------------------------------------------------------------------ groups
    def find_running(self, address: str) -> GroupRuntime | None:
        owner, name = self.engine.parse_address(address)
        return self._groups.get(name) if owner == self.engine.public_key else None

    def runtime(self, address: str) -> GroupRuntime:
        """A group this daemon runs, by ``NAME`` or ``OWNER/NAME``."""
        rt = self.find_running(address)
        if rt is not None:
            return rt
        owner, name = self.engine.parse_address(address)
        if self.engine.find(owner, name, KIND_GROUP) is not None:
            raise NotOwnerError(
                f"group {owner.hex()}/{name} is run by the daemon that owns it; this one holds a replica "
                "(ask that daemon, or use group stats here for its replicated progress)"
            )
        raise NotFoundError(f"no group {address}")

    def running(self) -> list[GroupRuntime]:
        return sorted(self._groups.values(), key=lambda rt: rt.name)

    async def create(self, name: str, queues: Iterable[str], **settings: Any) -> GroupRuntime:
        """Define and start a group over ``queues`` (addresses of queues this daemon holds)."""
        engine, me = self.engine, self.engine.public_key
        sources = []
        for address in queues:
            owner, qname = engine.parse_address(address)
            if engine.find(owner, qname, KIND_QUEUE) is None:
                raise NotFoundError(f"no queue {address} here (create it, or wait for it to replicate)")
            if owner == me and qname == dlq_name(name):
                raise MalformedError("a group cannot read its own dead-letter queue")
            sources.append(source_id(owner, qname))
        spec = GroupSpec(name=name, sources=tuple(sources), **settings)
        meta = spec_to_meta(spec)  # checks the spec
        compile_filter(spec.filter)
        if engine.find(me, name, KIND_GROUP) is not None:
            raise AlreadyExistsError(f"group {name} already exists")
        dlq_q = await self._dlq_queue(name)
        q = await engine.create_queue(name, meta, KIND_GROUP)
        await self._start(q, dlq_q, spec, {})
        log_event(log, "group.created", group=name, sources=list(spec.sources), filter=spec.filter)
        return self._groups[name]

    # ------------------------------------------------------------------ consumers
    async def dequeue(
        self, rt: GroupRuntime, consumer: str, visibility: float | None, wait: float | None
    ) -> Lease | None:
        """Lease the next available record; with ``wait``, block up to that many seconds for one."""
        deadline = trio.current_time() + (wait or 0.0)
        while True:
            lease = rt.dispatcher.dequeue(consumer, visibility, self.now())
            if lease is not None:
                self._deadline_moved(rt)
                return lease
            if await self._feed_now(rt):
                continue
            if wait is None or trio.current_time() >= deadline:
                return None
            with trio.move_on_at(deadline):
                await rt.changed.wait()

    async def _feed_now(self, rt: GroupRuntime) -> bool:
        """Offer what the group's sources committed and the feeder has not offered yet (True if any source
        was behind; the feeder may be the one that catches it up): an empty answer must not come from a
        record acknowledged to its writer a moment ago."""
        behind = False
        for sid in rt.sources:
            q = rt.source_queue(sid)
            if q is not None and rt.cursors[sid] < self.engine.state(q).held_end:
                behind = True
                await rt.catch_up(sid, self._background)
        return behind

    def take(self, rt: GroupRuntime, consumer: str, visibility: float | None, n: int) -> list[Lease]:
        """Lease up to ``n`` available records at once (a subscription filling its window), never past the
        group's per-consumer cap; CapacityError only if the consumer cannot join the group."""
        leases: list[Lease] = []
        cap = rt.spec.max_in_flight
        if cap and rt.dispatcher.has_consumer(consumer):
            n = min(n, cap - rt.dispatcher.in_flight(consumer))
        now = self.now()
        while len(leases) < n:
            try:
                lease = rt.dispatcher.dequeue(consumer, visibility, now)
            except CapacityError:
                if leases:
                    break
                raise
            if lease is None:
                break
            leases.append(lease)
        if leases:
            self._deadline_moved(rt)
        return leases

    def drop_consumer(self, rt: GroupRuntime, consumer: str) -> int:
        """Like :meth:`release` without waiting for the commit (safe while being cancelled); returns how
        many leases were given back."""
        changes = rt.dispatcher.release_consumer(consumer, self.now())
        if changes:
            self._deadline_moved(rt)
            rt.notify()
            self._settled(rt, changes)
        return len(changes.failed)

    def ack_submit(self, rt: GroupRuntime, token: str) -> tuple[Changes, Flight]:
        """Settle at once in memory; the flight says when it is durable (reply only after that)."""
        changes = rt.dispatcher.ack(token, self.now())
        rt.notify()  # a subscriber at its in-flight cap may take another
        self._sweep_detached(rt)
        return changes, self.committer.submit(rt, changes)

    async def ack(self, rt: GroupRuntime, token: str) -> Changes:
        changes, flight = self.ack_submit(rt, token)
        await flight.wait()
        return changes

    async def nack(self, rt: GroupRuntime, token: str, delay: float | None) -> Changes:
        changes = rt.dispatcher.nack(token, delay, self.now())
        return await self._returned(rt, changes)

    async def release(self, rt: GroupRuntime, consumer: str) -> Changes:
        """The consumer is gone: nack what it holds (each a failed attempt) and unregister it."""
        changes = rt.dispatcher.release_consumer(consumer, self.now())
        return await self._returned(rt, changes)

    async def _returned(self, rt: GroupRuntime, changes: Changes) -> Changes:
        """Leases ended without an ack: records are available again (now or at a retry time)."""
        self._deadline_moved(rt)
        rt.notify()
        self._sweep_detached(rt)
        await self.committer.persist(rt, changes)
        return changes

    def extend(self, rt: GroupRuntime, token: str, visibility: float) -> Lease:
        return rt.dispatcher.extend(token, visibility, self.now())

    async def ack_up_to(self, rt: GroupRuntime, queue: str, up_to: int) -> Changes:
        owner, name = self.engine.parse_address(queue)
        changes = rt.dispatcher.ack_up_to(source_id(owner, name), up_to, self.now())
        rt.notify()
        self._sweep_detached(rt)
        await self.committer.persist(rt, changes)
        return changes

    def connection_closed(self, consumer: str) -> None:
        """A client connection ended: forget it as a consumer, at once if it holds no leases."""
        now = self.now()
        for rt in self._groups.values():
            if rt.dispatcher.has_consumer(consumer):
                if rt.dispatcher.in_flight(consumer):
                    rt.detached.add(consumer)
                else:
                    rt.dispatcher.release_consumer(consumer, now)

    # ------------------------------------------------------------------ dead letters
    def dead_letters(self, rt: GroupRuntime, limit: int | None) -> list[DeadLetter]:
        return rt.dispatcher.dead_letters(limit)

    async def redrive(self, rt: GroupRuntime, offsets: list[int] | None) -> int:
        changes = rt.dispatcher.redrive(offsets, self.now())
        await self.committer.persist(rt, changes)
        rt.notify()
        return sum(len(op.progress.released) for op in changes.ops)

    async def purge(self, rt: GroupRuntime, offsets: list[int] | None) -> int:
        count = len(rt.dispatcher.dead_letters() if offsets is None else set(offsets))
        changes = rt.dispatcher.purge(offsets, self.now())
        await self.committer.persist(rt, changes)
        return count if changes else 0

    # ------------------------------------------------------------------ replicas
    async def replica_progress(self, address: str) -> tuple[QueueState, GroupSpec, dict[str, GroupProgress]]:
        """Any group log this daemon holds (its own or a replica): definition and folded progress."""
        q = self.engine.resolve(address, KIND_GROUP)
        state = self.engine.state(q)
        return state, spec_from_meta(state.meta_dict), await self._fold(q)


__all__ = ["DLQ_META_KEY", "GroupService"]
