"""Ed25519 identities and namespaced signatures.

Everything we sign is ``namespace || fixed-layout body``: a signature made for one purpose can never be
replayed as another (hypercore's caps.js does the same), and nothing signed is ever a msgpack'd dict whose
bytes could differ between encoders.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache

import nacl.exceptions
import nacl.signing
from nacl._sodium import ffi as _ffi
from nacl._sodium import lib as _sodium

from latticed.crdt.core_errors import BadSignatureError, MalformedError

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
HASH_SIZE = 32


def blake2b(data: bytes, person: bytes) -> bytes:
    """BLAKE2b-256 with a personalisation string, so hashes of different kinds never collide by design."""
    return hashlib.blake2b(data, digest_size=HASH_SIZE, person=person).digest()


@dataclass(frozen=True, slots=True)
class Identity:
    """An Ed25519 key pair: the only thing that can write to the queues and namespaces it owns."""

    seed: bytes = field(repr=False)
    public_key: bytes

    @classmethod
    def generate(cls) -> Identity:
        key = nacl.signing.SigningKey.generate()
        return cls(seed=bytes(key), public_key=bytes(key.verify_key))

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        if len(seed) != 32:
            raise MalformedError("an Ed25519 seed is 32 bytes")
        key = nacl.signing.SigningKey(seed)
        return cls(seed=seed, public_key=bytes(key.verify_key))

    @property
    def public_hex(self) -> str:
        return self.public_key.hex()

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of ``message``: on plain bytes libsodium's ``crypto_sign`` directly (what
        PyNaCl's ``SigningKey.sign`` calls, without its three Python layers: the owner signs a head a
        batch; its signed message starts with the same signature), anything else through PyNaCl."""
        if type(message) is bytes:
            size = len(message) + SIGNATURE_SIZE
            signed = _ffi.new("unsigned char[]", size)
            if not _sodium.crypto_sign(signed, _ffi.NULL, message, len(message), _secret_key(self.seed)):
                return _ffi.buffer(signed, SIGNATURE_SIZE)[:]  # type: ignore[no-any-return]
        return _signing_key(self.seed).sign(message).signature


@lru_cache(maxsize=1024)
def _signing_key(seed: bytes) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(seed)


@lru_cache(maxsize=1024)
def _secret_key(seed: bytes) -> bytes:
    """libsodium's 64-byte secret key of ``seed`` (the seed and the public key)."""
    return seed + bytes(_signing_key(seed).verify_key)


@lru_cache(maxsize=4096)
def _verify_key(public_key: bytes) -> nacl.signing.VerifyKey:
    return nacl.signing.VerifyKey(public_key)


def verify(public_key: bytes, message: bytes, signature: bytes) -> None:
    """Raise :class:`BadSignatureError` unless ``signature`` is ``public_key``'s over ``message``.

    Plain bytes go to libsodium's ``crypto_sign_open`` directly (what PyNaCl's ``VerifyKey.verify``
    calls, after checks in Python these arguments pass: every delta's heads come through here); anything
    else through PyNaCl, which decides as it always did."""
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        raise BadSignatureError("signature or key has the wrong length")
    if type(public_key) is bytes and type(message) is bytes and type(signature) is bytes:
        signed = signature + message
        size = len(signed)
        if _sodium.crypto_sign_open(
            _ffi.new("unsigned char[]", size), _ffi.new("unsigned long long *"), signed, size, public_key
        ):
            raise BadSignatureError("signature does not verify under the owner's key")
        return
    try:
        _verify_key(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError) as exc:
        raise BadSignatureError("signature does not verify under the owner's key") from exc


def parse_public_key(text: str) -> bytes:
    """Parse a hex public key as shown by ``latticectl id``."""
    try:
        raw = bytes.fromhex(text)
    except ValueError as exc:
        raise MalformedError(f"not a hex public key: {text!r}") from exc
    if len(raw) != PUBLIC_KEY_SIZE:
        raise MalformedError(f"a public key is {PUBLIC_KEY_SIZE} bytes (64 hex digits), got {len(raw)}")
    return raw
