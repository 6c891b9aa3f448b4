"""The sans-IO dispatcher of one consumer group: leases, retries and dead letters.

Lockd's dispatcher without storage or clocks: every call takes ``now`` (epoch seconds; it ends up in
durable dead-letter timestamps, so pass a wall clock) and nothing here blocks, sleeps or reads a disk.
The daemon's trio layer owns the I/O:

* it offers records as they append or replicate in (:meth:`Dispatcher.offer_candidates`), in increasing
  offset order per source; a jump means the records between were truncated before we saw them;
* it persists every :class:`Changes` *before* it replies (dead letters appended to the DLQ queue, then
  ``ops`` to the group log, in one transaction: a crash in between then duplicates a dead letter at worst,
  never loses one), and may coalesce many calls' ops into one group commit;
* it re-offers the DLQ records it appended (the DLQ is a source of the group whose records stay parked
  until redriven), and wakes at :meth:`Dispatcher.next_deadline` to call :meth:`Dispatcher.expire`.

Leases are local and not replicated (as in DQueue and SQS); after a crash :meth:`Dispatcher.recover`
redelivers every unsettled record. Failed attempts are counted (durably) when an attempt fails (nack,
lease expiry, consumer gone), not when it starts: the happy path costs one op per record, and a daemon
crash is not held against the record.

Every hot operation is O(log n): heaps with lazy deletion for ready records (by arrival order, which is
offset order within a source), retry timers, lease expiries and each source's lowest unsettled offset.

Why one module: the :class:`Dispatcher` is one state machine: every operation updates the same task table,
heaps and counters, and its invariants (each unsettled record in exactly one state, the heaps lazily
consistent with it) can only be checked with all of it in view. What it hands back is
:mod:`latticed.leases.outcomes`.
"""

from __future__ import annotations

import heapq
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import replace

from latticed.crdt.attempts import (
    ACKED,
    MAX_CONSUMER_BYTES,
    MAX_ERROR_CHARS,
    MAX_HISTORY,
    AttemptEntry,
    AttemptRecord,
    DeadLetterInfo,
    correlation_id,
    dead_letter_record,
    parse_dead_letter,
)
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.group import EMPTY, GroupProgress, ProgressOp, dlq_name, source_id
from latticed.crdt.group_spec import GroupSpec
from latticed.crdt.records import Record
from latticed.errors import CapacityError, LeaseError, NotAllowedError, NotFoundError
from latticed.leases.filters import compile_filter
from latticed.leases.outcomes import (
    NO_CHANGES,
    Changes,
    DeadLetter,
    Done,
    Failure,
    Grant,
    GroupStats,
    TaskView,
)

#: Done records kept for inspection are capped whatever the retention, to bound memory.
MAX_RETAINED_DONE = 100_000
#: Recently ended lease tokens remembered to say *why* a token is stale.
_ENDED_TOKENS = 4096


# Task states (plain strings: they key the hot-path counters, and an Enum's hash is Python-level).
AVAILABLE = "available"
LEASED = "leased"
FAILED = "failed"  # nacked or expired, waiting for its retry time
DEAD = "dead"  # a dead letter in the DLQ, waiting for redrive or purge
SETTLED = "settled"  # done, dead-lettered or purged: no longer held (marks heap entries stale)
STATES = (AVAILABLE, LEASED, FAILED, DEAD, SETTLED)


# ---------------------------------------------------------------------------------------------- internal


class _Task:
    __slots__ = (
        "attempts",
        "correlation",
        "history",
        "lease",
        "offset",
        "origin",
        "ready_at",
        "record",
        "seq",
        "source",
        "state",
    )

    def __init__(self, source: _Source, offset: int, seq: int, record: Record, attempts: int):
        self.source = source
        self.offset = offset
        self.seq = seq
        self.record = record
        self.attempts = attempts
        self.state: str = AVAILABLE
        self.lease: Grant | None = None
        self.ready_at = 0.0
        self.history: list[AttemptRecord] = []
        self.correlation: str | None = None
        self.origin: DeadLetterInfo | None = None

    def __lt__(self, other: _Task) -> bool:  # heap tie-break insurance; seqs are unique
        return self.seq < other.seq

    @property
    def correlation_id(self) -> str:
        if self.correlation is None:
            self.correlation = correlation_id(self.record, self.source.id, self.offset)
        return self.correlation


class _Source:
    __slots__ = (
        "floor_sent",
        "hint",
        "hint_attempts",
        "hint_history",
        "id",
        "is_dlq",
        "next_offset",
        "offsets",
        "tasks",
    )

    def __init__(self, sid: str, is_dlq: bool, hint: GroupProgress):
        self.id = sid
        self.is_dlq = is_dlq
        self.hint = hint  # durable progress at start-up: settles offsets we have not seen yet
        self.hint_attempts = hint.attempts_map()
        #: Durable attempt history of unsettled records, taken by each as it is offered.
        self.hint_history: dict[int, list[AttemptRecord]] = {}
        self.tasks: dict[int, _Task] = {}  # every unsettled member we hold
        self.offsets: list[int] = []  # heap of member offsets; settled ones are dropped lazily
        self.next_offset = hint.ack_floor
        self.floor_sent = hint.ack_floor

    def floor(self) -> int:
        """Lowest unsettled member offset, else everything seen is settled (or not a member)."""
        heap, tasks = self.offsets, self.tasks
        while heap and heap[0] not in tasks:
            heapq.heappop(heap)
        return heap[0] if heap else self.next_offset


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _order(attempt: AttemptRecord) -> tuple[int, int]:
    return attempt.ended_at_ms, attempt.number


def _seconds(value: float | None, what: str, *, positive: bool) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise MalformedError(f"{what} is a finite number of seconds")
    if value < 0 or (positive and value == 0):
        raise MalformedError(f"{what} must be {'positive' if positive else 'non-negative'}")
    return float(value)


# -------------------------------------------------------------------------------------------- dispatcher


class Dispatcher:
    """The in-memory state of one group on the daemon that runs it (see the module docstring)."""

    def __init__(
        self,
        spec: GroupSpec,
        owner: bytes,
        *,
        progress: Mapping[str, GroupProgress] | None = None,
        token_prefix: str | None = None,
        history: Iterable[AttemptEntry] = (),
    ):
        spec.check()
        self.spec = spec
        self.dlq = source_id(owner, dlq_name(spec.name))
        self._match = compile_filter(spec.filter)
        progress = progress or {}
        self._sources = {sid: _Source(sid, False, progress.get(sid, EMPTY)) for sid in spec.sources}
        self._sources[self.dlq] = _Source(self.dlq, True, progress.get(self.dlq, EMPTY))
        # Tokens are <prefix>.<counter>: unique within this process, and the random prefix makes tokens
        # from before a restart unknown (so refused) rather than aliases of new leases.
        self._prefix = secrets.token_hex(6) if token_prefix is None else token_prefix
        self._counter = 0
        self._seq = 0
        self._ready: list[tuple[int, _Task]] = []
        self._retry: list[tuple[float, int, _Task]] = []
        self._expiry: list[tuple[float, int, Grant]] = []
        self._leases: dict[str, _Task] = {}
        self._consumers: dict[str, set[str]] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._done: deque[tuple[float, Done]] = deque()
        self._done_index: dict[tuple[str, int], tuple[float, Done]] = {}
        #: Parked or redriven dead letters by where they came from (``inspect`` of a dead record).
        self._dead_by_origin: dict[tuple[str, int], int] = {}
        self._counts = dict.fromkeys(STATES, 0)
        self._load_history(history)

    @classmethod
    def recover(
        cls,
        spec: GroupSpec,
        owner: bytes,
        progress: Mapping[str, GroupProgress],
        source_records: Mapping[str, Iterable[tuple[int, Record]]],
        *,
        token_prefix: str | None = None,
        history: Iterable[AttemptEntry] = (),
    ) -> Dispatcher:
        """Rebuild after a restart from the durable progress (folded group log) and the records each
        source (and the DLQ) still holds from its floor on: settled records stay settled, everything else
        is available again at once (leases and retry timers were local), failed-attempt counts kept.
        ``history`` (the group log's attempt history) gives pending records their past attempts back, and
        done ones their history for the retention period."""
        dispatcher = cls(spec, owner, progress=progress, token_prefix=token_prefix, history=history)
        for source, records in source_records.items():
            dispatcher.offer_candidates(source, records)
        return dispatcher

    def _load_history(self, history: Iterable[AttemptEntry]) -> None:
        """Sort the durable history: pending records' attempts wait for them to be offered; done records'
        go to the retained done set (pruned to the retention period on the next call with a time)."""
        done: list[tuple[float, Done]] = []
        by_record: dict[tuple[str, int], list[AttemptRecord]] = {}
        for entry in history:
            if entry.source in self._sources:
                by_record.setdefault((entry.source, entry.offset), []).append(entry.attempt)
        for (sid, offset), attempts in by_record.items():
            src = self._sources[sid]
            unique = sorted({(a.number, a.ended_at_ms, a.outcome): a for a in attempts}.values(), key=_order)
            if not src.hint.is_settled(offset):
                src.hint_history[offset] = unique[-MAX_HISTORY:]
            elif unique[-1].outcome == ACKED and self.spec.retention_s > 0:
                last = unique[-1]
                done.append((last.ended_at_ms / 1000, Done(sid, offset, last.number, "", tuple(unique))))
        done.sort(key=lambda item: item[0])
        for kept in done[-MAX_RETAINED_DONE:]:
            self._done.append(kept)
            self._done_index[(kept[1].queue, kept[1].offset)] = kept

    # ------------------------------------------------------------------ intake
    def _source(self, queue: str) -> _Source:
        src = self._sources.get(queue)
        if src is None:
            raise NotFoundError(f"queue {queue} is not a source of group {self.spec.name}")
        return src

    def unsettled_floor(self, queue: str) -> int | None:
        """The lowest offset of ``queue`` this group may still deliver (everything below is settled, as
        far as this process knows); None if the queue is not one of its sources."""
        src = self._sources.get(queue)
        return None if src is None else src.floor()

    def offer_candidates(self, queue: str, records: Iterable[tuple[int, Record]]) -> Changes:
        """Take in records appended to (or replicated into) a source: members become available.

        Offsets already seen are ignored, so re-offering is harmless. Returns an op raising the floor when
        it moved past non-members (so the durable floor does not lag behind filtered-out records)."""
        src = self._source(queue)
        match, hint, ready = self._match, src.hint, self._ready
        for offset, record in records:
            if offset < src.next_offset:
                continue
            src.next_offset = offset + 1
            if offset < hint.ack_floor or offset in hint.acked or offset in hint.dead:
                continue
            origin = None
            if src.is_dlq:
                origin = parse_dead_letter(record)
            elif not match(record):
                continue
            self._seq += 1
            task = _Task(src, offset, self._seq, record, src.hint_attempts.get(offset, 0))
            task.origin = origin
            if src.hint_history:
                task.history = src.hint_history.pop(offset, [])
            if origin is not None:
                self._dead_by_origin[(origin.source, origin.offset)] = offset
            src.tasks[offset] = task
            heapq.heappush(src.offsets, offset)
            if src.is_dlq and offset not in hint.released:
                task.state = DEAD
            else:
                heapq.heappush(ready, (task.seq, task))
            self._counts[task.state] += 1
        floor = src.floor()
        if floor > src.floor_sent:
            src.floor_sent = floor
            return Changes(ops=(ProgressOp(src.id, GroupProgress(floor)),))
        return NO_CHANGES

    # ------------------------------------------------------------------ consumers
    def dequeue(self, consumer: str, visibility_s: float | None, now: float) -> Grant | None:
        """Lease the oldest available record whose retry time has come, or None if there is none.

        Raises :class:`CapacityError` past the group's consumer cap or this consumer's in-flight cap. A
        consumer is registered by its first dequeue and leaves with :meth:`release_consumer`."""
        visibility = self._visibility(visibility_s)
        tokens = self._join(consumer)
        spec = self.spec
        if spec.max_in_flight and len(tokens) >= spec.max_in_flight:
            raise CapacityError(f"consumer {consumer} already holds {spec.max_in_flight} leases (the cap)")
        self._promote(now)
        ready = self._ready
        while ready:
            _, task = heapq.heappop(ready)
            if task.state == AVAILABLE:
                break
        else:
            return None
        return self._grant(task, consumer, tokens, visibility, now)

    def claim(
        self,
        consumer: str,
        min_idle_s: float,
        count: int,
        visibility_s: float | None,
        now: float,
        *,
        holders: str | None = None,
    ) -> tuple[list[Grant], Changes]:
        """Take over leases whose holders have been idle at least ``min_idle_s`` (since they leased or
        last extended them), the longest idle first, at most ``count`` (Redis's XAUTOCLAIM). Each one's
        attempt ends as failed ("claimed", counted like an expiry); unless that was its last attempt (then
        it is dead-lettered), the record is leased to ``consumer`` at once, as its next attempt.
        ``holders``: only leases of consumers whose ids start with it (a remote daemon's own workers)."""
        min_idle = _seconds(min_idle_s, "min idle", positive=False)
        if type(count) is not int or count < 1:
            raise MalformedError("claim takes a count of at least 1")
        visibility = self._visibility(visibility_s)
        tokens = self._join(consumer)
        spec = self.spec
        if spec.max_in_flight:
            count = min(count, spec.max_in_flight - len(tokens))
            if count <= 0:
                raise CapacityError(
                    f"consumer {consumer} already holds {spec.max_in_flight} leases (the cap)"
                )
        idle = sorted(
            (lease.active_at or lease.leased_at, lease.token)
            for task in self._leases.values()
            if (lease := task.lease) is not None
            and lease.consumer != consumer
            and (holders is None or lease.consumer.startswith(holders))
            and now - (lease.active_at or lease.leased_at) >= min_idle
        )[:count]
        pairs = []
        for _, token in idle:
            task = self._leases[token]
            assert task.lease is not None
            pairs.append((task, task.lease))
        if not pairs:
            return [], NO_CHANGES
        changes = self._fail_all(pairs, "claimed", 0.0, now, f"claimed by {consumer}"[:MAX_ERROR_CHARS])
        grants = [
            self._grant(task, consumer, tokens, visibility, now)
            for task, _ in pairs
            if task.state == AVAILABLE
        ]
        return grants, changes

    def _visibility(self, visibility_s: float | None) -> float:
        if visibility_s is None:
            return self.spec.visibility_s
        return _seconds(visibility_s, "visibility", positive=True)

    def _join(self, consumer: str) -> set[str]:
        """The consumer's lease tokens, registering it (within the group's consumer cap) if new."""
        if not isinstance(consumer, str) or not consumer or len(consumer.encode()) > MAX_CONSUMER_BYTES:
            raise MalformedError(f"a consumer id is text of 1-{MAX_CONSUMER_BYTES} bytes")
        tokens = self._consumers.get(consumer)
        if tokens is None:
            spec = self.spec
            if spec.max_consumers and len(self._consumers) >= spec.max_consumers:
                raise CapacityError(f"group {spec.name} has its maximum of {spec.max_consumers} consumers")
            tokens = self._consumers[consumer] = set()
        return tokens

    def _grant(self, task: _Task, consumer: str, tokens: set[str], visibility: float, now: float) -> Grant:
        self._counter += 1
        token = f"{self._prefix}.{self._counter:x}"
        lease = Grant(
            token,
            task.source.id,
            task.offset,
            task.attempts + 1,
            consumer,
            task.correlation_id,
            task.record,
            now,
            now + visibility,
            now,
        )
        self._set_state(task, LEASED)
        task.lease = lease
        self._leases[token] = task
        tokens.add(token)
        heapq.heappush(self._expiry, (lease.expires_at, self._counter, lease))
        return lease

    def _live(self, token: str, now: float) -> tuple[_Task, Grant]:
        if not isinstance(token, str):
            raise LeaseError(f"a lease token is text, not {type(token).__name__}")
        task = self._leases.get(token)
        if task is None or task.lease is None:
            why = self._ended.get(token)
            if why is None:
                raise LeaseError(f"unknown lease token {token!r} (from before a restart, or never issued)")
            raise LeaseError(f"stale lease token {token!r}: {why}")
        lease = task.lease
        if now >= lease.expires_at:
            raise LeaseError(
                f"lease {token!r} expired at {lease.expires_at:.3f} (now {now:.3f}); the lease has ended"
            )
        return task, lease

    def _end_lease(self, task: _Task, lease: Grant, why: str) -> None:
        del self._leases[lease.token]
        task.lease = None
        tokens = self._consumers.get(lease.consumer)
        if tokens is not None:
            tokens.discard(lease.token)
        ended = self._ended
        ended[lease.token] = why
        if len(ended) > _ENDED_TOKENS:
            ended.popitem(last=False)

    def ack(self, token: str, now: float) -> Changes:
        """Settle a leased record as done."""
        task, lease = self._live(token, now)
        self._end_lease(task, lease, "the record was already acked")
        ended = AttemptRecord(lease.attempt, lease.consumer, _ms(lease.leased_at), _ms(now), ACKED)
        done = self._settle_done(task, lease.attempt, now, ended)
        return Changes(
            ops=(self._op(task.source, acked=(task.offset,)),),
            done=(done,),
            attempts=(AttemptEntry(task.source.id, task.offset, ended),),
        )

    def nack(self, token: str, delay_s: float | None, now: float, reason: str = "") -> Changes:
        """Give a leased record back: retry after ``delay_s`` (None: exponential backoff), or dead-letter
        it if this was its last attempt. ``reason`` (the consumer's error text) goes into its history."""
        delay = None if delay_s is None else _seconds(delay_s, "nack delay", positive=False)
        if not isinstance(reason, str) or len(reason) > MAX_ERROR_CHARS:
            raise MalformedError(f"a nack reason is text of at most {MAX_ERROR_CHARS} characters")
        task, lease = self._live(token, now)
        return self._fail_all([(task, lease)], "nack", delay, now, reason)

    def extend(self, token: str, visibility_s: float, now: float) -> Grant:
        """Keep a lease for ``visibility_s`` from now; returns the lease with its new deadline."""
        visibility = _seconds(visibility_s, "visibility", positive=True)
        task, lease = self._live(token, now)
        new = Grant(
            lease.token,
            lease.queue,
            lease.offset,
            lease.attempt,
            lease.consumer,
            lease.correlation_id,
            lease.record,
            lease.leased_at,
            now + visibility,
            now,
        )
        task.lease = new
        self._counter += 1
        heapq.heappush(self._expiry, (new.expires_at, self._counter, new))
        return new

    def release_consumer(self, consumer: str, now: float, delay_s: float | None = None) -> Changes:
        """A consumer went away: nack every lease it holds (each counts as a failed attempt, so a record
        that crashes its consumers still reaches the DLQ) and unregister it."""
        tokens = self._consumers.pop(consumer, None)
        if not tokens:
            return NO_CHANGES
        pairs = []
        for token in sorted(tokens, key=lambda t: self._leases[t].seq):
            task = self._leases[token]
            assert task.lease is not None
            pairs.append((task, task.lease))
        return self._fail_all(pairs, "released", delay_s, now)

    def update_spec(self, spec: GroupSpec) -> None:
        """An edited definition (same name and sources): it applies from now on. Leases in flight keep
        their deadlines, scheduled retries their times, records already taken in stay even if the new
        filter would not take them (and records skipped before are not taken in); new failures count
        against the new ``max_attempts`` and wait the new backoff, new leases get the new visibility, and
        the caps apply to the next lease (consumers and leases over a lowered cap are not cut off)."""
        spec.check()
        if spec.name != self.spec.name or spec.sources != self.spec.sources:
            raise MalformedError("a group's name and sources cannot be edited (create another group)")
        match = compile_filter(spec.filter)
        self.spec, self._match = spec, match

    def in_flight(self, consumer: str) -> int:
        """How many leases ``consumer`` holds (0 if it is not registered)."""
        tokens = self._consumers.get(consumer)
        return len(tokens) if tokens else 0

    def has_consumer(self, consumer: str) -> bool:
        return consumer in self._consumers

    def consumers(self) -> list[str]:
        """The registered consumers."""
        return list(self._consumers)

    def lease_record(self, token: str) -> tuple[str, Record] | None:
        """The source and record of a live lease (None: no such live lease)."""
        task = self._leases.get(token) if isinstance(token, str) else None
        return (task.source.id, task.record) if task is not None else None

    def holder(self, token: str) -> str | None:
        """The consumer a live lease was granted to (None: no such live lease)."""
        task = self._leases.get(token) if isinstance(token, str) else None
        return task.lease.consumer if task is not None and task.lease is not None else None

    def promote(self, now: float) -> None:
        """Make failed records whose retry time has come available (dequeue does this lazily; the
        daemon's timer calls it so :meth:`next_deadline` moves on and waiting consumers can be woken)."""
        self._promote(now)

    def expire(self, now: float) -> Changes:
        """End every lease whose deadline has passed: each counts as a failed attempt."""
        expiry, pairs = self._expiry, []
        while expiry and expiry[0][0] <= now:
            _, _, lease = heapq.heappop(expiry)
            task = self._leases.get(lease.token)
            if task is not None and task.lease is lease:
                pairs.append((task, lease))
        self._prune_done(now)
        if not pairs:
            return NO_CHANGES
        return self._fail_all(pairs, "expired", None, now)

    def ack_up_to(self, queue: str, up_to: int, now: float, *, holders: str | None = None) -> Changes:
        """Settle every record of ``queue`` below ``up_to`` at once, leased or not (their leases become
        stale); on the DLQ this purges. ``up_to`` may not pass what the group has seen of the queue.

        ``holders`` (a remote daemon's consumer prefix): only if every unsettled record below ``up_to``
        is leased to a consumer whose id starts with it, else nothing is settled (NotAllowedError); never
        on the DLQ. So a peer settles only what its own workers hold."""
        src = self._source(queue)
        if type(up_to) is not int or up_to < 0:
            raise MalformedError("ack_up_to takes an offset")
        if up_to > src.next_offset:
            raise MalformedError(f"ack_up_to({up_to}) is past the end the group has seen ({src.next_offset})")
        if holders is not None:
            self._check_held_below(src, up_to, holders)
        heap, done, attempts = src.offsets, [], []
        while heap and heap[0] < up_to:
            task = src.tasks.get(heapq.heappop(heap))
            if task is None:
                continue
            attempt, ended = task.attempts, None
            lease = task.lease
            if lease is not None:
                attempt = lease.attempt
                self._end_lease(task, lease, f"the record was acked by ack_up_to({up_to})")
                ended = AttemptRecord(lease.attempt, lease.consumer, _ms(lease.leased_at), _ms(now), ACKED)
                attempts.append(AttemptEntry(src.id, task.offset, ended))
            done.append(self._settle_done(task, attempt, now, ended))
        floor = src.floor()
        if floor <= src.floor_sent and not done:
            return NO_CHANGES
        src.floor_sent = max(src.floor_sent, floor)
        return Changes(
            ops=(ProgressOp(src.id, GroupProgress(floor)),), done=tuple(done), attempts=tuple(attempts)
        )

    def _check_held_below(self, src: _Source, up_to: int, holders: str) -> None:
        if src.is_dlq:
            raise NotAllowedError(f"only the owner of group {self.spec.name} purges its dead letters")
        for offset, task in src.tasks.items():
            if offset < up_to and (task.lease is None or not task.lease.consumer.startswith(holders)):
                raise NotAllowedError(
                    f"ack_up_to({up_to}) of {src.id} would settle offset {offset}, which is not leased to "
                    "a worker of the calling daemon (a remote daemon settles only its own leases)"
                )

    # ------------------------------------------------------------------ dead-letter queue
    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """Parked dead letters, oldest first."""
        src = self._sources[self.dlq]
        parked = sorted(o for o, t in src.tasks.items() if t.state == DEAD)
        return [self._dead_letter_view(src.tasks[o]) for o in parked[:limit]]

    def inspect_dead_letter(self, dlq_offset: int) -> DeadLetter:
        task = self._sources[self.dlq].tasks.get(dlq_offset)
        if task is None or task.state != DEAD:
            raise NotFoundError(f"no parked dead letter at offset {dlq_offset} of {self.dlq}")
        return self._dead_letter_view(task)

    @staticmethod
    def _dead_letter_view(task: _Task) -> DeadLetter:
        assert task.origin is not None
        return DeadLetter(task.offset, task.record, task.origin)

    def _parked(self, offsets: Iterable[int] | None) -> list[_Task]:
        src = self._sources[self.dlq]
        if offsets is None:
            return sorted((t for t in src.tasks.values() if t.state == DEAD), key=lambda t: t.offset)
        tasks = []
        for offset in offsets:
            task = src.tasks.get(offset)
            if task is None or task.state != DEAD:
                raise NotFoundError(f"no parked dead letter at offset {offset} of {self.dlq}")
            tasks.append(task)
        return tasks

    def redrive(self, dlq_offsets: Iterable[int] | None, now: float) -> Changes:
        """Make parked dead letters (all when None) available again, with a fresh attempt budget."""
        tasks = self._parked(dlq_offsets)
        if not tasks:
            return NO_CHANGES
        for task in tasks:
            self._set_state(task, AVAILABLE)
            heapq.heappush(self._ready, (task.seq, task))
        src = self._sources[self.dlq]
        return Changes(ops=(self._op(src, released=tuple(t.offset for t in tasks)),))

    def purge(self, dlq_offsets: Iterable[int] | None, now: float) -> Changes:
        """Drop parked dead letters (all when None) for good."""
        tasks = self._parked(dlq_offsets)
        if not tasks:
            return NO_CHANGES
        for task in tasks:
            self._settle(task)
        return Changes(ops=(self._op(self._sources[self.dlq], acked=tuple(t.offset for t in tasks)),))

    def live_history(self, now: float) -> list[AttemptEntry]:
        """The attempt history still needed: unsettled records' and done ones' within the retention
        period (what a compacted group log must carry over; dead letters carry their own)."""
        self._prune_done(now)
        out = [
            AttemptEntry(src.id, task.offset, attempt)
            for src in self._sources.values()
            for task in src.tasks.values()
            for attempt in task.history
        ]
        for src in self._sources.values():  # not offered yet (a source that has not replicated here)
            for offset, attempts in src.hint_history.items():
                out.extend(AttemptEntry(src.id, offset, a) for a in attempts)
        for _, done in self._done:
            if self._done_index.get((done.queue, done.offset), (0.0, None))[1] is done:
                out.extend(AttemptEntry(done.queue, done.offset, a) for a in done.history)
        return out

    # ------------------------------------------------------------------ time and introspection
    def next_deadline(self) -> float | None:
        """When something is due: the earliest lease expiry or retry time (so the daemon never polls)."""
        expiry, retry = self._expiry, self._retry
        while expiry:
            _, _, lease = expiry[0]
            task = self._leases.get(lease.token)
            if task is not None and task.lease is lease:
                break
            heapq.heappop(expiry)
        while retry and not (retry[0][2].state == FAILED and retry[0][2].ready_at == retry[0][0]):
            heapq.heappop(retry)
        times = [heap[0][0] for heap in (expiry, retry) if heap]
        return min(times) if times else None

    def stats(self, now: float) -> GroupStats:
        self._promote(now)
        self._prune_done(now)
        counts = self._counts
        oldest: float | None = None
        floors = {}
        for src in self._sources.values():
            floor = floors[src.id] = src.floor()
            task = src.tasks.get(floor)
            if task is not None and not src.is_dlq:
                age = max(0.0, now - task.record.timestamp / 1000)
                oldest = age if oldest is None else max(oldest, age)
        return GroupStats(
            available=counts[AVAILABLE],
            leased=counts[LEASED],
            done=len(self._done_index),
            failed=counts[FAILED],
            dead=counts[DEAD],
            ack_floor=floors,
            oldest_age_s=oldest,
            consumers=len(self._consumers),
        )

    def inspect(self, queue: str, offset: int, now: float) -> TaskView:
        """One record's state, attempts and history: pending, done (within the retention period) or dead
        (then its dead letter's history; a redriven one's attempts since follow). NotFoundError if
        settled and not retained, or unseen."""
        src = self._source(queue)
        task = src.tasks.get(offset)
        if task is None:
            self._prune_done(now)
            kept = self._done_index.get((queue, offset))
            if kept is not None:
                done_at, done = kept
                return TaskView(
                    queue, offset, "done", done.attempt, done.correlation_id, done.history, done_at=done_at
                )
            dlq_offset = self._dead_by_origin.get((queue, offset))
            dead = self._sources[self.dlq].tasks.get(dlq_offset) if dlq_offset is not None else None
            if dead is None or dead.origin is None:
                raise NotFoundError(f"{queue} offset {offset} is not pending in group {self.spec.name}")
            origin = dead.origin
            later = tuple(replace(a, number=origin.attempts + a.number) for a in dead.history)
            return TaskView(
                queue,
                offset,
                dead.state,
                origin.attempts + dead.attempts,
                dead.correlation_id,
                (*origin.history, *later),
                lease=dead.lease,
                retry_at=dead.ready_at if dead.state == FAILED else None,
                dlq_offset=dlq_offset,
            )
        return TaskView(
            queue,
            offset,
            task.state,
            task.attempts,
            task.correlation_id,
            tuple(task.history),
            lease=task.lease,
            retry_at=task.ready_at if task.state == FAILED else None,
        )

    # ------------------------------------------------------------------ internals
    def _set_state(self, task: _Task, state: str) -> None:
        counts = self._counts
        counts[task.state] -= 1
        counts[state] += 1
        task.state = state

    def _settle(self, task: _Task) -> None:
        self._counts[task.state] -= 1
        task.state = SETTLED
        del task.source.tasks[task.offset]
        origin = task.origin
        if origin is not None and self._dead_by_origin.get((origin.source, origin.offset)) == task.offset:
            del self._dead_by_origin[(origin.source, origin.offset)]

    def _settle_done(self, task: _Task, attempt: int, now: float, ended: AttemptRecord | None) -> Done:
        self._settle(task)
        history = (*task.history, ended) if ended is not None else tuple(task.history)
        done = Done(task.source.id, task.offset, attempt, task.correlation_id, history)
        if self.spec.retention_s > 0:
            entry = (now, done)
            self._done.append(entry)
            self._done_index[(done.queue, done.offset)] = entry
            if len(self._done) > MAX_RETAINED_DONE:
                self._forget_oldest_done()
        return done

    def _forget_oldest_done(self) -> None:
        entry = self._done.popleft()
        key = (entry[1].queue, entry[1].offset)
        if self._done_index.get(key) is entry:
            del self._done_index[key]

    def _prune_done(self, now: float) -> None:
        horizon = now - self.spec.retention_s
        while self._done and self._done[0][0] <= horizon:
            self._forget_oldest_done()

    def _promote(self, now: float) -> None:
        retry, ready = self._retry, self._ready
        while retry and retry[0][0] <= now:
            ready_at, _, task = heapq.heappop(retry)
            if task.state == FAILED and task.ready_at == ready_at:
                self._set_state(task, AVAILABLE)
                heapq.heappush(ready, (task.seq, task))

    def _op(
        self,
        src: _Source,
        acked: tuple[int, ...] = (),
        dead: tuple[int, ...] = (),
        released: tuple[int, ...] = (),
        attempts: tuple[tuple[int, int], ...] = (),
    ) -> ProgressOp:
        """A normal-form fragment carrying the current floor (so every op also moves the durable floor)."""
        floor = src.floor()
        src.floor_sent = max(src.floor_sent, floor)
        return ProgressOp(
            src.id,
            GroupProgress(
                floor,
                frozenset(o for o in acked if o > floor),
                frozenset(o for o in dead if o > floor),
                frozenset(released),
                attempts,
            ),
        )

    def _fail_all(
        self, pairs: list[tuple[_Task, Grant]], reason: str, delay: float | None, now: float, error: str = ""
    ) -> Changes:
        spec, failures, dead_letters, attempts = self.spec, [], [], []
        by_source: dict[_Source, tuple[list[int], list[tuple[int, int]]]] = {}
        for task, lease in pairs:
            self._end_lease(task, lease, f"the lease ended ({reason}) and the record will be redelivered")
            task.attempts += 1
            ended = AttemptRecord(
                lease.attempt, lease.consumer, _ms(lease.leased_at), _ms(now), reason, error
            )
            task.history.append(ended)
            del task.history[:-MAX_HISTORY]
            attempts.append(AttemptEntry(task.source.id, task.offset, ended))
            dead, counts = by_source.setdefault(task.source, ([], []))
            if spec.max_attempts and task.attempts >= spec.max_attempts:
                record = self._dead_letter(task, reason, now)
                self._settle(task)
                dead.append(task.offset)
                dead_letters.append(record)
                failures.append(Failure(lease, reason, task.attempts, None, record))
                continue
            counts.append((task.offset, task.attempts))
            wait = spec.backoff(task.attempts) if delay is None else delay
            if wait <= 0:
                self._set_state(task, AVAILABLE)
                heapq.heappush(self._ready, (task.seq, task))
                retry_at = now
            else:
                retry_at = task.ready_at = now + wait
                self._set_state(task, FAILED)
                heapq.heappush(self._retry, (retry_at, task.seq, task))
            failures.append(Failure(lease, reason, task.attempts, retry_at, None))
        ops = tuple(
            self._op(src, dead=tuple(dead), attempts=tuple(sorted(counts)))
            for src, (dead, counts) in by_source.items()
        )
        return Changes(
            ops=ops, dead_letters=tuple(dead_letters), failed=tuple(failures), attempts=tuple(attempts)
        )

    def _dead_letter(self, task: _Task, reason: str, now: float) -> Record:
        origin = task.origin
        if origin is not None:  # a redriven dead letter failing again: keep where it first came from
            source, offset = origin.source, origin.offset
            attempts = origin.attempts + task.attempts
            later = (replace(a, number=origin.attempts + a.number) for a in task.history)
            history = (*origin.history, *later)
        else:
            source, offset, attempts, history = (
                task.source.id,
                task.offset,
                task.attempts,
                tuple(task.history),
            )
        info = DeadLetterInfo(source, offset, attempts, task.correlation_id, reason, _ms(now), history)
        return dead_letter_record(task.record, info)


__all__ = [
    "AVAILABLE",
    "FAILED",
    "LEASED",
    "MAX_RETAINED_DONE",
    "DEAD",
    "SETTLED",
    "STATES",
    "Dispatcher",
]
