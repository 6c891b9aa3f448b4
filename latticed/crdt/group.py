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

The definition is :mod:`latticed.crdt.group_spec`; the attempt history and the dead letters themselves
are :mod:`latticed.crdt.attempts`. This module is the names, the lattice and its ops.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head import check_name
from latticed.crdt.records import MAX_OFFSET, Record
from latticed.crdt.signing import PUBLIC_KEY_SIZE

MAX_ATTEMPTS = 2**32 - 1
_MAX_OP_ITEMS = 1 << 20
_OP_VERSION = 1
_DLQ_SUFFIX = ".dlq"


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
