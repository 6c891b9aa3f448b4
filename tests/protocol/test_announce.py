"""Sealed mDNS announcements: round trip, every rejection path, and the vector in docs/discovery.md.

Pure and fast: time is an argument, nonces are injected where a fixed output is needed.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct

import nacl.bindings as sodium
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.paths import ROOT

from latticed.errors import IntegrityError, LatticedError, MalformedError
from latticed.protocol.announce import (
    ANNOUNCEMENT_SIZE,
    DEFAULT_MAX_AGE_MS,
    DEFAULT_MAX_FUTURE_MS,
    SERVICE_TYPE,
    TOKEN_LENGTH,
    Announcement,
    ForeignAnnouncementError,
    OtherNetworks,
    announcement_key,
    new_instance_name,
    open_announcement,
    seal_announcement,
)

DOC = ROOT / "docs" / "discovery.md"
K = bytes(range(32))
OTHER_K = bytes(range(1, 33))
PK = bytes.fromhex("d04ab232742bb4ab3a1368bd4615e4e6d0224ab71a016baf8520a332c9778737")
OTHER_PK = b"\x22" * 32
NOW = 1_700_000_000_000


def seal(**overrides: object) -> str:
    args: dict[str, object] = {"network_key": K, "public_key": PK, "port": 7000, "now_ms": NOW}
    args.update(overrides)
    return seal_announcement(**args)  # type: ignore[arg-type]


def open_(token: str | bytes, *, now_ms: int = NOW, **kwargs: object) -> Announcement | None:
    args: dict[str, object] = {"network_key": K, "now_ms": now_ms}
    args.update(kwargs)
    return open_announcement(token, **args)  # type: ignore[arg-type]


def flip_char(token: str, index: int) -> str:
    replacement = "A" if token[index] != "A" else "B"
    return token[:index] + replacement + token[index + 1 :]


def test_round_trip() -> None:
    token = seal()
    assert len(token) == TOKEN_LENGTH == 111
    assert re.fullmatch(r"[A-Za-z0-9_-]+", token)
    assert len(f"a={token}") <= 255  # one TXT string
    assert open_(token) == Announcement(public_key=PK, port=7000, timestamp_ms=NOW)
    assert open_(token.encode("ascii")) == open_(token)  # zeroconf hands TXT values over as bytes


def test_every_announcement_is_a_distinct_ciphertext() -> None:
    assert seal() != seal()  # random nonce: re-announcements cannot be linked by content


def test_identity_is_not_in_clear() -> None:
    blob = base64.urlsafe_b64decode(seal() + "=")
    assert len(blob) == ANNOUNCEMENT_SIZE
    assert PK not in blob and struct.pack(">H", 7000) not in blob[25:]


def test_wrong_network_key_is_rejected() -> None:
    with pytest.raises(ForeignAnnouncementError, match="authentication"):
        open_(seal(), network_key=OTHER_K)
    with pytest.raises(ForeignAnnouncementError, match="authentication"):
        open_(seal(network_key=OTHER_K))
    assert issubclass(ForeignAnnouncementError, IntegrityError)


def test_a_stale_member_is_not_taken_for_another_network() -> None:
    """Only a failed AEAD is "another network": a member's old announcement authenticates."""
    with pytest.raises(IntegrityError) as stale:
        open_(seal(), now_ms=NOW + DEFAULT_MAX_AGE_MS + 1)
    assert not isinstance(stale.value, ForeignAnnouncementError)


def test_other_networks_are_counted_by_instance_name_until_removed() -> None:
    others = OtherNetworks()
    assert others.count == 0
    assert others.heard("aa._latticed._tcp.local.", 0.0) is True  # the first: worth an INFO line
    assert others.heard("AA._latticed._tcp.local.", 1.0) is False  # mDNS names are case-insensitive
    assert others.heard("aa._latticed._tcp.local.", 2.0) is False  # a re-announcement: counted once
    others.heard("bb._latticed._tcp.local.", 3.0)
    assert others.count == 2 and "bb._latticed._tcp.local." in others and 7 not in others
    assert others.forget("aa._latticed._tcp.local.") is True  # mDNS removed it (a goodbye)
    assert others.forget("aa._latticed._tcp.local.") is False
    assert others.count == 1 and "aa._latticed._tcp.local." not in others
    others.forget("BB._latticed._tcp.local.")
    assert others.count == 0


def test_other_networks_are_logged_loudly_at_most_once_per_interval() -> None:
    others = OtherNetworks(log_interval_s=600.0)
    loud = [
        others.heard(f"{i:02x}._latticed._tcp.local.", now) for i, now in enumerate([0, 1, 599, 600, 601])
    ]
    assert loud == [True, False, False, True, False]
    others.forget("00._latticed._tcp.local.")
    assert others.heard("00._latticed._tcp.local.", 1000.0) is False  # back, but within 600 s of the last
    assert others.heard("ff._latticed._tcp.local.", 1200.0) is True


@pytest.mark.parametrize("index", [2, 10, 30, 60, 90, TOKEN_LENGTH - 2])
def test_tampered_token_is_rejected(index: int) -> None:
    with pytest.raises(IntegrityError):
        open_(flip_char(seal(), index))


def test_any_changed_character_is_rejected() -> None:
    """Characters 0-1 carry the version byte and the last one spare bits: those are MalformedError."""
    token = seal()
    for index in range(TOKEN_LENGTH):
        with pytest.raises(LatticedError):
            open_(flip_char(token, index))


def test_every_single_bit_flip_is_rejected() -> None:
    blob = base64.urlsafe_b64decode(seal() + "=")
    for bit in range(8, len(blob) * 8):  # byte 0 (version) is covered below
        mutated = bytearray(blob)
        mutated[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(IntegrityError):
            open_(base64.urlsafe_b64encode(bytes(mutated)).rstrip(b"="))


def test_other_version_is_rejected_before_decryption() -> None:
    blob = bytearray(base64.urlsafe_b64decode(seal() + "="))
    blob[0] = 2
    with pytest.raises(MalformedError, match="version 2"):
        open_(base64.urlsafe_b64encode(bytes(blob)).rstrip(b"="))


def test_version_and_service_type_are_authenticated() -> None:
    """A token sealed with other associated data (another version or service type) does not open."""
    blob = base64.urlsafe_b64decode(seal() + "=")
    nonce, sealed = blob[1:25], blob[25:]
    plain = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(
        sealed, b"\x01" + SERVICE_TYPE.encode(), nonce, announcement_key(K)
    )
    resealed = sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
        plain, b"\x01_other._tcp.local.", nonce, announcement_key(K)
    )
    with pytest.raises(IntegrityError):
        open_(base64.urlsafe_b64encode(blob[:25] + resealed).rstrip(b"="))


@pytest.mark.parametrize(
    "token",
    [
        "",
        "a" * (TOKEN_LENGTH - 1),
        "a" * (TOKEN_LENGTH + 1),
        "+" * TOKEN_LENGTH,  # standard base64, not base64url
        "=" * TOKEN_LENGTH,
        "é" * TOKEN_LENGTH,
        b"\xff" * TOKEN_LENGTH,
    ],
)
def test_malformed_tokens(token: str | bytes) -> None:
    with pytest.raises(MalformedError):
        open_(token)


def test_non_canonical_base64_is_rejected() -> None:
    token = seal()
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(token[-1])
    twin = token[:-1] + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last ^ 1]
    assert base64.urlsafe_b64decode(twin + "=") == base64.urlsafe_b64decode(token + "=")
    with pytest.raises(MalformedError, match="canonical"):
        open_(twin)


def test_freshness_window_edges() -> None:
    token = seal()
    assert open_(token, now_ms=NOW + DEFAULT_MAX_AGE_MS) is not None
    assert open_(token, now_ms=NOW - DEFAULT_MAX_FUTURE_MS) is not None
    with pytest.raises(IntegrityError, match="stale"):
        open_(token, now_ms=NOW + DEFAULT_MAX_AGE_MS + 1)
    with pytest.raises(IntegrityError, match="future"):
        open_(token, now_ms=NOW - DEFAULT_MAX_FUTURE_MS - 1)


def test_replayed_old_announcement_is_rejected() -> None:
    """An announcement recorded an hour ago and replayed now is refused even though it authenticates."""
    recorded = seal(now_ms=NOW - 3600 * 1000)
    assert open_(recorded, now_ms=NOW - 3600 * 1000 + 5) is not None
    with pytest.raises(IntegrityError, match="stale"):
        open_(recorded)


def test_custom_window() -> None:
    token = seal()
    with pytest.raises(IntegrityError, match="stale"):
        open_(token, now_ms=NOW + 1001, max_age_ms=1000)
    with pytest.raises(IntegrityError, match="future"):
        open_(token, now_ms=NOW - 1, max_future_ms=0)


def test_own_announcement_is_ignored() -> None:
    token = seal()
    assert open_(token, own_public_key=PK) is None
    assert open_(token, own_public_key=OTHER_PK) is not None


def test_own_check_comes_after_authentication() -> None:
    """A forged token cannot hide behind "it is ours": it fails authentication first."""
    with pytest.raises(IntegrityError):
        open_(seal(network_key=OTHER_K), own_public_key=PK)


@pytest.mark.parametrize(
    "overrides",
    [
        {"network_key": b"short"},
        {"public_key": b"\x00" * 31},
        {"port": 0},
        {"port": 65536},
        {"port": True},
        {"now_ms": -1},
        {"now_ms": 1 << 64},
        {"nonce": b"\x00" * 23},
    ],
)
def test_seal_rejects_bad_arguments(overrides: dict[str, object]) -> None:
    with pytest.raises(MalformedError):
        seal(**overrides)


def test_errors_belong_to_the_one_hierarchy() -> None:
    assert issubclass(IntegrityError, LatticedError) and issubclass(MalformedError, LatticedError)


def test_instance_names_are_random_and_say_nothing() -> None:
    names = {new_instance_name() for _ in range(100)}
    assert len(names) == 100
    assert all(re.fullmatch(r"[0-9a-f]{16}", n) for n in names)


@given(
    public_key=st.binary(min_size=32, max_size=32),
    port=st.integers(1, 65535),
    now_ms=st.integers(0, 2**64 - 1),
)
def test_round_trip_property(public_key: bytes, port: int, now_ms: int) -> None:
    token = seal(public_key=public_key, port=port, now_ms=now_ms)
    assert open_(token, now_ms=now_ms) == Announcement(public_key=public_key, port=port, timestamp_ms=now_ms)


def _doc_vector() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"```text test-vectors\n(.*?)```", text, re.S)
    assert match, "docs/discovery.md lacks its test-vectors block"
    return dict(line.split(" = ", 1) for line in match.group(1).splitlines() if line.strip())


def test_doc_vector_matches_code() -> None:
    v = _doc_vector()
    key, pk = bytes.fromhex(v["network_key"]), bytes.fromhex(v["public_key"])
    nonce, port, ts = bytes.fromhex(v["nonce"]), int(v["port"]), int(v["timestamp_ms"])
    assert announcement_key(key).hex() == v["k_ann"]
    token = seal_announcement(network_key=key, public_key=pk, port=port, now_ms=ts, nonce=nonce)
    assert token == v["token"]
    assert base64.urlsafe_b64decode(token + "=").hex() == v["sealed"]
    assert open_announcement(token, network_key=key, now_ms=ts) == Announcement(pk, port, ts)


def test_doc_vector_recomputed_from_the_spec_with_bare_libsodium() -> None:
    """Follows docs/discovery.md §3 line by line, without our module."""
    v = _doc_vector()
    key, pk = bytes.fromhex(v["network_key"]), bytes.fromhex(v["public_key"])
    nonce, port, ts = bytes.fromhex(v["nonce"]), int(v["port"]), int(v["timestamp_ms"])
    k_ann = sodium.crypto_generichash_blake2b_salt_personal(
        b"", digest_size=32, key=key, salt=b"\x00" * 16, person=b"latticed/v1/mdns"
    )
    assert k_ann == hashlib.blake2b(digest_size=32, key=key, person=b"latticed/v1/mdns").digest()
    plaintext = pk + port.to_bytes(2, "big") + ts.to_bytes(8, "big")
    ad = b"\x01" + b"_latticed._tcp.local."
    sealed = b"\x01" + nonce + sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext, ad, nonce, k_ann)
    assert len(sealed) == 83 and sealed.hex() == v["sealed"]
    assert base64.urlsafe_b64encode(sealed).rstrip(b"=").decode() == v["token"]
