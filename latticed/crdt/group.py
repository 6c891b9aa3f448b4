"""Consumer-group progress: the replicated half of a work queue, as a lattice.

Only settled facts are replicated (acks, dead letters, failed-attempt counts, redrives), never leases:
DQueue and SQS keep leases local too, so after a crash every unsettled record is delivered again.

Per (group, source queue) the abstract value is: the set S of settled offsets (done or dead-lettered),
the set R of offsets released for redelivery (redrive; meaningful on the group's dead-letter queue), and a
failed-attempts count per unsettled offset. Join is union, union, max, then forget what S settles, so it is
commutative, associative and idempotent. :class:`GroupProgress` stores S as ``ack_floor`` (every offset
below is settled) plus ``acked`` and ``dead`` above it; contiguous runs fold into the floor.

Decisions (see also :mod:`latticed.leases.dispatch`):

* **Dead letters settle their offset**: the floor advances over them, so one poison record cannot pin the
  floor (and grow ``acked``) for as long as it sits in the DLQ. The dead letter itself, payload included,
  lives in the group's DLQ (``<group>.dlq``, an ordinary signed queue owned by the daemon): the source may
  be someone else's queue and truncated at any time. Redrive releases DLQ offsets (``released`` in the
  DLQ's progress) and the group redelivers them from there; purge settles them.
* **Signing**: progress changes are ops appended to a signed queue of kind ``KIND_GROUP`` named after the
  group and owned by the daemon identity, so signing, deltas, fork proofs and replication are the queue
  lattice's. Each op is a progress *fragment* ``(source, GroupProgress)`` and folding is join: ops commute,
  replay is idempotent, a group-commit batch coalesces to one op per source (:func:`coalesce_ops`), and a
  snapshot is just the whole progress as ops (:func:`snapshot_ops`), after which the log may be truncated.
* **Group definition**: the group queue's signed metadata (key ``"group"``, canonical JSON), not a first
  op: metadata survives truncation of the op log and an owner edit replaces it under one head signature.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from latticed.crdt import queue as core
from latticed.crdt.errors import MalformedError
from latticed.crdt.head import KIND_GROUP, MAX_NAME_BYTES, check_name
from latticed.crdt.queue import QueueState
from latticed.crdt.records import MAX_HEADERS, MAX_OFFSET, MAX_VALUE_BYTES, Record, check_record
from latticed.crdt.signing import PUBLIC_KEY_SIZE, Identity

MAX_ATTEMPTS = 2**32 - 1
#: Attempt history kept per record (and written into its dead letter): the newest this many.
MAX_HISTORY = 32
MAX_CONSUMER_BYTES = 256
MAX_CORRELATION_BYTES = 256
MAX_FILTER_CHARS = 4096
_MAX_OP_ITEMS = 1 << 20
_OP_VERSION = 1
_DLQ_VERSION = 1
_DLQ_SUFFIX = ".dlq"
SPEC_META_KEY = "group"
DLQ_HEADER = "x-dlq"
CORRELATION_HEADER = "correlation-id"
#: How a failed attempt ended (a claimed one was handed to another consumer by ``claim``).
OUTCOMES = ("nack", "expired", "released", "claimed")
#: How a successful one did (in the attempt history only: dead letters record failures).
ACKED = "acked"
#: A nack's reason is kept up to this many characters.
MAX_ERROR_CHARS = 1024


# ----------------------------------------------------------------------------------------------- sources


def source_id(owner: bytes, name: str) -> str:
    """How a group names a source queue: ``<owner hex>/<name>`` (names cannot contain ``/``)."""
    check_name(name)
    if not isinstance(owner, bytes) or len(owner) != PUBLIC_KEY_SIZE:
        raise MalformedError("a source queue's owner is a 32-byte public key")
    return f"{owner.hex()}/{name}"


def parse_source_id(text: object) -> tuple[bytes, str]:
    if not isinstance(text, str) or text.count("/") != 1:
        raise MalformedError(f"a source queue is '<owner hex>/<name>', not {text!r}")
    owner_hex, name = text.split("/")
    try:
        owner = bytes.fromhex(owner_hex)
    except ValueError as exc:
        raise MalformedError(f"bad owner key in source {text!r}") from exc
    if len(owner) != PUBLIC_KEY_SIZE or owner_hex != owner.hex():
        raise MalformedError(f"bad owner key in source {text!r} (64 lowercase hex digits)")
    check_name(name)
    return owner, name


def dlq_name(group: str) -> str:
    """The dead-letter queue of a group: an ordinary signed queue owned by the group's daemon."""
    return group + _DLQ_SUFFIX


#: Metadata of a group's DLQ naming its group (set when the group creates it; reserved otherwise).
DLQ_META_KEY = "dlq_of"


def is_dlq_name(name: str) -> bool:
    """Whether ``name`` is in the namespace reserved for dead-letter queues (``<group>.dlq``): users
    cannot create such queues, so a group never adopts one by accident."""
    return name.endswith(_DLQ_SUFFIX)


# ---------------------------------------------------------------------------------------------- progress


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """Replicated progress of a group on one source queue, always in normal form.

    ``ack_floor``: every offset below is settled. ``acked``/``dead``: settled offsets above the floor
    (disjoint, the floor never in either). ``released``: unsettled offsets released for redelivery.
    ``attempts``: sorted ``(offset, failed attempts)`` for unsettled offsets (a tuple, so the value is
    truly immutable). Build with :meth:`make` unless the fields are already normal.
    """

    ack_floor: int = 0
    acked: frozenset[int] = frozenset()
    dead: frozenset[int] = frozenset()
    released: frozenset[int] = frozenset()
    attempts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def make(
        cls,
        ack_floor: int = 0,
        acked: Iterable[int] = (),
        dead: Iterable[int] = (),
        released: Iterable[int] = (),
        attempts: Mapping[int, int] | Iterable[tuple[int, int]] = (),
    ) -> GroupProgress:
        """Normalise: fold contiguous settled offsets into the floor, forget what is settled."""
        counts = dict(attempts.items() if isinstance(attempts, Mapping) else attempts)
        return _normal(ack_floor, set(acked), set(dead), set(released), counts)

    def is_settled(self, offset: int) -> bool:
        return offset < self.ack_floor or offset in self.acked or offset in self.dead

    def attempts_map(self) -> dict[int, int]:
        return dict(self.attempts)

    def join(self, other: GroupProgress) -> GroupProgress:
        return join(self, other)

    def ack(self, *offsets: int) -> GroupProgress:
        return join(self, GroupProgress.make(acked=offsets))

    def ack_up_to(self, up_to: int) -> GroupProgress:
        """Settle every offset below ``up_to`` at once (the journal queue's ``ack_up_to``)."""
        return join(self, GroupProgress(ack_floor=up_to))

    @property
    def is_empty(self) -> bool:
        return self == EMPTY


EMPTY = GroupProgress()


def _normal(
    floor: int, acked: set[int], dead: set[int], released: set[int], attempts: dict[int, int]
) -> GroupProgress:
    while floor in acked or floor in dead:
        floor += 1
    acked_f = frozenset(o for o in acked if o >= floor)
    dead_f = frozenset(o for o in dead if o >= floor and o not in acked_f)
    released_f = frozenset(o for o in released if o >= floor and o not in acked_f and o not in dead_f)
    counts = tuple(
        sorted(
            (o, n)
            for o, n in attempts.items()
            if n > 0 and o >= floor and o not in acked_f and o not in dead_f
        )
    )
    return GroupProgress(floor, acked_f, dead_f, released_f, counts)


def join(a: GroupProgress, b: GroupProgress) -> GroupProgress:
    """The lattice join: max floor, unions, max attempts per offset; then normalise."""
    if a is b or b == EMPTY:
        return a
    if a == EMPTY:
        return b
    counts = dict(a.attempts)
    for offset, n in b.attempts:
        if n > counts.get(offset, 0):
            counts[offset] = n
    return _normal(
        max(a.ack_floor, b.ack_floor),
        set(a.acked | b.acked),
        set(a.dead | b.dead),
        set(a.released | b.released),
        counts,
    )


# ----------------------------------------------------------------------------------------------- the ops


@dataclass(frozen=True, slots=True)
class ProgressOp:
    """One entry of the signed group log: a progress fragment for one source; folding is join."""

    source: str
    progress: GroupProgress


def encode_progress_op(op: ProgressOp) -> bytes:
    """Compact msgpack: ``[1, source, floor, acked, dead, released, [offset, n, offset, n, ...]]``."""
    p = op.progress
    flat: list[int] = []
    for offset, n in p.attempts:
        flat.append(offset)
        flat.append(n)
    body = [_OP_VERSION, op.source, p.ack_floor, sorted(p.acked), sorted(p.dead), sorted(p.released), flat]
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def _offsets(raw: Any, what: str) -> list[int]:
    if type(raw) is not list or len(raw) > _MAX_OP_ITEMS:
        raise MalformedError(f"progress op: {what} is a list of offsets")
    previous = -1
    for item in raw:
        if type(item) is not int or not previous < item <= MAX_OFFSET:
            raise MalformedError(f"progress op: {what} must be strictly increasing offsets")
        previous = item
    return raw


def decode_progress_op(raw: bytes) -> ProgressOp:
    """Strict inverse of :func:`encode_progress_op`; anything else raises :class:`MalformedError`."""
    if not isinstance(raw, bytes):
        raise MalformedError("a progress op is bytes")
    try:
        items = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:
        raise MalformedError("undecodable progress op") from exc
    if type(items) is not list or len(items) != 7:
        raise MalformedError("a progress op has 7 fields")
    version, source, floor, acked, dead, released, flat = items
    if version != _OP_VERSION or type(version) is not int:
        raise MalformedError(f"unknown progress op version {version!r}")
    parse_source_id(source)
    if type(floor) is not int or not 0 <= floor <= MAX_OFFSET + 1:
        raise MalformedError("progress op: the floor is an offset")
    acked_l, dead_l, released_l = (
        _offsets(acked, "acked"),
        _offsets(dead, "dead"),
        _offsets(released, "released"),
    )
    if type(flat) is not list or len(flat) % 2:
        raise MalformedError("progress op: attempts are offset, count pairs")
    offsets = _offsets(flat[0::2], "attempt offsets")
    counts: dict[int, int] = {}
    for offset, n in zip(offsets, flat[1::2], strict=True):
        if type(n) is not int or not 0 < n <= MAX_ATTEMPTS:
            raise MalformedError("progress op: attempt counts are positive 32-bit integers")
        counts[offset] = n
    return ProgressOp(source, _normal(floor, set(acked_l), set(dead_l), set(released_l), counts))


def apply_progress_ops(
    progress: Mapping[str, GroupProgress], ops: Iterable[ProgressOp]
) -> dict[str, GroupProgress]:
    """Fold ops into per-source progress (any order, any repetition: same result). One normalisation per
    source per call, so folding a batch costs the batch plus one copy of the progress."""
    acc: dict[str, tuple[list[int], set[int], set[int], set[int], dict[int, int]]] = {}
    for op in ops:
        p = op.progress
        slot = acc.get(op.source)
        if slot is None:
            base = progress.get(op.source, EMPTY)
            slot = acc[op.source] = (
                [base.ack_floor],
                set(base.acked),
                set(base.dead),
                set(base.released),
                dict(base.attempts),
            )
        floor, acked, dead, released, counts = slot
        floor[0] = max(floor[0], p.ack_floor)
        acked |= p.acked
        dead |= p.dead
        released |= p.released
        for offset, n in p.attempts:
            if n > counts.get(offset, 0):
                counts[offset] = n
    out = dict(progress)
    for source, (floor, acked, dead, released, counts) in acc.items():
        out[source] = _normal(floor[0], acked, dead, released, counts)
    return out


def coalesce_ops(ops: Iterable[ProgressOp]) -> list[ProgressOp]:
    """One op per source with the same effect as all of ``ops``: what a group commit appends."""
    folded = apply_progress_ops({}, ops)
    return [ProgressOp(source, progress) for source, progress in folded.items()]


def snapshot_ops(progress: Mapping[str, GroupProgress]) -> list[ProgressOp]:
    """The whole progress as ops: append these, then the log below them may be truncated."""
    return [ProgressOp(source, p) for source, p in sorted(progress.items()) if not p.is_empty]


def progress_record(op: ProgressOp, timestamp_ms: int) -> Record:
    """The record to append to the group log (keyed by source, so readers can filter)."""
    return Record(value=encode_progress_op(op), key=op.source.encode(), timestamp=timestamp_ms)


def ops_from_records(records: Iterable[Record]) -> list[ProgressOp]:
    return [decode_progress_op(record.value) for record in records]


# ------------------------------------------------------------------------------------------- definition


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group's definition, stored in its signed log's metadata.

    Durations are seconds. ``max_attempts`` 0 never dead-letters; ``max_consumers`` and ``max_in_flight``
    (per consumer) 0 mean no cap; ``retention_s`` 0 keeps no done records (they are kept in memory, for
    inspection, at most that long). ``filter`` "" takes every record (see :mod:`latticed.leases.filters`).
    """

    name: str
    sources: tuple[str, ...]
    filter: str = ""
    max_attempts: int = 5
    visibility_s: float = 30.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    retention_s: float = 60.0
    max_consumers: int = 0
    max_in_flight: int = 0
    description: str = ""

    def check(self) -> None:
        check_name(self.name)
        if len(dlq_name(self.name).encode()) > MAX_NAME_BYTES:
            raise MalformedError(f"a group name is at most {MAX_NAME_BYTES - len(_DLQ_SUFFIX)} bytes")
        if type(self.sources) is not tuple or not self.sources:
            raise MalformedError("a group reads one or more source queues")
        for source in self.sources:
            parse_source_id(source)
        if len(set(self.sources)) != len(self.sources):
            raise MalformedError("a group lists each source queue once")
        if not isinstance(self.filter, str) or len(self.filter) > MAX_FILTER_CHARS:
            raise MalformedError(f"a filter is text of at most {MAX_FILTER_CHARS} characters")
        if not isinstance(self.description, str) or len(self.description) > 4096:
            raise MalformedError("a description is text of at most 4096 characters")
        for name in ("max_attempts", "max_consumers", "max_in_flight"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_ATTEMPTS:
                raise MalformedError(f"{name} is an integer in [0, {MAX_ATTEMPTS}]")
        for name in ("visibility_s", "backoff_base_s", "backoff_cap_s", "retention_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise MalformedError(f"{name} is a finite number of seconds")
            if value < 0 or (name == "visibility_s" and value <= 0):
                raise MalformedError(f"{name} must be {'positive' if name == 'visibility_s' else '>= 0'}")

    def backoff(self, failures: int) -> float:
        """Retry delay after the ``failures``-th failed attempt: base * 2**(failures-1), capped."""
        if failures <= 0 or self.backoff_base_s == 0:
            return 0.0
        exponent = min(failures - 1, 63)
        return float(min(self.backoff_cap_s, self.backoff_base_s * 2.0**exponent))


_SPEC_FIELDS = (
    "name",
    "sources",
    "filter",
    "max_attempts",
    "visibility_s",
    "backoff_base_s",
    "backoff_cap_s",
    "retention_s",
    "max_consumers",
    "max_in_flight",
    "description",
)


def spec_to_meta(spec: GroupSpec) -> dict[str, str]:
    """Metadata updates that store ``spec`` (canonical JSON: sorted keys, no spaces)."""
    spec.check()
    body: dict[str, Any] = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    body["sources"] = list(spec.sources)
    body["v"] = 1
    return {SPEC_META_KEY: json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)}


def spec_from_meta(meta: Mapping[str, str]) -> GroupSpec:
    text = meta.get(SPEC_META_KEY)
    if text is None:
        raise MalformedError("not a group: its log has no 'group' metadata")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise MalformedError("group definition is not JSON") from exc
    if type(body) is not dict or body.get("v") != 1 or set(body) != {*_SPEC_FIELDS, "v"}:
        raise MalformedError(f"group definition must have exactly the fields v=1, {', '.join(_SPEC_FIELDS)}")
    if type(body["sources"]) is not list:
        raise MalformedError("group sources are a list")
    fields = {name: body[name] for name in _SPEC_FIELDS}
    fields["sources"] = tuple(body["sources"])
    spec = GroupSpec(**fields)
    spec.check()
    return spec


def create_group(identity: Identity, spec: GroupSpec, now_ms: int) -> QueueState:
    """The group's signed log: an empty ``KIND_GROUP`` queue whose metadata is the definition."""
    state = core.empty_state(identity.public_key, spec.name, KIND_GROUP)
    return core.commit(state, identity, now_ms=now_ms, meta_updates=spec_to_meta(spec))


def read_group(state: QueueState) -> tuple[GroupSpec, dict[str, GroupProgress]]:
    """A replica's (or the owner's) view of a group: its definition and the fold of the ops it holds."""
    if state.kind != KIND_GROUP:
        raise MalformedError("not a group log (wrong kind)")
    spec = spec_from_meta(state.meta_dict)
    if spec.name != state.name:
        raise MalformedError("group definition names another group")
    return spec, apply_progress_ops({}, ops_from_records(state.entries.records()))


# ------------------------------------------------------------------------------------------ dead letters


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One delivery attempt: who held it, when, how it ended (``OUTCOMES``, or ``"acked"``) and, for a
    nack, the reason its consumer gave (``error``, at most :data:`MAX_ERROR_CHARS`)."""

    number: int
    consumer: str
    leased_at_ms: int
    ended_at_ms: int
    outcome: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """Where a dead letter came from and why: carried in the ``x-dlq`` header of its DLQ record."""

    source: str
    offset: int
    attempts: int
    correlation_id: str
    reason: str
    dead_at_ms: int
    history: tuple[AttemptRecord, ...] = ()


def correlation_id(record: Record, source: str, offset: int) -> str:
    """The producer's ``correlation-id`` header if usable, else one derived from (source, offset), so the
    same record gets the same id on every delivery, on every replica and after restarts."""
    raw = record.header(CORRELATION_HEADER) if record.headers else None
    if raw:
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            text = ""
        if text and len(raw) <= MAX_CORRELATION_BYTES and text.isprintable():
            return text
    digest = hashlib.blake2b(f"{source}@{offset}".encode(), digest_size=16, person=b"latticed.corr.v1")
    return digest.hexdigest()


def _ms(name: str, value: Any) -> int:
    if type(value) is not int or not -(2**63) <= value < 2**63:
        raise MalformedError(f"dead letter: {name} is a 64-bit integer (ms)")
    return value


def _short_text(name: str, value: Any, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value.encode()) > limit:
        raise MalformedError(f"dead letter: {name} is text of 1-{limit} bytes")
    return value


def _attempt_to_wire(a: AttemptRecord) -> list[Any]:
    """``[number, consumer, leased_at, ended_at, outcome]``, plus the error text when there is one."""
    item: list[Any] = [a.number, a.consumer, a.leased_at_ms, a.ended_at_ms, a.outcome]
    if a.error:
        item.append(a.error)
    return item


def attempt_from_wire(item: Any, outcomes: tuple[str, ...] = OUTCOMES) -> AttemptRecord:
    """Strict inverse of :func:`_attempt_to_wire` (``outcomes``: which endings are allowed)."""
    if type(item) is not list or len(item) not in (5, 6):
        raise MalformedError("an attempt is [number, consumer, leased_at, ended_at, outcome, error?]")
    number, consumer, leased_at, ended_at, outcome = item[:5]
    error = item[5] if len(item) == 6 else ""
    if type(number) is not int or not 0 < number <= MAX_ATTEMPTS or outcome not in outcomes:
        raise MalformedError("bad attempt number or outcome")
    if not isinstance(error, str) or len(error) > MAX_ERROR_CHARS:
        raise MalformedError(f"an attempt's error is text of at most {MAX_ERROR_CHARS} characters")
    return AttemptRecord(
        number,
        _short_text("consumer", consumer, MAX_CONSUMER_BYTES),
        _ms("leased_at", leased_at),
        _ms("ended_at", ended_at),
        outcome,
        error,
    )


def _info_to_wire(info: DeadLetterInfo) -> bytes:
    history = [_attempt_to_wire(a) for a in info.history]
    body = [
        _DLQ_VERSION,
        info.source,
        info.offset,
        info.attempts,
        info.correlation_id,
        info.reason,
        info.dead_at_ms,
        history,
    ]
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def _info_from_wire(raw: bytes) -> DeadLetterInfo:
    try:
        items = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise MalformedError("undecodable dead-letter header") from exc
    if type(items) is not list or len(items) != 8 or items[0] != _DLQ_VERSION:
        raise MalformedError(
            "a dead-letter header is [1, source, offset, attempts, corr, reason, at, history]"
        )
    _, source, offset, attempts, corr, reason, dead_at, history = items
    parse_source_id(source)
    if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
        raise MalformedError("dead letter: offset out of range")
    if type(attempts) is not int or not 0 <= attempts <= MAX_ATTEMPTS:
        raise MalformedError("dead letter: attempts out of range")
    if reason not in OUTCOMES:
        raise MalformedError(f"dead letter: unknown reason {reason!r}")
    if type(history) is not list or len(history) > MAX_HISTORY:
        raise MalformedError(f"dead letter: history is a list of at most {MAX_HISTORY} attempts")
    try:
        attempts_out = [attempt_from_wire(item) for item in history]
    except MalformedError as exc:
        raise MalformedError(f"dead letter: {exc}") from exc
    return DeadLetterInfo(
        source,
        offset,
        attempts,
        _short_text("correlation id", corr, MAX_CORRELATION_BYTES),
        reason,
        _ms("dead_at", dead_at),
        tuple(attempts_out),
    )


# --------------------------------------------------------------------------------------- attempt history

#: Key of the group log's attempt-history records (progress ops are keyed by their source id, which cannot
#: start with "~", so folding tells them apart without decoding).
HISTORY_KEY = b"~history"
HISTORY_OUTCOMES = (*OUTCOMES, ACKED)
_OUTCOME_INDEX = {outcome: i for i, outcome in enumerate(HISTORY_OUTCOMES)}
_HISTORY_VERSION = 1
_MAX_HISTORY_ENTRIES = 1 << 20


@dataclass(frozen=True, slots=True)
class AttemptEntry:
    """One ended attempt of one record, as the group log keeps it (durable attempt history)."""

    source: str
    offset: int
    attempt: AttemptRecord


def encode_history(entries: Iterable[AttemptEntry]) -> bytes:
    """``[1, sources, consumers, [[source#, offset, number, consumer#, leased_ms, ended_ms, outcome#,
    error?], ...]]``: sources and consumers listed once per record (they repeat across entries)."""
    sources: dict[str, int] = {}
    consumers: dict[str, int] = {}
    rows = []
    outcome_index = _OUTCOME_INDEX
    for entry in entries:
        a = entry.attempt
        source = sources.get(entry.source)
        if source is None:
            source = sources[entry.source] = len(sources)
        consumer = consumers.get(a.consumer)
        if consumer is None:
            consumer = consumers[a.consumer] = len(consumers)
        row: list[Any] = [
            source,
            entry.offset,
            a.number,
            consumer,
            a.leased_at_ms,
            a.ended_at_ms,
            outcome_index[a.outcome],
        ]
        if a.error:
            row.append(a.error)
        rows.append(row)
    body = [_HISTORY_VERSION, list(sources), list(consumers), rows]
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def decode_history(raw: bytes) -> list[AttemptEntry]:
    """Strict inverse of :func:`encode_history`; anything else raises :class:`MalformedError`."""
    try:
        items = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:
        raise MalformedError("undecodable attempt history") from exc
    if type(items) is not list or len(items) != 4 or items[0] != _HISTORY_VERSION:
        raise MalformedError("attempt history is [1, sources, consumers, entries]")
    _, sources, consumers, rows = items
    if type(sources) is not list or type(consumers) is not list or type(rows) is not list:
        raise MalformedError("attempt history: sources, consumers and entries are lists")
    if len(rows) > _MAX_HISTORY_ENTRIES:
        raise MalformedError("attempt history: too many entries")
    for source in sources:
        parse_source_id(source)
    out = []
    for row in rows:
        if type(row) is not list or len(row) not in (7, 8):
            raise MalformedError("attempt history: an entry has 7 or 8 fields")
        src, offset, number, consumer, leased, ended, outcome = row[:7]
        if not (type(src) is int and 0 <= src < len(sources)):
            raise MalformedError("attempt history: bad source index")
        if not (type(consumer) is int and 0 <= consumer < len(consumers)):
            raise MalformedError("attempt history: bad consumer index")
        if not (type(outcome) is int and 0 <= outcome < len(HISTORY_OUTCOMES)):
            raise MalformedError("attempt history: bad outcome")
        if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
            raise MalformedError("attempt history: bad offset")
        wire = [number, consumers[consumer], leased, ended, HISTORY_OUTCOMES[outcome], *row[7:]]
        out.append(AttemptEntry(sources[src], offset, attempt_from_wire(wire, HISTORY_OUTCOMES)))
    return out


def history_records(entries: list[AttemptEntry], timestamp_ms: int) -> list[Record]:
    """The group-log records holding ``entries`` (split so that each fits in a record)."""
    if not entries:
        return []
    value = encode_history(entries)
    if len(value) <= MAX_VALUE_BYTES // 2 or len(entries) == 1:
        return [Record(value=value, key=HISTORY_KEY, timestamp=timestamp_ms)]
    half = len(entries) // 2
    return history_records(entries[:half], timestamp_ms) + history_records(entries[half:], timestamp_ms)


def dead_letter_record(original: Record, info: DeadLetterInfo) -> Record:
    """The DLQ record for ``original``: same key, value and timestamp; its headers plus ``correlation-id``
    (so redelivery after redrive keeps the id) and ``x-dlq`` (origin, attempts, history, reason).

    A previous ``x-dlq`` header (a redriven dead letter failing again) is replaced; if the original
    already has the maximum number of headers, the last ones are dropped to make room.
    """
    info = DeadLetterInfo(
        info.source,
        info.offset,
        info.attempts,
        info.correlation_id,
        info.reason,
        info.dead_at_ms,
        tuple(info.history[-MAX_HISTORY:]),
    )
    kept = [h for h in original.headers if h[0] not in (DLQ_HEADER, CORRELATION_HEADER)]
    del kept[MAX_HEADERS - 2 :]
    headers = (*kept, (CORRELATION_HEADER, info.correlation_id.encode()), (DLQ_HEADER, _info_to_wire(info)))
    record = Record(value=original.value, key=original.key, timestamp=original.timestamp, headers=headers)
    check_record(record)
    parse_dead_letter(record)  # what we write, we can read back: fail here, not on redrive
    return record


def parse_dead_letter(record: Record) -> DeadLetterInfo:
    """The ``x-dlq`` header of a DLQ record, strictly validated."""
    raw = record.header(DLQ_HEADER)
    if raw is None:
        raise MalformedError("not a dead letter: no x-dlq header")
    return _info_from_wire(raw)
