"""Records, their canonical bytes, and the hash chain that lets one signature cover a whole batch.

``digest(record, offset)`` hashes a fixed layout that includes the absolute offset, so a record cannot be
moved. ``chain_next(c, d) = H(c || d)`` links digests: a signed head that commits to the chain value at
its end vouches for every record before it, and a verified chain value at any offset lets a replica check
a suffix that starts there without holding anything older.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from latticed.crdt.errors import MalformedError

MAX_KEY_BYTES = 64 * 1024
MAX_VALUE_BYTES = 8 * 1024 * 1024
MAX_HEADERS = 256
MAX_HEADER_KEY_BYTES = 1024
MAX_HEADER_VALUE_BYTES = 64 * 1024

_RECORD_PERSON = b"latticed.rec.v1"
_CHAIN_PERSON = b"latticed.chain1"
_U64 = struct.Struct(">Q")
_FIXED = struct.Struct(">QqBII")  # offset, timestamp, has_key, key length, value length
_HDR = struct.Struct(">HI")

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Record:
    """One log entry, Kafka-shaped: key (optional), value, producer timestamp (ms), headers."""

    value: bytes
    key: bytes | None = None
    timestamp: int = 0
    headers: Headers = ()

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


def as_bytes(value: bytes | bytearray | memoryview | str, what: str) -> bytes:
    """Accept text for convenience, store bytes: payloads are opaque to the log."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise MalformedError(f"{what} must be bytes or str, not {type(value).__name__}")


def make_headers(headers: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None) -> Headers:
    """Headers as a dict or as (name, value) pairs (names may repeat, as in Kafka); values bytes or str."""
    if headers is None:
        return ()
    try:
        items = list(headers.items() if isinstance(headers, Mapping) else headers)
    except TypeError as exc:
        raise MalformedError("headers must be a mapping or (name, value) pairs") from exc
    out = []
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
            raise MalformedError(f"a header is a (str name, value) pair, not {item!r}")
        out.append((item[0], as_bytes(item[1], "header value")))
    return tuple(out)


def make_record(
    value: bytes | str,
    *,
    key: bytes | str | None = None,
    headers: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None = None,
    timestamp: int,
) -> Record:
    record = Record(
        value=as_bytes(value, "value"),
        key=None if key is None else as_bytes(key, "key"),
        timestamp=int(timestamp),
        headers=make_headers(headers),
    )
    check_record(record)
    return record


def check_record(record: Record) -> None:
    """Enforce the types and size limits, so a record that one replica accepts every replica accepts."""
    if type(record) is not Record:
        raise MalformedError(f"not a record: {type(record).__name__}")
    key, value, timestamp = record.key, record.value, record.timestamp
    if type(value) is not bytes or len(value) > MAX_VALUE_BYTES:
        raise MalformedError(f"record value must be bytes of at most {MAX_VALUE_BYTES} bytes")
    if key is not None and (type(key) is not bytes or len(key) > MAX_KEY_BYTES):
        raise MalformedError(f"record key must be bytes of at most {MAX_KEY_BYTES} bytes")
    if type(timestamp) is not int or not -(2**63) <= timestamp < 2**63:
        raise MalformedError("record timestamp must be a 64-bit integer (ms)")
    headers = record.headers
    if not headers:
        return
    if type(headers) is not tuple or len(headers) > MAX_HEADERS:
        raise MalformedError(f"headers are a tuple of at most {MAX_HEADERS} (name, value) pairs")
    for header in headers:
        if type(header) is not tuple or len(header) != 2:
            raise MalformedError("a header is a (name, value) pair")
        name, header_value = header
        if not isinstance(name, str) or len(name.encode()) > MAX_HEADER_KEY_BYTES:
            raise MalformedError("header names must be short strings")
        if not isinstance(header_value, bytes) or len(header_value) > MAX_HEADER_VALUE_BYTES:
            raise MalformedError("header values must be bytes of at most 64 KiB")


def encode_record(record: Record, offset: int) -> bytes:
    """The canonical bytes of a record at an offset: what the chain (and so the signature) covers."""
    key, value, headers = record.key, record.value, record.headers
    fixed = _FIXED.pack(offset, record.timestamp, key is not None, len(key) if key else 0, len(value))
    if not headers:
        return b"".join((fixed, key or b"", value, b"\x00\x00"))
    parts = [fixed, key or b"", value, struct.pack(">H", len(headers))]
    for name, header_value in headers:
        raw = name.encode()
        parts.append(_HDR.pack(len(raw), len(header_value)))
        parts.append(raw)
        parts.append(header_value)
    return b"".join(parts)


def record_digest(record: Record, offset: int) -> bytes:
    return hashlib.blake2b(encode_record(record, offset), digest_size=32, person=_RECORD_PERSON).digest()


def chain_next(previous: bytes, digest: bytes) -> bytes:
    return hashlib.blake2b(previous + digest, digest_size=32, person=_CHAIN_PERSON).digest()


# Personalised hashers are set up once and copied: keyword setup costs as much as hashing 100 bytes.
_RECORD_HASHER = hashlib.blake2b(digest_size=32, person=_RECORD_PERSON)
_CHAIN_HASHER = hashlib.blake2b(digest_size=32, person=_CHAIN_PERSON)


def chain_extend(base: bytes, first_offset: int, records: Sequence[Record]) -> list[bytes]:
    """Chain values after each record, starting from ``base`` (the chain value at ``first_offset``).

    The hot path of signing and verification: the header-less encoding is inlined."""
    out: list[bytes] = []
    append = out.append
    record_hasher = _RECORD_HASHER.copy
    chain_hasher = _CHAIN_HASHER.copy
    pack = _FIXED.pack
    current = base
    offset = first_offset
    for record in records:
        key, value = record.key, record.value
        if record.headers:
            encoded = encode_record(record, offset)
        else:
            fixed = pack(offset, record.timestamp, key is not None, len(key) if key else 0, len(value))
            encoded = b"".join((fixed, key or b"", value, b"\x00\x00"))
        h = record_hasher()
        h.update(encoded)
        c = chain_hasher()
        c.update(current)
        c.update(h.digest())
        current = c.digest()
        append(current)
        offset += 1
    return out


def chain_fold(base: bytes, digests: Iterable[bytes]) -> bytes:
    current = base
    for digest in digests:
        current = chain_next(current, digest)
    return current


def offset_bytes(offset: int) -> bytes:
    return _U64.pack(offset)


def blake2b_skip(previous: bytes, new_start: int) -> bytes:
    """Chain value after truncating past the end: offsets below ``new_start`` are never assigned."""
    data = previous + _U64.pack(new_start)
    return hashlib.blake2b(data, digest_size=32, person=b"latticed.skip.v1").digest()
