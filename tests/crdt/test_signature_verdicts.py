"""``signing.verify`` calls libsodium directly for plain bytes: the same verdict as PyNaCl's
``VerifyKey.verify`` on good signatures, forged ones, other keys, other messages and garbage keys."""

from __future__ import annotations

import nacl.exceptions
import nacl.signing
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt.core_errors import BadSignatureError
from latticed.crdt.signing import Identity, verify

SIGNER = Identity.from_seed(bytes(range(32)))
OTHER = Identity.from_seed(bytes(range(1, 33)))


def pynacl_says(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
        return False
    return True


def ours_says(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        verify(public_key, message, signature)
    except BadSignatureError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300),
    st.sampled_from(["good", "flip signature", "flip message", "other key", "random key", "zero key"]),
    st.integers(0, 10_000),
)
def test_same_verdict_as_pynacl(message: bytes, case: str, where: int) -> None:
    key, signature = SIGNER.public_key, SIGNER.sign(message)
    if case == "flip signature":
        i = where % 64
        signature = signature[:i] + bytes([signature[i] ^ 1]) + signature[i + 1 :]
    elif case == "flip message" and message:
        i = where % len(message)
        message = message[:i] + bytes([message[i] ^ 0x80]) + message[i + 1 :]
    elif case == "other key":
        key = OTHER.public_key
    elif case == "random key":
        key = where.to_bytes(32, "little")
    elif case == "zero key":
        key = bytes(32)
    expected = pynacl_says(key, message, signature)
    assert ours_says(key, message, signature) == expected
    assert expected == (case == "good" or (case == "flip message" and not message))


def test_wrong_lengths_and_buffers() -> None:
    signature = SIGNER.sign(b"m")
    with pytest.raises(BadSignatureError):
        verify(SIGNER.public_key[:31], b"m", signature)
    with pytest.raises(BadSignatureError):
        verify(SIGNER.public_key, b"m", signature[:63])
    verify(SIGNER.public_key, bytearray(b"m"), signature)  # not bytes: through PyNaCl, same verdict
