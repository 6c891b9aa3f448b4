"""The local API's request/reply operations: check arguments, call the engine, shape the reply.

One async function per op, listed in :data:`OPS` (and the pipelined writes in :data:`PIPELINED`); the
op table (:mod:`latticed.api.server.op_table`) gathers them with the other handler modules'. Handlers raise
:class:`~latticed.errors.LatticedError` for anything the client got wrong; the server turns that into an
error reply. ``tail`` is not here: it streams, so the server runs it (:mod:`latticed.api.server.tail`).

Why one module: it is the request/reply ops of queues, metadata, KV, sealed queues and status (one short
function per op), which read best whole: every op's argument checks and reply shape sit side by side.
Work-queue, membership, peer, retention and store ops and the streams live in their own modules; offers
into other daemons' queues and idempotent offers are handed to :mod:`.produce_handlers`.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from latticed.api.messages import (
    SUPPORTED_VERSIONS,
    arg_bool,
    arg_bytes,
    arg_int,
    arg_number,
    arg_str,
    parse_headers,
    versions_reply,
)
from latticed.api.server import core2_handlers, produce_handlers
from latticed.api.server.context import Begun, Context, Handler, PipelinedHandler, Reply, Request
from latticed.api.server.offer_layouts import offer_records
from latticed.api.server.queue_listing import Listed
from latticed.crdt import kv
from latticed.crdt.group import DLQ_META_KEY, is_dlq_name
from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.kvplan import KvRequest, hash_field, visible
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Record,
    RecordRun,
    check_record,
    check_records,
)
from latticed.crdt.signing import parse_public_key
from latticed.errors import MalformedError, NotFoundError, NotOwnerError
from latticed.host.core2_reach import core2_blind_peers
from latticed.host.retention_policy import check_meta, check_meta_entry
from latticed.produce.offered_columns import OfferedColumns
from latticed.storage.core2_view import Core2View
from latticed.storage.corruption import CorruptQueueError
from latticed.storage.jobs import Job
from latticed.storage.reader import Columns, RawRow
from latticed.storage.sealer import check_user_meta
from latticed.version import RELEASE

MAX_READ_RECORDS = 100_000


# ------------------------------------------------------------------ replies


def columns_reply(columns: Columns) -> Reply:
    return {
        "offsets": columns.offsets,
        "keys": columns.keys,
        "values": columns.values,
        "timestamps": columns.timestamps,
        "headers": columns.headers,
    }


def entry_wire(offset: int, row: RawRow | None) -> list[Any] | None:
    if row is None:
        return None
    key, value, ts, headers = row
    return [offset, key, value, ts, headers]


def queue_info(ctx: Context, q: int) -> dict[str, Any]:
    state = ctx.engine.state(q)
    return {
        "owner": state.owner.hex(),
        "name": state.name,
        "queue": f"{state.owner.hex()}/{state.name}",
        "start_offset": state.start,
        "end_offset": state.visible_end,  # a forked queue's reads stop there
        "size": state.visible_end - state.start,
        "meta": state.meta_dict,
        "forked": state.forked,
        "fork_proof": state.fork.digest().hex() if state.fork is not None else None,
        "known_end": state.known_end,
        "version": state.version,
        "owned": state.owner == ctx.engine.public_key,
        "core": 1,
        "created_ms": ctx.engine.created_ms(q),
        "sealed": ctx.sealer.describe(q),
        **({"floor": state.floor} if state.floor else {}),  # this replica dropped the records below
    }


# ------------------------------------------------------------------ node


async def hello(ctx: Context, request: Request) -> Reply:
    return {
        "versions": list(SUPPORTED_VERSIONS),
        "server": f"latticed/{ctx.version}",
        "release": RELEASE,
        "max_frame_bytes": ctx.max_frame_bytes,
        "queue_cores": [1, 2],  # the fork cores queue_create takes (absent: core 1 only)
        "default_queue_core": ctx.default_queue_core,  # what queue_create makes without ``core``
    }


async def versions(ctx: Context, request: Request) -> Reply:
    return versions_reply()


async def identity(ctx: Context, request: Request) -> Reply:
    return {"identity": ctx.engine.public_key.hex()}


async def status(ctx: Context, request: Request) -> Reply:
    engine = ctx.engine
    if ctx.health is not None:
        await ctx.health.refresh_disk()  # free space as it is now, not up to a sampling interval ago
    queues = engine.queues()
    records = 0
    for q in queues:
        state = engine.state(q)
        records += state.held_end - state.start
    for q in engine.core2.queues():
        try:
            start, end = (await engine.core2.value(q)).held
        except CorruptQueueError:
            continue  # named in ``corrupt_queues``: one bad queue must not hide the rest of the status
        records += end - start
    queues = [*queues, *engine.core2.queues()]
    return {
        "status": {
            "identity": engine.public_key.hex(),
            "version": ctx.version,
            "uptime_s": round(time.monotonic() - ctx.started, 3),
            "queues": len(queues),
            "records": records,
            "storage_bytes": engine.storage_bytes(),
            "data_dir": str(ctx.data_dir),
            "socket": str(ctx.socket_path),
            "listen": ctx.replication.listen if ctx.replication else None,
            "metrics": ctx.metrics_listen,
            "transactions": engine.transactions,
            "replication_lag": ctx.replication.lag() if ctx.replication else {},
            "replication": ctx.replication.counters() if ctx.replication else None,
            "cut_off_queues": ctx.replication.cut_off_queues() if ctx.replication else [],
            "forked_queues": await core2_handlers.forks(ctx),
            "corrupt_queues": core2_handlers.corrupt(ctx),
            "disk": ctx.health.disk_status() if ctx.health else None,
            "clock_skew": ctx.replication.clock_skew() if ctx.replication else [],
            "incompatible_peers": ctx.replication.incompatible_peers() if ctx.replication else [],
            "core2_blind_peers": (
                core2_blind_peers(ctx.replication.peers(), core2_handlers.core2_count(ctx))
                if ctx.replication
                else []
            ),
            "identity_runs": ctx.replication.identity_status() if ctx.replication else None,
            "retention": ctx.retention.counters_dict() if ctx.retention else None,
        }
    }


async def peers(ctx: Context, request: Request) -> Reply:
    """Known peers, and ``other_networks``: daemons mDNS hears on the LAN under another network key (None:
    mDNS is off; absent from older daemons)."""
    service = ctx.replication
    return {
        "peers": service.peers() if service else [],
        "other_networks": service.other_networks() if service else None,
    }


# ------------------------------------------------------------------ queues


def _not_reserved(name: str | None, meta: dict[str, Any]) -> None:
    """Queue names ending in .dlq and the dlq_of metadata key belong to groups' dead-letter queues."""
    if name is not None and is_dlq_name(name):
        raise MalformedError(
            f"queue names ending in .dlq are reserved for the dead-letter queues of groups ({name!r})"
        )
    if DLQ_META_KEY in meta:
        raise MalformedError(
            f"metadata key {DLQ_META_KEY!r} is reserved for the dead-letter queues of groups"
        )


def _not_a_dlq(ctx: Context, q: int) -> None:
    """Only a group writes its dead-letter queue (``latticectl dlq`` manages it)."""
    if ctx.engine.core2.holds(q):
        return  # groups (and their dead-letter queues) are on fork core 1
    state = ctx.engine.state(q)
    if is_dlq_name(state.name) and DLQ_META_KEY in state.meta_dict:
        raise NotOwnerError(
            f"{ctx.engine.address(q)} is the dead-letter queue of group {state.meta_dict[DLQ_META_KEY]}: "
            "only the group writes to it (see latticectl dlq)"
        )


async def queue_create(ctx: Context, request: Request) -> Reply:
    name = arg_str(request, "name")
    meta = request.get("meta") or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise MalformedError("argument 'meta' must be a map of text to text")
    check_user_meta(meta)
    check_meta(meta)
    _not_reserved(name, meta)
    readers = request.get("readers")  # a list (maybe empty) of reader identities: a sealed queue
    core = arg_int(request, "core", optional=True)  # the fork core (docs/lattice.md)
    if readers is not None:
        if core is not None and core != 1:
            raise MalformedError(
                "a sealed queue is on fork core 1 only: create it without --core, or with --core 1"
            )
        q = await ctx.sealer.create_queue(name, meta, parse_readers(readers))
        return {"queue": ctx.engine.address(q), "core": 1}
    core = ctx.default_queue_core if core is None else core  # absent (an older client): the daemon's
    q = await ctx.engine.create_queue(name, meta, core=core)
    return {"queue": ctx.engine.address(q), "core": core}


def parse_readers(raw: Any) -> list[bytes]:
    """Reader identities from the wire: a list of hex public keys."""
    if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
        raise MalformedError("argument 'readers' must be a list of hex public keys")
    return [parse_public_key(r) for r in raw]


async def queue_list(ctx: Context, request: Request) -> Reply:
    """Owned queues first, then by owner and name (entries cached per committed state: queue_listing.py)."""
    engine = ctx.engine
    core2 = engine.core2
    more = Listed(core2.queues, core2.loaded_lookup(), _load2(core2), _info2(core2), followed=True)
    queues = await ctx.listing.reply(
        engine.queues(), engine.state, lambda q, _: queue_info(ctx, q), more=(more,)
    )
    return {"queues": queues}


def _info2(core2: Core2View) -> Callable[[int, QueueState2], dict[str, Any]]:
    """A core-2 queue's entry; KeyError once it is dropped, or if of another kind (a group's, say: the
    commits the listing hears of are of every kind), so left out of the list."""

    def info(q: int, state: QueueState2) -> dict[str, Any]:
        if not core2.holds(q) or state.kind != KIND_QUEUE:
            raise KeyError(q)
        return core2.info(q, state)

    return info


def _load2(core2: Core2View) -> Callable[[int], Awaitable[QueueState2]]:
    async def load(q: int) -> QueueState2:
        try:
            return await core2.value(q)
        except (NotFoundError, CorruptQueueError):
            raise KeyError(q) from None  # dropped meanwhile, or corrupt (doctor lists it): left out

    return load


async def info_of(ctx: Context, request: Request) -> Reply:
    q = ctx.queue(request)
    if ctx.engine.core2.holds(q):
        return {"info": ctx.engine.core2.info(q, await ctx.engine.core2.value(q))}
    return {"info": queue_info(ctx, q)}


def _record(value: Any, key: Any, headers: Any, now: int) -> Record:
    """A record from wire values, checked as :func:`check_record` would (cheaply when it is plain)."""
    if type(value) is not bytes or (key is not None and type(key) is not bytes):
        raise MalformedError("record values are bytes and keys bytes or nil")
    if headers:
        record = Record(value, key, now, parse_headers(headers))
        check_record(record)
        return record
    if len(value) > MAX_VALUE_BYTES or (key is not None and len(key) > MAX_KEY_BYTES):
        raise MalformedError(f"record values are at most {MAX_VALUE_BYTES} bytes, keys {MAX_KEY_BYTES}")
    return Record(value, key, now, ())


def offer(ctx: Context, request: Request) -> Begun:
    if produce_handlers.produced(ctx, request):  # another daemon's queue, or a producer id and sequence
        return produce_handlers.begin_offer(ctx, request)
    q = ctx.queue(request, writing=True)
    # ``_not_a_dlq`` then ``_start_append``, with the core-2 question asked once (an offer's hot path).
    core2 = ctx.engine.core2
    on_core2 = core2.holds(q)
    if not on_core2:
        _not_a_dlq(ctx, q)
    record = _record(request.get("value"), request.get("key"), request.get("headers"), ctx.engine.clock())
    if on_core2:
        return core2.start_commit(q, (record,), checked=True), _offset_reply
    return ctx.sealer.start_append(q, (record,)), _offset_reply


def _start_append(ctx: Context, q: int, records: Sequence[Record]) -> Job:
    """The append of ``records`` (checked) to ``q``: a core-2 queue's straight to its commit (it is never
    sealed; asking the sealer would raise and catch an error per request to learn that)."""
    core2 = ctx.engine.core2
    if core2.holds(q):
        return core2.start_commit(q, records, checked=True)
    return ctx.sealer.start_append(q, records)


def _offset_reply(offset: int) -> Reply:
    return {"offset": offset}


def offer_batch(ctx: Context, request: Request) -> Begun:
    if produce_handlers.produced(ctx, request):
        return produce_handlers.begin_offer_batch(ctx, request)
    q = ctx.queue(request, writing=True)
    _not_a_dlq(ctx, q)
    raw = offer_records(request)
    now = ctx.engine.clock()
    if not isinstance(raw, OfferedColumns):
        records = _record_run(raw, now)
    elif raw.stamps is not None:
        raise MalformedError("record timestamps are taken from an idempotent offer only (with 'producer')")
    elif raw.plain:  # the columns as they came: no list, no Record
        records = RecordRun(raw.values, raw.keys, [now] * len(raw))
        check_records(records)
    else:
        records = _record_run(raw.rows(), now)
    return _start_append(ctx, q, records), functools.partial(_batch_reply, len(records))


def _batch_reply(count: int, first: int) -> Reply:
    return {"first": first, "count": count}


def _record_run(raw: list[Any], now: int) -> RecordRun:
    """The records of an ``offer_batch`` as one checked run, built a column at a time (no Record each)."""
    if set(map(type, raw)) != {list} or set(map(len, raw)) != {3}:
        raise MalformedError("each record is [value, key, headers]")
    values, keys, header_items = zip(*raw, strict=True)
    headers = [parse_headers(h) if h else () for h in header_items] if any(header_items) else None
    run = RecordRun(values, keys, [now] * len(values), headers)
    check_records(run)
    return run


async def peek(ctx: Context, request: Request) -> Reply:
    q = ctx.queue(request)
    offset = arg_int(request, "offset")
    row = ctx.sealer.open_row(q, offset, await ctx.engine.row(q, offset))
    return {"value": None if row is None else row[1]}


async def peek_entry(ctx: Context, request: Request) -> Reply:
    q = ctx.queue(request)
    offset = arg_int(request, "offset")
    row = ctx.sealer.open_row(q, offset, await ctx.engine.row(q, offset))
    return {"queue": ctx.engine.address(q), "entry": entry_wire(offset, row)}


async def first(ctx: Context, request: Request) -> Reply:
    q = ctx.queue(request)
    start, end = await ctx.engine.bounds(q)
    row = await ctx.engine.row(q, start) if end > start else None
    row = ctx.sealer.open_row(q, start, row)
    return {"queue": ctx.engine.address(q), "entry": entry_wire(start, row)}


async def last(ctx: Context, request: Request) -> Reply:
    q = ctx.queue(request)
    start, end = await ctx.engine.bounds(q)
    offset = end - 1
    row = await ctx.engine.row(q, offset) if end > start else None
    row = ctx.sealer.open_row(q, offset, row)
    return {"queue": ctx.engine.address(q), "entry": entry_wire(offset, row)}


def offset_runs(offsets: list[int]) -> list[list[int]]:
    """Sorted offsets as ``[first, last]`` runs (inclusive): a compact list of what was left out."""
    runs: list[list[int]] = []
    for offset in offsets:
        if runs and runs[-1][1] == offset - 1:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset])
    return runs


def _opened(ctx: Context, q: int, columns: Columns, request: Request, *, partial: bool) -> Reply:
    """The reply's columns opened. ``skip_unreadable`` (optional, default false): leave out the records
    of a sealed queue this identity cannot open and name them in ``unreadable`` (``[first, last]`` runs)
    instead of failing (or, for ``partial``, stopping at the first)."""
    sealer = ctx.sealer
    if arg_bool(request, "skip_unreadable", False):
        opened, left_out = sealer.open_readable(q, columns)
        return {**columns_reply(opened), "unreadable": offset_runs(left_out)}
    return columns_reply(sealer.open_columns(q, columns, partial=partial))


async def range_(ctx: Context, request: Request) -> Reply:
    """Records ``[from, to]`` (inclusive), clamped to what the queue holds; all of them or an error
    (``skip_unreadable``: see :func:`_opened`)."""
    q = ctx.queue(request)
    start, end = await ctx.engine.bounds(q)
    lo = max(arg_int(request, "from"), start)
    hi = min(arg_int(request, "to") + 1, end)
    wanted = max(hi - lo, 0)
    columns = await ctx.engine.read(q, lo, hi, wanted, ctx.max_reply_bytes)
    if len(columns) < wanted:
        raise MalformedError(
            f"range of {wanted} records does not fit in one reply ({ctx.max_frame_bytes} bytes): ask for "
            "fewer, or page through them with the read op (`latticectl range` and `tail` page by themselves)"
        )
    return {"queue": ctx.engine.address(q), **_opened(ctx, q, columns, request, partial=False)}


#: ``read``'s reply layouts: ``lists`` (the default: one msgpack array per column) and ``packed``.
READ_LAYOUTS = ("lists", "packed")


def packed_columns_reply(columns: Columns) -> Reply:
    """The ``packed`` layout of ``read``: each column as one buffer, so a reader builds Arrow arrays from
    them without touching single records (little-endian throughout).

    ``first``/``count``: the records are offsets ``first .. first + count - 1`` (``offsets``, int64 each, is
    sent only if they are not consecutive); ``values``: the values concatenated, ``value_lengths`` their
    lengths (int32 each); ``keys``/``key_lengths`` likewise (-1 = no key; ``key_lengths`` is null when no
    record has a key); ``timestamps``: int64 ms each; ``headers``: as in ``lists``, or null when no record
    has headers."""
    n = len(columns)
    offsets, keys, headers = columns.offsets, columns.keys, columns.headers
    key_lengths: bytes | None = None
    key_data = b""
    try:  # every record has a key (the common case): no per-record step in Python
        key_lengths = struct.pack(f"<{n}i", *map(len, keys))  # type: ignore[arg-type]
        key_data = b"".join(keys)  # type: ignore[arg-type]
    except TypeError:  # some have none
        if keys.count(None) < n:
            key_lengths = struct.pack(f"<{n}i", *[-1 if k is None else len(k) for k in keys])
            key_data = b"".join([k for k in keys if k])
    return {
        "layout": "packed",
        "first": offsets[0] if n else 0,
        "count": n,
        "offsets": None if n == 0 or offsets[-1] - offsets[0] == n - 1 else struct.pack(f"<{n}q", *offsets),
        "values": b"".join(columns.values),
        "value_lengths": struct.pack(f"<{n}i", *map(len, columns.values)),
        "keys": key_data,
        "key_lengths": key_lengths,
        "timestamps": struct.pack(f"<{n}q", *columns.timestamps),
        "headers": headers if any(headers) else None,
    }


async def read(ctx: Context, request: Request) -> Reply:
    """Bulk read from an offset, bounded by count and bytes; ``next_offset`` is where to continue.

    ``layout`` (optional): ``lists`` (default) or ``packed`` (:func:`packed_columns_reply`);
    ``skip_unreadable`` (``lists`` only): see :func:`_opened`."""
    q = ctx.queue(request)
    layout = arg_str(request, "layout", optional=True) or "lists"
    if layout not in READ_LAYOUTS:
        raise MalformedError(f"argument 'layout' must be one of {', '.join(READ_LAYOUTS)}, got {layout!r}")
    start, end = await ctx.engine.bounds(q)
    lo = max(arg_int(request, "from"), start)
    max_records = min(max(arg_int(request, "max_records", default=10_000), 1), MAX_READ_RECORDS)
    max_bytes = min(max(arg_int(request, "max_bytes", default=8 << 20), 1), ctx.max_reply_bytes)
    columns = await ctx.engine.read(q, lo, end, max_records, max_bytes)
    if arg_bool(request, "skip_unreadable", False) and layout == "lists":
        reply = _opened(ctx, q, columns, request, partial=True)  # what it left out is passed too
    else:
        columns = ctx.sealer.open_columns(q, columns, partial=True)
        reply = packed_columns_reply(columns) if layout == "packed" else columns_reply(columns)
    start, end = await ctx.engine.bounds(q)
    return {
        "queue": ctx.engine.address(q),
        **reply,
        "next_offset": columns.offsets[-1] + 1 if columns.offsets else max(lo, start),
        "start_offset": start,
        "end_offset": end,
    }


async def truncate(ctx: Context, request: Request) -> Reply:
    """Drop records before ``new_start``; answers how many went and the offsets the queue has after."""
    q = ctx.queue(request, writing=True)
    _not_a_dlq(ctx, q)
    before = await ctx.engine.bounds(q)
    new_start = arg_int(request, "new_start")
    await ctx.engine.truncate(q, new_start)
    after = await ctx.engine.bounds(q)
    dropped = max(min(after[0], before[1]) - before[0], 0)
    return {"dropped": dropped, "start_offset": after[0], "end_offset": after[1]}


async def _meta(ctx: Context, q: int) -> dict[str, str]:
    if ctx.engine.core2.holds(q):
        return dict((await ctx.engine.core2.value(q)).meta)
    return ctx.engine.state(q).meta_dict


async def meta_get(ctx: Context, request: Request) -> Reply:
    q = ctx.queue(request)
    return {"value": (await _meta(ctx, q)).get(arg_str(request, "key"))}


async def meta_list(ctx: Context, request: Request) -> Reply:
    return {"meta": await _meta(ctx, ctx.queue(request))}


async def meta_del(ctx: Context, request: Request) -> Reply:
    """Delete one metadata key of our own queue; a key that is not set signs nothing."""
    q = ctx.queue(request, writing=True)
    key = arg_str(request, "key")
    check_user_meta({key: None})
    _not_reserved(None, {key: None})
    _not_a_dlq(ctx, q)
    if not ctx.engine.owned(q):
        raise NotOwnerError(f"cannot delete metadata: not the owner of {ctx.engine.address(q)}")
    existed = key in await _meta(ctx, q)
    if existed:
        await ctx.engine.set_meta(q, {key: None})
    return {"existed": existed}


async def meta_set(ctx: Context, request: Request) -> Reply:
    q = ctx.queue(request, writing=True)
    key = arg_str(request, "key")
    if not key:
        raise MalformedError("metadata keys are non-empty")
    check_user_meta({key: None})
    _not_reserved(None, {key: None})
    _not_a_dlq(ctx, q)
    value = arg_str(request, "value", optional=True)
    check_meta_entry(key, value)
    await ctx.engine.set_meta(q, {key: value})
    return {}


# ------------------------------------------------------------------ KV


def _owner(request: Request) -> bytes | None:
    owner = arg_str(request, "owner", optional=True)
    return None if owner is None else parse_public_key(owner)


def kv_wire(kind: str | None, value: Any) -> Reply:
    if kind == kv.SET:
        return {"kind": kind, "value": sorted(value)}
    return {"kind": kind, "value": value}


async def _write(ctx: Context, request: Request, op: str, **fields: Any) -> Any:
    return await ctx.sealer.kv_write(KvRequest(op, arg_str(request, "key"), **fields))


def _readable_owner(ctx: Context, request: Request) -> bytes | None:
    """``_owner``, once this daemon may read that namespace (a sealed one: it opens every epoch of it)."""
    owner = _owner(request)
    ctx.sealer.check_kv(owner)
    return owner


async def kv_put(ctx: Context, request: Request) -> Reply:
    ttl = arg_number(request, "ttl")
    if ttl is not None and not 0 < ttl < 10**10:
        raise MalformedError("ttl is a positive number of seconds")
    ttl_ms = None if ttl is None else max(int(ttl * 1000), 1)
    await _write(ctx, request, "put", value=arg_bytes(request, "value"), ttl_ms=ttl_ms)
    return {}


async def kv_get(ctx: Context, request: Request) -> Reply:
    entry = await ctx.engine.kv_entry(_readable_owner(ctx, request), arg_str(request, "key"))
    return kv_wire(*visible(entry, ctx.engine.clock()))


async def kv_del(ctx: Context, request: Request) -> Reply:
    await _write(ctx, request, "del")
    return {}


async def kv_list(ctx: Context, request: Request) -> Reply:
    prefix = arg_str(request, "prefix", optional=True) or ""
    now = ctx.engine.clock()
    items = []
    for key, entry in await ctx.engine.kv_scan(_readable_owner(ctx, request), prefix):
        kind, value = visible(entry, now)
        if kind is not None:
            wire = kv_wire(kind, value)
            items.append([key, wire["kind"], wire["value"]])
    return {"items": items}


async def kv_incr(ctx: Context, request: Request) -> Reply:
    by = arg_int(request, "by", default=1)
    return {"value": await _write(ctx, request, "incr", by=by)}


async def kv_hset(ctx: Context, request: Request) -> Reply:
    await _write(ctx, request, "hset", member=arg_bytes(request, "field"), value=arg_bytes(request, "value"))
    return {}


async def kv_hdel(ctx: Context, request: Request) -> Reply:
    await _write(ctx, request, "hdel", member=arg_bytes(request, "field"))
    return {}


async def kv_hget(ctx: Context, request: Request) -> Reply:
    field_name = arg_bytes(request, "field")
    entry = await ctx.engine.kv_entry(_readable_owner(ctx, request), arg_str(request, "key"))
    return {"value": hash_field(entry, field_name, ctx.engine.clock())}


async def kv_hgetall(ctx: Context, request: Request) -> Reply:
    entry = await ctx.engine.kv_entry(_readable_owner(ctx, request), arg_str(request, "key"))
    kind, value = visible(entry, ctx.engine.clock())
    return {"value": value if kind == kv.HASH else {}}


async def kv_sadd(ctx: Context, request: Request) -> Reply:
    await _write(ctx, request, "sadd", member=arg_bytes(request, "member"))
    return {}


async def kv_srem(ctx: Context, request: Request) -> Reply:
    await _write(ctx, request, "srem", member=arg_bytes(request, "member"))
    return {}


async def kv_smembers(ctx: Context, request: Request) -> Reply:
    entry = await ctx.engine.kv_entry(_readable_owner(ctx, request), arg_str(request, "key"))
    kind, value = visible(entry, ctx.engine.clock())
    return {"value": sorted(value) if kind == kv.SET else []}


# ------------------------------------------------------------------ sealed queues and KV namespaces
# (docs/privacy.md; creating a sealed queue is queue_create with readers)


async def queue_share(ctx: Context, request: Request) -> Reply:
    """Give a reader the current key epoch (``history``: every earlier one too)."""
    q = ctx.queue(request)
    reader = parse_public_key(arg_str(request, "reader"))
    given = await ctx.sealer.share(q, reader, history=arg_bool(request, "history", False))
    return {"epochs": given, "sealed": ctx.sealer.describe(q)}


async def queue_unshare(ctx: Context, request: Request) -> Reply:
    """Remove a reader: a new key epoch from the queue's next offset, without it."""
    q = ctx.queue(request)
    reader = parse_public_key(arg_str(request, "reader"))
    removed, epoch, start = await ctx.sealer.unshare(q, reader)
    return {"removed": removed, "epoch": epoch, "start": start}


# ------------------------------------------------------------------ this daemon's KV namespace


def _namespace(ctx: Context) -> int:
    ns = ctx.engine.kv_namespace(None)
    if ns is None:
        raise NotFoundError("this daemon has no KV namespace yet (kv seal creates it sealed)")
    return ns


async def kv_seal(ctx: Context, request: Request) -> Reply:
    """Create this daemon's KV namespace sealed to ``readers`` (before its first write)."""
    raw = request.get("readers")
    readers = parse_readers([] if raw is None else raw)
    ns = await ctx.sealer.seal_kv(readers)
    return {"namespace": ctx.engine.address(ns), "sealed": ctx.sealer.describe(ns)}


async def kv_share(ctx: Context, request: Request) -> Reply:
    """Give a reader every key epoch of the namespace: a KV view is the fold of all its ops."""
    reader = parse_public_key(arg_str(request, "reader"))
    ns = _namespace(ctx)
    given = await ctx.sealer.share(ns, reader, history=True)
    return {"epochs": given, "sealed": ctx.sealer.describe(ns)}


async def kv_unshare(ctx: Context, request: Request) -> Reply:
    """Remove a reader: a new key epoch for the ops written from now on."""
    reader = parse_public_key(arg_str(request, "reader"))
    removed, epoch, start = await ctx.sealer.unshare(_namespace(ctx), reader)
    return {"removed": removed, "epoch": epoch, "start": start}


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "hello": hello,
    "versions": versions,
    "id": identity,
    "status": status,
    "peers": peers,
    "queue_create": queue_create,
    "queue_list": queue_list,
    "queue_info": info_of,
    "info": info_of,
    "peek": peek,
    "peek_entry": peek_entry,
    "first": first,
    "last": last,
    "range": range_,
    "read": read,
    "truncate": truncate,
    "meta_get": meta_get,
    "meta_list": meta_list,
    "meta_del": meta_del,
    "meta_set": meta_set,
    "kv_put": kv_put,
    "kv_get": kv_get,
    "kv_del": kv_del,
    "kv_list": kv_list,
    "kv_incr": kv_incr,
    "kv_hset": kv_hset,
    "kv_hdel": kv_hdel,
    "kv_hget": kv_hget,
    "kv_hgetall": kv_hgetall,
    "kv_sadd": kv_sadd,
    "kv_srem": kv_srem,
    "kv_smembers": kv_smembers,
    "queue_share": queue_share,
    "queue_unshare": queue_unshare,
    "kv_seal": kv_seal,
    "kv_share": kv_share,
    "kv_unshare": kv_unshare,
}
PIPELINED: dict[str, PipelinedHandler] = {
    "offer": offer,
    "offer_batch": offer_batch,
}


__all__ = [
    "MAX_READ_RECORDS",
    "OPS",
    "PIPELINED",
    "columns_reply",
    "entry_wire",
    "queue_info",
]
