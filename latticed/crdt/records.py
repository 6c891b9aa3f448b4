"""Records, their canonical bytes, and the hash chain that lets one signature cover a whole batch.

``digest(record, offset)`` hashes a fixed layout that includes the absolute offset, so a record cannot be
moved. ``chain_next(c, d) = H(c || d)`` links digests: a signed head that commits to the chain value at
its end vouches for every record before it, and a verified chain value at any offset lets a replica check
a suffix that starts there without holding anything older.

Why one module: a record, its canonical bytes and the hash chain over them are one definition that must
change together (the test vectors pin the digest layout and the chain fold at once); :class:`RecordRun` is
the same records in columns, the hot path of both.
"""

from __future__ import annotations

import hashlib
import struct
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import chain, repeat
from typing import Any, Final, cast, overload

from latticed.crdt import chain_compiled, columns_compiled
from latticed.crdt.core_errors import MalformedError

MAX_KEY_BYTES = 64 * 1024
MAX_VALUE_BYTES = 8 * 1024 * 1024
MAX_HEADERS = 256
MAX_HEADER_KEY_BYTES = 1024
MAX_HEADER_VALUE_BYTES = 64 * 1024
#: Offsets are signed 64-bit, as in Kafka (records and heads encode them as u64, so this always fits):
#: the last offset a record can have is ``MAX_OFFSET - 1``, and no signed head's start or end lies past it.
#: Here, in a module without crypto, so the Spark planner can check offsets against it cheaply.
MAX_OFFSET = 2**63 - 1

_RECORD_PERSON = b"latticed.rec.v1"
_CHAIN_PERSON = b"latticed.chain1"
_U64 = struct.Struct(">Q")
_FIXED = struct.Struct(">QqBII")  # offset, timestamp, has_key, key length, value length
_HDR = struct.Struct(">HI")
_HDR_COUNT = struct.Struct(">H")

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


class RecordRun(Sequence[Record]):
    """Consecutive records held as columns: how a batch arrives from a client and how the store writes it.

    A run is a ``Sequence[Record]`` (indexing or iterating builds the :class:`Record`), so it goes wherever
    records go; the hot paths (:func:`check_records`, :func:`chain_extend`, the store's segment encoder and
    live tails) read its columns instead, and never build a Record per entry: that object costs more than
    hashing the record does. It is as immutable as a Record: the columns are tuples and cannot be
    reassigned. ``headers`` is None when no record has any (the common case), else one tuple per record.
    A run is not checked when built: :func:`check_records` enforces the same limits as :func:`check_record`.
    """

    __slots__ = ("_checked", "headers", "keys", "timestamps", "values")

    values: tuple[bytes, ...]
    keys: tuple[bytes | None, ...]
    timestamps: tuple[int, ...]
    headers: tuple[Headers, ...] | None
    _checked: bool

    def __init__(
        self,
        values: Iterable[bytes],
        keys: Iterable[bytes | None],
        timestamps: Iterable[int],
        headers: Iterable[Headers] | None = None,
    ) -> None:
        values, keys, timestamps = tuple(values), tuple(keys), tuple(timestamps)
        if headers is not None:
            headers = tuple(headers)
            if not any(headers):
                headers = None
        if not len(values) == len(keys) == len(timestamps) or (
            headers is not None and len(headers) != len(values)
        ):
            raise MalformedError("a record run's columns differ in length")
        setter = object.__setattr__
        setter(self, "values", values)
        setter(self, "keys", keys)
        setter(self, "timestamps", timestamps)
        setter(self, "headers", headers)
        #: Set once :func:`check_records` passed: the columns cannot change, so neither can the verdict.
        setter(self, "_checked", False)

    @classmethod
    def of(cls, records: Iterable[Record]) -> RecordRun:
        """``records`` as a run (a run is returned as it is)."""
        if type(records) is RecordRun:
            return records
        records = records if isinstance(records, list | tuple) else list(records)
        return cls(
            [r.value for r in records],
            [r.key for r in records],
            [r.timestamp for r in records],
            [r.headers for r in records],
        )

    @classmethod
    def join(cls, runs: Sequence[RecordRun]) -> RecordRun:
        """The runs one after the other."""
        if len(runs) == 1:
            return runs[0]
        if len(runs) == 2 and cls is RecordRun:  # (a store's append: its overlay and a push, no generators)
            a, b = runs
            if type(a) is RecordRun and type(b) is RecordRun and a.headers is None and b.headers is None:
                checked = a._checked and b._checked
                return _columns(a.values + b.values, a.keys + b.keys, a.timestamps + b.timestamps, checked)
        headers: list[Headers] | None = None
        if any(run.headers is not None for run in runs):
            headers = []
            for run in runs:
                headers.extend(run.headers if run.headers is not None else repeat((), len(run.values)))
        joined = cls(
            chain.from_iterable(run.values for run in runs),
            chain.from_iterable(run.keys for run in runs),
            chain.from_iterable(run.timestamps for run in runs),
            headers,
        )
        if all(run._checked for run in runs):
            object.__setattr__(joined, "_checked", True)
        return joined

    @classmethod
    def checked(
        cls,
        values: Iterable[bytes],
        keys: Iterable[bytes | None],
        timestamps: Iterable[int],
        headers: Iterable[Headers] | None = None,
    ) -> RecordRun:
        """A run whose columns the caller has checked already, as :func:`check_records` would (the
        compiled column passes, :mod:`.columns_compiled`): marked checked without a second pass."""
        if (
            cls is RecordRun
            and headers is None
            and type(values) is tuple
            and type(keys) is tuple
            and type(timestamps) is tuple
            and len(values) == len(keys) == len(timestamps)
        ):
            return _columns(values, keys, timestamps, True)  # (a compiled decode's columns as they are)
        run = cls(values, keys, timestamps, headers)
        object.__setattr__(run, "_checked", True)
        return run

    def with_values(self, values: Iterable[bytes]) -> RecordRun:
        """These records' timestamps with ``values`` in their place and no keys or headers (a sealed
        queue's envelopes). The caller built the values, each bytes of at most MAX_VALUE_BYTES: a checked
        run gives a checked one, without a second pass over columns that were checked already."""
        run = RecordRun(values, repeat(None, len(self.values)), self.timestamps)
        if self._checked:
            object.__setattr__(run, "_checked", True)
        return run

    def __reduce__(self) -> tuple[type[RecordRun], tuple[Any, ...]]:
        """Pickled as its columns (a store job holding a delta read as a run crosses processes in the
        crash tests); it comes back unchecked, as any run built from columns."""
        return RecordRun, (self.values, self.keys, self.timestamps, self.headers)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a RecordRun is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a RecordRun is immutable (cannot delete {name!r})")

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> RecordRun: ...
    def __getitem__(self, index: int | slice) -> Record | RecordRun:
        headers = self.headers
        if isinstance(index, slice):
            part = RecordRun(
                self.values[index],
                self.keys[index],
                self.timestamps[index],
                None if headers is None else headers[index],
            )
            if self._checked:
                object.__setattr__(part, "_checked", True)
            return part
        return Record(
            self.values[index],
            self.keys[index],
            self.timestamps[index],
            () if headers is None else headers[index],
        )

    def __iter__(self) -> Iterator[Record]:
        headers = repeat(()) if self.headers is None else self.headers
        return map(Record, self.values, self.keys, self.timestamps, headers)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordRun):
            return (
                self.values == other.values
                and self.keys == other.keys
                and self.timestamps == other.timestamps
                and self.headers_column() == other.headers_column()
            )
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.values, self.keys, self.timestamps, self.headers_column()))

    def __repr__(self) -> str:
        return f"RecordRun({len(self.values)} records)"

    def headers_column(self) -> tuple[Headers, ...]:
        """One headers tuple per record (``()`` for none)."""
        return tuple(repeat((), len(self.values))) if self.headers is None else self.headers

    def payload_bytes(self) -> int:
        """Bytes of values and keys (what checkpoint spacing counts)."""
        size = sum(map(len, self.values))
        if self.keys.count(None) != len(self.keys):
            size += sum(map(len, filter(None, self.keys)))
        return size


def _columns(
    values: tuple[bytes, ...], keys: tuple[bytes | None, ...], timestamps: tuple[int, ...], checked: bool
) -> RecordRun:
    """The run ``RecordRun(values, keys, timestamps)`` builds (with ``_checked``), for columns that are
    already exact tuples of one length and no headers: nothing to copy or compare again."""
    run = object.__new__(RecordRun)
    setter = object.__setattr__
    setter(run, "values", values)
    setter(run, "keys", keys)
    setter(run, "timestamps", timestamps)
    setter(run, "headers", None)
    setter(run, "_checked", checked)
    return run


def join_records(first: Sequence[Record], second: Sequence[Record]) -> Sequence[Record]:
    """``first`` then ``second`` as one immutable sequence: a run when both are runs (or one is empty),
    else a tuple of records."""
    if type(first) is RecordRun and type(second) is RecordRun:  # (their columns' lengths: no frames)
        if not first.values:
            return second
        if not second.values:
            return first
        return RecordRun.join((first, second))
    if not first:
        return second if type(second) is RecordRun else tuple(second)
    if not second:
        return first if type(first) is RecordRun else tuple(first)
    if type(first) is RecordRun and type(second) is RecordRun:
        return RecordRun.join((first, second))
    return (*first, *second)


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


def check_records(records: Sequence[Record]) -> None:
    """:func:`check_record` for each record; a :class:`RecordRun` is checked a column at a time."""
    if type(records) is not RecordRun:
        for record in records:
            check_record(record)
        return
    if records._checked:
        return
    # The run made its columns tuples of one length when it was built, and they cannot change since.
    values, keys, timestamps, headers = records.values, records.keys, records.timestamps, records.headers
    n = len(values)
    if not n:
        return
    if _types(values) != {bytes} or max(map(len, values)) > MAX_VALUE_BYTES:
        raise MalformedError(f"record value must be bytes of at most {MAX_VALUE_BYTES} bytes")
    if keys.count(None) != n:
        present = [key for key in keys if key is not None]
        if _types(present) != {bytes} or max(map(len, present)) > MAX_KEY_BYTES:
            raise MalformedError(f"record key must be bytes of at most {MAX_KEY_BYTES} bytes")
    if _types(timestamps) != {int} or min(timestamps) < -(2**63) or max(timestamps) >= 2**63:
        raise MalformedError("record timestamp must be a 64-bit integer (ms)")
    if headers is not None and not _headers_fit(headers):
        for value, key, timestamp, header in zip(values, keys, timestamps, headers, strict=True):
            if header:
                check_record(Record(value, key, timestamp, header))
    object.__setattr__(records, "_checked", True)


def _headers_fit(headers: Sequence[Headers]) -> bool:
    """Whether every record's headers pass :func:`check_record`'s header rules, checked a column at a
    time (records of one batch mostly carry the same few header names). False means "not sure": the
    caller checks record by record, so the verdict, and its error, are exactly :func:`check_record`'s."""
    same = uniform(headers) if headers else None
    present = [h for h in headers if h] if same is MIXED else [same] if same else []
    if not present:
        return True
    if _types(present) != {tuple}:
        return False
    try:  # equal headers checked once: a producer's records, or a batch's, mostly carry the same ones
        distinct = set(present)
    except TypeError:  # something unhashable inside: not a valid header anyway
        return False
    if max(map(len, distinct)) > MAX_HEADERS:
        return False
    present = list(distinct)
    pairs = list(chain.from_iterable(present))
    if _types(pairs) != {tuple} or set(map(len, pairs)) != {2}:
        return False
    names, values = zip(*pairs, strict=True)
    if _types(names) != {str} or _types(values) != {bytes}:
        return False
    if max(map(len, values)) > MAX_HEADER_VALUE_BYTES:
        return False
    return all(len(name.encode()) <= MAX_HEADER_KEY_BYTES for name in set(names))


def _types(column: Iterable[Any]) -> set[type]:
    return set(map(type, column))


#: What :func:`uniform` returns when the items of a column differ.
MIXED: Final = object()


def uniform(column: Sequence[Any]) -> Any:
    """The one item every entry of a non-empty ``column`` equals, else :data:`MIXED`. One C pass (equal
    by identity first): the records of a producer's batch mostly carry the very same headers, and then
    headers are encoded, checked and converted once for the batch instead of once per record."""
    first = column[0]
    return first if column.count(first) == len(column) else MIXED


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


def _encode_columns(offset: int, key: bytes | None, value: bytes, timestamp: int, headers: Headers) -> bytes:
    """:func:`encode_record` from a run's columns (no Record built)."""
    fixed = _FIXED.pack(offset, timestamp, key is not None, len(key) if key else 0, len(value))
    if not headers:
        return b"".join((fixed, key or b"", value, _NO_HEADERS))
    parts = [fixed, key or b"", value, _HDR_COUNT.pack(len(headers))]
    for name, header_value in headers:
        raw = name.encode()
        parts += (_HDR.pack(len(raw), len(header_value)), raw, header_value)
    return b"".join(parts)


def _headers_bytes(headers: Headers) -> bytes:
    """The part of :func:`encode_record` after the value: the headers (``\\x00\\x00`` for none)."""
    if not headers:
        return _NO_HEADERS
    parts = [_HDR_COUNT.pack(len(headers))]
    for name, header_value in headers:
        raw = name.encode()
        parts += (_HDR.pack(len(raw), len(header_value)), raw, header_value)
    return b"".join(parts)


def record_digest(record: Record, offset: int) -> bytes:
    return hashlib.blake2b(encode_record(record, offset), digest_size=32, person=_RECORD_PERSON).digest()


def chain_next(previous: bytes, digest: bytes) -> bytes:
    return hashlib.blake2b(previous + digest, digest_size=32, person=_CHAIN_PERSON).digest()


# Personalised hashers are set up once and copied: keyword setup costs as much as hashing 100 bytes.
_RECORD_HASHER = hashlib.blake2b(digest_size=32, person=_RECORD_PERSON)
_CHAIN_HASHER = hashlib.blake2b(digest_size=32, person=_CHAIN_PERSON)
_hasher_copy = hashlib.blake2b.copy
_hasher_update = hashlib.blake2b.update
_hasher_digest = hashlib.blake2b.digest
#: Records hashed per step of :func:`chain_extend` (bounds the hashers alive at once: ~450 bytes each).
_CHAIN_STEP = 1024
#: Up to this many records are hashed one at a time.
_CHAIN_SMALL = 4
_NO_HEADERS = b"\x00\x00"
#: The personalisations as the compiled chain hasher takes them: 16 bytes, zero-padded as hashlib pads.
_PERSONS = (
    _RECORD_PERSON.ljust(chain_compiled.PERSON_BYTES, b"\0"),
    _CHAIN_PERSON.ljust(chain_compiled.PERSON_BYTES, b"\0"),
)


def chain_extend(base: bytes, first_offset: int, records: Sequence[Record]) -> list[bytes]:
    """Chain values after each record, starting from ``base`` (the chain value at ``first_offset``).

    The hot path of signing and verification. Record digests do not depend on each other, so they are
    computed a column at a time with ``map`` over C functions (encode, copy a personalised hasher, update,
    digest); only the chain itself is a Python loop, two hash calls per record. Where the compiled chain
    hasher was built (:mod:`.chain_compiled`), a batch is hashed in one C call instead: the same values."""
    out: list[bytes] = []
    n = len(records.values) if type(records) is RecordRun else len(records)  # (no ``__len__`` frame)
    if n <= _CHAIN_SMALL:
        return _chain_small(base, first_offset, records) if n else out
    compiled = chain_compiled.load()
    if compiled is not None:
        chains = _chain_compiled(compiled, base, first_offset, records)
        if chains is not None:
            return chains
    step = _CHAIN_STEP
    current = base
    for lo in range(0, n, step):
        part = records[lo : lo + step] if n > step else records
        current = _chain_part(current, first_offset + lo, part, out)
    return out


def _chain_compiled(
    compiled: chain_compiled.Compiled, base: bytes, first_offset: int, records: Sequence[Record]
) -> list[bytes] | None:
    """:func:`chain_extend` in one C call; None if the columns do not fit it (the Python path decides)."""
    values: Sequence[bytes]
    keys: Sequence[bytes | None]
    timestamps: Sequence[int]
    headers: Sequence[Headers] | None
    if type(records) is RecordRun:
        values, keys, timestamps, headers = records.values, records.keys, records.timestamps, records.headers
    else:
        values = [r.value for r in records]
        keys = [r.key for r in records]
        timestamps = [r.timestamp for r in records]
        headers = [r.headers for r in records]
        if not any(headers):
            headers = None
    tails: bytes | list[bytes] = _NO_HEADERS
    if headers is not None:
        same = uniform(headers)
        tails = _headers_bytes(same) if same is not MIXED else list(map(_headers_bytes, headers))
    return chain_compiled.extend(
        compiled, _PERSONS, base, first_offset, values=values, keys=keys, timestamps=timestamps, tails=tails
    )


@cache
def _run_hasher() -> tuple[Any, int] | None:
    """The compiled pass hashing a few records' chain from their columns (``_columns.chain_run``) and
    libsodium's BLAKE2b's address, or None: not built, or PyNaCl's libsodium not at hand."""
    columns = columns_compiled.load()
    if columns is None or not hasattr(columns, "chain_run"):
        return None
    address = columns_compiled.sodium_address(columns_compiled.BLAKE2B)
    return None if address is None else (columns.chain_run, address)


def _chain_small(base: bytes, first_offset: int, records: Sequence[Record]) -> list[bytes]:
    """A few records (single offers, a relay's live push): one record at a time costs less than setting
    up the columns. A run without headers is hashed from its columns in one C call where it was built
    (``chain_run``: no Record built, no bytes joined in Python); it answers None for anything but the
    plain shape, and the loop below, the reference, hashes and raises what it raises."""
    if type(records) is RecordRun and records.headers is None:
        hasher = _run_hasher()
        if hasher is not None:
            run, address = hasher
            found: list[bytes] | None = run(
                address,
                *_PERSONS,
                base,
                first_offset,
                records.values,
                records.keys,
                records.timestamps,
                _NO_HEADERS,
            )
            if found is not None:
                return found
    return _chain_records(base, first_offset, records)


def _chain_records(base: bytes, first_offset: int, records: Sequence[Record]) -> list[bytes]:
    """:func:`_chain_small` in Python, a record at a time: the reference the compiled pass is held to."""
    out = []
    current = base
    for offset, record in enumerate(records, first_offset):
        h = _RECORD_HASHER.copy()
        h.update(encode_record(record, offset))
        c = _CHAIN_HASHER.copy()
        c.update(current + h.digest())
        current = c.digest()
        out.append(current)
    return out


def _chain_part(base: bytes, first_offset: int, records: Sequence[Record], out: list[bytes]) -> bytes:
    n = len(records)
    if type(records) is RecordRun:
        values, keys, timestamps, has_headers = (
            records.values,
            records.keys,
            records.timestamps,
            records.headers is not None,
        )
    else:
        values = tuple([r.value for r in records])
        keys = tuple([r.key for r in records])
        timestamps = tuple([r.timestamp for r in records])
        has_headers = any([r.headers for r in records])
    offsets = range(first_offset, first_offset + n)
    pack = _FIXED.pack
    encoded: Iterable[bytes]
    tail = _NO_HEADERS  # the headers' bytes when every record has the same ones
    if has_headers and type(records) is RecordRun and records.headers:
        same = uniform(records.headers)
        if same is not MIXED:
            tail, has_headers = _headers_bytes(same), False
    if has_headers and type(records) is RecordRun:
        encoded = list(map(_encode_columns, offsets, keys, values, timestamps, records.headers or ()))
    elif has_headers:
        encoded = [encode_record(r, offset) for r, offset in zip(records, offsets, strict=True)]
    elif keys.count(None) == n:
        fixed = map(pack, offsets, timestamps, repeat(0, n), repeat(0, n), map(len, values))
        encoded = map(b"".join, zip(fixed, values, repeat(tail, n), strict=True))
    elif None not in keys:  # every record has a key
        present = cast("tuple[bytes, ...]", keys)
        fixed = map(pack, offsets, timestamps, repeat(1, n), map(len, present), map(len, values))
        encoded = map(b"".join, zip(fixed, present, values, repeat(tail, n), strict=True))
    else:
        encoded = [
            b"".join((pack(o, t, k is not None, len(k) if k else 0, len(v)), k or b"", v, tail))
            for o, k, v, t in zip(offsets, keys, values, timestamps, strict=True)
        ]
    hashers = list(map(_hasher_copy, repeat(_RECORD_HASHER, n)))
    deque(map(_hasher_update, hashers, encoded), maxlen=0)
    chain_hasher = _CHAIN_HASHER.copy
    append = out.append
    current = base
    for digest in map(_hasher_digest, hashers):
        c = chain_hasher()
        c.update(current + digest)
        current = c.digest()
        append(current)
    return current


def chain_fold(base: bytes, digests: Iterable[bytes]) -> bytes:
    current = base
    for digest in digests:
        current = chain_next(current, digest)
    return current


def blake2b_skip(previous: bytes, new_start: int) -> bytes:
    """Chain value after truncating past the end: offsets below ``new_start`` are never assigned."""
    data = previous + _U64.pack(new_start)
    return hashlib.blake2b(data, digest_size=32, person=b"latticed.skip.v1").digest()
