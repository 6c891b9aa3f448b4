"""The owner's side of remote offers: commit records other daemons (and local producers) offer.

A ``produce`` request arrives over the authenticated link (:mod:`latticed.net.leasing`) from the peer
whose identity the link proved. The owner checks, in order: the queue is one it owns; the queue's
``producers`` allow-list names the peer (:mod:`.policy`); for a sealed queue, the peer is a reader of its
current key epoch; the records are well formed and none carries :data:`~.policy.PRODUCER_HEADER`. Then it
stamps each record with that header (the peer's identity), appends them idempotently (:mod:`.dedup`) and
answers with the offsets once the transaction is durable. Nothing is written when any check fails.
The records come as a list of ``[value, key, headers]``, or, from a peer whose link agreed on
``produce-columns``, as the local API's columns (``layout: "packed"``), taken as a local columnar
``offer_batch`` is: the same checks, run, digest and header.

Sealed queues: the owner seals the records with the queue's current key, the producer header inside the
envelope like every other header, so a reader trusts it once it opens the record. The plaintext travels
only over the encrypted link to the owner, who is a reader by construction. A producer that is not a
reader is refused: the reader list is the set of identities the owner shares the queue's content with,
and a daemon outside it could neither read back nor check what it wrote (share the queue with it first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from typing import Any, Final, Protocol

from latticed.crdt import columns_compiled
from latticed.crdt.group import DLQ_META_KEY, is_dlq_name
from latticed.crdt.head import KIND_QUEUE, queue_id
from latticed.crdt.queue import QueueState
from latticed.crdt.records import MAX_KEY_BYTES, MAX_VALUE_BYTES, Headers, RecordRun, check_records
from latticed.errors import (
    LatticedError,
    MalformedError,
    NotAllowedError,
    NotOwnerError,
    RemoteProtocolError,
)
from latticed.net.leasing import LeaseServer
from latticed.process.logs import get_logger, log_event
from latticed.produce.dedup import (
    ProducedAppend,
    check_producer,
    offered_digest,
    packed_size,
    producer_scope,
)
from latticed.produce.offered_columns import PACKED_LAYOUT, OfferedColumns, offered_columns
from latticed.produce.policy import PRODUCER_HEADER, producers_of
from latticed.storage.batch import Batch
from latticed.storage.core2_jobs import Commit2
from latticed.storage.core2_queues import core2_of
from latticed.storage.core2_view import Core2View
from latticed.storage.jobs import Job, WriterView
from latticed.storage.sealer import SealableStore, Sealer

#: The request a producer's daemon sends the owner (a lease-forwarding op).
PRODUCE_OP: Final = "produce"
#: Records one request may carry.
MAX_RECORDS: Final = 100_000
#: Characters of the producer header's value the plain path takes (an identity's hex is 64).
_HEADER_VALUE: Final = 1024

log = get_logger(__name__)


class ProduceStore(SealableStore, Protocol):
    """What the owner side uses of the engine."""

    @property
    def public_key(self) -> bytes: ...

    @property
    def clock(self) -> Callable[[], int]: ...

    #: The queues on fork core 2 (a producer offers into them as into core 1's).
    core2: Core2View

    def find(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> int | None: ...

    def not_held(self, owner: bytes, name: str, kind: int, *, writing: bool = False) -> LatticedError: ...


def produced_run(raw: Any, producer_hex: str, now: int) -> RecordRun:
    """Records ``[value, key, headers]`` or ``[value, key, headers, timestamp_ms]`` from a producer, each
    stamped with the producer header (one it sent itself is refused), checked. Built a column at a time
    (as a local ``offer_batch`` is): a per-record loop cost the owner more than signing the records.
    Records ``[value, key, []]`` within the limits (the sink's) are split in one C pass where the column
    passes were built (:mod:`latticed.crdt.columns_compiled`); anything else takes the checks below."""
    plain = _plain_run(raw, producer_hex, now)
    if plain is not None:
        return plain[0]
    if type(raw) is not list or not 0 < len(raw) <= MAX_RECORDS:
        raise MalformedError(f"'records' is a list of 1-{MAX_RECORDS} [value, key, headers(, timestamp)]")
    lengths = set(map(len, raw))
    if set(map(type, raw)) != {list} or not lengths <= {3, 4}:
        raise MalformedError("each record is [value, key, headers] or [value, key, headers, timestamp]")
    n = len(raw)
    stamps: Sequence[Any] = ()
    # A column at a time by itemgetter: zip(*raw) made an iterator and a tuple per record.
    values, keys, sent = (tuple(map(itemgetter(i), raw)) for i in range(3))
    if lengths == {4}:
        stamps = tuple(map(itemgetter(3), raw))
    elif lengths != {3}:  # {3}: no record names its timestamp, every one gets the owner's clock
        stamps = [item[3] if len(item) == 4 else None for item in raw]
    timestamps: Iterable[int] = repeat(now, n)
    if stamps.count(None) != len(stamps):
        if not set(map(type, stamps)) <= {int, type(None)} or any(ts is not None and ts < 0 for ts in stamps):
            raise MalformedError("a record's timestamp is milliseconds since the epoch, or nil")
        timestamps = [now if ts is None else ts for ts in stamps]
    if set(map(type, values)) != {bytes} or not set(map(type, keys)) <= {bytes, type(None)}:
        raise MalformedError("record values are bytes and keys bytes or nil")
    stamp = (PRODUCER_HEADER, producer_hex.encode())
    if set(map(type, sent)) <= {list, type(None)} and not any(
        sent
    ):  # the common case: the producer header alone, one tuple shared by every record
        headers: list[Headers] = [_stamp(producer_hex)] * n
    else:
        headers = [(*_headers(hdr), stamp) for hdr in sent]
    run = RecordRun(values, keys, timestamps, headers)
    check_records(run)
    return run


@lru_cache(maxsize=256)
def _stamp(producer_hex: str) -> Headers:
    """The headers of a record offered by ``producer_hex`` and nothing else: one tuple per producer,
    shared by its requests, so the owner's passes over a commit's header column (equal headers once)
    find them equal by identity instead of comparing each."""
    return ((PRODUCER_HEADER, producer_hex.encode()),)


def _plain_run(raw: Any, producer_hex: str, now: int) -> tuple[RecordRun, int] | None:
    """:func:`produced_run` of records ``[value, key, []]`` (or ``None`` headers), values and keys within
    the limits, in one C pass, and the bytes msgpack packs ``raw`` into; None if the column passes were
    not built or the records are of another shape. The run is marked checked: ``offered`` accepts only
    values and keys :func:`check_records` passes, and the clock and the header are checked here."""
    columns = columns_compiled.load()
    if columns is None or type(now) is not int or not 0 <= now < 2**63 or len(producer_hex) > _HEADER_VALUE:
        return None
    split = columns.offered(raw, MAX_RECORDS, MAX_VALUE_BYTES, MAX_KEY_BYTES)
    if split is None:
        return None
    values, keys, size = split
    n = len(values)
    return RecordRun.checked(values, keys, repeat(now, n), [_stamp(producer_hex)] * n), size


def offered_run(
    records: Any, producer_hex: str, now: int, packed: bytes | memoryview | None
) -> tuple[RecordRun, bytes]:
    """:func:`produced_run` of ``records`` (a list, or :class:`OfferedColumns`) and the digest a retry
    must match (:func:`retry_digest`; ``packed``: the bytes a list was decoded from, if known)."""
    if type(records) is OfferedColumns:
        if not records.plain:  # timestamps or headers: the list form's path judges them
            records, packed = records.rows(), None
        elif len(records) > MAX_RECORDS:
            raise MalformedError(f"'records' is a list of 1-{MAX_RECORDS} [value, key, headers(, timestamp)]")
        else:  # checked by the split, as ``offered`` checks a list; the digest of the same list
            n = len(records)
            fits = type(now) is int and 0 <= now < 2**63 and len(producer_hex) <= _HEADER_VALUE
            build = RecordRun.checked if fits else RecordRun
            run = build(records.values, records.keys, repeat(now, n), [_stamp(producer_hex)] * n)
            check_records(run)
            return run, offered_digest(None, records.packed)
    plain = _plain_run(records, producer_hex, now)
    run, size = plain if plain is not None else (produced_run(records, producer_hex, now), None)
    return run, retry_digest(records, run, packed, size)


def retry_digest(
    raw: list[list[Any]], run: RecordRun, packed: bytes | memoryview | None, size: int | None = None
) -> bytes:
    """:func:`~latticed.produce.dedup.offered_digest` of ``raw`` (``run``: :func:`produced_run` of it),
    from ``packed``, the bytes ``raw`` was decoded from (None: unknown), when they are what packing
    ``raw`` gives: the same digest either way, without packing the sink's records again. ``size``: the
    bytes packing ``raw`` gives, if known (records ``[value, key, []]`` whose columns gave it)."""
    if size is not None:
        return offered_digest(raw, packed if packed is not None and len(packed) == size else None)
    return offered_digest(raw, packed if _verbatim(raw, run, packed) else None)


def _verbatim(raw: list[list[Any]], run: RecordRun, packed: bytes | memoryview | None) -> bool:
    """Whether ``packed``, the bytes ``raw`` was decoded from, is what packing ``raw`` gives: records
    ``[value, key, headers]`` (no timestamp), no headers sent (each record's only header is the
    producer's, one tuple for all), and exactly :func:`~latticed.produce.dedup.packed_size` long."""
    if packed is None or run.headers is None or set(map(len, raw)) != {3}:
        return False
    headers = run.headers
    if len(headers[0]) != 1 or headers.count(headers[0]) != len(headers):
        return False
    return len(packed) == packed_size(run.values, run.keys, within=len(packed))


def _headers(raw: Any) -> Headers:
    if raw is None:
        return ()
    if type(raw) is dict:
        raw = list(raw.items())
    if type(raw) not in (list, tuple):
        raise MalformedError("headers are a list of [name, value] pairs")
    out = []
    for pair in raw:
        if type(pair) not in (list, tuple) or len(pair) != 2:
            raise MalformedError("each header is [name, value]")
        name, value = pair
        if not isinstance(name, str) or type(value) is not bytes:
            raise MalformedError("header names are text and values bytes")
        if name == PRODUCER_HEADER:
            raise MalformedError(
                f"header {PRODUCER_HEADER!r} is set by the queue's owner (the identity that offered the "
                "record); a producer may not send it"
            )
        out.append((name, value))
    return tuple(out)


class OfferServer:
    """Commits offers of producers into queues this daemon owns (see the module docstring)."""

    def __init__(self, engine: ProduceStore, sealer: Sealer) -> None:
        self.engine = engine
        #: The daemon's one sealer (a sealed queue's records are sealed with its current key).
        self.sealer = sealer

    def own_queue(self, name: Any) -> int:
        """Our queue ``name``; if we have none of that name, NotFoundError (or the owner fence's
        BehindPeersError: one we dropped with ``queue repair --drop``, not back yet)."""
        if not isinstance(name, str) or not name or len(name) > 256:
            raise MalformedError("'queue' is the name of one of the owner's queues")
        q = self.engine.find(self.engine.public_key, name)
        if q is None:
            q = self.engine.core2.lookup(self.engine.public_key, name)
        if q is None:
            raise self.engine.not_held(self.engine.public_key, name, KIND_QUEUE, writing=True)
        return q

    def start(
        self,
        peer: bytes,
        q: int,
        producer: Any,
        seq: Any,
        records: Any,
        *,
        shared: Any = False,
        packed: bytes | memoryview | None = None,
    ) -> Job:
        """Check and start the idempotent append of ``records`` offered by ``peer`` (as its ``producer``,
        sequence ``seq``) to our queue ``q``; ``await engine.outcome(job)`` gives ``(first, count,
        duplicate)`` once durable. ``shared``: the producer id is one of the queue's, not ``peer``'s
        alone (see :func:`~latticed.produce.dedup.producer_scope`). ``packed``: the bytes ``records``
        were decoded from, if known (:func:`~latticed.produce.dedup.offered_digest`)."""
        engine = self.engine
        producer, seq = check_producer(producer, seq)
        scope = producer_scope(peer, producer, shared)
        if engine.core2.holds(q):
            return self._start2(peer, q, seq, scope, records, packed=packed)
        state = engine.state(q)
        if state.owner != engine.public_key:
            raise NotOwnerError(f"{engine.address(q)} is not this daemon's queue")
        if is_dlq_name(state.name) and DLQ_META_KEY in state.meta_dict:
            raise NotOwnerError(
                f"{engine.address(q)} is a group's dead-letter queue: only the group writes it"
            )
        if peer != engine.public_key:
            self.check_allowed(peer, q, state)
        now = engine.clock()
        run, digest = offered_run(records, peer.hex(), now, packed)
        engine.require_owner(q, "offer")
        inner = self.sealer.append_job(q, run)
        qid = queue_id(state.owner, state.name, state.kind)
        return engine.start_job(ProducedAppend(inner, qid, scope, seq, len(run), digest=digest, now_ms=now))

    def _start2(
        self, peer: bytes, q: int, seq: int, scope: str, records: Any, *, packed: bytes | memoryview | None
    ) -> Job:
        """:meth:`start` for a queue on fork core 2 (never sealed, never a dead-letter queue): the
        allow-list is checked here when the queue's value is loaded, and always by the job, against the
        metadata its commit signs under."""
        engine = self.engine
        core2 = engine.core2
        core2.require_owner(q, "offer")
        loaded = core2.loaded(q)
        if peer != engine.public_key and loaded is not None:
            _check_producer(core2.address(q), peer, dict(loaded.meta))
        now = engine.clock()
        run, digest = offered_run(records, peer.hex(), now, packed)
        row = core2.row(q)
        qid = queue_id(row.owner, row.name, row.kind)
        inner = OfferedCommit2(q, run, None if peer == engine.public_key else peer)
        return engine.start_job(ProducedAppend(inner, qid, scope, seq, len(run), digest=digest, now_ms=now))

    def check_allowed(self, peer: bytes, q: int, state: QueueState) -> None:
        """NotAllowedError unless the queue's allow-list names ``peer`` (and, sealed, it is a reader)."""
        address = self.engine.address(q)
        _check_producer(address, peer, state.meta_dict)
        sealing = self.sealer.sealing(q)
        if sealing is not None and peer not in sealing.readers:
            raise NotAllowedError(
                f"{address} is sealed and {peer.hex()} is not one of its readers: a producer of a sealed "
                "queue must be a reader (its owner can add it with latticectl queue share)"
            )

    async def serve(self, peer: bytes, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer a peer's ``produce`` request: ``{"first", "count", "duplicate"}`` once durable."""
        q = self.own_queue(body.get("queue"))
        if self.engine.core2.holds(q):
            await self.engine.core2.value(q)  # loaded: its allow-list is checked before the records are
        job = self.start(
            peer, q, body.get("producer"), body.get("seq"), requested(peer, body), shared=body.get("shared")
        )
        first, count, duplicate = await self.engine.outcome(job)
        return {"first": first, "count": count, "duplicate": duplicate}


def requested(peer: bytes, body: Mapping[str, Any]) -> Any:
    """The records of a ``produce`` request: its ``records``, or its columns (``layout: "packed"``, at
    most :data:`MAX_RECORDS`). Malformed columns are the peer's protocol error (its daemon checked them
    before sending): refused, logged, nothing written."""
    layout = body.get("layout")
    if layout is None:
        return body.get("records")
    try:
        if layout != PACKED_LAYOUT:
            raise MalformedError(f"'layout' is {PACKED_LAYOUT!r} or absent, got {layout!r}")
        if "records" in body:
            raise MalformedError(f"a {PACKED_LAYOUT!r} request sends its records as columns, not 'records'")
        return offered_columns(body, MAX_RECORDS)
    except MalformedError as exc:
        log_event(log, "produce.malformed_columns", level=logging.WARNING, peer=peer.hex(), reason=str(exc))
        raise RemoteProtocolError(f"produce: {exc}") from exc


def _check_producer(address: str, peer: bytes, meta: Mapping[str, str]) -> None:
    if not producers_of(meta).allows(peer):
        raise NotAllowedError(
            f"{address} does not take offers from {peer.hex()}: its owner lists the identities that "
            "may offer (latticectl queue edit NAME --producers ID,ID or '*')"
        )


class OfferedCommit2(Commit2):
    """Records a producer offered into our core-2 queue (checked already): ``peer`` (None: this daemon)
    must be on the allow-list of the metadata as the batch has it, so an edit of the list that commits
    first is the one an offer is judged by, as on core 1."""

    __slots__ = ("peer",)

    def __init__(self, q: int, records: Sequence[Any], peer: bytes | None) -> None:
        super().__init__(q, records, checked=True)
        self.peer = peer

    def apply(self, batch: Batch, writer: WriterView) -> None:
        if self.peer is not None:
            core2 = core2_of(writer)
            state = core2.peek(self.q)
            _check_producer(f"{state.owner.hex()}/{state.name}", self.peer, dict(state.meta))
        super().apply(batch, writer)


class WithOffers:
    """A lease server that also answers ``produce`` (everything else goes to ``leases``)."""

    def __init__(self, leases: LeaseServer, offers: OfferServer) -> None:
        self.leases = leases
        self.offers = offers

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        if op == PRODUCE_OP:
            return await self.offers.serve(peer, body)
        return await self.leases.serve(peer, op, body)

    def peer_gone(self, peer: bytes) -> None:
        self.leases.peer_gone(peer)


__all__ = [
    "MAX_RECORDS",
    "PRODUCE_OP",
    "OfferServer",
    "OfferedCommit2",
    "ProduceStore",
    "WithOffers",
    "offered_run",
    "produced_run",
    "requested",
    "retry_digest",
]
