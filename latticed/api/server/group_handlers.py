"""The work-queue ops of the local API (consumer groups, leases, dead letters).

Every op names its group as ``group`` (``NAME`` or ``OWNER/NAME``). Only the daemon that owns a group
grants its leases: the lease ops on another daemon's group (``dequeue``, ``subscribe``, ``ack``, ``nack``,
``extend``, ``ack_up_to``, ``group_inspect``) are forwarded to its owner (:mod:`latticed.groups.remote`).
``group_stats`` on a replica shows the owner's live counts when a link to it is up, else what the
replicated group log says (marked ``stale``).
The consumer is the connection (:mod:`latticed.api.server.consumer_id`). ``dequeue`` is a stream op so that a
client that hangs up while waiting is noticed (it does not get a lease it cannot receive); ``subscribe``
lives in
:mod:`latticed.api.server.subscribe`. Replies that settle or return a record echo its ``correlation_id``.

Why one module: it is the work-queue part of the op table, a short handler per op, and the handlers share
the argument readers and the one local-or-forwarded routing (``remote_of``/``service_of``) that decides
where each op runs; read side by side they show that every op routes the same way. Subscriptions, the
long-lived streams, are their own modules.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import trio

from latticed.api.messages import arg_int, arg_number, arg_str
from latticed.api.server.connection import Connection
from latticed.api.server.consumer_id import consumer_id
from latticed.api.server.context import Context, Handler, Reply, Request, StreamHandler
from latticed.crdt.group import GroupProgress
from latticed.crdt.head import KIND_GROUP
from latticed.crdt.signing import parse_public_key
from latticed.errors import LatticedError, MalformedError
from latticed.groups.remote import (
    STATS_WITHIN_S,
    RemoteGroup,
    RemoteGroups,
    describe_policy,
    policy_meta,
    remote_policy,
)
from latticed.groups.replica_dlq import STALE_NOTE, replica_dead_letters
from latticed.groups.runtime import GroupRuntime
from latticed.groups.service import DELETED_META_KEY, GroupService
from latticed.groups.views import (
    attempt_wire,
    counts,
    headers_wire,
    lease_wire,
    live_stats,
    settled_reply,
    source_ends,
    task_wire,
)
from latticed.leases.outcomes import DeadLetter
from latticed.protocol.lease_forwarding import error_for

#: Longest accepted duration argument (a day): longer is almost surely a unit mistake.
MAX_SECONDS: Final = 86_400.0
MAX_DLQ_LIST: Final = 10_000
MAX_REASON_CHARS: Final = 1024
MAX_CLAIM: Final = 10_000
_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)
T = TypeVar("T")


# ------------------------------------------------------------------ arguments


def service_of(ctx: Context) -> GroupService:
    if ctx.groups is None:
        raise LatticedError("work queues are not running in this daemon")
    return ctx.groups


def runtime_of(ctx: Context, request: Request) -> GroupRuntime:
    return service_of(ctx).runtime(arg_str(request, "group"))


def remote_of(ctx: Context, request: Request) -> tuple[RemoteGroups, RemoteGroup] | None:
    """The group's owner when another daemon owns it (its lease ops are forwarded there)."""
    remote = ctx.remote_groups
    if remote is None:
        return None
    target = remote.target(arg_str(request, "group"))
    return None if target is None else (remote, target)


def arg_reason(request: Request) -> str:
    reason = arg_str(request, "reason", optional=True) or ""
    if len(reason) > MAX_REASON_CHARS:
        raise MalformedError(f"argument 'reason' is text of at most {MAX_REASON_CHARS} characters")
    return str(reason)


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


def dead_letter_wire(letter: DeadLetter) -> dict[str, Any]:
    info, record = letter.info, letter.record
    return {
        "dlq_offset": letter.dlq_offset,
        "queue": info.source,
        "offset": info.offset,
        "attempts": info.attempts,
        "correlation_id": info.correlation_id,
        "reason": info.reason,
        "last_error": next((a.error for a in reversed(info.history) if a.error), None),
        "dead_at_ms": info.dead_at_ms,
        "history": [attempt_wire(a) for a in info.history],
        "key": record.key,
        "value": record.value,
        "timestamp": record.timestamp,
        "headers": headers_wire(tuple(h for h in record.headers if h[0] != "x-dlq")),
    }


def group_info(service: GroupService, rt: GroupRuntime) -> dict[str, Any]:
    spec, owner = rt.spec, service.engine.public_key.hex()
    try:
        remote: str | list[str] = describe_policy(remote_policy(service.engine.state(rt.q).meta_dict))
    except LatticedError:
        remote = []
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
        "remote_consumers": remote,
    }


def arg_identities(request: Request, name: str) -> list[str] | None:
    """A list of identities (hex), or None."""
    value = request.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MalformedError(f"argument {name!r} is a list of identities (64 hex digits each)")
    return [parse_public_key(v).hex() for v in value]


# ------------------------------------------------------------------ groups


def _settings(request: Request) -> dict[str, Any]:
    """The group settings a request gives (``GroupSpec`` field names), those left out omitted."""
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
    return settings


async def group_create(ctx: Context, request: Request) -> Reply:
    service = service_of(ctx)
    queues = request.get("queues")
    if not isinstance(queues, list) or not queues or not all(isinstance(q, str) for q in queues):
        raise MalformedError("argument 'queues' must be a non-empty list of queue names")
    allowed = arg_identities(request, "remote_consumers")
    meta = {k: v for k, v in policy_meta(allowed).items() if v is not None}
    rt = await service.create(arg_str(request, "name"), queues, extra_meta=meta, **_settings(request))
    return {"group": group_info(service, rt)}


async def group_edit(ctx: Context, request: Request) -> Reply:
    """Change a group's settings; ``remote_consumers``: a list of identities, or "any" (left out: as
    it is). What happens to leases in flight: docs/workqueues.md."""
    service, rt = service_of(ctx), runtime_of(ctx, request)
    settings = _settings(request)
    meta: dict[str, str | None] | None = None
    if request.get("remote_consumers") == "any":
        meta = policy_meta(None)
    elif request.get("remote_consumers") is not None:
        meta = policy_meta(arg_identities(request, "remote_consumers"))
    if not settings and meta is None:
        raise MalformedError("nothing to change: give at least one setting")
    await service.edit(rt, settings, meta)
    return {"group": group_info(service, rt)}


async def group_delete(ctx: Context, request: Request) -> Reply:
    """Delete a group: its leases in flight become unknown, its dead letters are dropped."""
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return {"group": rt.name, **await service.delete(rt)}


async def group_list(ctx: Context, request: Request) -> Reply:
    """Groups run here, then replicas of others' (with their owner's live counts when it is connected)."""
    service = service_of(ctx)
    groups = []
    for rt in service.running():
        groups.append({**group_info(service, rt), **counts(rt.dispatcher.stats(service.now()))})
    engine = service.engine
    replicas: list[dict[str, Any]] = []
    for q in engine.queues(KIND_GROUP):  # replicas of groups other daemons run
        if not engine.owned(q) and DELETED_META_KEY not in engine.state(q).meta_dict:
            state = engine.state(q)
            replicas.append(
                {
                    "group": engine.address(q),
                    "address": engine.address(q),
                    "owner": state.owner.hex(),
                    "running": False,
                }
            )
    remote = ctx.remote_groups
    if remote is not None and replicas:
        async with trio.open_nursery() as nursery:
            for row in replicas:
                nursery.start_soon(_add_live_counts, remote, row)
    return {"groups": groups + replicas}


async def _add_live_counts(remote: RemoteGroups, row: dict[str, Any]) -> None:
    target = remote.target(row["address"])
    assert target is not None
    stats = await _owner_stats(remote, target)
    if stats is None:
        row.update(live=False, stale="the owner is not connected: no live counts")
        return
    row["live"] = True
    for key in ("available", "leased", "done", "failed", "dead", "consumers"):
        row[key] = stats.get(key)


async def _owner_stats(remote: RemoteGroups, target: RemoteGroup) -> dict[str, Any] | None:
    """The owner's live stats if a link to it is up and it answers in time (never dials for them)."""
    if not remote.connected(target):
        return None
    try:
        with trio.fail_after(STATS_WITHIN_S):
            answer = await remote.call(target, "stats", {}, connect_within=0)
    except (LatticedError, trio.TooSlowError):
        return None
    stats = answer.get("stats")
    return stats if isinstance(stats, dict) else None


async def group_stats(ctx: Context, request: Request) -> Reply:
    service = service_of(ctx)
    address = arg_str(request, "group")
    rt = service.find_running(address)
    if rt is not None:
        return {"stats": live_stats(service.engine, rt, service.now())}
    found = remote_of(ctx, request)
    live = await _owner_stats(*found) if found is not None else None
    if live is not None:
        target = found[1] if found is not None else None
        return {
            "stats": {**live, "group": target.address if target else address, "running": False, "live": True}
        }
    stats = await _replica_stats(service, address)
    stats["live"] = False
    stats["stale"] = (
        "the owner is not connected: counts are from this daemon's copy of the group log (acks, dead "
        "letters and attempt counts as of its last update; leases live on the owner only)"
    )
    return {"stats": stats}


def _unsettled(progress: GroupProgress, end: int | None) -> int | None:
    if end is None:
        return None
    return max(0, end - progress.ack_floor - len(progress.acked) - len(progress.dead))


async def _replica_stats(service: GroupService, address: str) -> dict[str, Any]:
    """What a replica of a group log tells: floors and settled sets (leases are local to the owner)."""
    state, spec, progress = await service.replica_progress(address)
    dlq = f"{state.owner.hex()}/{spec.name}.dlq"
    sources = (*spec.sources, dlq)
    ends = source_ends(service.engine, sources)
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


async def group_inspect(ctx: Context, request: Request) -> Reply:
    """One record as the group sees it: state, attempts so far, their history, the live lease."""
    service = service_of(ctx)
    owner, name = service.engine.parse_address(arg_str(request, "queue"))
    offset = arg_int(request, "offset")
    found = remote_of(ctx, request)
    if found is not None:
        remote, target = found
        answer = await remote.call(target, "inspect", {"queue": f"{owner.hex()}/{name}", "offset": offset})
        return {"task": answer.get("task")}
    rt = runtime_of(ctx, request)
    view = await service.inspect(rt, f"{owner.hex()}/{name}", offset)
    return {"task": task_wire(view)}


# ------------------------------------------------------------------ leases


async def dequeue(ctx: Context, conn: Connection, request: Request) -> bool:
    """Lease one record (``wait``: block up to that long for one); reply ``{"lease": ... | None}``."""
    found = remote_of(ctx, request)
    if found is not None:
        return await _dequeue_remote(conn, request, *found)
    service, rt = service_of(ctx), runtime_of(ctx, request)
    visibility = arg_seconds(request, "visibility", positive=True)
    wait = arg_seconds(request, "wait")
    consumer = consumer_id()
    lease, gone = await _unless_client_leaves(
        conn, bool(wait), lambda: service.dequeue(rt, consumer, visibility, wait), None
    )
    if not gone:
        try:
            await conn.send(
                {"id": request.get("id"), "ok": True, "lease": lease and lease_wire(rt.name, lease)}
            )
            return True
        except _CLOSED:
            pass
    if lease is not None:  # granted to a client that left: give it back at once
        await service.nack(rt, lease.token, 0.0)
    return False


async def _dequeue_remote(
    conn: Connection, request: Request, remote: RemoteGroups, target: RemoteGroup
) -> bool:
    """``dequeue`` of another daemon's group: the owner leases, the record is read here if it is here.
    The owner unreachable: wait up to ``wait`` for it, then OwnerUnreachableError."""
    visibility = arg_seconds(request, "visibility", positive=True)
    wait = arg_seconds(request, "wait")
    consumer = consumer_id()
    none: list[dict[str, Any]] = []
    leases, gone = await _unless_client_leaves(
        conn, bool(wait), lambda: remote.take(target, consumer, 1, visibility, wait, op="dequeue"), none
    )
    if not gone:
        try:
            await conn.send({"id": request.get("id"), "ok": True, "lease": leases[0] if leases else None})
            return True
        except _CLOSED:
            pass
    remote.give_back(target, [lease["lease"] for lease in leases])
    return False


async def _unless_client_leaves(
    conn: Connection, watch: bool, call: Callable[[], Awaitable[T]], default: T
) -> tuple[T, bool]:
    """``call()``; with ``watch``, cancelled when the client hangs up meanwhile (a blocking dequeue must
    not lease to nobody): then ``(default, True)``. Its error is raised as it is, not in a group."""
    result, gone = default, False
    failure: LatticedError | None = None
    async with trio.open_nursery() as nursery:

        async def watcher() -> None:
            nonlocal gone
            if not await conn.watch():
                gone = True
                nursery.cancel_scope.cancel()

        if watch:
            nursery.start_soon(watcher)
        try:
            result = await call()
        except LatticedError as exc:
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result, gone


def _result(result: Any) -> Reply:
    """One per-lease result of a forwarded ack: the reply, or its typed error raised."""
    if not isinstance(result, dict):
        raise MalformedError("the owner's answer to ack is malformed")
    if not result.get("ok"):
        error = result.get("error") or {}
        raise error_for(str(error.get("code", "error")), str(error.get("message", "")))
    return {k: v for k, v in result.items() if k != "ok"}


async def ack(ctx: Context, request: Request) -> Reply:
    token = arg_str(request, "lease")
    found = remote_of(ctx, request)
    if found is not None:
        remote, target = found
        [result] = await remote.ack_many(target, [token])
        return _result(result)
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return settled_reply(await service.ack(rt, token))


async def nack(ctx: Context, request: Request) -> Reply:
    token = arg_str(request, "lease")
    delay = arg_seconds(request, "delay")
    reason = arg_reason(request)
    found = remote_of(ctx, request)
    if found is not None:
        remote, target = found
        answer = await remote.settle(target, "nack", {"lease": token, "delay": delay, "reason": reason})
        return dict(answer)
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return settled_reply(await service.nack(rt, token, delay, reason))


async def extend(ctx: Context, request: Request) -> Reply:
    visibility = arg_seconds(request, "visibility", positive=True)
    if visibility is None:
        raise MalformedError("argument 'visibility' (seconds) is required")
    token = arg_str(request, "lease")
    found = remote_of(ctx, request)
    if found is not None:
        remote, target = found
        answer = await remote.settle(target, "extend", {"lease": token, "visibility": visibility})
        return {"correlation_id": answer.get("correlation_id"), "expires_at": answer.get("expires_at")}
    service, rt = service_of(ctx), runtime_of(ctx, request)
    lease = service.extend(rt, token, visibility)
    return {"correlation_id": lease.correlation_id, "expires_at": lease.expires_at}


async def ack_up_to(ctx: Context, request: Request) -> Reply:
    queue, offset = arg_str(request, "queue"), arg_int(request, "offset")
    found = remote_of(ctx, request)
    if found is not None:
        remote, target = found
        owner, name = remote.engine.parse_address(queue)
        answer = await remote.settle(
            target, "ack_up_to", {"queue": f"{owner.hex()}/{name}", "offset": offset}
        )
        return {"acked": answer.get("acked")}
    service, rt = service_of(ctx), runtime_of(ctx, request)
    changes = await service.ack_up_to(rt, queue, offset)
    return {"acked": len(changes.done)}


async def claim(ctx: Context, request: Request) -> Reply:
    """Take over leases idle at least ``min_idle`` seconds (at most ``count``): ``{"leases": [...]}``."""
    min_idle = arg_seconds(request, "min_idle")
    if min_idle is None:
        raise MalformedError("argument 'min_idle' (seconds) is required")
    count = arg_int(request, "count", default=1)
    if not 1 <= count <= MAX_CLAIM:
        raise MalformedError(f"argument 'count' is an integer in [1, {MAX_CLAIM}]")
    visibility = arg_seconds(request, "visibility", positive=True)
    found = remote_of(ctx, request)
    if found is not None:
        remote, target = found
        return {"leases": await remote.claim(target, consumer_id(), min_idle, count, visibility)}
    service, rt = service_of(ctx), runtime_of(ctx, request)
    leases = await service.claim(rt, consumer_id(), min_idle, count, visibility)
    return {"leases": [lease_wire(rt.name, lease) for lease in leases]}


# ------------------------------------------------------------------ dead letters


def _replica(service: GroupService, request: Request) -> bool:
    """Whether the group is another daemon's (this one may hold a replica of it)."""
    owner, _ = service.engine.parse_address(arg_str(request, "group"))
    return owner != service.engine.public_key


async def dlq_list(ctx: Context, request: Request) -> Reply:
    """Parked dead letters: the running group's, or (another daemon's group) those of this replica."""
    service = service_of(ctx)
    limit = _count(request, "limit", MAX_DLQ_LIST) or MAX_DLQ_LIST
    if _replica(service, request):
        dlq, letters = await replica_dead_letters(service, arg_str(request, "group"), limit)
        return {"dlq": dlq, "dead_letters": [dead_letter_wire(d) for d in letters], "stale": STALE_NOTE}
    rt = runtime_of(ctx, request)
    letters = service.dead_letters(rt, limit)
    return {"dlq": rt.dlq, "dead_letters": [dead_letter_wire(d) for d in letters]}


async def dlq_show(ctx: Context, request: Request) -> Reply:
    offset = arg_int(request, "offset")
    if _replica(service_of(ctx), request):
        _, [letter] = await replica_dead_letters(service_of(ctx), arg_str(request, "group"), only=offset)
        return {"dead_letter": dead_letter_wire(letter), "stale": STALE_NOTE}
    rt = runtime_of(ctx, request)
    return {"dead_letter": dead_letter_wire(rt.dispatcher.inspect_dead_letter(offset))}


async def dlq_redrive(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return {"count": await service.redrive(rt, arg_offsets(request))}


async def dlq_purge(ctx: Context, request: Request) -> Reply:
    service, rt = service_of(ctx), runtime_of(ctx, request)
    return {"count": await service.purge(rt, arg_offsets(request))}


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "group_create": group_create,
    "group_edit": group_edit,
    "group_delete": group_delete,
    "group_list": group_list,
    "group_stats": group_stats,
    "group_inspect": group_inspect,
    "ack": ack,
    "nack": nack,
    "extend": extend,
    "ack_up_to": ack_up_to,
    "claim": claim,
    "dlq_list": dlq_list,
    "dlq_show": dlq_show,
    "dlq_redrive": dlq_redrive,
    "dlq_purge": dlq_purge,
}
STREAMS: dict[str, StreamHandler] = {
    "dequeue": dequeue,
}


__all__ = [
    "arg_reason",
    "arg_seconds",
    "dead_letter_wire",
    "lease_wire",
    "remote_of",
    "runtime_of",
    "service_of",
    "settled_reply",
]
