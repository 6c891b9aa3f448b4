"""How a group's state is shown: the maps the local API replies with and the owner answers a remote
daemon with (the same shapes, so a worker's daemon passes the owner's answers on unchanged)."""

from __future__ import annotations

from typing import Any

from latticed.crdt.attempts import AttemptRecord
from latticed.crdt.group import parse_source_id
from latticed.groups.group_ports import GroupStore
from latticed.groups.group_sources import find_source, held
from latticed.groups.runtime import GroupRuntime
from latticed.leases.outcomes import Changes, Grant, GroupStats, TaskView


def headers_wire(headers: tuple[tuple[str, bytes], ...]) -> list[list[Any]] | None:
    return [[k, v] for k, v in headers] if headers else None


def attempt_wire(attempt: AttemptRecord) -> dict[str, Any]:
    return {
        "attempt": attempt.number,
        "consumer": attempt.consumer,
        "leased_at_ms": attempt.leased_at_ms,
        "ended_at_ms": attempt.ended_at_ms,
        "outcome": attempt.outcome,
        "error": attempt.error,
    }


def lease_wire(group: str, lease: Grant) -> dict[str, Any]:
    """A lease with its record, as a client receives it (``group`` as the client should name it)."""
    record = lease.record
    return {
        "group": group,
        "queue": lease.queue,
        "offset": lease.offset,
        "lease": lease.token,
        "attempt": lease.attempt,
        "consumer": lease.consumer,
        "correlation_id": lease.correlation_id,
        "key": record.key,
        "value": record.value,
        "timestamp": record.timestamp,
        "headers": headers_wire(record.headers),
        "leased_at": lease.leased_at,
        "expires_at": lease.expires_at,
    }


def settled_reply(changes: Changes) -> dict[str, Any]:
    reply: dict[str, Any] = {"correlation_id": changes.correlation_id}
    if changes.done:
        done = changes.done[0]
        reply.update(queue=done.queue, offset=done.offset, attempt=done.attempt)
    if changes.failed:
        failed = changes.failed[0]
        reply.update(
            queue=failed.lease.queue,
            offset=failed.lease.offset,
            attempts=failed.attempts,
            retry_at=failed.retry_at,
            dead_lettered=failed.dead_letter is not None,
        )
    return reply


def task_wire(view: TaskView) -> dict[str, Any]:
    return {
        "queue": view.queue,
        "offset": view.offset,
        "state": view.state,
        "attempts": view.attempts,
        "correlation_id": view.correlation_id,
        "history": [attempt_wire(a) for a in view.history],
        "lease": view.lease.token if view.lease else None,
        "consumer": view.lease.consumer if view.lease else None,
        "expires_at": view.lease.expires_at if view.lease else None,
        "retry_at": view.retry_at,
        "done_at": view.done_at,
        "dlq_offset": view.dlq_offset,
    }


def source_ends(engine: GroupStore, sources: tuple[str, ...]) -> dict[str, int | None]:
    """How far this daemon holds each source (None: not here)."""
    ends = {}
    for sid in sources:
        owner, name = parse_source_id(sid)
        q = find_source(engine, owner, name)
        ends[sid] = held(engine, q)[1] if q is not None else None
    return ends


def log_position(engine: GroupStore, q: int) -> dict[str, int]:
    """Where the group log stands (its start moves up when it is compacted to a snapshot)."""
    state = engine.state(q)
    return {"start": state.start, "end": state.held_end, "version": state.version}


def counts(stats: GroupStats) -> dict[str, int]:
    """A running group's counts as ``group list`` and ``group stats`` show them."""
    return {
        "available": stats.available,
        "leased": stats.leased,
        "done": stats.done,
        "failed": stats.failed,
        "dead": stats.dead,
        "consumers": stats.consumers,
    }


def live_stats(engine: GroupStore, rt: GroupRuntime, now: float) -> dict[str, Any]:
    """The counts of a group this daemon runs (leases included: they live here only)."""
    stats = rt.dispatcher.stats(now)
    return {
        "group": rt.name,
        "running": True,
        **counts(stats),
        "ack_floor": dict(stats.ack_floor),
        "oldest_age_s": stats.oldest_age_s,
        "ends": source_ends(engine, rt.sources),
        "log": log_position(engine, rt.q),
    }


__all__ = [
    "attempt_wire",
    "counts",
    "headers_wire",
    "lease_wire",
    "live_stats",
    "log_position",
    "settled_reply",
    "source_ends",
    "task_wire",
]
