"""Signed heads v2: each head commits to every earlier head of its epoch, so any two heads of one owner
that are not on one chain contradict each other, however far apart they are.

Layout (big-endian, 232 bytes signed, 296 with the signature)::

    namespace    24  b"latticed/queue-head/v2\\n\\0"
    queue_id     32  as in v1 (:func:`latticed.crdt.head.queue_id`)
    epoch         8  +1 per recovery of a forked queue; orders before the version
    version       8  1 for an epoch's first head, +1 per signed change
    log          32  :func:`fold` of the leaves of versions 1 .. version-1 of this epoch
    start, end, base_hash, head_hash, meta_version, meta_hash, timestamp: as in v1
    signature    64  Ed25519 over all of the above

A *leaf* is ``(digest of the body, end)``: 40 bytes per version is all a replica keeps of a head once a
newer one supersedes it. The accumulator runs over leaves rather than bodies (SSB's ``previous`` names the
previous body), so a replica that kept only leaves can still show, with the owner's signature on a newer
head, which head the owner signed at any earlier version: the leaves from there fold into that head's
``log``. The end rides in the leaf so a fork point (the end of the last head both branches share) needs
no body either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Iterable
from typing import Any

from latticed.crdt import fold_compiled
from latticed.crdt.core_errors import MalformedError, WrongOwnerError
from latticed.crdt.records import MAX_OFFSET
from latticed.crdt.signing import Identity, blake2b, verify

HEAD2_NAMESPACE = b"latticed/queue-head/v2\n\x00"
#: The signed fields after the namespace (a replica rebuilding bodies from records packs them itself).
HEAD2_BODY = _BODY = struct.Struct(">32sQQ32sQQ32s32sQ32sQ")
HEAD2_SIZE = len(HEAD2_NAMESPACE) + _BODY.size + 64
LEAF_SIZE = 40
_U64 = struct.Struct(">Q")

#: ``(digest of a head's body, that head's end)``: what the log keeps of each version.
Leaf = tuple[bytes, int]


def genesis(queue_id: bytes, epoch: int) -> bytes:
    """The log before an epoch's first head: distinct per queue and epoch."""
    return blake2b(queue_id + _U64.pack(epoch), b"latticed.lg0.v1")


def is_leaf(leaf: object) -> bool:
    """A 32-byte digest and an offset (anything else off the wire must not reach :func:`fold`), of exactly
    these types: a subclass may answer ``len`` and unpacking otherwise than its storage, which the C
    passes read (``_columns.c``'s ``f_leaf``), so both refuse it and decide alike."""
    if type(leaf) is not tuple or len(leaf) != 2:
        return False
    digest, end = leaf
    return type(digest) is bytes and len(digest) == 32 and type(end) is int and 0 <= end <= MAX_OFFSET


# Personalised once and copied per use (as records.py does): a catch-up hashes twice per version.
_BODY_HASHER = hashlib.blake2b(digest_size=32, person=b"latticed.hd2.v1")
_LOG_HASHER = hashlib.blake2b(digest_size=32, person=b"latticed.log.v1")


def body_digest(body: bytes) -> bytes:
    """What a leaf names a head by: its signed bytes, without the signature."""
    hasher = _BODY_HASHER.copy()
    hasher.update(body)
    return hasher.digest()


def fold_one(log: bytes, digest: bytes, end: int) -> bytes:
    """The accumulator ``log`` extended by the leaf ``(digest, end)``."""
    hasher = _LOG_HASHER.copy()
    hasher.update(log + digest + _U64.pack(end))
    return hasher.digest()


def fold(log: bytes, leaves: Iterable[Leaf]) -> bytes:
    """Extend the accumulator ``log`` by ``leaves``, oldest first (in C where built: a catch-up folds a
    leaf per version)."""
    if type(leaves) in (list, tuple) and len(leaves) > 2:  # type: ignore[arg-type]
        found = fold_compiled.fold(log, leaves)
        if found is not None:
            return found[0]
    for digest, end in leaves:
        log = fold_one(log, digest, end)
    return log


@dataclasses.dataclass(frozen=True, slots=True)
class HeadV2:
    """An owner-signed head that names its place in the owner's chain of heads (epoch, version, log)."""

    queue_id: bytes
    epoch: int
    version: int
    log: bytes
    start: int
    end: int
    base_hash: bytes
    head_hash: bytes
    meta_version: int
    meta_hash: bytes
    timestamp: int
    signature: bytes = b""
    #: :meth:`leaf`, computed once (a catch-up asks each body for it several times); not a field.
    _leaf: Leaf | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def body(self) -> bytes:
        return HEAD2_NAMESPACE + _BODY.pack(
            self.queue_id,
            self.epoch,
            self.version,
            self.log,
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

    def leaf(self) -> Leaf:
        """This head's entry in the log (two signatures over one body are one statement)."""
        leaf = self._leaf
        if leaf is None:
            leaf = body_digest(self.body()), self.end
            object.__setattr__(self, "_leaf", leaf)
        return leaf

    @classmethod
    def from_bytes(cls, raw: bytes) -> HeadV2:
        if not isinstance(raw, bytes) or len(raw) != HEAD2_SIZE or not raw.startswith(HEAD2_NAMESPACE):
            raise MalformedError("not a v2 signed queue head")
        fields = _BODY.unpack_from(raw, len(HEAD2_NAMESPACE))
        signed: tuple[Any, ...] = (*fields, raw[-64:])  # the signature is the last field: no ``replace``
        head = cls(*signed)
        head.check()
        return head

    def signed(self, identity: Identity) -> HeadV2:
        """This body under ``identity``'s signature (the owner's commit is the only caller)."""
        self.check()
        # The constructor, not dataclasses.replace (~1.3 µs more, once a batch): the same fields.
        return HeadV2(
            self.queue_id,
            self.epoch,
            self.version,
            self.log,
            self.start,
            self.end,
            self.base_hash,
            self.head_hash,
            self.meta_version,
            self.meta_hash,
            self.timestamp,
            identity.sign(self.body()),
        )

    def check(self) -> None:
        """Raise :class:`MalformedError` unless every field fits the signed layout exactly."""
        for value in (self.queue_id, self.log, self.base_hash, self.head_hash, self.meta_hash):
            if not isinstance(value, bytes) or len(value) != 32:
                raise MalformedError("a head's hashes are 32 bytes")
        counters = (self.epoch, self.version, self.start, self.end, self.meta_version, self.timestamp)
        for number in counters:
            if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 2**64:
                raise MalformedError("a head's counters are unsigned 64-bit integers")
        if self.version < 1 or self.start > self.end or self.end > MAX_OFFSET:
            raise MalformedError("a head's version starts at 1 and its offsets run start <= end <= 2^63-1")
        if not isinstance(self.signature, bytes):
            raise MalformedError("a head's signature is bytes")

    def verify(self, owner: bytes, expected_queue_id: bytes) -> None:
        """Well formed (else :class:`MalformedError`), this queue's and the owner's (else an
        :class:`IntegrityError`)."""
        self.check()
        if self.queue_id != expected_queue_id:
            raise WrongOwnerError("head belongs to another queue (another owner or name)")
        verify(owner, self.body(), self.signature)


#: The last heads :func:`next_log` folded and their logs (held, so compared by identity): a relay folded
#: each live push's head ~7 times (its decode twice, its steps, its check, the value's summary, its
#: pass-on's encode, the next push's decode as the link's ref). Not a ``HeadV2`` slot: the compiled
#: loops set exactly its fields (:mod:`.leaf_compiled`).
_next_logs: list[tuple[HeadV2, bytes]] = []
_NEXT_LOGS = 4


def next_log(head: HeadV2) -> bytes:
    """The ``log`` the owner's next head of ``head``'s epoch signs."""
    for known, log in _next_logs:
        if known is head:
            return log
    digest, end = head.leaf()
    log = fold_one(head.log, digest, end)
    _next_logs.append((head, log))
    if len(_next_logs) > _NEXT_LOGS:
        del _next_logs[0]
    return log
