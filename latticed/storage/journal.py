"""The owner's journal: each batch of the owner's single offers (its records and its signed head) framed,
checksummed and numbered, so that it can be acked after one small ``fdatasync`` and replayed on open.

Why (issue 28, bench/RESULTS.md "journal26"): a batch's durable ``COMMIT`` writes ~12 SQLite pages and
fsyncs them; this file gets ~2 KB a batch, overwritten in place in a preallocated file, while SQLite is
written with ``synchronous=NORMAL``. Here: the format and the replay's decisions (:func:`scan`,
:func:`plan`: sans-IO), and :class:`JournalFile`, the file's few system calls. Nothing in the daemon writes
a journal yet, so no store schema changes with this module; wiring it in will (an older build must
refuse a store whose journal it would not replay).

The salt is in every frame's CRC, so bytes a client chose (a record's value) left past the tail cannot
pass for a frame without the file's header, and a replayed entry's head must still carry the owner's
signature (:func:`plan`).

Format, version 1 (integers little-endian):

* header, :data:`HEADER_SIZE` bytes: :data:`MAGIC`, the version (u32), a 16-byte salt drawn when the file
  is started (or started over), the CRC-32 of those 28 bytes (u32);
* then entries, each a frame: the body's length (u32), its sequence number (u64: 1, 2, ... under one
  salt), the CRC-32 of salt, length, sequence number and body (u32), then the body;
* a body: msgpack ``[queue id (32 bytes), first offset, records, signed head]``, each record
  ``[value, key or nil, timestamp, [[header name, value], ...]]``, the head as ``HeadV2.to_bytes``.

A scan stops at the first frame that is not whole, fails its CRC, or does not carry the next number: a
tail torn by a power loss (never acked: the ack waits for the entry's ``fdatasync``), the zeros of the
preallocated space, or an older salt's entries past the tail after the file was started over.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from latticed.crdt.core_errors import IntegrityError, MalformedError
from latticed.crdt.head2 import HeadV2
from latticed.crdt.records import Record

MAGIC: Final = b"LTDJRNL\x00"
VERSION: Final = 1
_HEADER: Final = struct.Struct("<8sI16s")
_HEADER_CRC: Final = struct.Struct("<I")
HEADER_SIZE: Final = _HEADER.size + _HEADER_CRC.size  # 32
_FRAME: Final = struct.Struct("<IQI")  # body length, sequence number, CRC-32
#: A body larger than this is not one this build writes (a batch of single offers is a few KB; a frame
#: claiming more is a torn or foreign length, not a reason to read gigabytes).
MAX_BODY_BYTES: Final = 64 << 20


@dataclass(frozen=True, slots=True)
class Entry:
    """One journaled batch of one queue: its records from ``first`` on, and the head that signs them."""

    queue_id: bytes
    first: int
    records: tuple[Record, ...]
    head: bytes  #: ``HeadV2.to_bytes()``


def header(salt: bytes) -> bytes:
    """The file's first :data:`HEADER_SIZE` bytes under ``salt`` (16 bytes, fresh each start)."""
    if len(salt) != 16:
        raise ValueError("a journal's salt is 16 bytes")
    fixed = _HEADER.pack(MAGIC, VERSION, salt)
    return fixed + _HEADER_CRC.pack(zlib.crc32(fixed))


def _body(entry: Entry) -> bytes:
    records = [[r.value, r.key, r.timestamp, [list(h) for h in r.headers]] for r in entry.records]
    packed: bytes = msgpack.packb([entry.queue_id, entry.first, records, entry.head], use_bin_type=True)
    return packed


def _crc(salt: bytes, length: int, seq: int, body: bytes | memoryview) -> int:
    return zlib.crc32(body, zlib.crc32(salt + struct.pack("<IQ", length, seq)))


def frame(salt: bytes, seq: int, entry: Entry) -> bytes:
    """``entry`` as the ``seq``-th frame under ``salt``: what the writer appends and fdatasyncs."""
    body = _body(entry)
    if len(body) > MAX_BODY_BYTES:
        raise ValueError("a journal entry is larger than MAX_BODY_BYTES")
    return _FRAME.pack(len(body), seq, _crc(salt, len(body), seq, body)) + body


def _entry(body: bytes) -> Entry:
    """The body's entry; MalformedError if its shape is not version 1's."""
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
        qid, first, rows, head = raw
        if not (isinstance(qid, bytes) and isinstance(first, int) and isinstance(head, bytes)):
            raise MalformedError("a journal entry's queue id, offset or head has the wrong type")
        records = tuple(_record(row) for row in rows)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise MalformedError(f"an undecodable journal entry: {exc}") from exc
    return Entry(qid, first, records, head)


def _record(row: Any) -> Record:
    value, key, timestamp, headers = row
    if not isinstance(value, bytes) or not (key is None or isinstance(key, bytes)):
        raise MalformedError("a journaled record's value or key is not bytes")
    if not isinstance(timestamp, int) or not all(
        isinstance(h, list) and len(h) == 2 and isinstance(h[0], str) and isinstance(h[1], bytes)
        for h in headers
    ):
        raise MalformedError("a journaled record's timestamp or headers have the wrong type")
    return Record(value, key, timestamp, tuple((name, data) for name, data in headers))


@dataclass
class Scan:
    """What a journal's bytes hold, up to the last whole entry."""

    salt: bytes | None  #: None: no valid header (an empty file, or one torn while it was started)
    entries: list[Entry] = field(default_factory=list)
    end: int = 0  #: the offset after the last whole entry: where the next frame is written
    torn: bool = False  #: bytes other than zeros past ``end`` (a torn frame or an older salt's entries)
    malformed: str | None = None  #: a whole, checksummed frame whose body does not decode (a bug): why


def scan(data: bytes | bytearray | memoryview) -> Scan:
    """Every whole entry of a journal file's ``data``, in order; never raises on any bytes."""
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        return Scan(None, torn=_nonzero(view))
    magic, version, salt = _HEADER.unpack_from(view)
    (crc,) = _HEADER_CRC.unpack_from(view, _HEADER.size)
    if magic != MAGIC or version != VERSION or crc != zlib.crc32(view[: _HEADER.size]):
        return Scan(None, torn=_nonzero(view))
    result = Scan(salt, end=HEADER_SIZE)
    offset, seq = HEADER_SIZE, 1
    while offset + _FRAME.size <= len(view):
        length, got_seq, crc = _FRAME.unpack_from(view, offset)
        start = offset + _FRAME.size
        if got_seq != seq or length > MAX_BODY_BYTES or start + length > len(view):
            break
        body = bytes(view[start : start + length])
        if crc != _crc(salt, length, seq, body):
            break
        try:
            entry = _entry(body)
        except MalformedError as exc:
            result.malformed = str(exc)
            break
        result.entries.append(entry)
        offset, seq = start + length, seq + 1
        result.end = offset
    result.torn = _nonzero(view[result.end :])
    return result


def _nonzero(view: memoryview) -> bool:
    """Whether any byte is not zero (in C: the preallocated rest of a file is megabytes)."""
    return bytes(view).count(0) != len(view)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A journaled entry not replayed, and why (reported; never merged)."""

    queue_id: bytes
    first: int
    reason: str


@dataclass
class Plan:
    """What a replay does with a scan's entries against what the store holds."""

    replay: list[tuple[Entry, HeadV2]] = field(default_factory=list)  #: in order, each verified
    skipped: int = 0  #: entries the store already holds (its rows were written after the entry)
    refused: list[Refusal] = field(default_factory=list)


def plan(entries: Sequence[Entry], owner: bytes, stored_end: Callable[[bytes], int | None]) -> Plan:
    """Which of ``entries`` (the owner ``owner``'s) to replay on top of the store, whose queue ends are
    ``stored_end(queue_id)`` (None: no such queue).

    An entry is replayed only if its head is well formed, signed by ``owner`` for its queue, ends where its
    records do, and starts exactly where the queue ends (the store's end, or the previous replayed
    entry's). One that fails any of these is refused with its reason, and so is every later entry of its
    queue (their chain would start from a head not replayed). The records' chain up to the head's hash is
    checked by the merge each replayed entry goes through, as a peer's delta is."""
    result = Plan()
    ends: dict[bytes, int] = {}
    broken: set[bytes] = set()
    for entry in entries:
        qid = entry.queue_id
        if qid in broken:
            result.refused.append(Refusal(qid, entry.first, "after a refused entry of its queue"))
            continue
        try:
            head = HeadV2.from_bytes(entry.head)
            head.verify(owner, qid)
        except (MalformedError, IntegrityError) as exc:
            broken.add(qid)
            result.refused.append(Refusal(qid, entry.first, f"its head: {exc}"))
            continue
        end = ends.get(qid)
        if end is None:
            end = stored_end(qid)
        reason = None
        if end is None:
            reason = "no such queue in the store"
        elif head.end != entry.first + len(entry.records):
            reason = f"its head ends at {head.end}, its records at {entry.first + len(entry.records)}"
        elif head.end <= end:
            result.skipped += 1
            continue
        elif entry.first != end:
            reason = f"it starts at {entry.first}, the queue ends at {end}"
        if reason is not None:
            broken.add(qid)
            result.refused.append(Refusal(qid, entry.first, reason))
            continue
        ends[qid] = head.end
        result.replay.append((entry, head))
    return result


class JournalFile:
    """The journal on disk: frames overwrite written zeros in place, so an entry's ``fdatasync`` has no
    file size to log (on this box ~100 µs against ~140 for an append, bench/RESULTS.md journal26).

    The space is written ahead in :attr:`chunk`-byte steps of zeros, each fsynced before a frame lands in
    it. :meth:`append` returns only once its frames are on disk: the caller acks after it, never before.
    After an ``OSError`` from it the file must not be appended to again (a failed ``fdatasync`` may have
    dropped the pages it did not write, and a retry can report success): the caller stops journaling."""

    def __init__(self, fd: int, salt: bytes, *, end: int, seq: int, size: int, chunk: int) -> None:
        self._fd, self.salt, self.end, self._seq, self._size, self.chunk = fd, salt, end, seq, size, chunk

    @classmethod
    def open(cls, path: str, *, salt: bytes, chunk: int = 4 << 20) -> tuple[JournalFile, Scan]:
        """Open (or create) the journal at ``path``; returns it, positioned after its last whole entry,
        and what it holds. ``salt`` (16 fresh bytes) starts a file with no valid header: a new file, or
        one whose header a power loss tore while it was started over (its entries were all in the store
        by then); the returned scan says ``torn`` when such a file held bytes, for the caller to report
        (damage cannot be told from that case)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            found = scan(os.pread(fd, size, 0)) if size else Scan(None)
            journal = cls(
                fd, found.salt or salt, end=found.end, seq=len(found.entries) + 1, size=size, chunk=chunk
            )
            if found.salt is None:
                journal.start_over(salt)
        except BaseException:
            os.close(fd)
            raise
        return journal, found

    def _reserve(self, upto: int) -> None:
        if upto <= self._size:
            return
        size = self._size + -(-(upto - self._size) // self.chunk) * self.chunk  # whole chunks
        os.pwrite(self._fd, bytes(size - self._size), self._size)
        os.fsync(self._fd)  # the size and the zeros, before any frame is written into them
        self._size = size

    def append(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` after the last one and ``fdatasync`` them."""
        blob = b"".join(frame(self.salt, self._seq + i, entry) for i, entry in enumerate(entries))
        self._reserve(self.end + len(blob))
        if os.pwrite(self._fd, blob, self.end) != len(blob):
            raise OSError(f"a short write to the journal at {self.end}")
        os.fdatasync(self._fd)
        self.end += len(blob)
        self._seq += len(entries)

    def start_over(self, salt: bytes) -> None:
        """Forget every entry: a new header under ``salt``, durable before the next append. Only once the
        store holds every entry durably (its WAL fsynced): the old entries are then never needed."""
        self._reserve(HEADER_SIZE)
        os.pwrite(self._fd, header(salt), 0)
        os.fdatasync(self._fd)
        self.salt, self.end, self._seq = salt, HEADER_SIZE, 1

    def close(self) -> None:
        os.close(self._fd)
