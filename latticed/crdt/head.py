"""Signed heads: one owner signature vouches for a queue's whole state at a version.

Layout (big-endian, 248 bytes signed)::

    namespace   24  b"latticed/queue-head/v1\\n\\0"
    queue_id    32  BLAKE2b(kind || owner || len(name) || name)
    version      8  owner's mutation counter, +1 per signed change
    start        8  first offset present (signed low-watermark: truncation is the owner's act)
    end          8  next offset to be assigned
    base_hash   32  chain value at ``start``: a truncated suffix still verifies on its own
    head_hash   32  chain value at ``end``
    meta_version 8  version at which metadata last changed
    meta_hash   32  BLAKE2b of the canonical metadata map
    timestamp    8  owner's clock (ms) when signing
    signature   64  Ed25519 over all of the above
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

from latticed.crdt.core_errors import MalformedError, WrongOwnerError
from latticed.crdt.records import MAX_OFFSET
from latticed.crdt.signing import Identity, blake2b, verify

HEAD_NAMESPACE = b"latticed/queue-head/v1\n\x00"
_BODY = struct.Struct(">32sQQQ32s32sQ32sQ")
HEAD_SIZE = len(HEAD_NAMESPACE) + _BODY.size + 64
MAX_NAME_BYTES = 255
MAX_META_KEY_BYTES = 1024
MAX_META_VALUE_BYTES = 64 * 1024
_U64_LIMIT = 2**64


class QueueKind(IntEnum):
    """What a signed log holds; part of its id and of every signed head (a ``u8`` there)."""

    QUEUE = 0  #: records offered by the owner
    KV = 1  #: the owner's KV ops, folded into a view
    GROUP = 2  #: a consumer group's definition and progress


KIND_QUEUE = QueueKind.QUEUE
KIND_KV = QueueKind.KV
KIND_GROUP = QueueKind.GROUP


def check_name(name: str) -> None:
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME_BYTES or "/" in name:
        raise MalformedError(f"a name is 1-{MAX_NAME_BYTES} bytes of text without '/': {name!r}")


def fresh_queue_id(owner: bytes, name: str, kind: int = KIND_QUEUE) -> bytes:
    """:func:`queue_id` without its cache, for names that come from a client and may name nothing: each
    cached entry made during a burst of such requests would pin the memory allocated around it."""
    raw = name.encode()
    return blake2b(bytes([kind]) + owner + bytes([len(raw)]) + raw, b"latticed.qid.v1")


#: A queue's identity (cached: every signed head carries it, so every commit asks for it).
queue_id = lru_cache(maxsize=4096)(fresh_queue_id)


def genesis_hash(qid: bytes) -> bytes:
    """Chain value at offset 0: distinct per queue, so chains of two queues never share a value."""
    return blake2b(qid, b"latticed.gen.v1")


def meta_hash(meta: Mapping[str, str]) -> bytes:
    parts = []
    for key in sorted(meta):
        k, v = key.encode(), meta[key].encode()
        if len(k) > MAX_META_KEY_BYTES or len(v) > MAX_META_VALUE_BYTES:
            raise MalformedError("metadata key or value too long")
        parts.append(struct.pack(">HI", len(k), len(v)) + k + v)
    return blake2b(b"".join(parts), b"latticed.meta.v1")


def canonical_meta(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Metadata pairs as the owner signs them: sorted by key, each key once (a repeated key keeps its
    last value, as the dict :func:`meta_hash` hashes does). A peer's pairs are stored and passed on in
    this form once their hash checked: docs/protocol.md, "Metadata"."""
    return tuple(sorted(dict(pairs).items()))


@dataclass(frozen=True, slots=True)
class SignedHead:
    """An owner-signed summary of a queue at one version; totally ordered by version for an honest owner."""

    queue_id: bytes
    version: int
    start: int
    end: int
    base_hash: bytes
    head_hash: bytes
    meta_version: int
    meta_hash: bytes
    timestamp: int
    signature: bytes

    def body(self) -> bytes:
        return HEAD_NAMESPACE + _BODY.pack(
            self.queue_id,
            self.version,
            self.start,
            self.end,
            self.base_hash,
            self.head_hash,
            self.meta_version,
            self.meta_hash,
            self.timestamp,
        )

    def to_bytes(self) -> bytes:
        return self.body() + self.signature

    @classmethod
    def from_bytes(cls, raw: bytes) -> SignedHead:
        """The layout only: the store reloads with this what it once accepted. Foreign heads also pass
        :meth:`check` (wire decoding, :meth:`verify`), which holds them to :data:`MAX_OFFSET`."""
        if not isinstance(raw, bytes) or len(raw) != HEAD_SIZE or not raw.startswith(HEAD_NAMESPACE):
            raise MalformedError("not a signed queue head")
        qid, version, start, end, base, head_hash, meta_version, mhash, timestamp = _BODY.unpack_from(
            raw, len(HEAD_NAMESPACE)
        )
        head = cls(qid, version, start, end, base, head_hash, meta_version, mhash, timestamp, raw[-64:])
        if head.start > head.end:
            raise MalformedError("head start is past its end")
        return head

    @classmethod
    def sign(
        cls,
        identity: Identity,
        *,
        queue_id: bytes,
        version: int,
        start: int,
        end: int,
        base_hash: bytes,
        head_hash: bytes,
        meta_version: int,
        meta_hash: bytes,
        timestamp: int,
    ) -> SignedHead:
        unsigned = cls(
            queue_id, version, start, end, base_hash, head_hash, meta_version, meta_hash, timestamp, b""
        )
        return cls(
            queue_id,
            version,
            start,
            end,
            base_hash,
            head_hash,
            meta_version,
            meta_hash,
            timestamp,
            identity.sign(unsigned.body()),
        )

    def check(self) -> None:
        """Raise :class:`MalformedError` unless every field fits the signed layout exactly.

        ``struct`` would otherwise pad or cut a wrong-length hash silently (so a signature would cover
        bytes other than the fields) or fail with an untyped error on a wrong type or range.
        """
        if not self._plain_fields():
            self._check_fields()
        if self.start > self.end:
            raise MalformedError("head start is past its end")
        if self.end > MAX_OFFSET:
            # The owner's commit never signs one: a replica must not hold (nor store, nor serve) offsets
            # its own owner could not have written.
            raise MalformedError(f"a head's offsets stop at {MAX_OFFSET}, this one ends at {self.end}")
        if not isinstance(self.signature, bytes):
            raise MalformedError("a head's signature is bytes")

    def _plain_fields(self) -> bool:
        """Every hash exactly ``bytes`` of 32 and every counter exactly ``int`` in range: what a decoded
        head holds, checked in one expression (two heads per relayed record); anything else, a subclass
        included, goes through :meth:`_check_fields`, which decides."""
        q, b, h, m = self.queue_id, self.base_hash, self.head_hash, self.meta_hash
        v, s, e, mv, t = self.version, self.start, self.end, self.meta_version, self.timestamp
        return (
            type(q) is bytes
            and type(b) is bytes
            and type(h) is bytes
            and type(m) is bytes
            and len(q) == len(b) == len(h) == len(m) == 32
            and type(v) is int
            and type(s) is int
            and type(e) is int
            and type(mv) is int
            and type(t) is int
            and 0 <= v < _U64_LIMIT
            and 0 <= s < _U64_LIMIT
            and 0 <= e < _U64_LIMIT
            and 0 <= mv < _U64_LIMIT
            and 0 <= t < _U64_LIMIT
        )

    def _check_fields(self) -> None:
        for value in (self.queue_id, self.base_hash, self.head_hash, self.meta_hash):
            if not isinstance(value, bytes) or len(value) != 32:
                raise MalformedError("a head's hashes are 32 bytes")
        for number in (self.version, self.start, self.end, self.meta_version, self.timestamp):
            if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < _U64_LIMIT:
                raise MalformedError("a head's counters are unsigned 64-bit integers")

    def verify(self, owner: bytes, expected_queue_id: bytes) -> None:
        """Check this head is well formed (else :class:`MalformedError`) and is the owner's, for this queue
        (else an :class:`IntegrityError`)."""
        self.check()
        if self.queue_id != expected_queue_id:
            raise WrongOwnerError("head belongs to another queue (another owner or name)")
        verify(owner, self.body(), self.signature)

    @property
    def sort_key(self) -> tuple[int, bytes]:
        """Total order used by merge: version first; the signature breaks ties between forked heads."""
        return (self.version, self.signature)
