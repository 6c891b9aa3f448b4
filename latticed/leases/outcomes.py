"""What the lease dispatcher (:mod:`latticed.leases.dispatch`) hands back: leases granted, records
settled or failed, the changes a call must make durable before its reply, and the read-only views
(``inspect``, dead letters, stats).

Frozen values apart from the dispatcher, so the trio service, the API handlers and the group views
depend on these and not on the lease rules that produce them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from latticed.crdt.attempts import AttemptEntry, AttemptRecord, DeadLetterInfo
from latticed.crdt.group import ProgressOp
from latticed.crdt.records import Record


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease as the dispatcher grants it: a record handed to a consumer until ``expires_at``; ``token``
    fences every later call. (The client's view of it is :class:`latticed.api.client.group_client.Lease`.)

    ``attempt`` counts from 1 (failed attempts so far + 1). ``queue``/``offset`` name what is leased: a
    source record, or a redriven DLQ record (whose ``x-dlq`` header names the original)."""

    token: str
    queue: str
    offset: int
    attempt: int
    consumer: str
    correlation_id: str
    record: Record
    leased_at: float
    expires_at: float
    #: When its holder last showed life (leased or extended it): ``claim`` measures idleness from here.
    active_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Done:
    """A record settled as done; ``history`` is every attempt it had, the successful one last (empty for
    one settled by ``ack_up_to`` without a lease). ``correlation_id`` is "" when rebuilt from the
    durable history after a restart (the caller derives it from the record)."""

    queue: str
    offset: int
    attempt: int
    correlation_id: str
    history: tuple[AttemptRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class Failure:
    """A lease that ended without an ack; ``retry_at`` None means it was dead-lettered."""

    lease: Grant
    reason: str  # "nack" | "expired" | "released"
    attempts: int
    retry_at: float | None
    dead_letter: Record | None

    @property
    def correlation_id(self) -> str:
        return self.lease.correlation_id


@dataclass(frozen=True, slots=True)
class Changes:
    """What one call changed that must be durable before the caller replies.

    Append ``dead_letters`` to the group's DLQ queue and ``ops`` (see :func:`~latticed.crdt.group.
    progress_record`) to the group log, in one transaction. ``done`` and ``failed`` say what happened, with
    correlation ids to echo."""

    ops: tuple[ProgressOp, ...] = ()
    dead_letters: tuple[Record, ...] = ()
    done: tuple[Done, ...] = ()
    failed: tuple[Failure, ...] = ()
    #: Attempts that ended (acked or failed): appended to the group log's durable history.
    attempts: tuple[AttemptEntry, ...] = ()

    @property
    def correlation_id(self) -> str | None:
        """The correlation id to echo for a single-record call (ack, nack)."""
        if self.done:
            return self.done[0].correlation_id
        if self.failed:
            return self.failed[0].correlation_id
        return None

    def __bool__(self) -> bool:
        return bool(self.ops or self.dead_letters or self.done or self.failed or self.attempts)


NO_CHANGES = Changes()


@dataclass(frozen=True, slots=True)
class TaskView:
    """One record as the group sees it (``inspect``)."""

    queue: str
    offset: int
    state: str
    attempts: int
    correlation_id: str
    history: tuple[AttemptRecord, ...]
    lease: Grant | None = None
    retry_at: float | None = None
    done_at: float | None = None
    dlq_offset: int | None = None  # a dead record: where its dead letter is


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A parked record of the DLQ: its DLQ offset, the record (payload included) and where it came from."""

    dlq_offset: int
    record: Record
    info: DeadLetterInfo


@dataclass(frozen=True, slots=True)
class GroupStats:
    available: int
    leased: int
    done: int  # acked and still retained
    failed: int  # waiting for a retry
    dead: int  # parked in the DLQ
    ack_floor: Mapping[str, int] = field(default_factory=dict)
    oldest_age_s: float | None = None  # age of the oldest unsettled source record (producer timestamp)
    consumers: int = 0


__all__ = ["NO_CHANGES", "Changes", "DeadLetter", "Done", "Failure", "Grant", "GroupStats", "TaskView"]
