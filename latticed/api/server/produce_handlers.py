"""Offers into another daemon's queue, and idempotent offers (producer id + sequence), for the ``offer``
and ``offer_batch`` handlers of :mod:`.handlers`: they hand a request here when :func:`produced` says it
is one of these, and keep plain offers into our own queues to themselves.

A request naming ``OWNER/NAME`` of another identity is forwarded to that owner (it must list this
daemon's identity as a producer); the reply comes once the owner committed the records durably.
Optional request fields: ``producer`` (text) and ``seq`` (integer): a retry of the same pair writes
nothing twice, here or at a remote owner; ``shared`` (true: the producer id is the queue's, the same
from any daemon, as a Spark task retried on another host needs); ``wait`` (seconds): how long a remote
owner may take to be reached and answer (else ``owner_unreachable``). Records may carry a fourth field,
their timestamp in milliseconds (None: the owner's clock). Replies carry ``duplicate``: true when the
owner had already committed that sequence (the offsets are the ones it got then).

Both ops stay pipelined: a forwarded offer is a job like a local one, completed by a task of
:class:`~latticed.produce.forward.RemoteOffers` here, so a connection's replies keep their order.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import trio

from latticed.api.server.context import Begun, Context, Reply, Request
from latticed.api.server.offer_layouts import offer_records
from latticed.crdt.signing import parse_public_key
from latticed.errors import LatticedError, MalformedError, NotAllowedError
from latticed.process.logs import get_logger, log_event
from latticed.produce.dedup import check_producer, producer_scope
from latticed.produce.forward import DEFAULT_WAIT_S, RemoteOffers
from latticed.produce.offered_columns import LINK_FIELDS, OfferedColumns
from latticed.produce.owner import MAX_RECORDS, produced_run
from latticed.produce.policy import producers_of
from latticed.storage.jobs import Job

log = get_logger(__name__)

#: Longest ``wait`` a request may ask for.
MAX_WAIT_S = 3600.0


class Forwarded(Job):
    """A job completed by the owner's answer instead of the storage thread; ``result`` is ``(first,
    count, duplicate)``."""

    def apply(self, batch: Any, writer: Any) -> None:  # pragma: no cover - never given to the writer
        raise LatticedError("a forwarded offer is not a storage job")


def _remote_owner(ctx: Context, request: Request) -> bytes | None:
    """The owner named by the request's queue if it is another identity (None: ours, or not an address:
    resolving it says what is wrong)."""
    address = request.get("queue")
    if not isinstance(address, str):
        return None
    owner_hex, sep, _ = address.rpartition("/")
    if not sep:
        return None
    try:
        owner = parse_public_key(owner_hex)
    except MalformedError:
        return None
    return None if owner == ctx.engine.public_key else owner


def _wait(request: Request) -> float:
    value = request.get("wait")
    if value is None:
        return DEFAULT_WAIT_S
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= MAX_WAIT_S:
        raise MalformedError(f"'wait' is a number of seconds in [0, {MAX_WAIT_S:g}]")
    return float(value)


def produced(ctx: Context, request: Request) -> bool:
    """Whether an offer request is one for this module: it names a producer, or another identity's queue
    (and this daemon forwards offers)."""
    if request.get("producer") is not None:
        return True
    return ctx.producers is not None and _remote_owner(ctx, request) is not None


def _begin(ctx: Context, request: Request, raw: Any, build: Any) -> Begun:
    producers = ctx.producers
    if producers is None:
        raise LatticedError("this daemon does not take idempotent or remote offers")
    owner = _remote_owner(ctx, request)
    producer, seq = request.get("producer"), request.get("seq")
    if producer is None:
        producer, seq = producers.next_own()
    producer, seq = check_producer(producer, seq)
    shared = request.get("shared")
    producer_scope(ctx.engine.public_key, producer, shared)  # 'shared' is checked before anything runs
    if owner is None:
        q = ctx.queue(request, writing=True)
        packed = getattr(request, "packed_records", None) if raw is request.get("records") else None
        job = producers.local.start(
            ctx.engine.public_key, q, producer, seq, raw, shared=shared, packed=packed
        )
        return job, build
    columns: dict[str, Any] | None = None
    if type(raw) is OfferedColumns:  # sent on as they came where the owner's link takes columns
        columns = {f: request.get(f) for f in LINK_FIELDS}
        if not raw.plain:  # cut and size-checked already; timestamps and headers are judged here
            produced_run(raw.rows(), owner.hex(), 0)
    else:
        produced_run(raw, owner.hex(), 0)  # refuse what the owner would refuse before it travels
    name = str(request["queue"]).rpartition("/")[2]
    _refuse_if_replica_says_so(ctx, producers, owner, request["queue"])
    job = Forwarded()
    job.done = trio.Event()
    wait = _wait(request)
    forward = functools.partial(
        _forward,
        producers,
        job,
        owner=owner,
        name=name,
        raw=raw,
        columns=columns,
        producer=producer,
        seq=seq,
        wait=wait,
        shared=bool(shared),
    )
    producers.spawn(forward)
    return job, build


def _refuse_if_replica_says_so(ctx: Context, producers: RemoteOffers, owner: bytes, address: str) -> None:
    """This daemon's replica of the queue says its owner does not take our offers, and no link to the
    owner is up to ask it (its newer metadata may say otherwise): refused at once, as the owner would."""
    try:
        q = ctx.engine.resolve(address)
    except LatticedError:
        return  # not held here: only the owner knows
    me = ctx.engine.public_key
    core2 = ctx.engine.core2
    meta: Mapping[str, str]
    if core2.holds(q):
        loaded = core2.loaded(q)
        if loaded is None:
            return  # a core-2 replica not loaded yet says nothing: the owner judges
        meta = dict(loaded.meta)
    else:
        meta = ctx.engine.state(q).meta_dict
    if not producers_of(meta).allows(me) and not producers.links.connected(owner):
        raise NotAllowedError(
            f"{address} does not take offers from {me.hex()} (as this daemon's replica of its signed "
            "metadata says): its owner lists the identities that may offer (latticectl queue edit "
            "NAME --producers ID,ID or '*')"
        )


async def _forward(
    producers: RemoteOffers,
    job: Job,
    *,
    owner: bytes,
    name: str,
    raw: list[list[Any]] | OfferedColumns,
    columns: dict[str, Any] | None,
    producer: str,
    seq: int,
    wait: float,
    shared: bool,
) -> None:
    try:
        answer = await producers.offer(
            owner, name, raw, columns=columns, producer=producer, seq=seq, wait=wait, shared=shared
        )
        first, count = answer.get("first"), answer.get("count")
        if type(first) is not int or type(count) is not int:
            raise MalformedError("the owner's answer to an offer has no offsets")
        job.result = (first, count, bool(answer.get("duplicate")))
    except LatticedError as exc:
        job.error = exc
    except Exception as exc:  # a bug: this offer fails, the daemon goes on
        log_event(log, "produce.forward_crashed", level=logging.ERROR, exc_info=exc)
        job.error = LatticedError(f"internal error forwarding an offer: {type(exc).__name__}")
    job.done.set()
    if job.notify is not None:
        job.notify()


def _offer_reply(result: tuple[int, int, bool]) -> Reply:
    return {"offset": result[0], "duplicate": result[2]}


def _batch_reply(result: tuple[int, int, bool]) -> Reply:
    return {"first": result[0], "count": result[1], "duplicate": result[2]}


def begin_offer(ctx: Context, request: Request) -> Begun:
    """``offer`` when :func:`produced` says so."""
    raw = [[request.get("value"), request.get("key"), request.get("headers")]]
    return _begin(ctx, request, raw, _offer_reply)


def begin_offer_batch(ctx: Context, request: Request) -> Begun:
    """``offer_batch`` when :func:`produced` says so."""
    return _begin(ctx, request, offer_records(request, MAX_RECORDS), _batch_reply)


__all__ = ["Forwarded", "begin_offer", "begin_offer_batch", "produced"]
