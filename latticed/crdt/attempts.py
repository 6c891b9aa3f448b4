"""A record's delivery attempts as a group keeps them: the attempt history in the group log and the
dead letters in its DLQ (each carrying the record, where it came from and why it failed).

Pure and replicated like the progress lattice (:mod:`latticed.crdt.group`), but a separate job: these are
records' histories, encoded for the log and the ``x-dlq`` header, while the lattice only says which
offsets are settled. The lease rules that produce them are :mod:`latticed.leases.dispatch`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.group import MAX_ATTEMPTS, parse_source_id
from latticed.crdt.records import MAX_HEADERS, MAX_OFFSET, MAX_VALUE_BYTES, Record, check_record

#: Attempt history kept per record (and written into its dead letter): the newest this many.
MAX_HISTORY = 32
MAX_CONSUMER_BYTES = 256
MAX_CORRELATION_BYTES = 256
_DLQ_VERSION = 1
DLQ_HEADER = "x-dlq"
CORRELATION_HEADER = "correlation-id"
#: How a failed attempt ended (a claimed one was handed to another consumer by ``claim``).
OUTCOMES = ("nack", "expired", "released", "claimed")
#: How a successful one did (in the attempt history only: dead letters record failures).
ACKED = "acked"
#: A nack's reason is kept up to this many characters.
MAX_ERROR_CHARS = 1024


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
    info = replace(info, history=tuple(info.history[-MAX_HISTORY:]))
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
