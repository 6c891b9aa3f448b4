"""The ``compact`` protocol feature: DELTA, ACK and HAVE encodings that leave out what the receiver rebuilds.

A full DELTA of one 100-byte record is ~460 bytes: the 248-byte signed head carries a fixed 24-byte
namespace, the 32-byte queue id and four 32-byte hashes, and the message names the queue in full. Once both
ends of a link speak ``compact`` (agreed per link, :mod:`latticed.protocol.versions`), the sender uses these
instead; before that, and with a peer that does not speak it, the full layouts go out unchanged.

Both ends keep the same per-link, per-direction memory, updated as each message is encoded and as it is
decoded (one ordered stream, so the two never differ):

* a number per queue key, in order of first use (at most :data:`MAX_REFS`): later messages name the queue
  by that number;
* per numbered queue, the last head and tip a DELTA carried: the next head's hashes, counters and
  timestamp are written relative to them, and a hash the receiver rebuilds exactly is left out;
* per DELTA in flight, what the receiver holds once it applied it: its ACK says "that" in two bytes.

A left-out field is rebuilt by one rule (:func:`_rebuild_base` ...), which the encoder runs on its own
memory: a field is omitted only when the rule gives exactly its bytes. So the receiver rebuilds every
signed head to the same 248 bytes and verifies the signature over them as strictly as ever (a forged or
altered head fails that check); one the rule cannot rebuild (no memory to rebuild from) is a
:class:`~latticed.errors.RemoteProtocolError`, never a guess.

Layouts (msgpack arrays, type code first):

* ``CDELTA [16, seq, queue, head, meta, tip, from_offset, from_hash, records, checkpoints, fork]`` —
  ``queue`` a number or ``[owner, name, kind]``; ``head`` None or ``[version, start, end, base_hash,
  head_hash, meta_version, meta_hash, timestamp, signature]`` with version, end and timestamp relative to
  the last head (if any) and a hash None where rebuilt; ``tip`` True (the head), None, or a head;
  ``from_offset`` / ``from_hash`` None where they continue the last tip.
* ``CACK [17, seq]`` — the receiver holds what that DELTA implied; ``[17, seq, summary]`` otherwise.
* ``CHAVES [18, [[queue, summary], ...]]`` — every HAVE of one flush in one message.

Why one module: the encoder and the decoder must apply the same rules to the same memory; apart, one could
change without the other and a receiver would rebuild other bytes than were signed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head import SignedHead, fresh_queue_id, genesis_hash, meta_hash, queue_id
from latticed.crdt.queue import QueueDelta, Summary
from latticed.crdt.records import MAX_OFFSET, chain_extend
from latticed.crdt.wire import (
    proof_from_wire,
    proof_to_wire,
    records_from_wire,
    records_to_wire,
    summary_from_wire,
    summary_to_wire,
)
from latticed.errors import RemoteProtocolError
from latticed.protocol.queue_numbers import name_queue, named_queue
from latticed.protocol.replication_messages import (
    COMPACT_ACK,
    COMPACT_DELTA,
    COMPACT_HAVES,
    Ack,
    Delta,
    Have,
    QueueKey,
)

__all__ = ["CHAIN_LIMIT", "COMPACT_FEATURE", "MAX_REFS", "CompactLink"]

#: The protocol feature's name (:data:`latticed.version.PROTOCOL_FEATURES`).
COMPACT_FEATURE: Final = "compact"
#: Queues a link numbers per direction (beyond that a queue is named in full, and nothing is remembered
#: of it): bounds what a peer can make us keep.
MAX_REFS: Final = 4096
#: A tip's head hash is rebuilt from the records only for chunks this small (the receiver hashes them once
#: more when it verifies; live pushes are a record or a few).
CHAIN_LIMIT: Final = 64
#: DELTAs in flight remembered per direction (the session's window is far smaller).
_MAX_SEQS: Final = 1024
_EMPTY_META_HASH: Final = meta_hash({})
_SIGNATURE_SIZE: Final = 64


@dataclass(slots=True)
class _Last:
    """What the last DELTA of a queue on this link, this direction, carried."""

    head: SignedHead | None = None
    tip: SignedHead | None = None
    #: The queue's id, computed once per link and queue (not through queue_id's cache: the peer chooses
    #: the names, and this memory is bounded by the link's numbered queues).
    qid: bytes | None = None


@dataclass(slots=True)
class _Direction:
    """One direction's memory: queue numbers and the last heads per numbered queue."""

    numbers: dict[QueueKey, int] = field(default_factory=dict)
    keys: list[QueueKey] = field(default_factory=list)
    last: dict[QueueKey, _Last] = field(default_factory=dict)
    #: DELTAs of this direction not acknowledged yet: their queue and what they imply (see _implied).
    inflight: dict[int, tuple[QueueKey, Summary | None]] = field(default_factory=dict)

    def learn(self, key: QueueKey) -> None:
        if key not in self.numbers and len(self.keys) < MAX_REFS:
            self.numbers[key] = len(self.keys)
            self.keys.append(key)
            self.last[key] = _Last()

    def remember_delta(self, seq: int, key: QueueKey, implied: Summary | None) -> None:
        if len(self.inflight) >= _MAX_SEQS:
            self.inflight.pop(next(iter(self.inflight)))
        self.inflight[seq] = (key, implied)


def _implied(d: QueueDelta) -> Summary | None:
    """What a receiver holding everything below the chunk holds once it applied it (None: no records)."""
    head, tip = d.head, d.tip
    if head is None or tip is None or d.fork is not None:
        return None
    return Summary(head.version, head.start, tip.end, tip.head_hash, head.meta_version)


# -------------------------------------------------------------------- the rules that rebuild a field


def _rebuild_from_hash(qid: bytes, last: _Last | None, from_offset: int) -> bytes | None:
    if from_offset == 0:
        return genesis_hash(qid)
    if last is not None and last.tip is not None and last.tip.end == from_offset:
        return last.tip.head_hash
    return None


def _rebuild_base(qid: bytes, last: _Last | None, start: int) -> bytes | None:
    if start == 0:
        return genesis_hash(qid)
    if last is not None and last.head is not None and last.head.start == start:
        return last.head.base_hash
    return None


def _rebuild_head_hash(last: _Last | None, end: int, chained: bytes | None) -> bytes | None:
    """``chained``: the chain value at the records' end, when this head is the tip that vouches for them."""
    if chained is not None:
        return chained
    if last is not None:
        for head in (last.head, last.tip):
            if head is not None and head.end == end:
                return head.head_hash
    return None


def _rebuild_meta_hash(last: _Last | None, meta_version: int, meta: Any) -> bytes:
    if meta is not None:
        return meta_hash(dict(meta))
    if last is not None and last.head is not None and last.head.meta_version == meta_version:
        return last.head.meta_hash
    return _EMPTY_META_HASH


# ------------------------------------------------------------------------------------ field helpers


def _int(raw: Any, what: str) -> int:
    if type(raw) is not int:
        raise RemoteProtocolError(f"compact {what} must be an integer")
    return raw


def _opt_hash(raw: Any, what: str) -> bytes | None:
    if raw is not None and type(raw) is not bytes:
        raise RemoteProtocolError(f"compact {what} must be bytes or nil")
    return raw


def _needed(value: bytes | None, what: str) -> bytes:
    if value is None:
        raise RemoteProtocolError(f"compact DELTA leaves out {what}, which this link cannot rebuild")
    return value


@dataclass(slots=True)
class CompactLink:
    """Both directions of one link's compact memory: ``encode_*`` for what we send, :meth:`decode` for
    what we receive. Sans-IO; call in the order messages go out and come in."""

    _out: _Direction = field(default_factory=_Direction)
    _in: _Direction = field(default_factory=_Direction)

    # ---------------------------------------------------------------- heads
    @staticmethod
    def _head_out(h: SignedHead, qid: bytes, last: _Last | None, chained: bool, meta: Any) -> list[Any]:
        """``chained``: this head is the tip of a chunk the receiver rebuilds its head hash from (a tip's
        hash must be the records' chain value, or the chunk fails verification whatever its encoding)."""
        ref = last.head if last is not None else None
        base = None if _rebuild_base(qid, last, h.start) == h.base_hash else h.base_hash
        rebuilt = h.head_hash if chained else _rebuild_head_hash(last, h.end, None)
        mhash = None if _rebuild_meta_hash(last, h.meta_version, meta) == h.meta_hash else h.meta_hash
        return [
            h.version - (ref.version if ref else 0),
            h.start,
            h.end - (ref.end if ref else 0),
            base,
            None if rebuilt == h.head_hash else h.head_hash,
            h.meta_version,
            mhash,
            h.timestamp - (ref.timestamp if ref else 0),
            h.signature,
        ]

    @staticmethod
    def _head_in(raw: Any, qid: bytes, last: _Last | None, chained: bytes | None, meta: Any) -> SignedHead:
        if type(raw) is not list or len(raw) != 9:
            raise RemoteProtocolError("a compact head has 9 fields")
        ref = last.head if last is not None else None
        version = _int(raw[0], "head version") + (ref.version if ref else 0)
        start = _int(raw[1], "head start")
        end = _int(raw[2], "head end") + (ref.end if ref else 0)
        meta_version = _int(raw[5], "head meta version")
        timestamp = _int(raw[7], "head timestamp") + (ref.timestamp if ref else 0)
        base = _opt_hash(raw[3], "base hash")
        head_hash = _opt_hash(raw[4], "head hash")
        mhash = _opt_hash(raw[6], "meta hash")
        signature = raw[8]
        if type(signature) is not bytes or len(signature) != _SIGNATURE_SIZE:
            raise RemoteProtocolError("a compact head's signature is 64 bytes")
        head = SignedHead(
            qid,
            version,
            start,
            end,
            base if base is not None else _needed(_rebuild_base(qid, last, start), "a base hash"),
            head_hash
            if head_hash is not None
            else _needed(_rebuild_head_hash(last, end, chained), "a head hash"),
            meta_version,
            mhash if mhash is not None else _rebuild_meta_hash(last, meta_version, meta),
            timestamp,
            signature,
        )
        head.check()  # MalformedError: the caller's protocol error
        return head

    # ---------------------------------------------------------------- DELTA
    def encode_delta(self, message: Delta) -> list[Any]:
        """A DELTA as ``CDELTA`` (always possible)."""
        d, side = message.delta, self._out
        key = (d.owner, d.name, d.kind)
        name = name_queue(side, key)
        last = side.last.get(key)
        qid = queue_id(d.owner, d.name, d.kind)
        from_offset: int | None = d.from_offset
        if last is not None and last.tip is not None and last.tip.end == d.from_offset:
            from_offset = None
        from_hash: bytes | None = d.from_hash
        if _rebuild_from_hash(qid, last, d.from_offset) == d.from_hash:
            from_hash = None
        chained = bool(d.records) and len(d.records) <= CHAIN_LIMIT
        tip: Any = None
        if d.tip is not None and d.tip != d.head:
            tip = self._head_out(d.tip, qid, last, chained, None)
        elif d.tip is not None:
            tip = True
        head = None
        if d.head is not None:
            head = self._head_out(d.head, qid, last, chained and tip is True, d.meta)
        self._remember(side, key, d)
        side.remember_delta(message.seq, key, _implied(d))
        return [
            COMPACT_DELTA,
            message.seq,
            name,
            head,
            None if d.meta is None else [[k, v] for k, v in d.meta],
            tip,
            from_offset,
            from_hash,
            records_to_wire(d.records),
            [c.to_bytes() for c in d.checkpoints],
            proof_to_wire(d.fork) if d.fork else None,
        ]

    def _decode_delta(self, raw: list[Any]) -> Delta:
        if len(raw) != 11:
            raise RemoteProtocolError("a compact DELTA has 11 items")
        side = self._in
        seq = _int(raw[1], "DELTA seq")
        key = named_queue(side, raw[2])
        last = side.last.get(key)
        qid = last.qid if last is not None else None
        if qid is None:
            qid = fresh_queue_id(*key)  # not through queue_id's cache: the peer chooses the names
            if last is not None:
                last.qid = qid
        from_offset = raw[6]
        if from_offset is None:
            if last is None or last.tip is None:
                raise RemoteProtocolError("compact DELTA continues a chunk this link has not carried")
            from_offset = last.tip.end
        from_offset = _int(from_offset, "from_offset")
        if not 0 <= from_offset <= MAX_OFFSET:
            raise RemoteProtocolError(f"compact DELTA from_offset must be 0 to {MAX_OFFSET}")
        records_raw = raw[8]
        records = records_from_wire(records_raw if type(records_raw) is not tuple else list(records_raw))
        from_hash = _opt_hash(raw[7], "from_hash")
        if from_hash is None:
            from_hash = _needed(_rebuild_from_hash(qid, last, from_offset), "a chunk's starting hash")
        meta = _meta(raw[4])
        tip_raw, head_raw = raw[5], raw[3]
        chained: bytes | None = None
        if records and len(records) <= CHAIN_LIMIT and len(from_hash) == 32:
            vouching = head_raw if tip_raw is True else tip_raw
            if type(vouching) is list and len(vouching) == 9 and vouching[4] is None:  # left out
                chained = chain_extend(from_hash, from_offset, records)[-1]
        if tip_raw is True and head_raw is None:
            raise RemoteProtocolError("compact DELTA's tip refers to a missing head")
        head = None
        if head_raw is not None:
            head = self._head_in(head_raw, qid, last, chained if tip_raw is True else None, meta)
        tip: SignedHead | None = None
        if tip_raw is True:
            tip = head
        elif tip_raw is not None:
            tip = self._head_in(tip_raw, qid, last, chained, None)
        checkpoints_raw = raw[9]
        if type(checkpoints_raw) is not list or not all(type(c) is bytes for c in checkpoints_raw):
            raise RemoteProtocolError("compact DELTA checkpoints are a list of signed heads")
        checkpoints = []
        for item in checkpoints_raw:
            checkpoint = SignedHead.from_bytes(item)
            checkpoint.check()
            checkpoints.append(checkpoint)
        delta = QueueDelta(
            owner=key[0],
            name=key[1],
            kind=key[2],
            head=head,
            meta=meta,
            tip=tip,
            from_offset=from_offset,
            from_hash=from_hash,
            records=records,
            checkpoints=tuple(checkpoints),
            fork=None if raw[10] is None else proof_from_wire(raw[10]),
            tip_hash_from_records=chained is not None,
        )
        self._remember(side, key, delta)
        side.remember_delta(seq, key, _implied(delta))
        return Delta(seq, delta)

    @staticmethod
    def _remember(side: _Direction, key: QueueKey, d: QueueDelta) -> None:
        last = side.last.get(key)
        if last is not None:
            if d.head is not None:
                last.head = d.head
            if d.tip is not None:
                last.tip = d.tip

    # ---------------------------------------------------------------- ACK
    def encode_ack(self, ack: Ack) -> list[Any] | None:
        """An ACK of a DELTA that came compact, as ``CACK``; None: send it in full."""
        known = self._in.inflight.pop(ack.seq, None)
        if known is None or known[0] != ack.key:
            return None
        if known[1] is not None and known[1] == ack.summary:
            return [COMPACT_ACK, ack.seq]
        return [COMPACT_ACK, ack.seq, summary_to_wire(ack.summary)]

    def acked(self, seq: int) -> None:
        """A full ACK of ``seq`` arrived: forget what we remembered of it."""
        self._out.inflight.pop(seq, None)

    def _decode_ack(self, raw: list[Any]) -> Ack:
        if len(raw) not in (2, 3):
            raise RemoteProtocolError("a compact ACK has 2 or 3 items")
        seq = _int(raw[1], "ACK seq")
        known = self._out.inflight.pop(seq, None)
        if known is None:
            raise RemoteProtocolError("compact ACK of a delta we did not send compact")
        key, implied = known
        if len(raw) == 3:
            return Ack(seq, key, summary_from_wire(raw[2]))
        if implied is None:
            raise RemoteProtocolError("compact ACK leaves out a summary its delta does not imply")
        return Ack(seq, key, implied)

    # ---------------------------------------------------------------- HAVEs
    def encode_haves(self, haves: list[Have]) -> list[Any]:
        side = self._out
        return [COMPACT_HAVES, [[name_queue(side, h.key), summary_to_wire(h.summary)] for h in haves]]

    def _decode_haves(self, raw: list[Any]) -> tuple[Have, ...]:
        if len(raw) != 2 or type(raw[1]) is not list:
            raise RemoteProtocolError("compact HAVEs are [18, [[queue, summary], ...]]")
        out = []
        for entry in raw[1]:
            if type(entry) is not list or len(entry) != 2:
                raise RemoteProtocolError("a compact HAVE is [queue, summary]")
            out.append(Have(named_queue(self._in, entry[0]), summary_from_wire(entry[1])))
        return tuple(out)

    # ---------------------------------------------------------------- in
    def decode(self, raw: list[Any]) -> Delta | Ack | tuple[Have, ...]:
        """A compact message (``raw[0]`` one of the compact codes, unpacked). Anything malformed, or a
        field this link cannot rebuild, is a :class:`RemoteProtocolError`."""
        try:
            code = raw[0]
            if code == COMPACT_DELTA:
                return self._decode_delta(raw)
            if code == COMPACT_ACK:
                return self._decode_ack(raw)
            if code == COMPACT_HAVES:
                return self._decode_haves(raw)
        except MalformedError as exc:  # the queue's own decoders (records, summaries, heads, proofs)
            raise RemoteProtocolError(f"bad compact message from peer: {exc}") from exc
        raise RemoteProtocolError(f"not a compact message type: {raw[0]!r}")


def _meta(raw: Any) -> tuple[tuple[str, str], ...] | None:
    if raw is None:
        return None
    if type(raw) is not list or not all(
        type(i) is list and len(i) == 2 and type(i[0]) is str and type(i[1]) is str for i in raw
    ):
        raise RemoteProtocolError("compact metadata is a list of [key, value] texts")
    return tuple((i[0], i[1]) for i in raw)
