"""The work-queue ops of the local API (consumer groups, leases, dead letters).

Every op names its group as ``group`` (``NAME`` or ``OWNER/NAME``); only the daemon that owns a group
serves its consumers, any daemon holding a replica answers ``group_stats`` from the replicated progress.
The consumer is the connection (:mod:`latticed.api.consumer_id`). ``dequeue`` is a stream op so that a client
that hangs up while waiting is noticed (it does not get a lease it cannot receive); ``subscribe`` lives in
:mod:`latticed.api.subscribe`. Replies that settle or return a record echo its ``correlation_id``.
"""

from __future__ import annotations

import math
from typing import Any, Final

import trio

from latticed.api.connection import Connection
from latticed.api.consumer_id import consumer_id
from latticed.api.handlers import Context, Reply, Request, handler, stream
from latticed.api.wire import arg_int, arg_number, arg_str
from latticed.crdt.group import AttemptRecord, GroupProgress, parse_source_id
from latticed.crdt.head import KIND_GROUP
from latticed.errors import LatticedError, MalformedError
from latticed.groups.runtime import GroupRuntime
from latticed.groups.service import GroupService
from latticed.leases.dispatch import Changes, DeadLetter, Grant

#: Longest accepted duration argument (a day): longer is almost surely a unit mistake.
MAX_SECONDS: Final = 86_400.0
MAX_DLQ_LIST: Final = 10_000
_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)


# ------------------------------------------------------------------ arguments


def service_of(ctx: Context) -> GroupService:
    if ctx.groups is None:
        raise LatticedError("work queues are not running in this daemon")
    return ctx.groups


def runtime_of(ctx: Context, request: Request) -> GroupRuntime:
    return service_of(ctx).runtime(arg_str(request, "group"))


def arg_seconds(request: Request, name: str, *, positive: bool = False) -> float | None:
    value = arg_number(request, name)
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or value > MAX_SECONDS or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise MalformedError(f"argument {name!r} is a number of seconds {bound} and at most {MAX_SECONDS:g}")
    return value


def arg_offsets(request: Request, name: str = "offsets") -> list[int] | None:
    value = request.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(o) is int and o >= 0 for o in value):
        raise MalformedError(f"argument {name!r} must be a list of offsets")
    return sorted(set(value))


def _count(request: Request, name: str, limit: int) -> int:
    value = arg_int(request, name, default=0)
    if not 0 <= value <= limit:
        raise MalformedError(f"argument {name!r} is an integer in [0, {limit}]")
    return int(value)


# ------------------------------------------------------------------ replies


def headers_wire(headers: tuple[tuple[str, bytes], ...]) -> list[list[Any]] | None:
    return [[k, v] for k, v in headers] if headers else None


def lease_wire(rt: GroupRuntime, lease: Grant) -> dict[str, Any]:
    record = lease.record
    return {
        "group": rt.name,
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


def attempt_wire(attempt: AttemptRecord) -> dict[str, Any]:
    return {
        "attempt": attempt.number,
        "consumer": attempt.consumer,
        "leased_at_ms": attempt.leased_at_ms,
        "ended_at_ms": attempt.ended_at_ms,
        "outcome": attempt.outcome,
    }


def dead_letter_wire(letter: DeadLetter) -> dict[str, Any]:
    info, record = letter.info, letter.record
    return {
        "dlq_offset": letter.dlq_offset,
        "queue": info.source,
        "offset": info.offset,
        "attempts": info.attempts,
        "correlation_id": info.correlation_id,
        "reason": info.reason,
        "dead_at_ms": info.dead_at_ms,
        "history": [attempt_wire(a) for a in info.history],
        "key": record.key,
        "value": record.value,
        "timestamp": record.timestamp,
        "headers": headers_wire(tuple(h for h in record.headers if h[0] != "x-dlq")),
    }


def group_info(service: GroupService, rt: GroupRuntime) -> dict[str, Any]:
    spec, owner = rt.spec, service.engine.public_key.hex()
    return {
        "group": rt.name,
        "address": f"{owner}/{rt.name}",
        "owner": owner,
        "running": True,
        "sources": list(spec.sources),
        "dlq": rt.dlq,
        "filter": spec.filter,
        "max_attempts": spec.max_attempts,
        "visibility_s": spec.visibility_s,
        "retry_backoff_s": spec.backoff_base_s,
        "backoff_cap_s": spec.backoff_cap_s,
        "retention_s": spec.retention_s,
        "max_consumers": spec.max_consumers,
        "max_in_flight": spec.max_in_flight,
        "description": spec.description,
    }


def settled_reply(changes: Changes) -> Reply:
    reply: Reply = {"correlation_id": changes.correlation_id}
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


# ------------------------------------------------------------------ groups


@handler("group_create")
async def group_create(ctx: Context, request: Request) -> Reply:
    service = service_of(ctx)
    queues = request.get("queues")
    if not isinstance(queues, list) or not queues or not all(isinstance(q, str) for q in queues):
        raise MalformedError("argument 'queues' must be a non-empty list of queue names")
    settings: dict[str, Any] = {}
    for wire, field in (
        ("visibility_s", "visibility_s"),
        ("retry_backoff_s", "backoff_base_s"),
        ("backoff_cap_s", "backoff_cap_s"),
        ("retention_s", "retention_s"),
    ):
        value = arg_seconds(request, wire, positive=wire == "visibility_s")
        if value is not None:
            settings[field] = value
    for name in ("max_attempts", "max_consumers", "max_in_flight"):
        if request.get(name) is not None:
            settings[name] = _count(request, name, 2**32 - 1)
    for name in ("filter", "description"):
        text = arg_str(request, name, optional=True)
        if text is not None:
            settings[name] = text
    rt = await service.create(arg_str(request, "name"), queues, **settings)
    return {"group": group_info(service, rt)}


@handler("group_list")
async def group_list(ctx: Context, request: Request) -> Reply:
    service = service_of(ctx)
    groups = [group_info(service, rt) for rt in service.running()]
    engine = service.engine
    for q in engine.queues(KIND_GROUP):  # replicas of groups other daemons run
        if not engine.owned(q):
            state = engine.state(q)
            groups.append(
                {
                    "group": engine.address(q),
                    "address": engine.address(q),
                    "owner": state.owner.hex(),
                    "running": False,
                }
            )
    return {"groups": groups}


@handler("group_stats")
async def group_stats(ctx: Context, request: Request) -> Reply:
    service = service_of(ctx)
    address = arg_str(request, "group")
    rt = service.find_running(address)
    if rt is not None:
        stats = rt.dispatcher.stats(service.now())
        return {
            "stats": {
                "group": rt.name,
                "running": True,
                "available": stats.available,
                "leased": stats.leased,
                "done": stats.done,
                "failed": stats.failed,
                "dead": stats.dead,
                "consumers": stats.consumers,
                "ack_floor": dict(stats.ack_floor),
                "oldest_age_s": stats.oldest_age_s,
                "ends": _ends(service, rt.sources),
                "log": _log(service, rt.q),
            }
        }
    return {"stats": await _replica_stats(service, address)}


def _ends(service: GroupService, sources: tuple[str, ...]) -> dict[str, int | None]:
    engine, ends = service.engine, {}
    for sid in sources:
        owner, name = parse_source_id(sid)
        q = engine.find(owner, name)
        ends[sid] = engine.state(q).held_end if q is not None else None
    return ends


def _log(service: GroupService, q: int) -> dict[str, int]:
    """Where the group log stands (its start moves up when it is compacted to a snapshot)."""
    state = service.engine.state(q)
    return {"start": state.start, "end": state.held_end, "version": state.version}


def _unsettled(progress: GroupProgress, end: int | None) -> int | None:
    if end is None:
        return None
    return max(0, end - progress.ack_floor - len(progress.acked) - len(progress.dead))


async def _replica_stats(service: GroupService, address: str) -> dict[str, Any]:
    """What a replica of a group log tells: floors and settled sets (leases are local to the owner)."""
    state, spec, progress = await service.replica_progress(address)
    dlq = f"{state.owner.hex()}/{spec.name}.dlq"
    sources = (*spec.sources, dlq)
    ends = _ends(service, sources)
    empty = GroupProgress()
    floors = {sid: progress.get(sid, empty).ack_floor for sid in sources}
    pending = [_unsettled(progress.get(sid, empty), ends[sid]) for sid in spec.sources]
    parked = _unsettled(progress.get(dlq, empty), ends[dlq])
    return {
        "group": f"{state.owner.hex()}/{spec.name}",
        "running": False,
        "available": None,
        "leased": None,
        "done": None,
        "pending": None if None in pending else sum(p for p in pending if p is not None),
        "failed": sum(len(progress.get(sid, empty).attempts) for sid in spec.sources),
        "dead": None if parked is None else max(0, parked - len(progress.get(dlq, empty).released)),
        "acked_above_floor": {sid: len(progress.get(sid, empty).acked) for sid in sources},
        "ack_floor": floors,
        "ends": ends,
        "log": {"start": state.start, "end": state.held_end, "version": state.version},
    }


@handler("group_inspect")
async def group_inspect(ctx: Context, request: Request) -> Reply:
    """One record as the group sees it: state, attempts so far, their history, the live lease."""
    service = service_of(ctx)
    rt = runtime_of(ctx, request)
    owner, name = service.engine.parse_address(arg_str(request, "queue"))
    view = rt.dispatcher.inspect(f"{owner.hex()}/{name}", arg_int(request, "offset"), service.now())
    return {
        "task": {
            "queue": view.queue,
            "offset": view.offset,
            "state": view.state,
            "attempts": view.attempts,
            "correlation_id": view.correlation_id,
            "history": [attempt_wire(a) for a in view.history],
            "lease": view.lease.token if view.lease else None,
            "expires_at": view.lease.expires_at if view.lease else None,
            "retry_at": view.retry_at,
        }
    }


# ------------------------------------------------------------------ leases


@stream("dequeue")
async def dequeue(ctx: Context, conn: Connection, request: Request) -> bool:
    """Lease one record (``wait``: block up to that long for one); reply ``{"lease": ... | None}``."""
    service, rt = service_of(ctx), runtime_of(ctx, request)
    visibility = arg_seconds(request, "visibility", positive=True)
    wait = arg_seconds(request, "wait")
    consumer = consumer_id()
    lease: Grant | None = None
    failure: LatticedError | None = None
    gone = False
    if not wait:
        lease = await service.dequeue(rt, consumer, visibility, None)
    else:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal gone
                if not await conn.watch():
                    gone = True
                    nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            try:
                lease = await service.dequeue(rt, consumer, visibility, wait)
            except LatticedError as exc:
                failure = exc
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if not gone:
        try:
            await conn.send({"id": request.get("id"), "ok": True, "lease": lease and lease_wire(rt, lease)})
            return True
        except _CLOSED:
            pass
    if lease is not None:  # granted to a client that left: give it back at once
        await service.nack(rt, lease.token, 0.0)
    return False


@handler("ack")
async def ack(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return settled_reply(await service.ack(rt, arg_str(request, "lease")))


@handler("nack")
async def nack(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    delay = arg_seconds(request, "delay")
    return settled_reply(await service.nack(rt, arg_str(request, "lease"), delay))


@handler("extend")
async def extend(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    visibility = arg_seconds(request, "visibility", positive=True)
    if visibility is None:
        raise MalformedError("argument 'visibility' (seconds) is required")
    lease = service.extend(rt, arg_str(request, "lease"), visibility)
    return {"correlation_id": lease.correlation_id, "expires_at": lease.expires_at}


@handler("ack_up_to")
async def ack_up_to(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    changes = await service.ack_up_to(rt, arg_str(request, "queue"), arg_int(request, "offset"))
    return {"acked": len(changes.done)}


# ------------------------------------------------------------------ dead letters


@handler("dlq_list")
async def dlq_list(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    limit = _count(request, "limit", MAX_DLQ_LIST) or MAX_DLQ_LIST
    letters = service.dead_letters(rt, limit)
    return {"dlq": rt.dlq, "dead_letters": [dead_letter_wire(d) for d in letters]}


@handler("dlq_show")
async def dlq_show(ctx: Context, request: Request) -> Reply:
    rt = runtime_of(ctx, request)
    return {"dead_letter": dead_letter_wire(rt.dispatcher.inspect_dead_letter(arg_int(request, "offset")))}


@handler("dlq_redrive")
async def dlq_redrive(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return {"count": await service.redrive(rt, arg_offsets(request))}


@handler("dlq_purge")
async def dlq_purge(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return {"count": await service.purge(rt, arg_offsets(request))}


__all__ = ["arg_seconds", "dead_letter_wire", "lease_wire", "runtime_of", "service_of", "settled_reply"]
