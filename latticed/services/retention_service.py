"""Retention as a daemon service: enforce owners' policies, replica caps, and KV expiry (see
:mod:`latticed.host.retention_policy` for the policy and its reserved metadata keys).

* **Our queues** with a policy are cut by signed truncations (``Engine.truncate``: the usual owner path,
  fenced like any write), so every replica follows.
* **Replicated queues** under a cap (``replica_max_bytes``, ``replica_queue_caps``) lose their oldest
  records here only (``Engine.drop_local``); what stays still verifies against the owner's signature.
* **When**: a change listener sees every commit and compares counters only (records held, and bytes as
  measured at the last check plus the records since at their average size), so no work is done per
  record; a queue found over a limit is checked on a reader thread and cut. A timer (``retention_interval_s``)
  checks ages, re-measures, and purges expired KV keys, in our namespace and in replicas alike, then lets
  our KV op log drop what no longer decides anything (:mod:`latticed.storage.kvcompact`), and runs one
  bounded step of expiring idle producers' rows (``expire_producers``, :mod:`latticed.produce.expiry`).
* **Our core-2 queues** follow the same policies through their own signed truncation, checked after
  their commits and at each round of the timer (:mod:`latticed.services.retention_core2`); replica caps
  do not apply to them.
* ``keep_unsettled``: the cut stops at the lowest offset some consumer group on this daemon has not
  settled (durably), as the journal seed prunes only below its ack floor.

A failed step (a full disk, a fenced write) is logged and tried again at the next check; bad input never
stops the service.

Why one module: it is one service loop: the three kinds of enforcement (owners' truncations, replica caps,
KV expiry) share the watch list, its wake-ups and the counters they report; the policy itself is pure and
lives in :mod:`latticed.host.retention_policy`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import trio

from latticed.crdt.head import KIND_KV, KIND_QUEUE
from latticed.crdt.queue import Meta, QueueState
from latticed.crdt.queue2 import QueueState2
from latticed.errors import LatticedError
from latticed.host.retention_policy import (
    NO_POLICY,
    ReplicaCaps,
    RetentionPolicy,
    keep_target,
    policy_from_meta,
)
from latticed.process.logs import get_logger, log_event
from latticed.process.ticks import sleep_until_tick
from latticed.services.retention_core2 import enforce_core2
from latticed.services.service_ports import RetentionStore
from latticed.storage import prune
from latticed.storage.corruption import CorruptQueueError
from latticed.storage.kvcompact import worth_compacting
from latticed.storage.wiring import ChangeFanout

log = get_logger(__name__)

#: Until a queue is first measured, its records are guessed at this many bytes each.
GUESS_RECORD_BYTES: Final = 256
#: KV compaction steps run per check at most (each is one bounded storage job).
KV_STEPS_PER_CHECK: Final = 64

#: The lowest offset of a queue (by ``OWNER/NAME``) some consumer group here has not settled, or None.
UnsettledFloor = Callable[[str], int | None]
#: One bounded step of expiring idle producers' rows; returns how many producers expired.
ExpireProducers = Callable[[], Awaitable[int]]


@dataclass(slots=True)
class _Watch:
    """What the service knows of one queue between checks."""

    q: int
    meta: Meta
    owned: bool
    policy: RetentionPolicy
    #: The byte limit in force here (the owner's, or this daemon's cap on a replica); None: none.
    max_bytes: int | None
    #: Bytes held at the last check, at which end, and bytes per record then.
    measured_bytes: int = 0
    measured_end: int = 0
    record_bytes: float = GUESS_RECORD_BYTES
    #: A check for this queue is queued or running.
    pending: bool = False
    #: Commits below this end trigger no check: the last one cut nothing although a limit was passed
    #: (groups hold the records), so the next looks after another step's worth of records.
    quiet_until: int = 0

    @property
    def active(self) -> bool:
        return self.max_bytes is not None or (self.owned and self.policy.limited)

    def over(self, state: QueueState) -> bool:
        """Whether the commit that produced ``state`` pushed the queue past a limit (counters only)."""
        if state.held_end < self.quiet_until:
            return False
        records = self.policy.max_records if self.owned else None
        if records is not None and state.held_end - state.start > records:
            return True
        if self.max_bytes is not None:
            estimate = self.measured_bytes + (state.held_end - self.measured_end) * self.record_bytes
            return estimate > self.max_bytes
        return False


@dataclass(slots=True)
class Counters:
    checks: int = 0
    truncations: int = 0
    records_truncated: int = 0
    bytes_truncated: int = 0
    local_drops: int = 0
    records_dropped_locally: int = 0
    bytes_dropped_locally: int = 0
    kv_keys_purged: int = 0
    kv_ops_compacted: int = 0
    producers_expired: int = 0
    failures: int = 0


@dataclass(slots=True)
class RetentionService:
    """Runs in the daemon's nursery (:func:`run_retention`); its methods run on the trio thread."""

    engine: RetentionStore
    caps: ReplicaCaps = field(default_factory=ReplicaCaps)
    interval_s: float = 10.0
    unsettled_floor: UnsettledFloor | None = None
    expire_producers: ExpireProducers | None = None
    counters: Counters = field(default_factory=Counters)
    _watches: dict[tuple[bytes, str], _Watch] = field(default_factory=dict)
    _dirty: list[int] = field(default_factory=list)
    #: Our limited core-2 queues that committed since their last check (checked by the worker).
    _dirty2: set[int] = field(default_factory=set)
    #: Our core-2 queues with a limit (a superset: one whose limit went stays until a commit says so),
    #: trusted by the timer only once it scanned every core-2 queue while hearing of their commits.
    _limited2: set[int] = field(default_factory=set)
    _hearing2: bool = False
    _scanned2: bool = False
    _wake: trio.Event = field(default_factory=trio.Event)
    #: Queues whose policy could not be read in full, with what was wrong (logged once per change).
    problems: dict[str, list[str]] = field(default_factory=dict)

    # ------------------------------------------------------------------ what applies where
    def policy(self, q: int) -> RetentionPolicy:
        return policy_from_meta(self.engine.state(q).meta_dict)[0]

    def cap(self, q: int) -> int | None:
        """The byte limit this daemon enforces on queue ``q`` (its owner's, or its replica cap here)."""
        state = self.engine.state(q)
        if state.kind != KIND_QUEUE:
            return None
        if state.owner == self.engine.public_key:
            return self.policy(q).max_bytes
        return self.caps.cap_for(f"{state.owner.hex()}/{state.name}")

    def _watch(self, state: QueueState) -> _Watch | None:
        key = (state.owner, state.name)
        watch = self._watches.get(key)
        if watch is not None and watch.meta is state.meta:
            return watch
        q = self.engine.find(state.owner, state.name, state.kind)
        if q is None:
            return None
        owned = state.owner == self.engine.public_key
        policy, problems = policy_from_meta(state.meta_dict)
        address = f"{state.owner.hex()}/{state.name}"
        if problems and self.problems.get(address) != problems:
            log_event(log, "retention.bad_policy", level=logging.WARNING, queue=address, problems=problems)
        if problems:
            self.problems[address] = problems
        else:
            self.problems.pop(address, None)
        max_bytes = policy.max_bytes if owned else self.caps.cap_for(address)
        fresh = _Watch(q, state.meta, owned, policy, max_bytes, measured_end=state.start)
        if watch is not None:
            fresh.measured_bytes, fresh.measured_end = watch.measured_bytes, watch.measured_end
            fresh.record_bytes = watch.record_bytes
        self._watches[key] = fresh
        if fresh.active and (watch is None or watch.policy != policy or watch.max_bytes != max_bytes):
            self._mark(fresh)  # a new queue or a new policy: look at once
        return fresh

    # ------------------------------------------------------------------ triggers
    def on_change(self, state: QueueState) -> None:
        """Engine listener (trio thread, after each commit): cheap counter checks only."""
        if state.kind != KIND_QUEUE or state.head is None:
            return
        watch = self._watch(state)
        if watch is not None and watch.active and not watch.pending and watch.over(state):
            self._mark(watch)

    def on_change2(self, q: int, state: QueueState2 | None) -> None:
        """Core-2 engine listener: one of our queues with a limit that committed is checked soon (one
        check per queue at a time; the plan reads the segments, so not more often than the worker runs)."""
        if state is None or state.kind != KIND_QUEUE:
            self._limited2.discard(q)
            return
        if state.forked or q in self._dirty2:  # marked: in the set already
            return
        if self.engine.core2.owned(q) and policy_from_meta(dict(state.meta))[0].limited:
            self._limited2.add(q)
            self._dirty2.add(q)
            self._wake.set()
        else:
            self._limited2.discard(q)

    def _mark(self, watch: _Watch) -> None:
        if not watch.pending:
            watch.pending = True
            self._dirty.append(watch.q)
            self._wake.set()

    def check_all(self) -> None:
        """Queue a check of every queue under a limit (the timer; also after start-up)."""
        for q in self.engine.queues(KIND_QUEUE):
            watch = self._watch(self.engine.state(q))
            if watch is not None and watch.active:
                self._mark(watch)

    # ------------------------------------------------------------------ running
    async def run(
        self,
        changes: ChangeFanout,
        *,
        task_status: trio.TaskStatus[RetentionService] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Until cancelled; hears of every commit through ``changes`` (a limit crossed is cut at once)."""
        with changes.subscribed(self.on_change), self.engine.core2.subscribed(self.on_change2):
            self._hearing2, self._scanned2 = True, False
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._worker)
                nursery.start_soon(self._timer)
                log_event(
                    log,
                    "retention.started",
                    interval_s=self.interval_s,
                    replica_max_bytes=self.caps.default,
                    replica_queue_caps=len(self.caps.patterns),
                )
                task_status.started(self)

    async def _timer(self) -> None:
        while True:
            await self.upkeep()
            await sleep_until_tick(self.interval_s)  # with the daemon's other periodic jobs

    async def upkeep(self) -> None:
        """One round of the timer: check every limited queue, purge KV, expire idle producers (a step)."""
        self.check_all()
        await self.enforce_core2()
        for event, step in (
            ("retention.kv_purge_failed", self.purge_kv),
            ("retention.producer_expiry_failed", self.expire_idle_producers),
        ):
            try:
                await step()
            except Exception as exc:  # as in enforce: logged, and tried again at the next round
                self.counters.failures += 1
                expected = isinstance(exc, LatticedError)
                log_event(
                    log,
                    event,
                    level=logging.WARNING if expected else logging.ERROR,
                    exc_info=False if expected else exc,
                    error=str(exc),
                )

    async def expire_idle_producers(self) -> int:
        """One bounded step of expiring idle producers' rows (none without ``expire_producers``)."""
        if self.expire_producers is None:
            return 0
        expired = await self.expire_producers()
        self.counters.producers_expired += expired
        if expired:
            log_event(log, "retention.producers_expired", level=logging.DEBUG, producers=expired)
        return expired

    async def _worker(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            dirty, self._dirty = self._dirty, []
            for q in dirty:
                await self.enforce(q)
            dirty2, self._dirty2 = self._dirty2, set()
            for q in sorted(dirty2):
                await self.enforce_core2_queue(q)

    def _failed(self, address: str, exc: Exception) -> None:
        """Count and log a failed check; a :class:`LatticedError` is expected (a full disk, a fence)
        and logged without its traceback."""
        self.counters.failures += 1
        expected = isinstance(exc, LatticedError)
        log_event(
            log,
            "retention.failed",
            level=logging.WARNING if expected else logging.ERROR,
            exc_info=False if expected else exc,
            queue=address,
            error=str(exc),
            hint="tried again at the next check",
        )

    async def enforce(self, q: int) -> int:
        """Check queue ``q`` now and cut what its limits ask for; returns the records dropped."""
        if self.engine.core2.holds(q):  # moved to core 2 since it was marked: enforce_core2 checks it
            return 0
        state = self.engine.state(q)
        watch = self._watch(state)
        if watch is None:
            return 0
        try:
            dropped = await self._enforce(q, watch)
        except Exception as exc:  # a full disk, a fenced write, or a bug: never the daemon's end
            self._failed(self.engine.address(q), exc)
            # Not again at once: at the timer's next round, or after another step's worth of records.
            watch.quiet_until = self.engine.state(q).held_end + self._step_records(watch)
            return 0
        finally:
            watch.pending = False
        if watch.active and watch.over(self.engine.state(q)):
            self._mark(watch)  # commits that came while it ran pushed it over again
        return dropped

    async def enforce_core2(self) -> int:
        """Check every core-2 queue of ours with a policy and truncate what it asks for (a failure is
        logged per queue, as in :meth:`enforce`); returns the records dropped.

        Every core-2 queue is looked at the first time only: while the service hears of core 2's
        commits, the queues with a limit are known (:meth:`on_change2`), and a daemon of tens of
        thousands of queues, few of them limited, is not scanned whole every round."""
        total = 0
        if self._hearing2 and self._scanned2:
            for q in sorted(self._limited2):
                total += await self.enforce_core2_queue(q)
            return total
        for q in self.engine.core2.queues(KIND_QUEUE):
            total += await self.enforce_core2_queue(q)
        self._scanned2 = self._hearing2
        return total

    async def enforce_core2_queue(self, q: int) -> int:
        """Check our core-2 queue ``q`` against its policy and truncate what it asks for (a failure is
        logged, and tried again later); returns the records dropped."""
        core2 = self.engine.core2
        if not core2.holds(q):  # dropped since it was noted
            self._limited2.discard(q)
            return 0
        before = core2.loaded(q)
        try:
            cut = await enforce_core2(self.engine, core2, q, self.unsettled_floor)
        except CorruptQueueError:
            # Logged once by the store when found (store.queue_corrupt) and named by doctor: not a
            # failure of this pass, and nothing to cut until it is dropped and sent again whole (a
            # commit, which brings it back here through on_change2).
            self._limited2.discard(q)
            return 0
        except Exception as exc:  # a full disk, a fenced write, or a bug: never the daemon's end
            self._limited2.add(q)  # not known to be unlimited: checked again at the next round
            self._failed(core2.address(q), exc)
            return 0
        if cut is None:
            # Not ours, no limit, or frozen: left out of the rounds until a commit brings it back,
            # unless a commit came while its value loaded (then it stays until the next round).
            if not core2.owned(q) or (before is not None and core2.loaded(q) is before):
                self._limited2.discard(q)
            return 0
        self._limited2.add(q)
        self.counters.checks += 1
        if cut.dropped:
            self.counters.truncations += 1
            self.counters.records_truncated += cut.dropped
            self.counters.bytes_truncated += cut.freed
            log_event(
                log,
                "retention.truncated",
                level=logging.DEBUG,
                queue=core2.address(q),
                reason=cut.reason,
                start=cut.start,
                dropped=cut.dropped,
            )
        return cut.dropped

    async def _enforce(self, q: int, watch: _Watch) -> int:
        engine = self.engine
        state = engine.state(q)
        if not watch.active or state.head is None:
            return 0
        self.counters.checks += 1
        policy = watch.policy if watch.owned else NO_POLICY
        cutoff = None
        if policy.max_age_ms is not None:
            cutoff = engine.clock() - policy.max_age_ms
        start, end = state.start, state.held_end
        plan = await engine.inspect(
            lambda reader: prune.plan(
                reader.conn,
                q,
                start,
                end,
                max_bytes=watch.max_bytes,
                max_records=policy.max_records,
                cutoff_ms=cutoff,
            )
        )
        cut = plan.cut
        if cut is not None and watch.policy.keep_unsettled and self.unsettled_floor is not None:
            floor = self.unsettled_floor(engine.address(q))
            if floor is not None and floor < cut:
                log_event(
                    log, "retention.held_by_groups", level=logging.DEBUG, queue=engine.address(q), floor=floor
                )
                cut = floor if floor > start else None
        held_records = end - (cut or start)
        watch.measured_end = end
        watch.measured_bytes = plan.held_bytes if cut == plan.cut else self._scaled(plan, start, end, cut)
        if held_records > 0 and watch.measured_bytes > 0:
            watch.record_bytes = watch.measured_bytes / held_records
        if cut is None or cut <= start:
            if plan.cut is not None:
                watch.quiet_until = end + self._step_records(watch)
            return 0
        watch.quiet_until = 0
        upto: int = cut
        freed = await engine.inspect(lambda reader: prune.bytes_between(reader.conn, q, start, upto))
        if watch.owned:
            await engine.truncate(q, cut)
            dropped = max(min(engine.state(q).start, end) - start, 0)
            self.counters.truncations += 1
            self.counters.records_truncated += dropped
            self.counters.bytes_truncated += freed if dropped else 0
            event = "retention.truncated"
        else:
            await engine.drop_local(q, cut)
            dropped = max(engine.state(q).start - start, 0)
            self.counters.local_drops += 1
            self.counters.records_dropped_locally += dropped
            self.counters.bytes_dropped_locally += freed if dropped else 0
            event = "retention.dropped_locally"
        log_event(
            log,
            event,
            level=logging.DEBUG,
            queue=engine.address(q),
            reason=plan.reason,
            start=engine.state(q).start,
            dropped=dropped,
            held_bytes=watch.measured_bytes,
        )
        return dropped

    @staticmethod
    def _step_records(watch: _Watch) -> int:
        """About how many records make one step of a limit (the share a cut leaves free)."""
        steps = []
        if watch.owned and watch.policy.max_records is not None:
            steps.append(watch.policy.max_records - keep_target(watch.policy.max_records))
        if watch.max_bytes is not None:
            steps.append(int((watch.max_bytes - keep_target(watch.max_bytes)) / max(watch.record_bytes, 1.0)))
        return max(min(steps, default=1), 1)

    @staticmethod
    def _scaled(plan: prune.Plan, start: int, end: int, cut: int | None) -> int:
        """Bytes held when the groups stopped the cut short of the plan's: scaled by records."""
        if plan.held_records <= 0:
            return plan.held_bytes
        held = end - (cut if cut is not None else start)
        return int(plan.held_bytes * held / plan.held_records)

    # ------------------------------------------------------------------ KV
    async def purge_kv(self) -> int:
        """Delete expired keys from every KV view here (ours and replicas'), then let our op log drop the
        ops that decide nothing any more; returns the keys purged."""
        engine = self.engine
        purged = 0
        for ns in engine.queues(KIND_KV):
            now = engine.clock()
            try:
                count = await engine.purge_expired_kv(ns, now)
            except LatticedError as exc:
                self.counters.failures += 1
                log_event(log, "retention.kv_purge_failed", level=logging.WARNING, error=str(exc))
                continue
            purged += count
            if count:
                log_event(
                    log, "retention.kv_purged", level=logging.DEBUG, namespace=engine.address(ns), keys=count
                )
            if count and engine.owned(ns):
                await self._compact_kv(ns)  # else the writer's own upkeep keeps the log in check
        self.counters.kv_keys_purged += purged
        return purged

    async def _compact_kv(self, ns: int) -> None:
        engine = self.engine
        for _ in range(KV_STEPS_PER_CHECK):
            state = engine.state(ns)
            keys: int = await engine.inspect(
                lambda reader: int(
                    reader.conn.execute("SELECT count(*) FROM kv WHERE ns = ?", (ns,)).fetchone()[0]
                )
            )
            if not worth_compacting(state.held_end - state.start, keys):
                return
            try:
                dropped = await engine.compact_kv_step(ns)
            except LatticedError as exc:
                self.counters.failures += 1
                log_event(log, "retention.kv_compaction_failed", level=logging.WARNING, error=str(exc))
                return
            self.counters.kv_ops_compacted += dropped

    def counters_dict(self) -> dict[str, int]:
        return {name: getattr(self.counters, name) for name in Counters.__dataclass_fields__}


async def run_retention(
    engine: RetentionStore,
    changes: ChangeFanout,
    caps: ReplicaCaps,
    interval_s: float,
    unsettled_floor: UnsettledFloor | None = None,
    *,
    expire_producers: ExpireProducers | None = None,
    task_status: trio.TaskStatus[RetentionService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the retention service until cancelled (started: the service, for status and the API)."""
    service = RetentionService(engine, caps, interval_s, unsettled_floor, expire_producers)
    await service.run(changes, task_status=task_status)


__all__ = ["Counters", "ExpireProducers", "RetentionService", "UnsettledFloor", "run_retention"]
