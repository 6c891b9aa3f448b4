"""Sealed records: encrypted so that only a queue's readers open them, while every replica verifies them.

A record of a sealed queue is signed, chained, stored and replicated as an *envelope* in its value (no key,
no headers), so the owner's signatures cover the ciphertext and a daemon without the key relays it like any
other record. Layouts (big-endian; docs/privacy.md has the why)::

    envelope  = version u8 (1) | epoch u32 | nonce 24
                | XChaCha20-Poly1305(key: epoch's content key, nonce, ad, plaintext: inner)
    ad        = "latticed/sealed-record/v1\\n" | queue id 32 | epoch u32
    inner     = flags u8 (bit 0: a key, bit 1: headers)
                | [key length u32 | key]
                | [header count u16 | (name length u16 | value length u32 | name | value)*]
                | value

Nonces are 24 random bytes per record, drawn by the caller (one read of the OS's random source per batch):
nothing the daemon could lose in a crash or get back from a backup (a counter, an offset) goes into them,
so a rolled-back owner never encrypts two plaintexts under one nonce. A content key is wrapped to each
reader as a libsodium sealed box to the X25519 form of the reader's Ed25519 identity; the ephemeral
secret comes in as an argument, so wrapping is deterministic (and libsodium's ``crypto_box_seal_open``
opens it).

A batch is sealed (and opened) in one call by the compiled sealer (:mod:`latticed.privacy.compiled`)
where it was built at install, else by one libsodium call per record from Python: the same bytes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from itertools import accumulate, groupby, repeat
from typing import Any, Final

import nacl.bindings as sodium
import nacl.exceptions

from latticed.crdt.core_errors import MalformedError, TamperedError
from latticed.crdt.records import (
    MAX_HEADER_KEY_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Headers,
    Record,
    RecordRun,
    check_records,
)
from latticed.crdt.signing import Identity
from latticed.privacy import compiled

try:  # libsodium through PyNaCl's own cffi module: ~4x cheaper per record than nacl.bindings' checks
    from nacl._sodium import ffi as _ffi
    from nacl._sodium import lib as _lib
except ImportError:  # pragma: no cover - a PyNaCl without it: the bindings below do the same
    _ffi = _lib = None


#: The compiled batch sealer, where it was built (same envelopes, fewer µs): see :mod:`.compiled`.
_compiled = None if _lib is None else compiled.load(_ffi, _lib)

KEY_SIZE: Final = 32
NONCE_SIZE: Final = 24
TAG_SIZE: Final = 16
VERSION: Final = 1
_PREFIX = struct.Struct(">BI")  # version, epoch
#: Bytes before the ciphertext: version, epoch, nonce.
HEADER_SIZE: Final = _PREFIX.size + NONCE_SIZE
#: What an envelope adds to its inner record.
OVERHEAD: Final = HEADER_SIZE + TAG_SIZE
#: The largest inner record: its envelope must fit in a record value.
MAX_INNER_BYTES: Final = MAX_VALUE_BYTES - OVERHEAD
MAX_EPOCH: Final = 2**32 - 1
AD_NAMESPACE: Final = b"latticed/sealed-record/v1\n"
#: A wrapped content key: ephemeral X25519 public key, then the key boxed to the reader (MAC 16 + 32).
WRAP_SIZE: Final = 32 + 16 + KEY_SIZE

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HDR = struct.Struct(">HI")
_PLAIN = b"\x00"  # flags of an inner record with neither key nor headers: the common case
_HAS_KEY = 1
_HAS_HEADERS = 2


def associated_data(queue_id: bytes, epoch: int) -> bytes:
    """What each record's AEAD tag binds besides the ciphertext: the queue and the key epoch."""
    return AD_NAMESPACE + queue_id + _U32.pack(epoch)


# ------------------------------------------------------------------ inner records


def encode_inner(key: bytes | None, value: bytes, headers: Headers) -> bytes:
    """A record's key, value and headers as one byte string (what gets encrypted)."""
    if key is None and not headers:
        return _PLAIN + value
    parts = [bytes([(_HAS_KEY if key is not None else 0) | (_HAS_HEADERS if headers else 0)])]
    if key is not None:
        parts += [_U32.pack(len(key)), key]
    if headers:
        parts.append(_U16.pack(len(headers)))
        for name, header_value in headers:
            raw = name.encode()
            parts += [_HDR.pack(len(raw), len(header_value)), raw, header_value]
    parts.append(value)
    return b"".join(parts)


def decode_inner(raw: bytes) -> tuple[bytes | None, bytes, Headers]:
    """The key, value and headers of an opened envelope; MalformedError if the layout is broken (it was
    authenticated, so only a broken writer makes one) or outside the record limits."""
    if not raw:
        raise MalformedError("an opened sealed record is empty")
    flags = raw[0]
    if flags == 0:
        return None, raw[1:], ()
    if flags & ~(_HAS_KEY | _HAS_HEADERS):
        raise MalformedError(f"an opened sealed record has unknown flags {flags:#x}")
    pos = 1
    key = None
    try:
        if flags & _HAS_KEY:
            (size,) = _U32.unpack_from(raw, pos)
            pos += 4
            if size > MAX_KEY_BYTES or pos + size > len(raw):
                raise MalformedError("an opened sealed record's key overruns it")
            key = raw[pos : pos + size]
            pos += size
        headers: list[tuple[str, bytes]] = []
        if flags & _HAS_HEADERS:
            (count,) = _U16.unpack_from(raw, pos)
            pos += 2
            if not 0 < count <= MAX_HEADERS:
                raise MalformedError("an opened sealed record has a bad header count")
            for _ in range(count):
                name_size, value_size = _HDR.unpack_from(raw, pos)
                pos += _HDR.size
                if (
                    name_size > MAX_HEADER_KEY_BYTES
                    or value_size > MAX_HEADER_VALUE_BYTES
                    or pos + name_size + value_size > len(raw)
                ):
                    raise MalformedError("an opened sealed record's header overruns it")
                name = raw[pos : pos + name_size].decode()
                pos += name_size
                headers.append((name, raw[pos : pos + value_size]))
                pos += value_size
    except (struct.error, UnicodeDecodeError) as exc:
        raise MalformedError(f"an opened sealed record does not decode: {exc}") from exc
    return key, raw[pos:], tuple(headers)


# ------------------------------------------------------------------ envelopes


def accelerated() -> bool:
    """Whether batches are sealed and opened by the compiled batch sealer (same bytes, fewer µs)."""
    return _compiled is not None


def seal_run(
    content_key: bytes, queue_id: bytes, epoch: int, records: Sequence[Record], nonces: bytes
) -> RecordRun:
    """``records`` sealed under ``content_key`` as epoch ``epoch`` of queue ``queue_id``: the same
    timestamps, no keys, no headers, envelopes as values. ``nonces``: 24 random bytes per record."""
    _check_key(content_key)
    if not 0 <= epoch <= MAX_EPOCH:
        raise MalformedError(f"a key epoch is 0 to {MAX_EPOCH}")
    run = RecordRun.of(records)
    check_records(run)  # a checked run (every offer_batch) passes at once
    n = len(run)
    if len(nonces) != NONCE_SIZE * n:
        raise MalformedError(f"{n} records need {NONCE_SIZE * n} bytes of nonces, not {len(nonces)}")
    # Each inner record is prefix | part: the flags byte alone before a bare value (the common case),
    # else the whole encoded record.
    prefix, parts = _PLAIN, run.values
    if run.headers is not None or run.keys.count(None) != n:
        prefix = b""
        parts = tuple(map(encode_inner, run.keys, run.values, run.headers_column()))
    ad = associated_data(queue_id, epoch)
    head = _PREFIX.pack(VERSION, epoch)
    seal = _seal_compiled if _compiled is not None else _seal_python
    # Every envelope is bytes of at most MAX_VALUE_BYTES (the inner records' sizes are checked on the
    # way), so the checked run of the records gives a checked run of envelopes.
    return run.with_values(seal(content_key, ad, head, parts, nonces, prefix=prefix))


def _too_large() -> MalformedError:
    return MalformedError(
        f"a sealed record's key, value and headers take at most {MAX_INNER_BYTES} bytes together"
    )


def _seal_compiled(
    key: bytes, ad: bytes, head: bytes, parts: Sequence[bytes], nonces: bytes, *, prefix: bytes
) -> list[bytes]:
    assert _compiled is not None
    sealed = compiled.seal(
        _compiled, key, ad, head, parts, nonces=nonces, prefix=prefix, max_inner=MAX_INNER_BYTES
    )
    if sealed is None:
        raise _too_large()
    return sealed


def _seal_python(
    key: bytes, ad: bytes, head: bytes, parts: Sequence[bytes], nonces: bytes, *, prefix: bytes
) -> list[bytes]:
    """The same envelopes without the compiled sealer: one libsodium call per record."""
    inner = list(map(prefix.__add__, parts)) if prefix else list(parts)
    n = len(inner)
    if n and max(map(len, inner)) > MAX_INNER_BYTES:
        raise _too_large()
    nonce_list = [nonces[i : i + NONCE_SIZE] for i in range(0, NONCE_SIZE * n, NONCE_SIZE)]
    if _lib is None:  # pragma: no cover
        encrypt = sodium.crypto_aead_xchacha20poly1305_ietf_encrypt
        return [head + nonce + encrypt(p, ad, nonce, key) for p, nonce in zip(inner, nonce_list, strict=True)]
    # Every ciphertext into one buffer, one C call per record driven by map (no Python frame per record).
    lengths = list(map(len, inner))
    starts = list(accumulate(map(TAG_SIZE.__add__, lengths), initial=0))
    out = bytearray(starts[-1])
    base = _ffi.from_buffer(out)
    null = _ffi.NULL
    failed = any(
        map(
            _lib.crypto_aead_xchacha20poly1305_ietf_encrypt,
            [base + s for s in starts[:-1]],
            repeat(null, n),
            inner,
            lengths,
            repeat(ad, n),
            repeat(len(ad), n),
            repeat(null, n),
            nonce_list,
            repeat(key, n),
        )
    )
    if failed:  # pragma: no cover - libsodium encrypts any input of these sizes
        raise MalformedError("sealing a record failed")
    view = memoryview(out)
    return [
        b"".join((head, nonce, view[lo:hi]))
        for nonce, lo, hi in zip(nonce_list, starts, starts[1:], strict=False)
    ]


def envelope_epoch(value: bytes) -> int:
    """The key epoch an envelope was sealed under (MalformedError if it is not an envelope)."""
    if len(value) < OVERHEAD or value[0] != VERSION:
        raise MalformedError("a record of a sealed queue is not a sealed envelope (version 1)")
    epoch: int = _U32.unpack_from(value, 1)[0]
    return epoch


def envelope_nonce(value: bytes) -> bytes:
    envelope_epoch(value)
    return value[_PREFIX.size : HEADER_SIZE]


def open_values(queue_id: bytes, values: Sequence[bytes], key_for: Callable[[int], bytes]) -> list[bytes]:
    """The inner records of ``values`` (envelopes of queue ``queue_id``); ``key_for(epoch)`` gives the
    content key of an epoch (or raises). TamperedError if a tag does not verify."""
    if _compiled is not None:
        return _open_compiled(queue_id, values, key_for)
    out: list[bytes] = []
    ads: dict[int, tuple[bytes, bytes]] = {}
    decrypt: Any = None if _lib is None else _lib.crypto_aead_xchacha20poly1305_ietf_decrypt
    buffer = bytearray(0)
    pointer: Any = None
    for value in values:
        epoch = envelope_epoch(value)
        found = ads.get(epoch)
        if found is None:
            found = ads[epoch] = _key_and_ad(queue_id, epoch, key_for)
        key, ad = found
        nonce = value[_PREFIX.size : HEADER_SIZE]
        size = len(value) - OVERHEAD
        if decrypt is None:  # pragma: no cover
            try:
                out.append(
                    sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(value[HEADER_SIZE:], ad, nonce, key)
                )
            except nacl.exceptions.CryptoError as exc:
                raise _tampered(epoch) from exc
            continue
        if len(buffer) < size or pointer is None:
            buffer = bytearray(max(size, 4096, 2 * len(buffer)))
            pointer = _ffi.from_buffer(buffer)
        ciphertext = value[HEADER_SIZE:]
        if decrypt(pointer, _ffi.NULL, _ffi.NULL, ciphertext, len(ciphertext), ad, len(ad), nonce, key):
            raise _tampered(epoch)
        out.append(bytes(buffer[:size]))
    return out


def _open_compiled(queue_id: bytes, values: Sequence[bytes], key_for: Callable[[int], bytes]) -> list[bytes]:
    """:func:`open_values` one C call per run of envelopes of one epoch (usually the whole read)."""
    assert _compiled is not None
    out: list[bytes] = []
    ads: dict[int, tuple[bytes, bytes]] = {}
    for epoch, group in groupby(values, envelope_epoch):  # each value's version and length checked
        found = ads.get(epoch)
        if found is None:
            found = ads[epoch] = _key_and_ad(queue_id, epoch, key_for)
        opened = compiled.open_run(_compiled, *found, list(group))
        if opened is None:
            raise _tampered(epoch)
        out += opened
    return out


def _key_and_ad(queue_id: bytes, epoch: int, key_for: Callable[[int], bytes]) -> tuple[bytes, bytes]:
    key = key_for(epoch)
    _check_key(key)
    return key, associated_data(queue_id, epoch)


def _tampered(epoch: int) -> TamperedError:
    return TamperedError(
        f"a sealed record (key epoch {epoch}) does not decrypt: its ciphertext or tag was changed"
    )


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_SIZE:
        raise MalformedError(f"a content key is {KEY_SIZE} bytes")


# ------------------------------------------------------------------ readers' keys


def reader_public_key(public_key: bytes) -> bytes:
    """The X25519 public key of an Ed25519 identity (what content keys are wrapped to)."""
    try:
        return bytes(sodium.crypto_sign_ed25519_pk_to_curve25519(public_key))
    except (nacl.exceptions.CryptoError, nacl.exceptions.TypeError, nacl.exceptions.ValueError) as exc:
        raise MalformedError(
            f"{public_key.hex()} is not an Ed25519 public key a content key can be wrapped to"
        ) from exc


def reader_secret_key(identity: Identity) -> bytes:
    """The X25519 secret key of an Ed25519 identity (what opens the content keys wrapped to it)."""
    return bytes(sodium.crypto_sign_ed25519_sk_to_curve25519(identity.seed + identity.public_key))


def wrap_content_key(content_key: bytes, reader: bytes, ephemeral_secret: bytes) -> bytes:
    """``content_key`` as a libsodium sealed box to ``reader``'s (Ed25519 public key) X25519 key, with the
    given ephemeral secret (32 random bytes, used once): ``epk | crypto_box(key, BLAKE2b-192(epk | pk))``."""
    _check_key(content_key)
    if len(ephemeral_secret) != 32:
        raise MalformedError("an ephemeral X25519 secret is 32 bytes")
    pk = reader_public_key(reader)
    epk = bytes(sodium.crypto_scalarmult_base(ephemeral_secret))
    nonce = hashlib.blake2b(epk + pk, digest_size=24).digest()
    return epk + bytes(sodium.crypto_box(content_key, nonce, pk, ephemeral_secret))


def unwrap_content_key(wrapped: bytes, identity: Identity) -> bytes:
    """The content key in a wrap to ``identity``; TamperedError if it does not open with its key."""
    if len(wrapped) != WRAP_SIZE:
        raise MalformedError(f"a wrapped content key is {WRAP_SIZE} bytes")
    try:
        key = sodium.crypto_box_seal_open(
            wrapped, reader_public_key(identity.public_key), reader_secret_key(identity)
        )
    except nacl.exceptions.CryptoError as exc:
        raise TamperedError("the content key wrapped to this identity does not open with its key") from exc
    return bytes(key)


__all__ = [
    "AD_NAMESPACE",
    "HEADER_SIZE",
    "KEY_SIZE",
    "MAX_EPOCH",
    "MAX_INNER_BYTES",
    "NONCE_SIZE",
    "OVERHEAD",
    "TAG_SIZE",
    "VERSION",
    "WRAP_SIZE",
    "associated_data",
    "decode_inner",
    "encode_inner",
    "envelope_epoch",
    "envelope_nonce",
    "open_values",
    "reader_public_key",
    "reader_secret_key",
    "seal_run",
    "unwrap_content_key",
    "wrap_content_key",
]
