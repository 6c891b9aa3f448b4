"""The messages of queues on the v2 fork core (protocol feature ``heads-v2``), and their strict encodings.

They use type codes of their own (32-37, and 38-43 for the compact forms of
:mod:`latticed.protocol.core2_compact`), which no v1 decoder is ever sent: a session speaks them only on
a link that agreed on ``heads-v2`` (:mod:`latticed.protocol.core2_session`), so core-1 messages and their
decoding are untouched. Each is a msgpack array, type code first::

    DIGEST2 [32, [[owner, name, kind, summary], ...]]   what the sender holds, at link start
    DELTA2  [33, seq, summary, delta]                   a chunk of a queue, and what the sender holds
    ACK2    [34, seq, owner, name, kind, summary | nil] verified; here is what I hold (nil: nothing)
    ACK2    [34, seq]                                   verified; I hold the summary your DELTA2 seq carried
    HAVE2   [35, owner, name, kind, summary]            I hold this now (a pruned link, or no news)
    WANT2   [36, owner, name, kind, summary | nil]      graft: send me what I lack
    PRUNE2  [37, owner, name, kind]                     your delta brought nothing: HAVE2s instead

    summary  [epoch, known, fold, held_end, held_hash, heads]
    delta    [owner, name, kind, log | nil, meta | nil, from_offset, records, bodies (, steps)]
    log      [base, base_fold, epoch, shared, [[head, tail], ...], start_head | tip index | nil]
    steps    [version, bytes]

``shared`` and each ``tail`` are leaves packed 40 bytes each (digest, end as u64 big-endian); ``steps`` are
the :mod:`~latticed.crdt.leaf_codec` steps of the versions after ``version`` whose bodies end inside the
records, in place of those bodies and of their leaves in ``shared`` (:mod:`latticed.protocol.core2_steps`;
``version`` is one the receiver holds, or one of ``bodies``, whose leaves up to it ``shared`` keeps); heads
are the 296 signed bytes of :class:`~latticed.crdt.head2.HeadV2`; ``bodies`` are the 232 unsigned bytes of the
heads ending inside the records (the receiver checks them against the verified log); records are rows as
in :mod:`latticed.crdt.wire`. ``heads`` is empty unless the value is forked: then a digest of its tips and
start head (see :class:`Summary2`).

Decoding is strict and bounded: anything but exactly these layouts, a field of another type or size, an
offset past the last one, more than :data:`MAX_TIPS` branches, is a :class:`RemoteProtocolError`
raised before anything reaches the session; the message size is bounded by the caller's unpack.

Why one module: each form's encoder and its strict decoder must agree field by field, and the fuzz tests
hold them to it as one unit.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from latticed.crdt import queue2
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.epoch_delta import LogDelta, LogSummary
from latticed.crdt.epochs import Chains, Tip
from latticed.crdt.head import check_name, fresh_queue_id
from latticed.crdt.head2 import HEAD2_BODY, HEAD2_NAMESPACE, HEAD2_SIZE, HeadV2, Leaf, next_log
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import MAX_OFFSET, RecordRun
from latticed.crdt.signing import blake2b
from latticed.crdt.wire import pack, records_from_wire, records_to_wire
from latticed.errors import LocalProtocolError, RemoteProtocolError
from latticed.protocol.replication_messages import QueueKey, check_key

__all__ = [
    "CACK2",
    "CACKS2",
    "CDELTA2",
    "CDIGEST2",
    "CHAVE2",
    "CORE2_CODES",
    "CORE2_NAMES",
    "CPRUNE2",
    "CWANT2",
    "MAX_TIPS",
    "Ack2",
    "AckHeld2",
    "AckRun2",
    "Delta2",
    "Digest2",
    "Have2",
    "Message2",
    "Prune2",
    "Summary2",
    "Want2",
    "decode2",
    "delta_from_wire",
    "delta_to_wire",
    "encode2",
    "link_summary",
    "summary_from_wire",
    "summary_to_wire",
]

DIGEST2, DELTA2, ACK2, HAVE2, WANT2, PRUNE2 = range(32, 38)
#: The codes of the same messages in their compact forms (:mod:`latticed.protocol.core2_compact`).
CDIGEST2, CDELTA2, CACK2, CHAVE2, CWANT2, CPRUNE2 = range(38, 44)
#: A run of ACK2s in one (:class:`AckRun2`): a compact form only.
CACKS2: Final = 44
#: The type codes of core-2 messages, full or compact, and the names traffic counters give them.
CORE2_NAMES: Final = {
    DIGEST2: "digest2",
    DELTA2: "delta2",
    ACK2: "ack2",
    HAVE2: "have2",
    WANT2: "want2",
    PRUNE2: "prune2",
    CDIGEST2: "digest2",
    CDELTA2: "delta2",
    CACK2: "ack2",
    CHAVE2: "have2",
    CWANT2: "want2",
    CPRUNE2: "prune2",
    CACKS2: "ack2",
}
CORE2_CODES: Final = frozenset(CORE2_NAMES)
#: Branches a value may carry (an honest owner's copies make two or three; more is a leaked key).
MAX_TIPS: Final = 1024

_LEAF = struct.Struct(">32sQ")
_BODY_SIZE: Final = HEAD2_SIZE - 64
_HEADS_PERSON = b"latticed.tips.v1"


@dataclass(frozen=True, slots=True)
class Summary2:
    """What a replica holds of a core-2 queue, as a link says it: queue2's summary (the leaves it knows,
    how far it holds records) and, for a forked value, ``heads``: a digest of its tips and start head.
    Two forked values with the same shared leaves and records may hold other branches or another start
    head, which the log summary does not tell; with ``heads`` equal summaries are equal values."""

    core: queue2.Summary
    heads: bytes = b""


def link_summary(state: QueueState2) -> Summary2:
    """``queue2.summary(state)`` and the digest of a forked value's heads. An unforked value's fold is
    its newest head's :func:`~latticed.crdt.head2.next_log` (the head's signed ``log`` folds the leaves
    before it): O(1) instead of folding every leaf, on every change a link announces. Kept on the value
    (:attr:`QueueState2.memo`): the ACK, the change hook and the value ahead each ask for it."""
    memo = state.memo
    if type(memo) is Summary2:
        return memo
    summary = _link_summary(state)
    object.__setattr__(state, "memo", summary)
    return summary


def _link_summary(state: QueueState2) -> Summary2:
    chains = state.chains
    if not chains.forked and chains.tips:
        head = chains.tips[0].head
        log = LogSummary(chains.epoch, len(chains.shared) + 1, next_log(head))
        end = state.held[1]
        return Summary2(queue2.Summary(log, end, state.chain_at(end) or b""))
    heads = b""
    if chains.forked:
        start = chains.start_head.to_bytes() if chains.start_head is not None else b""
        heads = blake2b(b"".join(t.head.to_bytes() for t in chains.tips) + start, _HEADS_PERSON)
    return Summary2(queue2.summary(state), heads)


@dataclass(frozen=True, slots=True)
class Digest2:
    entries: tuple[tuple[QueueKey, Summary2], ...]


@dataclass(frozen=True, slots=True)
class Delta2:
    seq: int
    summary: Summary2  #: what the sender holds as it sends
    delta: queue2.Delta
    #: The versions whose bodies end inside the records, as steps after a version (:mod:`.core2_steps`).
    steps: Steps | None = None


@dataclass(frozen=True, slots=True)
class Ack2:
    seq: int
    key: QueueKey
    summary: Summary2 | None  #: None: the receiver holds nothing of it (the delta did not fit)


@dataclass(frozen=True, slots=True)
class AckHeld2:
    """ACK2's short form: the receiver holds exactly the summary DELTA2 ``seq`` carried (a live stream's
    usual case), so neither the queue nor the summary travels again: both sides know them by ``seq``."""

    seq: int


@dataclass(frozen=True, slots=True)
class AckRun2:
    """ACK2s of a run in one (compact links only): DELTA2s ``seq`` to ``seq + count - 1``, all of one
    queue, are stored, and the receiver holds what the last of them carried. A relay stores the pushes
    that came together in one commit; each earlier one's own ACK2 would carry that newer summary whole."""

    seq: int
    count: int


@dataclass(frozen=True, slots=True)
class Have2:
    key: QueueKey
    summary: Summary2


@dataclass(frozen=True, slots=True)
class Want2:
    key: QueueKey
    summary: Summary2 | None  #: None: the sender holds nothing of it


@dataclass(frozen=True, slots=True)
class Prune2:
    key: QueueKey


#: ``(version, leaf_codec steps)``: the versions after ``version``, rebuilt by the receiver.
Steps = tuple[int, bytes]
Message2 = Digest2 | Delta2 | Ack2 | AckHeld2 | AckRun2 | Have2 | Want2 | Prune2


# ------------------------------------------------------------------------------------------ fields


def _bytes(raw: Any, sizes: tuple[int, ...], what: str) -> bytes:
    if type(raw) is not bytes or len(raw) not in sizes:
        raise MalformedError(f"{what} must be {' or '.join(map(str, sizes))} bytes")
    return raw


def _u64(raw: Any, what: str) -> int:
    if type(raw) is not int or not 0 <= raw < 2**64:
        raise MalformedError(f"{what} must be an unsigned 64-bit integer")
    return raw


def _offset(raw: Any, what: str) -> int:
    if type(raw) is not int or not 0 <= raw <= MAX_OFFSET:
        raise MalformedError(f"{what} must be an offset, 0 to {MAX_OFFSET}")
    return raw


def _list(raw: Any, length: int | None, what: str) -> list[Any]:
    if type(raw) is not list or (length is not None and len(raw) != length):
        raise MalformedError(f"{what} must be a list" + (f" of {length} items" if length else ""))
    return raw


def summary_to_wire(s: Summary2) -> list[Any]:
    log = s.core.log
    return [log.epoch, log.known, log.fold, s.core.held_end, s.core.held_hash, s.heads]


def summary_from_wire(raw: Any) -> Summary2:
    epoch, known, fold, held_end, held_hash, heads = _list(raw, 6, "a core-2 summary")
    log = LogSummary(_u64(epoch, "an epoch"), _u64(known, "a leaf count"), _bytes(fold, (32,), "a fold"))
    core = queue2.Summary(log, _offset(held_end, "a held end"), _bytes(held_hash, (0, 32), "a chain value"))
    return Summary2(core, _bytes(heads, (0, 32), "a digest of heads"))


def _leaves_to_wire(leaves: Sequence[Leaf]) -> bytes:
    return b"".join(_LEAF.pack(digest, end) for digest, end in leaves)


def _leaves_from_wire(raw: Any) -> tuple[Leaf, ...]:
    if type(raw) is not bytes or len(raw) % _LEAF.size:
        raise MalformedError("leaves are packed 40 bytes each")
    leaves = tuple(_LEAF.iter_unpack(raw))
    if any(end > MAX_OFFSET for _, end in leaves):
        raise MalformedError(f"a leaf's end is an offset, 0 to {MAX_OFFSET}")
    return leaves


def _head(raw: Any) -> HeadV2:
    if type(raw) is not bytes:
        raise MalformedError("a signed v2 head is bytes")
    return HeadV2.from_bytes(raw)


def _body(raw: Any) -> HeadV2:
    if type(raw) is not bytes or len(raw) != _BODY_SIZE or not raw.startswith(HEAD2_NAMESPACE):
        raise MalformedError("a v2 head body is its 232 unsigned bytes")
    body = HeadV2(*HEAD2_BODY.unpack_from(raw, len(HEAD2_NAMESPACE)))
    body.check()
    return body


def _start_head(raw: Any, tips: list[Tip]) -> HeadV2 | None:
    """A log's start head: none, its signed bytes, or the index of the tip whose head it is."""
    if raw is None:
        return None
    if type(raw) is int:
        if not 0 <= raw < len(tips):
            raise MalformedError("a start head names a tip the log does not carry")
        return tips[raw].head
    return _head(raw)


def _log_to_wire(log: LogDelta) -> list[Any]:
    value = log.value
    tips = [[t.head.to_bytes(), _leaves_to_wire(t.tail)] for t in value.tips]
    start: bytes | int | None = None
    if value.start_head is not None:
        # Where the start did not move, the start head is a tip's own head: its index, not 296 bytes again.
        start = next((i for i, t in enumerate(value.tips) if t.head == value.start_head), None)
        if start is None:
            start = value.start_head.to_bytes()
    return [log.base, log.base_fold, value.epoch, _leaves_to_wire(value.shared), tips, start]


def _log_from_wire(raw: Any, owner: bytes, qid: bytes) -> LogDelta:
    base, base_fold, epoch, shared, tips_raw, start = _list(raw, 6, "a core-2 log")
    tips_list = _list(tips_raw, None, "tips")
    if len(tips_list) > MAX_TIPS:
        raise MalformedError(f"more than {MAX_TIPS} branches")
    tips = []
    for item in tips_list:
        head, tail = _list(item, 2, "a tip")
        tips.append(Tip(_head(head), _leaves_from_wire(tail)))
    value = Chains(
        owner,
        qid,
        _u64(epoch, "an epoch"),
        _leaves_from_wire(shared),
        tuple(tips),
        _start_head(start, tips),
    )
    return LogDelta(_u64(base, "a leaf count"), _bytes(base_fold, (32,), "a fold"), value)


def delta_to_wire(d: queue2.Delta, steps: Steps | None = None) -> list[Any]:
    """``d`` as it travels, with ``steps`` (then ``d`` leaves out what they rebuild)."""
    return [
        d.owner,
        d.name,
        d.kind,
        None if d.log is None else _log_to_wire(d.log),
        None if d.meta is None else [[k, v] for k, v in d.meta],
        d.from_offset,
        records_to_wire(RecordRun.of(d.records)),  # zipped from columns: the bytes rows give, sooner
        [b.body() for b in d.bodies],
        *([] if steps is None else [[steps[0], steps[1]]]),
    ]


def delta_from_wire(raw: Any) -> tuple[queue2.Delta, Steps | None]:
    """A delta and its steps (None: none), or :class:`MalformedError`."""
    if type(raw) is not list or len(raw) not in (8, 9):
        raise MalformedError("a core-2 delta is a list of 8 or 9 items")
    owner, name, kind, log, meta, from_offset, records, bodies = raw[:8]
    steps: Steps | None = None
    if len(raw) == 9:
        version, raw_steps = _list(raw[8], 2, "steps")
        if type(raw_steps) is not bytes:
            raise MalformedError("steps are bytes")
        steps = (_u64(version, "a version"), raw_steps)
    try:
        owner, name, kind = check_key(owner, name, kind)
    except RemoteProtocolError as exc:
        raise MalformedError(str(exc)) from exc
    check_name(name)
    if not 0 <= kind <= 255:
        raise MalformedError("a queue kind is one byte")
    qid = fresh_queue_id(owner, name, kind)  # not cached: a peer's names may name nothing
    pairs: tuple[tuple[str, str], ...] | None = None
    if meta is not None:
        items = _list(meta, None, "metadata")
        if not all(type(i) is list and len(i) == 2 and all(type(x) is str for x in i) for i in items):
            raise MalformedError("metadata is a list of [str, str] pairs")
        pairs = tuple((k, v) for k, v in items)
    piece = None if log is None else _log_from_wire(log, owner, qid)
    delta = queue2.Delta(
        owner,
        name,
        kind,
        piece,
        pairs,
        _offset(from_offset, "a first offset"),
        records_from_wire(records),  # a run, checked a column at a time: verify_delta does not repeat it
        tuple(_body(b) for b in _list(bodies, None, "bodies")),
    )
    return delta, steps


# ------------------------------------------------------------------------------------------ messages


def _key(m: Ack2 | Have2 | Want2 | Prune2) -> list[Any]:
    return [m.key[0], m.key[1], m.key[2]]


def encode2(message: Message2) -> bytes:
    """The wire bytes of a core-2 message."""
    match message:
        case Digest2():
            rows = [[k[0], k[1], k[2], summary_to_wire(s)] for k, s in message.entries]
            return pack([DIGEST2, rows])
        case Delta2():
            wire = delta_to_wire(message.delta, message.steps)
            return pack([DELTA2, message.seq, summary_to_wire(message.summary), wire])
        case Ack2():
            summary = None if message.summary is None else summary_to_wire(message.summary)
            return pack([ACK2, message.seq, *_key(message), summary])
        case AckHeld2():
            return pack([ACK2, message.seq])
        case Have2():
            return pack([HAVE2, *_key(message), summary_to_wire(message.summary)])
        case Want2():
            summary = None if message.summary is None else summary_to_wire(message.summary)
            return pack([WANT2, *_key(message), summary])
        case Prune2():
            return pack([PRUNE2, *_key(message)])
    raise LocalProtocolError(f"not a core-2 message: {type(message).__name__}")


_LENGTHS: Final = {DIGEST2: 2, DELTA2: 4, ACK2: 6, HAVE2: 5, WANT2: 5, PRUNE2: 4}


def _seq(raw: Any) -> int:
    if type(raw) is not int or not 0 <= raw < 2**64:
        raise MalformedError("a sequence number is an unsigned 64-bit integer")
    return raw


def decode2(raw: list[Any]) -> Message2:
    """The core-2 message in an array :func:`~latticed.protocol.replication_messages.unpack_message`
    returned (its type code in :data:`CORE2_CODES`); anything malformed is a RemoteProtocolError."""
    code = raw[0]
    if _LENGTHS.get(code) != len(raw) and (code, len(raw)) != (ACK2, 2):
        raise RemoteProtocolError(f"core-2 message {code} with {len(raw)} items")
    name = CORE2_NAMES[code].upper()
    try:
        if code == DIGEST2:
            entries = []
            for row in _list(raw[1], None, "DIGEST2 entries"):
                owner, qname, kind, summary = _list(row, 4, "a DIGEST2 entry")
                entries.append((check_key(owner, qname, kind), summary_from_wire(summary)))
            return Digest2(tuple(entries))
        if code == ACK2 and len(raw) == 2:
            return AckHeld2(_seq(raw[1]))
        if code == DELTA2:
            delta, steps = delta_from_wire(raw[3])
            return Delta2(_seq(raw[1]), summary_from_wire(raw[2]), delta, steps)
        key = check_key(*raw[-4:-1]) if code != PRUNE2 else check_key(*raw[1:])
        if code == ACK2:
            return Ack2(_seq(raw[1]), key, None if raw[5] is None else summary_from_wire(raw[5]))
        if code == HAVE2:
            return Have2(key, summary_from_wire(raw[4]))
        if code == WANT2:
            return Want2(key, None if raw[4] is None else summary_from_wire(raw[4]))
        return Prune2(key)
    except MalformedError as exc:
        raise RemoteProtocolError(f"bad {name} from peer: {exc}") from exc
