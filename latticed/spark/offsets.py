"""Offset planning for the lattice source: pure functions over what the daemon reported (no I/O).

An offset is a JSON object ``{"OWNER/NAME": next_offset}`` whose keys are always sorted: Spark stores
``json.dumps`` of it verbatim and decides "new data?" by comparing that text, so the same offsets in a
different key order would run empty micro-batches forever.

Two pins make a restarted query deterministic even though the daemon's view moves on:

* ``latest`` is not resolved when the query starts. The initial offset holds the sentinel ``-1`` for the
  queue and the first micro-batch *pins* it: its end offset is the queue's end at that moment and it reads
  nothing from that queue. Spark writes a batch's end offset to its offsets log before running it, but not
  batch 0's start (it calls ``initialOffset()`` again after a crash); a sentinel start is the same on
  every call, so a query that crashes before batch 0 commits neither skips nor re-reads anything.
* a queue that appears later (a ``queuePattern`` subscription, replicated in) is pinned the same way at its
  current start offset ("earliest"), and read from the next batch on.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from latticed.crdt.core_errors import LatticedError
from latticed.crdt.records import MAX_OFFSET
from latticed.errors import ForkedQueueError, MalformedError, NotFoundError
from latticed.process.logs import get_logger, log_event
from latticed.spark.options import EARLIEST, LATEST, OffsetSpec

log = get_logger(__name__)

#: queue (``OWNER/NAME``) -> the next offset to read, or LATEST (not pinned yet).
Offsets = dict[str, int]

#: The checkpoint offset each queue was last reported behind at (logging only).
_behind: dict[str, int] = {}


class DataLossError(LatticedError):
    """Records the query had not read yet were truncated away (``failOnDataLoss`` is true)."""

    code = "data_loss"


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue as the local daemon reported it: ``[start, end)`` is what it holds now."""

    queue: str
    start: int
    end: int
    forked: bool = False
    core: int = 1
    #: A frozen core-2 queue's fork point: ``end`` stops there until its owner recovers it.
    fork_point: int | None = None
    #: A core-2 queue's epoch (its owner's recoveries) and where that epoch's own records begin.
    epoch: int = 0
    epoch_start: int = 0

    @property
    def frozen(self) -> bool:
        """A core-2 queue whose owner forked it: nothing past ``fork_point`` is served."""
        return self.core == 2 and self.fork_point is not None

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> QueueView:
        """From a ``queue_list``/``queue_info`` entry of the local API."""
        return cls(
            queue=str(info["queue"]),
            start=int(info["start_offset"]),
            end=int(info["end_offset"]),
            forked=bool(info.get("forked", False)),
            core=int(info.get("core", 1)),
            fork_point=None if info.get("fork_point") is None else int(info["fork_point"]),
            epoch=int(info.get("epoch", 0)),
            epoch_start=int(info.get("epoch_start", 0)),
        )


def check_offsets(offsets: Mapping[str, int], what: str) -> None:
    """Raise MalformedError for an offset past :data:`MAX_OFFSET` (no queue reaches one; the daemon
    refuses them), so a bad checkpoint or a bad report fails the query clearly instead of stalling it or
    overflowing the 64-bit offset column of a batch."""
    for queue, offset in offsets.items():
        if offset > MAX_OFFSET:
            raise MalformedError(
                f"lattice source: {what} has offset {offset} for queue {queue}, past the last offset a "
                f"queue can reach ({MAX_OFFSET}); the offsets are corrupt"
            )


def sorted_offsets(offsets: Mapping[str, int]) -> Offsets:
    """A copy with keys in sorted order: the JSON text Spark compares must be canonical."""
    return {queue: int(offsets[queue]) for queue in sorted(offsets)}


def forked_error(queue: str) -> ForkedQueueError:
    return ForkedQueueError(
        f"queue {queue} is forked: its owner signed two different histories, so there is no single log "
        f"to read (the daemon holds the fork proof; `latticectl queue info {queue}` shows it). "
        "Stop subscribing to it, or have the owner start a new queue."
    )


@dataclass(frozen=True, slots=True)
class QueueSelection:
    """Which queues a query reads: an explicit list of ``OWNER/NAME`` (already resolved) or a glob."""

    queues: tuple[str, ...] | None = None
    pattern: str | None = None

    def matches(self, queue: str) -> bool:
        if self.queues is not None:
            return queue in self.queues
        return self.pattern is not None and fnmatch.fnmatchcase(queue, self.pattern)

    def select(self, views: Iterable[QueueView], *, strict: bool) -> dict[str, QueueView]:
        """The subscribed queues among ``views``, sorted by name.

        A forked core-1 subscribed queue is a ForkedQueueError (a frozen core-2 one is read up to its fork
        point, see :func:`past_fork`). With ``strict``, an explicitly listed queue the
        daemon does not know is a NotFoundError (at start; later a vanished queue just keeps its offset).
        """
        chosen: dict[str, QueueView] = {}
        for view in views:
            if self.matches(view.queue):
                if view.forked and view.core != 2:
                    raise forked_error(view.queue)
                check_offsets({view.queue: view.end}, "the local daemon")
                chosen[view.queue] = view
        if strict and self.queues is not None:
            missing = [q for q in self.queues if q not in chosen]
            if missing:
                raise NotFoundError(f"unknown queue(s) on the local daemon: {', '.join(missing)}")
        return {q: chosen[q] for q in sorted(chosen)}


def resolve_spec_keys(spec: Mapping[str, int], resolve: Mapping[str, str], option: str) -> dict[str, int]:
    """Rewrite the queue specs of an offsets JSON (``NAME`` or ``OWNER/NAME``) to ``OWNER/NAME``."""
    out: dict[str, int] = {}
    for key, offset in spec.items():
        queue = resolve.get(key, key)
        if "/" not in queue:
            raise MalformedError(f"lattice option {option!r}: {key!r} is not one of the subscribed queues")
        out[queue] = offset
    return out


def initial_offsets(views: Mapping[str, QueueView], starting: OffsetSpec) -> Offsets:
    """Where a new streaming query starts: ``earliest`` is concrete, ``latest`` is the -1 sentinel.

    Queues left out of a JSON spec start at earliest (as new queues do). A JSON key must be a subscribed
    queue; its offset is taken as given (a too-low one is data loss, found when planning batch 0)."""
    if isinstance(starting, dict):
        unknown = sorted(set(starting) - set(views))
        if unknown:
            raise MalformedError(
                f"lattice option 'startingOffsets' names queues that are not subscribed: {', '.join(unknown)}"
            )
    out: Offsets = {}
    for queue, view in views.items():
        if starting == "latest":
            out[queue] = LATEST
        elif starting == "earliest":
            out[queue] = view.start
        else:
            assert isinstance(starting, dict)
            offset = starting.get(queue, EARLIEST)
            out[queue] = view.start if offset == EARLIEST else offset
    return sorted_offsets(out)


def allocate(available: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` records over queues by water-filling: a queue with a small backlog gets all of it,
    the rest share equally. Unlike a split proportional to backlog (Kafka's), a small queue is never starved
    behind a big one, and the result is deterministic (ties broken by name)."""
    grants = {queue: 0 for queue in available}
    waiting = sorted((n, queue) for queue, n in available.items() if n > 0)
    remaining = budget
    for i, (n, queue) in enumerate(waiting):
        left = len(waiting) - i
        share = -(-remaining // left)  # ceil: the last queue may take everything still unspent
        grants[queue] = min(n, share)
        remaining -= grants[queue]
    return grants


def readable_from(queue: str, offset: int, view: QueueView, *, fail_on_data_loss: bool) -> int:
    """The first offset that can still be read at or after ``offset``; truncation below it is data loss."""
    if view.start <= offset:
        return offset
    lost = f"records {offset}..{view.start - 1} of queue {queue} were truncated before the query read them"
    if fail_on_data_loss:
        raise DataLossError(
            f"{lost} (failOnDataLoss is true). To skip them and go on, restart with the option "
            "failOnDataLoss=false; to keep them next time, read faster or truncate less eagerly."
        )
    log_event(log, "spark.data_loss", logging.WARNING, queue=queue, lost_from=offset, lost_to=view.start)
    return view.start


def fork_message(queue: str, point: int, offset: int) -> str:
    """Why a query past a frozen queue's fork point stopped, and the two ways on."""
    name = queue.partition("/")[2] or queue
    return (
        f"queue {queue} forked at offset {point} (its owner signed two histories) and is frozen there, but "
        f"this query has read or planned records up to offset {offset}, past the fork point (failOnDataLoss "
        f"is true). Its owner continues it from offset {point} in a new epoch with `latticectl queue "
        f"recover {name}` on the owner's daemon; to follow it there, restart the query now with "
        f"failOnDataLoss=false: it waits at offset {point} and reads the new epoch from there (the "
        f"{offset - point} record(s) it read past the fork point are superseded)."
    )


def past_fork(queue: str, offset: int, view: QueueView, *, fail_on_data_loss: bool) -> int | None:
    """Where a query at ``offset`` goes on in a frozen core-2 queue: None if it is not past the fork point
    (it reads up to it, then has no new data); else the fork point, from which the owner's recovery goes
    on in a new epoch (the records read past it are lost to the query), or DataLossError."""
    point = view.fork_point
    if not view.frozen or point is None or offset <= point:
        return None
    if fail_on_data_loss:
        raise DataLossError(fork_message(queue, point, offset))
    log_event(
        log,
        "spark.fork_rewind",
        logging.WARNING,
        queue=queue,
        fork_point=point,
        checkpoint=offset,
        lost=offset - point,
    )
    return point


def stops_at_fork(queue: str, pos: int, hi: int, view: QueueView, fail_on_data_loss: bool) -> bool:
    """Whether a partition read up to ``pos`` of ``[.., hi)`` stops at a frozen queue's fork point: the
    rest will not come (the next micro-batch reads the owner's new epoch from the fork point); with
    ``fail_on_data_loss`` that is DataLossError."""
    point = view.fork_point
    if point is None or not view.frozen or pos < point:
        return False
    if fail_on_data_loss:
        raise DataLossError(fork_message(queue, point, hi))
    log_event(log, "spark.fork_stop", logging.WARNING, queue=queue, fork_point=point, planned_to=hi)
    return True


def latest_offsets(
    start: Mapping[str, int],
    views: Mapping[str, QueueView],
    *,
    max_rows: int | None,
    target: Mapping[str, int] | None = None,
    fail_on_data_loss: bool = True,
) -> Offsets:
    """The end offset of the next micro-batch.

    ``views`` are the subscribed queues now; ``max_rows`` caps the records admitted (``None``: all);
    ``target`` (Trigger.AvailableNow) caps each queue at its end when the trigger was prepared and hides
    queues that appeared since. Queues in ``start`` the daemon no longer reports keep their offset.
    A query past a frozen core-2 queue's fork point fails, or (``fail_on_data_loss`` false) is moved back
    to it by an empty batch and waits there for the owner's recovery (:func:`past_fork`).
    """
    check_offsets(start, "the start of the micro-batch")
    end: Offsets = dict(start)
    available: dict[str, int] = {}
    begin: dict[str, int] = {}
    for queue, view in views.items():
        cap = view.end
        if target is not None:
            if queue not in target:
                continue
            cap = min(cap, target[queue])
        offset = start.get(queue)
        if offset is None:
            end[queue] = view.start  # new queue: pin at earliest, read from the next batch
        elif offset == LATEST:
            end[queue] = max(cap, view.start)  # pin "latest" now (see the module docstring)
        elif (point := past_fork(queue, offset, view, fail_on_data_loss=fail_on_data_loss)) is not None:
            end[queue] = point  # an empty batch that moves the checkpoint back to the fork point
        else:
            if view.end < offset and _behind.get(queue) != offset:
                _behind[queue] = offset  # once per offset: latestOffset is polled every few ms when idle
                log_event(
                    log, "spark.replica_behind", logging.WARNING, queue=queue, checkpoint=offset, end=view.end
                )
            first = readable_from(queue, offset, view, fail_on_data_loss=fail_on_data_loss)
            begin[queue] = first
            available[queue] = max(0, cap - first)
    grants = available if max_rows is None else allocate(available, max_rows)
    for queue, granted in grants.items():
        # A skipped (truncated) stretch moves the offset even when nothing else is admitted, so the skip
        # is checkpointed once instead of being found (and logged) again on every poll.
        if granted > 0 or begin[queue] > start[queue]:
            end[queue] = begin[queue] + granted
    return sorted_offsets(end)


@dataclass(frozen=True, slots=True)
class Range:
    """Records ``[lo, hi)`` of one queue: one Spark partition."""

    queue: str
    lo: int
    hi: int


#: ``minPartitions`` does not cut pieces smaller than this: a task costs more than reading them.
MIN_SPLIT_RECORDS: Final = 10_000


def plan_ranges(
    start: Mapping[str, int],
    end: Mapping[str, int],
    max_per_partition: int,
    min_partitions: int | None = None,
) -> list[Range]:
    """Partitions for ``[start, end)``: one per queue with records, a big range cut into equal pieces of at
    most ``max_per_partition`` records so several tasks share a backlog (equal, so no short last task is
    left running alone). With ``min_partitions``, the pieces are also small enough that the batch has at
    least that many partitions, but not below MIN_SPLIT_RECORDS records. Pinned queues read nothing."""
    check_offsets(start, "the start of the batch")
    check_offsets(end, "the end of the batch")
    spans = {
        queue: (lo, end[queue])
        for queue in sorted(end)
        if (lo := start.get(queue)) is not None and lo >= 0 and end[queue] > lo
    }
    share = None
    if min_partitions is not None and spans:
        total = sum(hi - lo for lo, hi in spans.values())
        share = max(MIN_SPLIT_RECORDS, -(-total // min_partitions))
    out: list[Range] = []
    for queue, (lo, hi) in spans.items():
        n = hi - lo
        pieces = -(-n // max_per_partition)
        if share is not None:
            pieces = max(pieces, min(-(-n // share), n // MIN_SPLIT_RECORDS))
        cuts = [lo + n * i // pieces for i in range(pieces + 1)]
        out.extend(Range(queue, a, b) for a, b in itertools.pairwise(cuts))
    return out


def batch_bounds(
    views: Mapping[str, QueueView],
    starting: OffsetSpec,
    ending: OffsetSpec,
    *,
    fail_on_data_loss: bool = True,
) -> tuple[Offsets, Offsets]:
    """Concrete ``[start, end)`` per queue for a batch read (``spark.read``), resolved once at planning."""
    if isinstance(ending, dict):
        unknown = sorted(set(ending) - set(views))
        if unknown:
            raise MalformedError(
                f"lattice option 'endingOffsets' names queues that are not subscribed: {', '.join(unknown)}"
            )
    start = initial_offsets(views, starting)
    end: Offsets = {}
    for queue, view in views.items():
        offset = ending.get(queue, LATEST) if isinstance(ending, dict) else LATEST
        end[queue] = view.end if offset == LATEST else offset
        start[queue] = readable_from(queue, start[queue], view, fail_on_data_loss=fail_on_data_loss)
        point = past_fork(queue, start[queue], view, fail_on_data_loss=fail_on_data_loss)
        start[queue] = start[queue] if point is None else point
        if end[queue] < start[queue]:
            raise MalformedError(
                f"lattice source: queue {queue} would be read from {start[queue]} to {end[queue]}: "
                "endingOffsets is before startingOffsets"
            )
    return start, sorted_offsets(end)


__all__ = [
    "DataLossError",
    "Offsets",
    "QueueView",
    "Range",
    "QueueSelection",
    "allocate",
    "batch_bounds",
    "check_offsets",
    "fork_message",
    "forked_error",
    "initial_offsets",
    "latest_offsets",
    "MIN_SPLIT_RECORDS",
    "past_fork",
    "plan_ranges",
    "readable_from",
    "resolve_spec_keys",
    "sorted_offsets",
    "stops_at_fork",
]
