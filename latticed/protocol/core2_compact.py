"""Core-2 messages on a link that agreed on both ``compact`` and ``heads-v2``: what the link carried before
is not sent again.

A live DELTA2 of one 100-byte record is ~600 bytes in the full form (:mod:`.core2_wire`): the 296-byte
signed head whole (a fixed namespace, the queue id, five 32-byte hashes), the sender's 74-byte summary,
the base fold, the owner key and the queue named in full. These forms (type codes 38-43) leave that out
the way core 1's :mod:`latticed.protocol.compact` does. Both ends keep the same per-link, per-direction
memory, updated as each of these messages is encoded and as it is decoded (one ordered stream, so the two
never differ):

* a number per queue key, in order of first use (at most :data:`MAX_REFS`): later messages name the
  queue by it;
* per numbered queue, the *ref*: the last tip head a compact DELTA2 of it carried. The next head's
  counters are written relative to it, and a hash is left out where one rule rebuilds it.

A left-out field is rebuilt by one rule (``_base_fold``, ``_head_log``, ``_base_hash``, ``_head_hash``,
``_meta_hash``), which the encoder runs on its own memory: a field is left out only when the rule gives
exactly its bytes. So the receiver rebuilds every signed head to the same bytes and ``queue2.verify_delta``
checks the signature over them as strictly as ever (a forged or altered head, or records that are not the
ones signed, fail that check); a field the rule cannot rebuild is a :class:`RemoteProtocolError`, never a
guess. The sender's summary is left out (nil) when it is exactly what the delta leaves the receiver
holding along its only tip (:func:`_implied`).

Layouts (msgpack arrays, type code first; ``queue`` is a number this direction gave it, or ``[owner,
name, kind]``, numbered then while there is room)::

    CDIGEST2 [38, [[queue, summary], ...]]
    CDELTA2  [39, seq, queue, summary | nil, log | nil, meta | nil, from_offset | nil, records, bodies,
              steps | nil]
    CACK2    [40, seq, queue, summary | nil]
    CHAVE2   [41, queue, summary]
    CWANT2   [42, queue, summary | nil]
    CPRUNE2  [43, queue]
    CACKS2   [44, seq, count]     ACK2s of DELTA2s seq .. seq + count - 1 (count >= 2), all of one
                                  queue: the receiver holds what the last carried

    records  rows as in :mod:`.core2_wire`, each timestamp less the row's before (the first's less the
             ref's timestamp); where the link agreed on :data:`REPEAT_HEADERS`, a row's headers equal
             to the row's before are nil (a producer's stamp, ~84 bytes, goes once a delta)
    log      [base - ref.version, base_fold | nil, epoch, shared, [[head, tail], ...], start]
    head     its 296 signed bytes, or [version, log | nil, start, end, base_hash | nil, head_hash | nil,
             meta_version, meta_hash | nil, timestamp, signature] (counters less the ref's, if any; the
             log's epoch and the queue's id)
    steps    [version - ref.version, bytes]

A relay passes a push on as it came (``net/core2_ahead.Relay``): where the link it goes out on carried
the same ref for the queue as the one it came in on, the fields written relative to the ref go out as
they were received (:class:`_Received`), not rebuilt and compared again: the receiver, with that same
ref, rebuilds from them the bytes this end rebuilt and verified.

``from_offset`` nil is the ref's end; ``summary``, ``meta``, ``bodies``, ``shared``, ``tail`` and
``start`` are as in :mod:`.core2_wire`. ACK2's short form ``[34, seq]`` is already compact and stays; a
relay's pushes stored in one commit are acknowledged by one ``CACKS2``.

Why one module: the encoder and the decoder must apply the same rules to the same memory; apart, one
could change without the other and a receiver would rebuild other bytes than were signed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise, repeat
from operator import sub
from typing import Any, Final

from latticed.crdt import chain_memo, columns_compiled, queue2
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.epoch_delta import LogDelta, LogSummary
from latticed.crdt.epochs import Chains, Tip
from latticed.crdt.head import check_name, fresh_queue_id, genesis_hash, meta_hash
from latticed.crdt.head2 import HeadV2, Leaf, fold, genesis, next_log
from latticed.crdt.records import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    MIXED,
    Headers,
    Record,
    RecordRun,
    chain_extend,
    uniform,
)
from latticed.crdt.wire import pack, records_from_wire, records_to_wire
from latticed.errors import RemoteProtocolError
from latticed.protocol import core2_head_compiled
from latticed.protocol.core2_wire import (  # the full forms' field decoders, shared
    CACK2,
    CACKS2,
    CDELTA2,
    CDIGEST2,
    CHAVE2,
    CORE2_NAMES,
    CPRUNE2,
    CWANT2,
    MAX_TIPS,
    Ack2,
    AckRun2,
    Delta2,
    Digest2,
    Have2,
    Message2,
    Prune2,
    Steps,
    Summary2,
    Want2,
    _body,
    _bytes,
    _head,
    _leaves_from_wire,
    _leaves_to_wire,
    _offset,
    _start_head,
    _u64,
    encode2,
    summary_from_wire,
    summary_to_wire,
)
from latticed.protocol.queue_numbers import name_queue, named_queue
from latticed.protocol.replication_messages import QueueKey

__all__ = ["CHAIN_LIMIT", "COMPACT2_CODES", "LEAF_LIMIT", "MAX_REFS", "REPEAT_HEADERS", "Compact2Link"]

#: The feature of compact DELTA2 rows whose headers equal the row's before sent as nil. A decoder of this
#: build reads them on any link (the form is unambiguous: a row's headers are otherwise a list); an
#: encoder sends them only on a link that agreed on the feature.
REPEAT_HEADERS: Final = "repeat-headers"

#: Queues a link numbers per direction (beyond that a queue is named in full, and nothing is remembered
#: of it): bounds what a peer can make us keep (a key and one head each).
MAX_REFS: Final = 4096
#: A head hash is rebuilt from the records only for chunks this small (the receiver hashes them again
#: when it verifies; a live push is a record or a few).
CHAIN_LIMIT: Final = 64
#: A tip's log is rebuilt by folding the leaves the delta carries only when they are this few.
LEAF_LIMIT: Final = 64
#: The type codes of this module's forms.
COMPACT2_CODES: Final = frozenset({CDIGEST2, CDELTA2, CACK2, CHAVE2, CWANT2, CPRUNE2, CACKS2})
_SIGNATURE_SIZE: Final = 64
_EMPTY_META_HASH: Final = meta_hash({})


@dataclass(slots=True)
class _Queue:
    """What one direction remembers of a numbered queue: its id (computed once per link, at its first
    delta: the peer chooses the names, so not through ``queue_id``'s cache) and the ref."""

    qid: bytes | None = None
    ref: HeadV2 | None = None


@dataclass(slots=True)
class _Direction:
    numbers: dict[QueueKey, int] = field(default_factory=dict)
    keys: list[QueueKey] = field(default_factory=list)
    queues: dict[QueueKey, _Queue] = field(default_factory=dict)

    def learn(self, key: QueueKey) -> None:
        if key not in self.numbers and len(self.keys) < MAX_REFS:
            self.numbers[key] = len(self.keys)
            self.keys.append(key)
            self.queues[key] = _Queue()

    def qid(self, key: QueueKey) -> bytes:
        known = self.queues.get(key)
        if known is None:
            return fresh_queue_id(*key)
        if known.qid is None:
            known.qid = fresh_queue_id(*key)
        return known.qid

    def ref(self, key: QueueKey) -> HeadV2 | None:
        known = self.queues.get(key)
        return None if known is None else known.ref

    def carried(self, key: QueueKey, d: queue2.Delta) -> None:
        """The delta went by: its only tip is the queue's ref from now on (a forked log leaves it)."""
        known = self.queues.get(key)
        if known is not None and d.log is not None and len(d.log.value.tips) == 1:
            known.ref = d.log.value.tips[0].head


# -------------------------------------------------------------------- the rules that rebuild a field


@dataclass(frozen=True, slots=True)
class _Context:
    """What the rules of one delta's heads read: the link's memory and the delta's other fields, each
    costly one computed once per delta (:func:`_context`), so a message's rebuilding costs about what
    verifying it does."""

    qid: bytes
    ref: HeadV2 | None
    epoch: int
    #: The base fold extended by the shared leaves the delta carries (None: more than LEAF_LIMIT).
    shared_fold: bytes | None
    from_offset: int
    #: The records, for a head hash rebuilt from them: only in a log of one tip (a forked one's heads
    #: would each hash them again).
    records: Sequence[Record]
    meta: tuple[tuple[str, str], ...] | None


#: A :class:`_Context`'s fields in its order, as :func:`_compiled_head` takes them.
_Fields = tuple[
    bytes, HeadV2 | None, int, bytes | None, int, Sequence[Record], tuple[tuple[str, str], ...] | None
]


def _context(
    qid: bytes,
    ref: HeadV2 | None,
    log: tuple[int, bytes, Sequence[Leaf], int],
    frame: tuple[int, Sequence[Record], tuple[tuple[str, str], ...] | None],
) -> _Context:
    """``log``: its epoch, base fold, shared leaves and number of tips; ``frame``: the delta's first
    offset, records and metadata."""
    epoch, base_fold, shared, tips = log
    from_offset, records, meta = frame
    shared_fold = fold(base_fold, shared) if len(shared) <= LEAF_LIMIT else None
    return _Context(qid, ref, epoch, shared_fold, from_offset, records if tips == 1 else (), meta)


def _base_fold(qid: bytes, ref: HeadV2 | None, epoch: int, base: int) -> bytes | None:
    if base == 0:
        return genesis(qid, epoch)
    if ref is not None and ref.epoch == epoch and ref.version == base:
        return next_log(ref)  # the ref's log folds the leaves before it; its own leaf is the last
    return None


def _head_log(c: _Context, tail: tuple[Leaf, ...]) -> bytes | None:
    """A tip's log folds the base's leaves, the shared ones the delta carries and its tail."""
    if c.shared_fold is None or len(tail) > LEAF_LIMIT:
        return None
    return fold(c.shared_fold, tail)


def _base_hash(c: _Context, start: int) -> bytes | None:
    if c.ref is not None and c.ref.start == start:
        return c.ref.base_hash
    return genesis_hash(c.qid) if start == 0 else None


def _head_hash(c: _Context, start: int, end: int, base_hash: bytes, *, keep: bool = False) -> bytes | None:
    """The chain value at the records' end when they end at ``end`` and start where the chain value is
    known (the ref's end, the head's start, the queue's genesis); else the ref's where ends agree.
    ``keep``: the chain goes to :mod:`~latticed.crdt.chain_memo` (a delta read: its steps and its
    verification hash the same records from the same base next)."""
    records, frm = c.records, c.from_offset
    if records and len(records) <= CHAIN_LIMIT and frm + len(records) == end:
        base = None
        if c.ref is not None and c.ref.end == frm:
            base = c.ref.head_hash
        elif frm == start:
            base = base_hash
        elif frm == 0:
            base = genesis_hash(c.qid)
        if base is not None:
            chain = chain_extend(base, frm, records)
            if keep:
                chain_memo.remember(base, frm, records, chain)
            return chain[-1]
    if c.ref is not None and c.ref.end == end:
        return c.ref.head_hash
    return None


def _meta_hash(c: _Context, meta_version: int) -> bytes | None:
    if c.ref is not None and c.ref.meta_version == meta_version:
        return c.ref.meta_hash
    if c.meta is not None:
        return meta_hash(dict(c.meta))
    return _EMPTY_META_HASH if meta_version == 0 else None


#: The last delta :func:`_implied` answered for, and its answer (held, so compared by identity): a relay
#: asks it of each live push twice, reading it and passing it on as it came. One slot read and written
#: as one tuple, so a reader in another thread sees a delta with its own answer.
_last_implied: list[tuple[object, Summary2 | None]] = [(None, None)]


def _implied(d: queue2.Delta) -> Summary2 | None:
    """What a receiver holds once it joined ``d`` along its only tip (None: a forked log, or none)."""
    known, answer = _last_implied[0]
    if known is d:
        return answer
    if d.log is None or len(d.log.value.tips) != 1:
        return None
    head = d.log.value.tips[0].head
    log = LogSummary(head.epoch, head.version, next_log(head))
    implied = Summary2(queue2.Summary(log, head.end, head.head_hash))
    _last_implied[0] = (d, implied)  # a delta, its log and its tips are frozen: the answer holds
    return implied


# ------------------------------------------------------------------------------------ field helpers


def _int(raw: Any, what: str) -> int:
    if type(raw) is not int:
        raise MalformedError(f"{what} must be an integer")
    return raw


def _needed(value: bytes | None, what: str) -> bytes:
    if value is None:
        raise MalformedError(f"it leaves out {what}, which this link cannot rebuild")
    return value


def _list(raw: Any, length: int, what: str) -> list[Any]:
    if type(raw) is not list or len(raw) != length:
        raise MalformedError(f"{what} must be a list of {length} items")
    return raw


def _meta_from_wire(raw: Any) -> tuple[tuple[str, str], ...] | None:
    if raw is None:
        return None
    if type(raw) is not list or not all(
        type(i) is list and len(i) == 2 and type(i[0]) is str and type(i[1]) is str for i in raw
    ):
        raise MalformedError("metadata is a list of [str, str] pairs")
    return tuple((i[0], i[1]) for i in raw)


def _records_out(records: RecordRun, base: int, repeat: bool) -> list[Any]:
    """Rows as in :mod:`.core2_wire`, each timestamp less the one before (the first less ``base``, the
    ref's): a record's stamp is its commit's, 1 byte instead of 9. ``repeat``: headers equal to the
    row's before go as nil."""
    stamps = records.timestamps
    steps = tuple(map(sub, stamps, (base, *stamps[:-1])))
    if records.headers is None:  # ``records_to_wire`` of the run with these stamps, with no run built
        return list(zip(records.keys, records.values, steps, ((),) * len(steps), strict=True))
    if not repeat:
        return records_to_wire(RecordRun(records.values, records.keys, steps, records.headers))
    return list(zip(records.keys, records.values, steps, _header_runs(records.headers), strict=True))


def _header_runs(headers: tuple[Headers, ...]) -> list[Any]:
    """The header column as rows carry it, each entry equal to the one before it nil."""
    same = uniform(headers)
    if same is not MIXED:  # a producer's stamp: converted once, then nil
        return [[[k, v] for k, v in same], *repeat(None, len(headers) - 1)]
    out: list[Any] = [[[k, v] for k, v in headers[0]]]
    out += [None if h == before else [[k, v] for k, v in h] for before, h in pairwise(headers)]
    return out


def _restamped(raw: Any, base: int) -> Any:
    """``raw``'s rows with their timestamps summed back and nil headers replaced by the row's before,
    in place (their limits are checked after, as any row's are). Nil headers on the first row repeat
    nothing: malformed."""
    if type(raw) is not list:
        return raw
    stamp, before = base, None
    for row in raw:
        if type(row) is not list or len(row) != 4 or type(row[2]) is not int:
            raise MalformedError("a record is [key, value, timestamp step, headers]")
        stamp = row[2] = stamp + row[2]
        if row[3] is None:
            if before is None:
                raise MalformedError("a record's headers repeat no record's before it")
            row[3] = before
        else:
            before = row[3]
    return raw


def _records_in(raw: Any, base: int) -> RecordRun:
    """The delta's rows as a checked run: plain rows (no headers, a stamp within 64 bits) in one C pass
    (``compact_rows``: restamped, typed and bounded as :func:`check_records` bounds them, in place of
    ~15 Python calls a live push), anything else, or no compiled module, by :func:`_restamped` and
    ``records_from_wire``, which decide (tests/protocol/test_compact_rows_compiled.py pins the two)."""
    columns = columns_compiled.load()
    read = None if columns is None else getattr(columns, "compact_rows", None)  # None: a stale build
    found = None if read is None else read(raw, base, MAX_VALUE_BYTES, MAX_KEY_BYTES)
    if found is not None:
        return RecordRun.checked(*found)
    return records_from_wire(_restamped(raw, base))


def _head_out(h: HeadV2, c: _Context, tail: tuple[Leaf, ...]) -> bytes | list[Any]:
    if h.epoch != c.epoch or h.queue_id != c.qid:
        return h.to_bytes()
    ref = c.ref
    base_hash = _base_hash(c, h.start)
    return [
        h.version - (ref.version if ref else 0),
        None if _head_log(c, tail) == h.log else h.log,
        h.start - (ref.start if ref else 0),
        h.end - (ref.end if ref else 0),
        None if base_hash == h.base_hash else h.base_hash,
        None if _head_hash(c, h.start, h.end, h.base_hash) == h.head_hash else h.head_hash,
        h.meta_version - (ref.meta_version if ref else 0),
        None if _meta_hash(c, h.meta_version) == h.meta_hash else h.meta_hash,
        h.timestamp - (ref.timestamp if ref else 0),
        h.signature,
    ]


def _compiled_head(raw: list[Any], c: _Fields, tail: tuple[Leaf, ...]) -> HeadV2 | None:
    """The live case of :func:`_head_in` in one C pass (None: not built or not that case). A left-out
    head hash is the records' chain from the ref's end, hashed here (the pass parses nothing) and kept
    for the steps and the verification, as :func:`_head_hash` keeps it. Nothing is read or hashed here
    that the Python path would not read and hash for the same head: a ref exactly of ``HeadV2`` (the
    pass reads no other), and the records hashed only where the head's end is theirs (a sent end
    difference of exactly their count from the ref's end), as :func:`_head_hash` hashes them. It takes
    a :class:`_Context`'s fields as a tuple (:data:`_Fields`): a live push
    (:meth:`Compact2Link._live_delta`) builds no context, a frozen dataclass's seven setattrs."""
    qid, ref, epoch, shared_fold, frm, records, meta = c
    if ref is not None and type(ref) is not HeadV2:
        return None
    chain = None
    n = len(records.values) if type(records) is RecordRun else len(records)  # (no ``__len__`` frame)
    if (
        raw[5] is None
        and ref is not None
        and n
        and n <= CHAIN_LIMIT
        and ref.end == frm
        and type(raw[3]) is int
        and raw[3] == n
    ):
        chain = chain_extend(ref.head_hash, frm, records)
    head = core2_head_compiled.compact_head(
        raw,
        ref,
        queue_id=qid,
        epoch=epoch,
        shared_fold=shared_fold,
        tail=tail,
        chained=None if chain is None else chain[-1],
        records_end=frm + n,
        empty_meta=_EMPTY_META_HASH if meta is None else None,
    )
    if head is not None and chain is not None and ref is not None:
        chain_memo.remember(ref.head_hash, frm, records, chain)
    return head


def _head_in(raw: Any, c: _Context, tail: tuple[Leaf, ...]) -> HeadV2:
    if type(raw) is bytes:
        return _head(raw)
    fields = _list(raw, 10, "a compact head")
    head = _compiled_head(
        fields, (c.qid, c.ref, c.epoch, c.shared_fold, c.from_offset, c.records, c.meta), tail
    )
    if head is not None:
        return head
    ref = c.ref
    version = _int(fields[0], "a head's version") + (ref.version if ref else 0)
    start = _int(fields[2], "a head's start") + (ref.start if ref else 0)
    end = _int(fields[3], "a head's end") + (ref.end if ref else 0)
    meta_version = _int(fields[6], "a head's metadata version") + (ref.meta_version if ref else 0)
    timestamp = _int(fields[8], "a head's timestamp") + (ref.timestamp if ref else 0)
    hashes = [None if fields[i] is None else _bytes(fields[i], (32,), "a hash") for i in (1, 4, 5, 7)]
    signature = _bytes(fields[9], (_SIGNATURE_SIZE,), "a signature")
    log = hashes[0] if hashes[0] is not None else _needed(_head_log(c, tail), "a head's log")
    base_hash = hashes[1] if hashes[1] is not None else _needed(_base_hash(c, start), "a base hash")
    head_hash = hashes[2]
    if head_hash is None:
        head_hash = _needed(_head_hash(c, start, end, base_hash, keep=True), "a head hash")
    mhash = hashes[3] if hashes[3] is not None else _needed(_meta_hash(c, meta_version), "a meta hash")
    head = HeadV2(
        c.qid,
        c.epoch,
        version,
        log,
        start,
        end,
        base_hash,
        head_hash,
        meta_version,
        mhash,
        timestamp,
        signature,
    )
    head.check()
    return head


@dataclass(frozen=True, slots=True)
class _Received:
    """The newest compact DELTA2 decoded in this process: the delta and steps it became (kept alive, so
    their identity names them), the ref it was read against, and its fields as they came (log, meta,
    first offset, bodies, steps; the records' timestamps are restamped as they are read)."""

    delta: queue2.Delta
    steps: Steps | None
    ref: HeadV2 | None
    fields: tuple[Any, Any, Any, Any, Any]


#: One slot (the event loop's codecs only): a push is passed on right after it is read.
_as_received: list[_Received | None] = [None]


def _start_out(value: Chains) -> bytes | int | None:
    if value.start_head is None:
        return None
    index = next((i for i, t in enumerate(value.tips) if t.head == value.start_head), None)
    return value.start_head.to_bytes() if index is None else index


def _fields_out(
    d: queue2.Delta, steps: Steps | None, ref: HeadV2 | None, qid: bytes, records: RecordRun
) -> tuple[Any, Any, Any, Any, Any]:
    """A DELTA2's log, metadata, first offset, bodies and steps, each written relative to ``ref`` (the
    last head of the queue this link carried) and left out where the receiver rebuilds it."""
    log: list[Any] | None = None
    if d.log is not None:
        value = d.log.value
        base_fold = _base_fold(qid, ref, value.epoch, d.log.base)
        c = _context(
            qid,
            ref,
            (value.epoch, d.log.base_fold, value.shared, len(value.tips)),
            (d.from_offset, records, d.meta),
        )
        tips = [[_head_out(t.head, c, t.tail), _leaves_to_wire(t.tail)] for t in value.tips]
        log = [
            d.log.base - (ref.version if ref else 0),
            None if base_fold == d.log.base_fold else d.log.base_fold,
            value.epoch,
            _leaves_to_wire(value.shared),
            tips,
            _start_out(value),
        ]
    return (
        log,
        None if d.meta is None else [[k, v] for k, v in d.meta],
        None if ref is not None and ref.end == d.from_offset else d.from_offset,
        [b.body() for b in d.bodies],
        None if steps is None else [steps[0] - (ref.version if ref else 0), steps[1]],
    )


@dataclass(slots=True)
class Compact2Link:
    """Both directions of one link's compact core-2 memory: :meth:`encode` for what we send,
    :meth:`decode` for what we receive. Sans-IO; call in the order messages go out and come in."""

    _out: _Direction = field(default_factory=_Direction)
    _in: _Direction = field(default_factory=_Direction)
    #: Whether the peer reads :data:`REPEAT_HEADERS` rows (the link agreed on it).
    repeat_headers: bool = False

    # ---------------------------------------------------------------- out
    def encode(self, message: Message2) -> bytes:
        """The wire bytes of ``message`` in its compact form (ACK2's short form as it is)."""
        side = self._out
        match message:
            case Delta2():
                return self.encode_delta(message)
            case Digest2():
                rows = [[name_queue(side, k), summary_to_wire(s)] for k, s in message.entries]
                return pack([CDIGEST2, rows])
            case Ack2():
                summary = None if message.summary is None else summary_to_wire(message.summary)
                return pack([CACK2, message.seq, name_queue(side, message.key), summary])
            case Have2():
                return pack([CHAVE2, name_queue(side, message.key), summary_to_wire(message.summary)])
            case Want2():
                summary = None if message.summary is None else summary_to_wire(message.summary)
                return pack([CWANT2, name_queue(side, message.key), summary])
            case Prune2():
                return pack([CPRUNE2, name_queue(side, message.key)])
            case AckRun2():
                return pack([CACKS2, message.seq, message.count])
        return encode2(message)  # AckHeld2: two items already

    def encode_delta(self, message: Delta2) -> bytes:
        """A DELTA2's wire bytes (:meth:`encode` of a :class:`Delta2`, for a caller that knows the type)."""
        return pack(self._encode_delta(message))

    def _encode_delta(self, message: Delta2) -> list[Any]:
        d, side = message.delta, self._out
        key = (d.owner, d.name, d.kind)
        queue = name_queue(side, key)
        ref = side.ref(key)
        records = RecordRun.of(d.records)
        came = _as_received[0]
        if came is not None and came.delta is d and came.steps is message.steps and came.ref == ref:
            fields = came.fields  # as it came: what the peer rebuilds the same signed bytes from
        else:  # (the queue id only here: a pure function of the key, kept on the link once asked)
            fields = _fields_out(d, message.steps, ref, side.qid(key), records)
        side.carried(key, d)
        log, meta, from_offset, bodies, steps = fields
        return [
            CDELTA2,
            message.seq,
            queue,
            None if _implied(d) == message.summary else summary_to_wire(message.summary),
            log,
            meta,
            from_offset,
            _records_out(records, ref.timestamp if ref else 0, self.repeat_headers),
            bodies,
            steps,
        ]

    # ---------------------------------------------------------------- in
    def decode(self, raw: list[Any]) -> Message2:
        """A compact core-2 message (``raw[0]`` in :data:`COMPACT2_CODES`, unpacked). Anything malformed,
        or a field this link cannot rebuild, is a :class:`RemoteProtocolError`."""
        code, side = raw[0], self._in
        name = CORE2_NAMES.get(code, "message").upper()
        try:
            if code == CDELTA2:
                return self._decode_delta(raw)
            if code == CDIGEST2 and len(raw) == 2 and type(raw[1]) is list:
                entries = []
                for row in raw[1]:
                    queue, summary = _list(row, 2, "a DIGEST2 entry")
                    entries.append((named_queue(side, queue), summary_from_wire(summary)))
                return Digest2(tuple(entries))
            if code == CACK2 and len(raw) == 4:
                seq = _u64(raw[1], "a sequence number")
                key = named_queue(side, raw[2])
                return Ack2(seq, key, None if raw[3] is None else summary_from_wire(raw[3]))
            if code == CHAVE2 and len(raw) == 3:
                return Have2(named_queue(side, raw[1]), summary_from_wire(raw[2]))
            if code == CWANT2 and len(raw) == 3:
                key = named_queue(side, raw[1])
                return Want2(key, None if raw[2] is None else summary_from_wire(raw[2]))
            if code == CPRUNE2 and len(raw) == 2:
                return Prune2(named_queue(side, raw[1]))
            if code == CACKS2 and len(raw) == 3:
                seq = _u64(raw[1], "a sequence number")
                count = _int(raw[2], "a run's count")
                if count < 2:
                    raise MalformedError("a run of ACK2s is at least two")
                _u64(seq + count - 1, "a run's last sequence number")
                return AckRun2(seq, count)
        except MalformedError as exc:
            raise RemoteProtocolError(f"bad compact {name} from peer: {exc}") from exc
        raise RemoteProtocolError(f"compact core-2 message {code} with {len(raw)} items")

    def _decode_delta(self, raw: list[Any]) -> Delta2:
        if len(raw) != 10:
            raise RemoteProtocolError(f"compact core-2 message {raw[0]} with {len(raw)} items")
        live = self._live_delta(raw)
        if live is not None:
            return live
        side = self._in
        seq = _u64(raw[1], "a sequence number")
        key = named_queue(side, raw[2])
        check_name(key[1])
        ref, qid = side.ref(key), side.qid(key)
        base_version = ref.version if ref else 0
        if raw[6] is None:
            if ref is None:
                raise MalformedError("it continues a chunk this link has not carried")
            from_offset = ref.end
        else:
            from_offset = _offset(raw[6], "a first offset")
        records = _records_in(raw[7], ref.timestamp if ref else 0)
        meta = _meta_from_wire(raw[5])
        piece = (
            None
            if raw[4] is None
            else self._log_in(
                raw[4], key=key, qid=qid, ref=ref, from_offset=from_offset, records=records, meta=meta
            )
        )
        bodies = raw[8]
        if type(bodies) is not list:
            raise MalformedError("bodies must be a list")
        steps: Steps | None = None
        if raw[9] is not None:
            version, packed = _list(raw[9], 2, "steps")
            steps = (_u64(_int(version, "a version") + base_version, "a version"), packed)
            if type(packed) is not bytes:
                raise MalformedError("steps are bytes")
        delta = queue2.Delta(
            key[0],
            key[1],
            key[2],
            piece,
            meta,
            from_offset,
            records,
            tuple(_body(b) for b in bodies),
        )
        if raw[3] is None:
            summary = _implied(delta)
            if summary is None:
                raise MalformedError("it leaves out a summary its delta does not imply")
        else:
            summary = summary_from_wire(raw[3])
        side.carried(key, delta)
        _as_received[0] = _Received(delta, steps, ref, (raw[4], raw[5], raw[6], raw[8], raw[9]))
        return Delta2(seq, summary, delta, steps)

    def _live_delta(self, raw: list[Any]) -> Delta2 | None:
        """A live push (one record or a few, the next version of the link's ref, one tip, the summary
        implied) read in one C pass (``compact_delta``: every field's type and bounds, the rows
        restamped) and the head in another (:func:`_compiled_head`), in place of ~60 Python calls;
        None: not built, or not that case, and the Python path reads ``raw`` (which the passes leave as
        it was) and decides (tests/protocol/test_compact_delta_compiled.py pins the two).

        Invariants of the shortcuts (relay27): the name is not checked again, because this direction's
        ref is set only by ``_Direction.carried``-equivalents in this method and :meth:`_decode_delta`,
        each after ``check_name`` of the same immutable key (no ref: not this path); the queue id and
        the new ref are read and written on the key's ``_Queue`` entry at hand, exactly as
        ``side.qid`` and ``side.carried`` would (one tip: its head is the ref); the rows' columns are
        the compiled pass's exact tuples, taken as the run's columns (``RecordRun.checked``). Nothing
        here verifies a signature or a chain: the delta is checked before any merge or relay
        (``AheadPushes.check`` / the storage thread), as on the Python path."""
        columns, side, number = columns_compiled.load(), self._in, raw[2]
        # A module built before the pass existed (a stale build beside newer sources) lacks it: Python's.
        read = None if columns is None else getattr(columns, "compact_delta", None)
        if read is None or type(number) is not int or not 0 <= number < len(side.keys):
            return None
        key = side.keys[number]
        known = side.queues.get(key)
        if known is None or type(known.ref) is not HeadV2:  # a first push, or no ref kept: the rules
            return None  # need more than the ref
        ref = known.ref
        found = read(raw, ref.timestamp, MAX_VALUE_BYTES, MAX_KEY_BYTES)
        if found is None:
            return None
        seq, base_d, epoch, head_raw, no_meta, from_raw, rows, steps_d, packed = found
        if base_d != 0 or epoch != ref.epoch:  # the base fold is the ref's next log only then
            return None
        steps: Steps | None = None
        if steps_d is not None:
            version = steps_d + ref.version
            if not 0 <= version < 2**64 or packed is None:
                return None
            steps = (version, packed)
        # (``check_name(key[1])`` passed already: this direction's ref is set only by ``carried``, and
        # both decodes call it after checking the name of the same, immutable key)
        qid = known.qid
        if qid is None:  # ``side.qid(key)``, with the entry at hand
            qid = known.qid = fresh_queue_id(*key)
        base_fold = next_log(ref)
        from_offset = ref.end if from_raw is None else from_raw
        records = RecordRun.checked(*rows)
        meta: tuple[tuple[str, str], ...] | None = () if no_meta else None
        head = _compiled_head(head_raw, (qid, ref, epoch, base_fold, from_offset, records, meta), ())
        if head is None:
            return None
        log = LogDelta(ref.version, base_fold, Chains(key[0], qid, epoch, (), (Tip(head, ()),), head))
        delta = queue2.Delta(key[0], key[1], key[2], log, meta, from_offset, records, ())
        summary = _implied(delta)
        if summary is None:  # one tip: always implied
            return None
        known.ref = head  # ``side.carried(key, delta)``: its one tip's head
        _as_received[0] = _Received(delta, steps, ref, (raw[4], raw[5], raw[6], raw[8], raw[9]))
        return Delta2(seq, summary, delta, steps)

    @staticmethod
    def _log_in(
        raw: Any,
        *,
        key: QueueKey,
        qid: bytes,
        ref: HeadV2 | None,
        from_offset: int,
        records: RecordRun,
        meta: tuple[tuple[str, str], ...] | None,
    ) -> LogDelta:
        base_d, base_fold_raw, epoch_raw, shared_raw, tips_raw, start = _list(raw, 6, "a compact log")
        base = _u64(_int(base_d, "a leaf count") + (ref.version if ref else 0), "a leaf count")
        epoch = _u64(epoch_raw, "an epoch")
        if base_fold_raw is None:
            base_fold = _needed(_base_fold(qid, ref, epoch, base), "a base fold")
        else:
            base_fold = _bytes(base_fold_raw, (32,), "a fold")
        shared = _leaves_from_wire(shared_raw)
        if type(tips_raw) is not list or len(tips_raw) > MAX_TIPS:
            raise MalformedError(f"tips are a list of at most {MAX_TIPS} branches")
        c = _context(qid, ref, (epoch, base_fold, shared, len(tips_raw)), (from_offset, records, meta))
        tips = []
        for item in tips_raw:
            head, tail_raw = _list(item, 2, "a tip")
            tail = _leaves_from_wire(tail_raw)
            tips.append(Tip(_head_in(head, c, tail), tail))
        value = Chains(key[0], qid, epoch, shared, tuple(tips), _start_head(start, tips))
        return LogDelta(base, base_fold, value)
