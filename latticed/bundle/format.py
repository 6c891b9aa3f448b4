"""The bundle file and the want file, encoded and decoded without I/O (bytes in, sections out).

A bundle is ``MAGIC ‖ u16 format version`` and then sections, each ``u32 big-endian length ‖ msgpack
body``: one HEADER (who exported it, when), any number of DELTA (a queue's delta exactly as replication
sends it), and one END that closes it: how many sections and records came before, a BLAKE2b-256 digest of
every byte before the END section, and the exporter's signature over those. Nothing may follow END.

What makes a bundle safe is not the exporter's signature (anyone can write a bundle and sign it with their
own key) but that every delta is verified as a peer's is, against its owner's signatures and hash chain.
The digest and signature make any change to the file (a flipped byte in a field no owner signs, a section
dropped or added, a truncation) a refusal of the whole file, so that nothing of a damaged bundle is merged.

Errors: input that is not a bundle at all (another magic, a format version this release does not know) is
a :class:`MalformedError`; anything wrong after that is a :class:`TamperedError` (an integrity failure).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from latticed.crdt.core_errors import IntegrityError, MalformedError, TamperedError
from latticed.crdt.queue import QueueDelta, Summary
from latticed.crdt.signing import HASH_SIZE, PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, verify
from latticed.crdt.wire import delta_from_wire, delta_to_wire, summary_from_wire, summary_to_wire

#: The first bytes of every bundle; what follows is the format version (u16, big-endian).
MAGIC: Final = b"LATTBNDL"
#: The first bytes of a want file (``latticectl bundle want``), followed by its format version.
WANT_MAGIC: Final = b"LATTWANT"
#: The format this release writes and the only one it reads; a later release reads this one too.
FORMAT_VERSION: Final = 1
_PREAMBLE: Final = struct.Struct(">8sH")
_LENGTH: Final = struct.Struct(">I")
_COUNTS: Final = struct.Struct(">QQ")
#: A section longer than this is refused before it is buffered (a delta chunk is a few MiB at most).
MAX_SECTION_BYTES: Final = 64 << 20
#: A want file larger than this is refused (a summary is under 100 bytes: about a million queues).
MAX_WANT_BYTES: Final = 128 << 20

SECTION_HEADER: Final = 0
SECTION_DELTA: Final = 1
SECTION_END: Final = 2

_DIGEST_PERSON: Final = b"latticed-bundle"
_SIGNED_PREFIX: Final = b"latticed/bundle-end/v1\x00"

#: A queue, KV namespace or group log: owner key, name, kind.
LogKey = tuple[bytes, str, int]


@dataclass(frozen=True, slots=True)
class BundleHeader:
    exporter: bytes  #: the public key of the daemon that wrote the bundle
    created_ms: int
    #: Whether the export left out what a want file said the other side holds.
    incremental: bool


@dataclass(frozen=True, slots=True)
class BundleEnd:
    sections: int  #: sections before END, HEADER included
    records: int  #: records in all DELTA sections
    digest: bytes
    signature: bytes


Section = BundleHeader | QueueDelta | BundleEnd


def _digest() -> Any:
    return hashlib.blake2b(digest_size=HASH_SIZE, person=_DIGEST_PERSON)


def _signed(digest: bytes, sections: int, records: int) -> bytes:
    return _SIGNED_PREFIX + digest + _COUNTS.pack(sections, records)


def _frame(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    if len(data) > MAX_SECTION_BYTES:
        raise MalformedError(f"a bundle section of {len(data)} bytes is over {MAX_SECTION_BYTES}")
    return _LENGTH.pack(len(data)) + data


class BundleWriter:
    """Bytes of a bundle, section by section: :meth:`start`, :meth:`delta` per chunk, :meth:`finish`."""

    def __init__(self, identity: Identity, created_ms: int, *, incremental: bool) -> None:
        self._identity = identity
        self._header = BundleHeader(identity.public_key, created_ms, incremental)
        self._hash = _digest()
        self.sections = 0
        self.records = 0

    def _hashed(self, data: bytes) -> bytes:
        self._hash.update(data)
        return data

    def start(self) -> bytes:
        self.sections += 1
        head = self._header
        return self._hashed(
            _PREAMBLE.pack(MAGIC, FORMAT_VERSION)
            + _frame([SECTION_HEADER, head.exporter, head.created_ms, head.incremental])
        )

    def delta(self, delta: QueueDelta) -> bytes:
        self.sections += 1
        self.records += len(delta.records)
        return self._hashed(_frame([SECTION_DELTA, delta_to_wire(delta)]))

    def finish(self) -> bytes:
        digest = self._hash.digest()
        signature = self._identity.sign(_signed(digest, self.sections, self.records))
        return _frame([SECTION_END, self.sections, self.records, digest, signature])


class BundleReader:
    """Feed a bundle's bytes in any pieces (:meth:`feed`), take its sections out as they complete; then
    :meth:`close`. Only decoding and the file's own digest and signature are checked here: every delta
    must still go through ``verify_delta`` before it is trusted. Holds at most one section in memory."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._hash = _digest()
        self._preamble = False
        self.header: BundleHeader | None = None
        self.end: BundleEnd | None = None
        self.sections = 0
        self.records = 0
        #: Bytes taken so far (progress).
        self.consumed = 0

    def feed(self, data: bytes) -> list[Section]:
        """The sections ``data`` completes, in order."""
        if self.end is not None and data:
            raise TamperedError("bytes follow the end of the bundle")
        self._buffer += data
        out: list[Section] = []
        if not self._preamble:
            if len(self._buffer) < _PREAMBLE.size:
                if not MAGIC.startswith(bytes(self._buffer[: len(MAGIC)])):
                    raise MalformedError("not a latticed bundle (it does not start with LATTBNDL)")
                return out
            self._read_preamble()
        while self.end is None and len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > MAX_SECTION_BYTES:
                raise TamperedError(f"bundle section {self.sections + 1} claims {length} bytes (damaged)")
            if len(self._buffer) < _LENGTH.size + length:
                break
            raw = bytes(self._buffer[: _LENGTH.size + length])
            del self._buffer[: len(raw)]
            self.consumed += len(raw)
            out.append(self._section(raw))
        if self.end is not None and self._buffer:
            raise TamperedError("bytes follow the end of the bundle")
        return out

    def close(self) -> BundleEnd:
        """The END section, once the whole bundle was fed; a bundle cut short is a TamperedError."""
        if not self._preamble:
            raise MalformedError("not a latticed bundle (too short)")
        if self.end is None:
            raise TamperedError(
                f"the bundle is truncated: it ends after {self.sections} complete sections without its end"
            )
        return self.end

    def _read_preamble(self) -> None:
        magic, version = _PREAMBLE.unpack_from(self._buffer)
        if magic != MAGIC:
            raise MalformedError("not a latticed bundle (it does not start with LATTBNDL)")
        if version != FORMAT_VERSION:
            raise MalformedError(
                f"bundle format version {version}: this release reads version {FORMAT_VERSION} only "
                "(a newer release wrote it)"
            )
        self._hash.update(bytes(self._buffer[: _PREAMBLE.size]))
        del self._buffer[: _PREAMBLE.size]
        self.consumed += _PREAMBLE.size
        self._preamble = True

    def _section(self, raw: bytes) -> Section:
        number = self.sections + 1
        try:
            body = msgpack.unpackb(raw[_LENGTH.size :], raw=False, strict_map_key=True, use_list=True)
        except Exception as exc:  # msgpack raises many unrelated types for bad input
            raise TamperedError(f"bundle section {number} does not decode (damaged)") from exc
        if not isinstance(body, list) or not body or type(body[0]) is not int:
            raise TamperedError(f"bundle section {number} is not a section (damaged)")
        kind = body[0]
        if kind == SECTION_END:
            self.end = self._end(body)
            return self.end
        self._hash.update(raw)
        self.sections = number
        if kind == SECTION_HEADER:
            if self.header is not None or number != 1:
                raise TamperedError("a bundle has one header, first")
            self.header = _header(body)
            return self.header
        if self.header is None:
            raise TamperedError("the bundle's first section is not its header")
        if kind != SECTION_DELTA or len(body) != 2:
            raise TamperedError(f"bundle section {number} is of an unknown kind {kind!r} (damaged)")
        try:
            delta = delta_from_wire(body[1])
        except MalformedError as exc:
            raise TamperedError(f"bundle section {number} is not a valid delta: {exc}") from exc
        self.records += len(delta.records)
        return delta

    def _end(self, body: list[Any]) -> BundleEnd:
        if self.header is None:
            raise TamperedError("the bundle has no header")
        if (
            len(body) != 5
            or type(body[1]) is not int
            or type(body[2]) is not int
            or not isinstance(body[3], bytes)
            or not isinstance(body[4], bytes)
            or len(body[4]) != SIGNATURE_SIZE
        ):
            raise TamperedError("the bundle's end section is damaged")
        end = BundleEnd(body[1], body[2], body[3], body[4])
        if (end.sections, end.records) != (self.sections, self.records):
            raise TamperedError(
                f"the bundle's end counts {end.sections} sections and {end.records} records, "
                f"but {self.sections} and {self.records} came before it (damaged)"
            )
        if end.digest != self._hash.digest():
            raise TamperedError("the bundle's digest does not match its bytes (damaged or altered)")
        try:
            verify(self.header.exporter, _signed(end.digest, end.sections, end.records), end.signature)
        except IntegrityError as exc:
            raise TamperedError("the bundle's end is not signed by the exporter it names") from exc
        return end


def _header(body: list[Any]) -> BundleHeader:
    if (
        len(body) != 4
        or not isinstance(body[1], bytes)
        or len(body[1]) != PUBLIC_KEY_SIZE
        or type(body[2]) is not int
        or type(body[3]) is not bool
    ):
        raise TamperedError("the bundle's header is damaged")
    return BundleHeader(body[1], body[2], body[3])


def read_all(chunks: Iterable[bytes]) -> Iterator[Section]:
    """Every section of a bundle given as byte chunks, checked to its end (tests and tools)."""
    reader = BundleReader()
    for chunk in chunks:
        yield from reader.feed(chunk)
    reader.close()


# ------------------------------------------------------------------------------------------ want files


@dataclass(frozen=True, slots=True)
class Want:
    """What a daemon holds, for another daemon's export to leave out."""

    holder: bytes
    holds: Mapping[LogKey, Summary]


def encode_want(holder: bytes, holds: Mapping[LogKey, Summary]) -> bytes:
    rows = [[owner, name, kind, summary_to_wire(s)] for (owner, name, kind), s in holds.items()]
    body: bytes = msgpack.packb([holder, rows], use_bin_type=True)
    return _PREAMBLE.pack(WANT_MAGIC, FORMAT_VERSION) + body


def decode_want(data: bytes) -> Want:
    """A want file; anything else (a bundle given by mistake, a damaged file) is a MalformedError."""
    if not isinstance(data, bytes) or len(data) < _PREAMBLE.size:
        raise MalformedError("not a latticed want file (too short)")
    magic, version = _PREAMBLE.unpack_from(data)
    if magic != WANT_MAGIC:
        hint = " (it is a bundle: give it to bundle import)" if magic == MAGIC else ""
        raise MalformedError(f"not a latticed want file{hint}")
    if version != FORMAT_VERSION:
        raise MalformedError(f"want file format version {version}: this release reads {FORMAT_VERSION}")
    if len(data) > MAX_WANT_BYTES:
        raise MalformedError(f"a want file is at most {MAX_WANT_BYTES} bytes")
    try:
        raw = msgpack.unpackb(data[_PREAMBLE.size :], raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises many unrelated types for bad input
        raise MalformedError("the want file does not decode (damaged)") from exc
    if not isinstance(raw, list) or len(raw) != 2 or not isinstance(raw[1], list):
        raise MalformedError("the want file is damaged")
    holder, rows = raw
    if not isinstance(holder, bytes) or len(holder) != PUBLIC_KEY_SIZE:
        raise MalformedError("the want file does not name its holder")
    holds: dict[LogKey, Summary] = {}
    for row in rows:
        if (
            not isinstance(row, list)
            or len(row) != 4
            or not isinstance(row[0], bytes)
            or not isinstance(row[1], str)
            or type(row[2]) is not int
        ):
            raise MalformedError("a want file row is [owner, name, kind, summary]")
        holds[(row[0], row[1], row[2])] = summary_from_wire(row[3])
    return Want(holder, holds)


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_SECTION_BYTES",
    "WANT_MAGIC",
    "BundleEnd",
    "BundleHeader",
    "BundleReader",
    "BundleWriter",
    "LogKey",
    "Section",
    "Want",
    "decode_want",
    "encode_want",
    "read_all",
]
