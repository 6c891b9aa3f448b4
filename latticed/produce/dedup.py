"""The owner's idempotent append: a producer's retry of a sequence it already sent writes nothing twice.

As Kafka's idempotent producer: each offer names a producer id and a sequence number. The owner
remembers, per queue and producer, the last :data:`REMEMBERED` sequences it committed and the offsets
they got, in the store's ``settings`` table (one row per queue and producer, written in the same
transaction as the records: a crash cannot keep one without the other). A sequence it remembers is
answered with the offsets it got the first time, and nothing is appended, if it offers the same records
(a digest of them is remembered too): a retry that sends other records under a sequence already written
is refused, never answered as written (a Spark batch re-run that split its rows otherwise would lose
them silently). A sequence older than every
one remembered (once :data:`REMEMBERED` are) is refused: the owner can no longer tell whether it wrote
it. Rows a release does not know are ignored by it, so this needs no schema change.

Next to each such row, a second one (:func:`used_row_name`) holds when the producer last wrote, so that
idle producers' rows can expire (:mod:`.expiry`); it is written in the same transaction too.

The producer id is namespaced by the identity the request came from (a daemon cannot use another's
sequences), unless the request says it is *shared*: then it is one of the queue's, whichever daemon
sends it, for a producer that moves between daemons (a Spark task retried on another host must hit the
sequences its first attempt left). Any identity allowed to offer into the queue may use a shared id; a
shared producer id is as private as its user keeps it (Spark derives it from the query's id). Runs on
the storage thread, inside the group commit (:class:`ProducedAppend`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from latticed.crdt.wire import pack, unpack
from latticed.errors import LatticedError, MalformedError
from latticed.storage.batch import Batch
from latticed.storage.jobs import Job, WriterView

#: The ``settings`` rows of producers' sequences (``producer/QID/SCOPE``): a name range of its own.
ROW_PREFIX: Final = "producer/"
#: The rows holding when each producer last wrote (``producer-used/QID/SCOPE``).
USED_PREFIX: Final = "producer-used/"
#: Sequences remembered per queue and producer.
REMEMBERED: Final = 256
#: A producer id is text of at most this many characters.
MAX_PRODUCER_CHARS: Final = 128
MAX_SEQUENCE: Final = 2**63 - 1


def row_name(qid: bytes, producer: str) -> str:
    """The ``settings`` row remembering ``producer``'s sequences on queue ``qid``."""
    return f"{ROW_PREFIX}{qid.hex()}/{producer}"


def used_row_name(row: str) -> str:
    """The ``settings`` row holding when the producer of row ``row`` (:func:`row_name`) last wrote."""
    return USED_PREFIX + row.removeprefix(ROW_PREFIX)


def producer_scope(peer: bytes, producer: str, shared: Any) -> str:
    """The name the owner remembers a producer's sequences under: ``peer``'s own, or the queue's
    (``shared``; ``*`` is no identity, so the two never meet)."""
    if shared not in (None, False, True):
        raise MalformedError("'shared' is true or false")
    return f"*/{producer}" if shared else f"{peer.hex()}/{producer}"


def check_producer(producer: Any, seq: Any) -> tuple[str, int]:
    """A producer id and sequence from a peer or client (MalformedError if not)."""
    if not isinstance(producer, str) or not 0 < len(producer) <= MAX_PRODUCER_CHARS:
        raise MalformedError(f"a producer id is text of 1-{MAX_PRODUCER_CHARS} characters")
    if type(seq) is not int or not 0 <= seq <= MAX_SEQUENCE:
        raise MalformedError("a producer's sequence is a non-negative integer")
    return producer, seq


#: Bytes of the digest of an offer's records kept with each remembered sequence.
DIGEST_BYTES: Final = 16


def offered_digest(records: Any, verbatim: bytes | memoryview | None = None) -> bytes:
    """What a retry must match: the values, keys and headers the producer sent (before the owner stamps
    them), whichever daemon forwarded them (msgpack writes equal decoded values as equal bytes). Not the
    timestamps: a re-run may compute them anew (a ``current_timestamp()`` column), and the first
    attempt's then stand for the same rows. ``verbatim``: bytes known to be what packing ``records``
    gives (:func:`packed_size` tells), hashed as they are instead of packing ``records`` again."""
    if verbatim is not None:
        return _digest(verbatim)
    sent = records if set(map(len, records)) == {3} else [record[:3] for record in records]
    return _digest(pack(sent))


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES, person=b"latticed.offer").digest()


def _bin_bytes(blobs: Sequence[bytes]) -> int:
    """Bytes of ``blobs`` packed one after another (each bin 8, 16 or 32: the smallest that holds it)."""
    lengths = list(map(len, blobs))
    longer = sum(map((1 << 8).__le__, lengths)) + 2 * sum(map((1 << 16).__le__, lengths))
    return sum(lengths) + 2 * len(lengths) + longer


def packed_size(values: Sequence[bytes], keys: Sequence[bytes | None], *, within: int | None = None) -> int:
    """How many bytes msgpack packs the records ``[value, key, []]`` (or ``None`` headers) of these
    columns into: bytes, bytes or nil, and empty headers each have one shortest encoding, the one
    msgpack writes, and every other encoding is longer. So bytes that decode to such records and are
    this long are, byte for byte, what packing them gives. ``within``: the length of such bytes, which
    lets values and keys all under 256 bytes (bin 8 each) be counted without looking at each length:
    the size if they were, at most the true one, which is at most ``within``, equals ``within`` only
    if all three are equal."""
    n = len(values)
    nils = keys.count(None)
    present: Sequence[Any] = keys if not nils else [key for key in keys if key is not None]
    # The array, then each record: fixarray 3, value, key (nil: one byte), headers (one byte: [] or nil).
    fixed = (1 if n < 16 else 3 if n < 1 << 16 else 5) + n + nils + n
    if within is not None:
        short = fixed + sum(map(len, values)) + 2 * n + sum(map(len, present)) + 2 * len(present)
        if short == within:
            return short
    return fixed + _bin_bytes(values) + _bin_bytes(present)


def _entry_ok(entry: Any) -> bool:
    """``[seq, first, count]`` (rows written before digests were kept) or ``[seq, first, count, digest]``."""
    if type(entry) is not list or len(entry) not in (3, 4):
        return False
    if not all(type(x) is int for x in entry[:3]):
        return False
    return len(entry) == 3 or (type(entry[3]) is bytes and len(entry[3]) == DIGEST_BYTES)


def _decode(raw: bytes | None) -> list[list[Any]]:
    if raw is None:
        return []
    try:
        entries = unpack(raw)
    except LatticedError:
        entries = None
    if type(entries) is not list or not all(_entry_ok(e) for e in entries):
        return []  # unreadable: treated as never seen (never happens unless the row was edited)
    return entries


def _stored(writer: WriterView, name: str) -> bytes | None:
    """The committed ``settings`` row ``name`` (storage thread)."""
    row = writer.store.connection.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
    return None if row is None else bytes(row[0])


class ProducedAppend(Job):
    """``inner`` (an append of one owned queue, plain or sealed) unless ``producer`` already sent ``seq``;
    ``result`` is ``(first offset, count, duplicate)``. ``now_ms``: when, for the producer's last use."""

    __slots__ = ("count", "digest", "inner", "name", "now_ms", "seq")

    def __init__(
        self, inner: Job, qid: bytes, producer: str, seq: int, count: int, *, digest: bytes, now_ms: int
    ) -> None:
        super().__init__()
        self.inner = inner
        self.name = row_name(qid, producer)
        self.seq = seq
        self.count = count
        self.digest = digest
        self.now_ms = now_ms

    def apply(self, batch: Batch, writer: WriterView) -> None:
        staged = batch.settings.get(self.name)
        entries = _decode(staged if staged is not None else _stored(writer, self.name))
        for seq, first, count, *digest in entries:
            if seq == self.seq:
                if count != self.count or (digest and digest[0] != self.digest):
                    raise MalformedError(
                        f"sequence {seq} of this producer was {count} other record(s) than these "
                        f"{self.count}: a retry must send the same records (nothing written)"
                    )
                self.result = (first, count, True)
                return
        if len(entries) >= REMEMBERED and self.seq < entries[0][0]:
            raise MalformedError(
                f"sequence {self.seq} is older than the last {REMEMBERED} this producer sent (from "
                f"{entries[0][0]}): the owner cannot tell whether it wrote it, so it writes nothing"
            )
        self.inner.apply(batch, writer)
        first = int(self.inner.result)
        entries.append([self.seq, first, self.count, self.digest])
        entries.sort()
        batch.settings[self.name] = pack(entries[-REMEMBERED:])
        batch.settings[used_row_name(self.name)] = pack(self.now_ms)
        batch.mutations += 1
        self.result = (first, self.count, False)


__all__ = [
    "MAX_PRODUCER_CHARS",
    "REMEMBERED",
    "ROW_PREFIX",
    "USED_PREFIX",
    "ProducedAppend",
    "check_producer",
    "offered_digest",
    "packed_size",
    "producer_scope",
    "row_name",
    "used_row_name",
]
