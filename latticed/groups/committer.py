"""Group commit for work-queue changes: everything groups changed while the previous commit was being
written goes into the next one, as ONE storage job (one transaction, one fsync, one signature per queue).

Why not one engine append per ack: an ack is a few bytes of progress; the fixed cost of a commit (fsync,
an Ed25519 signature, a storage-thread round trip) dwarfs it. Here a burst of acks from many consumers
costs one commit, and its ops coalesce to one record per (group, source) (:func:`coalesce_ops`), so the
group log grows per commit, not per ack. A caller that must not reply before its change is durable awaits
:meth:`Committer.persist`; background changes (floor moves from intake, lease expiry) use ``submit``.

Order inside the transaction: dead letters to the DLQ, then progress ops to the group log; both or
neither land. After the commit the DLQ is caught up (so a dead letter is listed as soon as the nack that
made it returns), and the group's folded progress is updated; a log longer than ``COMPACT_AT`` records is
then replaced by a snapshot of that progress (appended, then the log truncated below it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from latticed.crdt.attempts import AttemptEntry, history_records
from latticed.crdt.group import ProgressOp, apply_progress_ops, coalesce_ops, progress_record, snapshot_ops
from latticed.crdt.records import MAX_VALUE_BYTES, Record
from latticed.errors import LatticedError
from latticed.groups.group_ports import GroupStore
from latticed.groups.runtime import GroupRuntime
from latticed.leases.outcomes import Changes
from latticed.process.logs import get_logger, log_event
from latticed.storage.sealer import Sealer

log = get_logger(__name__)

#: Group log length (records) past which it is compacted to a snapshot of its progress.
COMPACT_AT: Final = 4096
#: How long a commit may wait for the changes the last commits suggest are coming, and how far back
#: (seconds) "the last commits" look: after a burst, a lone ack stops waiting this soon.
LINGER_S: Final = 0.001
RECENT_S: Final = 0.02


class Flight:
    """One commit's outcome, shared by everyone whose changes it carries."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: LatticedError | None = None

    async def wait(self) -> None:
        """Return once committed; raise the storage error if the commit failed."""
        await self.done.wait()
        if self.error is not None:
            raise type(self.error)(str(self.error))


_DONE = Flight()
_DONE.done.set()


def _records(ops: list[ProgressOp], now_ms: int) -> list[Record]:
    """One record per source; the ops as they came if a coalesced one would not fit in a record."""
    coalesced = [progress_record(op, now_ms) for op in coalesce_ops(ops)]
    if all(len(r.value) <= MAX_VALUE_BYTES for r in coalesced):
        return coalesced
    return [progress_record(op, now_ms) for op in ops]


class Committer:
    """Coalesces groups' :class:`Changes` into storage jobs; run :meth:`run` in a nursery."""

    def __init__(
        self, engine: GroupStore, sealer: Sealer, caught_up: Callable[[GroupRuntime], Awaitable[None]]
    ) -> None:
        self._engine = engine
        self._sealer = sealer
        self._caught_up = caught_up
        self._pending: list[tuple[GroupRuntime, Changes]] = []
        self._flight = Flight()
        self._writing: Flight | None = None
        self._wake = trio.Event()
        self._recent: deque[tuple[float, int]] = deque()
        self.commits = 0

    def submit(self, rt: GroupRuntime, changes: Changes) -> Flight:
        """Queue changes for the next commit (nothing to write: nothing queued)."""
        flight = self._flight
        if rt.deleted:
            flight = _DONE  # its log is a tombstone now: nothing more goes into it
        elif changes.ops or changes.dead_letters or changes.attempts:
            self._pending.append((rt, changes))
            self._wake.set()
        else:
            flight = _DONE
        return flight

    async def flush(self) -> None:
        """Return once everything submitted so far has been committed (or has failed)."""
        for flight in (self._writing, self._flight if self._pending else None):
            if flight is not None:
                await flight.done.wait()

    async def persist(self, rt: GroupRuntime, changes: Changes) -> None:
        """Return once ``changes`` are durable; raises the storage error if the commit failed."""
        await self.submit(rt, changes).wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            await self._linger()
            self._wake = trio.Event()
            batch, self._pending = self._pending, []
            self._recent.append((trio.current_time(), len(batch)))
            flight, self._flight = self._flight, Flight()
            self._writing = flight
            try:
                await self._commit(batch)
            except LatticedError as exc:
                flight.error = exc
                log_event(log, "group.commit_failed", level=40, error=str(exc), changes=len(batch))
            except Exception as exc:  # a bug: fail these callers, keep committing for the others
                flight.error = LatticedError(f"internal error committing work-queue changes: {exc!r}")
                log_event(log, "group.commit_crashed", level=50, exc_info=exc, changes=len(batch))
            finally:
                self._writing = None
                flight.done.set()

    async def _linger(self) -> None:
        """If the last few commits carried more changes than are pending, wait (briefly) for as many:
        consumers that ack one record at a time then share commits instead of alternating in halves."""
        recent, now = self._recent, trio.current_time()
        while recent and recent[0][0] < now - RECENT_S:
            recent.popleft()
        target = max((n for _, n in recent), default=1)
        if len(self._pending) >= target:
            return
        with trio.move_on_after(LINGER_S):
            while len(self._pending) < target:
                self._wake = trio.Event()
                await self._wake.wait()

    async def _commit(self, batch: list[tuple[GroupRuntime, Changes]]) -> None:
        ops: dict[GroupRuntime, list[ProgressOp]] = {}
        dead: dict[GroupRuntime, list[Record]] = {}
        history: dict[GroupRuntime, list[AttemptEntry]] = {}
        for rt, changes in batch:
            ops.setdefault(rt, []).extend(changes.ops)
            if changes.dead_letters:
                dead.setdefault(rt, []).extend(changes.dead_letters)
            if changes.attempts:
                history.setdefault(rt, []).extend(changes.attempts)
        now_ms = self._engine.clock()
        parts: list[tuple[int, list[Record]]] = [(rt.dlq_q, records) for rt, records in dead.items()]
        for rt, rt_ops in ops.items():
            records = _records(rt_ops, now_ms) + history_records(history.get(rt, []), now_ms)
            if records:
                parts.append((rt.q, records))
        await self._sealer.append_many(parts)  # a sealed DLQ's dead letters are sealed
        self.commits += 1
        for rt, rt_ops in ops.items():
            rt.progress = apply_progress_ops(rt.progress, rt_ops)
        for rt in dead:
            await self._caught_up(rt)
        for rt in ops:
            await self._compact(rt)

    async def _compact(self, rt: GroupRuntime) -> None:
        state = self._engine.state(rt.q)
        if state.held_end - state.start < COMPACT_AT:
            return
        now_ms = self._engine.clock()
        records = [progress_record(op, now_ms) for op in snapshot_ops(rt.progress)]
        # The attempt history still needed (pending records', done ones' within the retention) moves up too.
        records += history_records(rt.dispatcher.live_history(now_ms / 1000), now_ms)
        if any(len(r.value) > MAX_VALUE_BYTES for r in records):
            log_event(log, "group.snapshot_too_large", level=30, group=rt.name)
            return
        first = await self._engine.append(rt.q, records) if records else state.held_end
        await self._engine.truncate(rt.q, first)
        log_event(log, "group.compacted", group=rt.name, start=first, ops=len(records))


__all__ = ["COMPACT_AT", "Committer", "Flight"]
