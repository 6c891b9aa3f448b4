"""The work-queue service: runs the consumer groups this daemon owns, on top of the store (a
:class:`~latticed.groups.group_ports.GroupStore`).

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

Why one module: :class:`GroupService` is one job, running this daemon's groups, whose parts (start-up,
feeding, lease ops, commits, edit and delete) share the runtimes and the committer and must keep one
ordering rule: durable before the reply. Reads, the runtime and the committer already live apart.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import trio

from latticed.crdt.attempts import HISTORY_KEY, AttemptEntry, correlation_id, decode_history
from latticed.crdt.group import (
    DLQ_META_KEY,
    GroupProgress,
    apply_progress_ops,
    decode_progress_op,
    dlq_name,
    source_id,
)
from latticed.crdt.group_spec import GroupSpec, spec_from_meta, spec_to_meta
from latticed.crdt.head import KIND_GROUP, KIND_QUEUE
from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record
from latticed.errors import (
    AlreadyExistsError,
    CapacityError,
    LatticedError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
)
from latticed.groups.committer import Committer, Flight
from latticed.groups.group_ports import GroupStore
from latticed.groups.group_sources import held, watch_sources
from latticed.groups.runtime import CATCH_UP_BYTES, CATCH_UP_RECORDS, GroupRuntime, records_of
from latticed.leases.filters import compile_filter
from latticed.leases.outcomes import Changes, DeadLetter, Grant, TaskView
from latticed.process.logs import get_logger, log_event
from latticed.storage.sealer import Sealer
from latticed.storage.wiring import ChangeFanout

log = get_logger(__name__)

#: Metadata of a deleted group's log (when, ms): a tombstone, since a signed queue cannot be unmade on
#: the peers holding it; its ops and its DLQ's dead letters are truncated away.
DELETED_META_KEY = "deleted"


class GroupService:
    """Every group this daemon runs; all methods run on the daemon's trio thread."""

    def __init__(self, engine: GroupStore, changes: ChangeFanout, sealer: Sealer) -> None:
        self.engine = engine
        #: Seals and opens records of sealed queues (the daemon's one :class:`Sealer` over ``engine``).
        self.sealer = sealer
        self._changes = changes
        self._groups: dict[str, GroupRuntime] = {}
        self._by_source: dict[str, list[GroupRuntime]] = {}
        self._dirty: set[str] = set()
        self._feed = trio.Event()
        #: Set (and replaced) when the set of sources changes, for :func:`watch_sources`.
        self._sources_changed = trio.Event()
        self._timer_wake = trio.Event()
        self._timer_until = math.inf
        self.committer = Committer(engine, sealer, self._catch_up_dlq)

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
                nursery.start_soon(
                    watch_sources,
                    engine,
                    self._source_queues,
                    lambda: self._sources_changed,
                    self._mark_dirty,
                )
                nursery.start_soon(self._timer)
                log_event(log, "groups.started", groups=len(self._groups))
                task_status.started(self)

    async def _load(self, q: int) -> None:
        state = self.engine.state(q)
        if DELETED_META_KEY in state.meta_dict:
            return
        try:
            spec = spec_from_meta(state.meta_dict)
            if spec.name != state.name:
                raise MalformedError("the group definition names another group")
            progress, history = await self._fold(q)
            dlq_q = await self._dlq_queue(spec.name)
            await self._start(q, dlq_q, spec, progress, history)
        except LatticedError as exc:
            log_event(log, "group.load_failed", level=40, group=state.name, error=str(exc))

    async def _fold(self, q: int) -> tuple[dict[str, GroupProgress], list[AttemptEntry]]:
        """The progress a group log holds (the join of its ops) and its attempt history (read in bounded
        batches)."""
        engine, progress = self.engine, dict[str, GroupProgress]()
        history: list[AttemptEntry] = []
        pos = engine.state(q).start
        while pos < engine.state(q).held_end:
            columns = await engine.read(q, pos, engine.state(q).held_end, CATCH_UP_RECORDS, CATCH_UP_BYTES)
            if not columns.offsets:
                break
            ops = []
            for offset, key, value in zip(columns.offsets, columns.keys, columns.values, strict=True):
                try:
                    if key == HISTORY_KEY:
                        history.extend(decode_history(value))
                    else:
                        ops.append(decode_progress_op(value))
                except MalformedError as exc:
                    log_event(
                        log, "group.bad_op", level=30, queue=engine.address(q), offset=offset, error=str(exc)
                    )
            progress = apply_progress_ops(progress, ops)
            pos = columns.offsets[-1] + 1
        return progress, history

    async def _start(
        self,
        q: int,
        dlq_q: int,
        spec: GroupSpec,
        progress: dict[str, GroupProgress],
        history: list[AttemptEntry] | None = None,
    ) -> None:
        rt = GroupRuntime(self.engine, q, dlq_q, spec, progress, sealer=self.sealer, history=history or ())
        self._groups[spec.name] = rt
        for sid in rt.sources:
            self._by_source.setdefault(sid, []).append(rt)
        self._sources_changed.set()
        self._sources_changed = trio.Event()
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

    async def _dlq_queue(self, group: str, *, sealed: bool = False) -> int:
        """The group's DLQ: ours if it exists (and is this group's, or empty), else a new one. Dead letters
        carry their records, so a group with a sealed source gets a DLQ sealed to this daemon alone."""
        engine, name = self.engine, dlq_name(group)
        q = engine.find(engine.public_key, name, KIND_QUEUE)
        if q is None:
            if sealed:
                return await self.sealer.create_queue(name, {DLQ_META_KEY: group}, ())
            return await engine.create_queue(name, {DLQ_META_KEY: group})
        state = engine.state(q)
        if state.meta_dict.get(DLQ_META_KEY) != group:  # a queue made before .dlq names were reserved
            raise AlreadyExistsError(
                f"queue {name} exists and is not the dead-letter queue of group {group}: a group's DLQ is "
                f"always <group>.dlq, so choose another group name"
            )
        if sealed and self.sealer.sealing(q) is None:
            raise MalformedError(
                f"queue {name} is not sealed: it cannot hold the dead letters of a group with a sealed source"
            )
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

    def _source_queues(self) -> list[tuple[str, int]]:
        """Each source some group reads, with its queue here (those this daemon holds)."""
        found = ((sid, rts[0].source_queue(sid)) for sid, rts in self._by_source.items() if rts)
        return [(sid, q) for sid, q in found if q is not None]

    def _mark_dirty(self, sids: list[str]) -> None:
        """Sources that may have new records (core-2 commits, which the change fanout does not carry)."""
        self._dirty.update(sids)
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
        if owner != self.engine.public_key and self.engine.find(owner, name, KIND_GROUP) is not None:
            raise NotOwnerError(
                f"group {owner.hex()}/{name} is run by the daemon that owns it; this one holds a replica "
                "(ask that daemon; group stats, dlq list and dlq show read its replicated state here)"
            )
        raise NotFoundError(f"no group {address}")

    def running(self) -> list[GroupRuntime]:
        return sorted(self._groups.values(), key=lambda rt: rt.name)

    async def create(
        self,
        name: str,
        queues: Iterable[str],
        *,
        extra_meta: Mapping[str, str] | None = None,
        **settings: Any,
    ) -> GroupRuntime:
        """Define and start a group over ``queues`` (addresses of queues this daemon holds); ``extra_meta``
        goes into its log's metadata beside the definition (the remote-consumer allow-list)."""
        engine, me = self.engine, self.engine.public_key
        sealer = self.sealer
        sources = []
        sealed = False
        for address in queues:
            owner, qname = engine.parse_address(address)
            found = engine.find(owner, qname, KIND_QUEUE)
            if found is None:
                raise NotFoundError(f"no queue {address} here (create it, or wait for it to replicate)")
            sealing = sealer.sealing(found)
            if sealing is not None:  # its records reach consumers here in plaintext: we must read them
                sealer.content_key(found, sealing, sealing.current.number)
                sealed = True
            if owner == me and qname == dlq_name(name):
                raise MalformedError("a group cannot read its own dead-letter queue")
            sources.append(source_id(owner, qname))
        spec = GroupSpec(name=name, sources=tuple(sources), **settings)
        meta = spec_to_meta(spec)  # checks the spec
        compile_filter(spec.filter)
        old = engine.find(me, name, KIND_GROUP)
        if old is not None and DELETED_META_KEY not in engine.state(old).meta_dict:
            raise AlreadyExistsError(f"group {name} already exists")
        dlq_q = await self._dlq_queue(name, sealed=sealed)
        if old is None:
            q = await engine.create_queue(name, {**(extra_meta or {}), **meta}, KIND_GROUP)
        else:  # a deleted group's log (emptied when it was deleted) carries the new one
            q = old
            updates: dict[str, str | None] = {key: None for key in engine.state(q).meta_dict}
            await engine.set_meta(q, {**updates, **(extra_meta or {}), **meta})
        await self._start(q, dlq_q, spec, {})
        log_event(log, "group.created", group=name, sources=list(spec.sources), filter=spec.filter)
        return self._groups[name]

    def unsettled_floor(self, sid: str) -> int | None:
        """The lowest offset of source ``sid`` (``OWNER/NAME``) some group here has not settled, durably
        (None: no group here reads it). Retention's ``keep_unsettled`` cuts no further: below the durable
        ack floor every group settled everything, and a crash cannot bring an in-memory ack back."""
        floors = []
        for rt in self._by_source.get(sid, ()):
            floor = rt.dispatcher.unsettled_floor(sid)
            if floor is None:
                continue
            durable = rt.progress[sid].ack_floor if sid in rt.progress else 0
            floors.append(min(floor, durable))
        return min(floors) if floors else None

    # ------------------------------------------------------------------ consumers
    async def dequeue(
        self,
        rt: GroupRuntime,
        consumer: str,
        visibility: float | None,
        wait: float | None,
        *,
        hold_slot: bool = True,
    ) -> Grant | None:
        """Lease the next available record; with ``wait``, block up to that many seconds for one.
        ``hold_slot=False`` (a remote caller): while it waits holding no lease, the consumer does not
        count against ``max_consumers`` (a peer's waiting calls cannot lock local consumers out)."""
        deadline = trio.current_time() + (wait or 0.0)
        while True:
            _check(rt)
            lease = rt.dispatcher.dequeue(consumer, visibility, self.now())
            if lease is not None:
                self._deadline_moved(rt)
                return lease
            if not hold_slot:
                self._unregister_idle(rt, consumer)
            if await self._feed_now(rt):
                continue
            if rt.unreadable:  # nothing to lease, and records wait that this daemon cannot open
                raise next(iter(rt.unreadable.values()))
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
            if q is not None and rt.cursors[sid] < held(self.engine, q)[1] and sid not in rt.unreadable:
                behind = True
                await rt.catch_up(sid, self._background)
        return behind

    def take(self, rt: GroupRuntime, consumer: str, visibility: float | None, n: int) -> list[Grant]:
        """Lease up to ``n`` available records at once (a subscription filling its window), never past the
        group's per-consumer cap; CapacityError only if the consumer cannot join the group."""
        _check(rt)
        leases: list[Grant] = []
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

    async def take_waiting(
        self, rt: GroupRuntime, consumer: str, visibility: float | None, n: int, wait: float | None
    ) -> list[Grant]:
        """:meth:`take`, blocking up to ``wait`` seconds while nothing is available (a remote
        subscription's long poll). While it waits holding no lease, the consumer is not registered (it
        does not count against ``max_consumers``)."""
        deadline = trio.current_time() + (wait or 0.0)
        while True:
            _check(rt)
            leases = self.take(rt, consumer, visibility, n)
            if leases or n <= 0:
                return leases
            self._unregister_idle(rt, consumer)
            if await self._feed_now(rt):
                continue
            if rt.unreadable:
                raise next(iter(rt.unreadable.values()))
            if not wait or trio.current_time() >= deadline:
                return []
            with trio.move_on_at(deadline):
                await rt.changed.wait()

    def _unregister_idle(self, rt: GroupRuntime, consumer: str) -> None:
        dispatcher = rt.dispatcher
        if dispatcher.has_consumer(consumer) and not dispatcher.in_flight(consumer):
            dispatcher.release_consumer(consumer, self.now())  # holds nothing: nothing to give back

    def detach(self, rt: GroupRuntime, consumer: str) -> None:
        """The consumer is not connected (a remote one between its calls, or a closed connection): its
        leases stay until acked, nacked or expired, and it is unregistered once they have ended."""
        dispatcher = rt.dispatcher
        if dispatcher.has_consumer(consumer):
            if dispatcher.in_flight(consumer):
                rt.detached.add(consumer)
            else:
                dispatcher.release_consumer(consumer, self.now())

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
        _check(rt)
        changes = rt.dispatcher.ack(token, self.now())
        rt.notify()  # a subscriber at its in-flight cap may take another
        self._sweep_detached(rt)
        return changes, self.committer.submit(rt, changes)

    async def ack(self, rt: GroupRuntime, token: str) -> Changes:
        changes, flight = self.ack_submit(rt, token)
        await flight.wait()
        return changes

    async def nack(self, rt: GroupRuntime, token: str, delay: float | None, reason: str = "") -> Changes:
        _check(rt)
        changes = rt.dispatcher.nack(token, delay, self.now(), reason)
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

    async def inspect(self, rt: GroupRuntime, queue: str, offset: int) -> TaskView:
        """One record as the group sees it (a done record rebuilt from the durable history after a
        restart gets its correlation id from the record, if the source still holds it)."""
        view = rt.dispatcher.inspect(queue, offset, self.now())
        if view.correlation_id:
            return view
        record = None
        q = rt.source_queue(queue)
        if q is not None:
            columns = await self.engine.read(q, offset, offset + 1, 1, CATCH_UP_BYTES)
            with contextlib.suppress(LatticedError):
                records = records_of(self.sealer.open_columns(q, columns))
                record = records[0][1] if records else None
        fallback = Record(b"") if record is None else record
        return replace(view, correlation_id=correlation_id(fallback, queue, offset))

    def extend(self, rt: GroupRuntime, token: str, visibility: float) -> Grant:
        _check(rt)
        return rt.dispatcher.extend(token, visibility, self.now())

    async def claim(
        self,
        rt: GroupRuntime,
        consumer: str,
        min_idle: float,
        count: int,
        visibility: float | None,
        *,
        holders: str | None = None,
    ) -> list[Grant]:
        """Take over leases idle at least ``min_idle`` seconds (see :meth:`Dispatcher.claim`; ``holders``:
        only those of consumers with that id prefix); replies once the attempts they cost are durable."""
        _check(rt)
        leases, changes = rt.dispatcher.claim(
            consumer, min_idle, count, visibility, self.now(), holders=holders
        )
        if changes:
            self._deadline_moved(rt)
            rt.notify()
            await self.committer.persist(rt, changes)
        return leases

    async def ack_up_to(
        self, rt: GroupRuntime, queue: str, up_to: int, *, holders: str | None = None
    ) -> Changes:
        """Settle ``queue`` below ``up_to`` (``holders``: a remote caller's consumer prefix, see
        :meth:`Dispatcher.ack_up_to`)."""
        _check(rt)
        owner, name = self.engine.parse_address(queue)
        changes = rt.dispatcher.ack_up_to(source_id(owner, name), up_to, self.now(), holders=holders)
        rt.notify()
        self._sweep_detached(rt)
        await self.committer.persist(rt, changes)
        return changes

    def connection_closed(self, consumer: str) -> None:
        """A client connection ended: forget it as a consumer, at once if it holds no leases."""
        for rt in self._groups.values():
            self.detach(rt, consumer)

    # ------------------------------------------------------------------ dead letters
    def dead_letters(self, rt: GroupRuntime, limit: int | None) -> list[DeadLetter]:
        return rt.dispatcher.dead_letters(limit)

    async def redrive(self, rt: GroupRuntime, offsets: list[int] | None) -> int:
        _check(rt)
        changes = rt.dispatcher.redrive(offsets, self.now())
        await self.committer.persist(rt, changes)
        rt.notify()
        return sum(len(op.progress.released) for op in changes.ops)

    async def purge(self, rt: GroupRuntime, offsets: list[int] | None) -> int:
        _check(rt)
        count = len(rt.dispatcher.dead_letters() if offsets is None else set(offsets))
        changes = rt.dispatcher.purge(offsets, self.now())
        await self.committer.persist(rt, changes)
        return count if changes else 0

    # ------------------------------------------------------------------ lifecycle of a group
    async def edit(
        self,
        rt: GroupRuntime,
        settings: Mapping[str, Any],
        extra_meta: Mapping[str, str | None] | None = None,
    ) -> GroupRuntime:
        """Change a running group's settings (not its name or sources); see
        :meth:`~latticed.leases.dispatch.Dispatcher.update_spec` for what happens to leases in flight. The
        new definition is signed into its log's metadata (replicas see it) before it applies here."""
        _check(rt)
        spec = replace(rt.spec, **settings)
        meta = spec_to_meta(spec)  # checks it
        compile_filter(spec.filter)
        await self.engine.set_meta(rt.q, {**(extra_meta or {}), **meta})
        rt.dispatcher.update_spec(spec)
        rt.spec = spec
        self._deadline_moved(rt)
        rt.notify()
        log_event(log, "group.edited", group=rt.name, changed=sorted(settings))
        return rt

    async def delete(self, rt: GroupRuntime) -> dict[str, int]:
        """Stop a group for good: its leases in flight become unknown (an ack of one fails as no such
        group), waiting consumers are told, its log keeps only a tombstone and its DLQ's dead letters
        are truncated away (on replicas too). Its sources are untouched; the name may be reused."""
        _check(rt)
        stats = rt.dispatcher.stats(self.now())
        self._groups.pop(rt.name, None)
        for sid in rt.sources:
            runtimes = self._by_source.get(sid, [])
            if rt in runtimes:
                runtimes.remove(rt)
        rt.deleted = True
        rt.notify()
        await self.committer.flush()  # what was queued for it lands first (then goes with the rest)
        engine = self.engine
        await engine.set_meta(rt.q, {DELETED_META_KEY: str(engine.clock())})
        await engine.truncate(rt.q, engine.state(rt.q).held_end)
        dead = engine.state(rt.dlq_q).held_end - engine.state(rt.dlq_q).start
        await engine.truncate(rt.dlq_q, engine.state(rt.dlq_q).held_end)
        log_event(log, "group.deleted", group=rt.name, leases=stats.leased, dead_letters=stats.dead)
        return {"leases_voided": stats.leased, "dead_letters_dropped": stats.dead, "dlq_records": dead}

    # ------------------------------------------------------------------ replicas
    async def replica_progress(self, address: str) -> tuple[QueueState, GroupSpec, dict[str, GroupProgress]]:
        """Any group log this daemon holds (its own or a replica): definition and folded progress."""
        q = self.engine.resolve(address, KIND_GROUP)
        state = self.engine.state(q)
        if DELETED_META_KEY in state.meta_dict:
            raise NotFoundError(f"group {self.engine.address(q)} was deleted")
        progress, _ = await self._fold(q)
        return state, spec_from_meta(state.meta_dict), progress


def _check(rt: GroupRuntime) -> None:
    if rt.deleted:
        raise NotFoundError(f"group {rt.name} was deleted")


__all__ = ["DELETED_META_KEY", "DLQ_META_KEY", "GroupService"]
