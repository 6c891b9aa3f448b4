"""Network key files: mode 0600, never overwritten, strict parsing that does not echo the secret."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from latticed.errors import AlreadyExistsError, MalformedError, NotFoundError
from latticed.host.config import DaemonConfig
from latticed.host.netkey import (
    DEFAULT_NETWORK_KEY,
    decode_network_key,
    encode_network_key,
    load_network_key,
    network_key_fingerprint,
    new_network_key,
    read_network_key,
    write_network_key,
)


def test_new_keys_are_random_32_bytes() -> None:
    keys = {new_network_key() for _ in range(10)}
    assert len(keys) == 10 and all(len(k) == 32 for k in keys)


def test_write_then_read_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "network.key"
    old_umask = os.umask(0)  # even a permissive umask must not widen the mode
    try:
        key = write_network_key(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == key.hex() + "\n"
    assert read_network_key(path) == key


def test_write_given_key(tmp_path: Path) -> None:
    key = bytes(range(32))
    assert write_network_key(tmp_path / "k", key) == key
    assert read_network_key(str(tmp_path / "k")) == key


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "network.key"
    first = write_network_key(path)
    with pytest.raises(AlreadyExistsError, match="not overwriting"):
        write_network_key(path)
    assert read_network_key(path) == first


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        read_network_key(tmp_path / "absent")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "00" * 31,
        "00" * 33,
        "zz" * 32,
        "00" * 16 + "\n" + "00" * 16,
        " " + "00" * 31 + " 00",
        "é" * 64,
    ],
)
def test_malformed_files_are_rejected_without_echo(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(text.encode())
    with pytest.raises(MalformedError, match=r"bad\.key") as info:
        read_network_key(path)
    if len(text) > 8:
        assert text.strip() not in str(info.value)


def test_hex_round_trip_and_whitespace() -> None:
    key = new_network_key()
    assert decode_network_key("  " + encode_network_key(key).upper() + "\r\n") == key
    with pytest.raises(MalformedError):
        encode_network_key(b"short")


def test_default_key_is_documented_value() -> None:
    assert (
        hashlib.blake2b(b"latticed default network key -- INSECURE", digest_size=32).digest()
        == DEFAULT_NETWORK_KEY
    )


def test_fingerprint_is_short_stable_and_not_the_key() -> None:
    key = bytes(range(32))
    fingerprint = network_key_fingerprint(key)
    assert len(fingerprint) == 16 and fingerprint == network_key_fingerprint(key)
    assert fingerprint not in key.hex() and fingerprint != network_key_fingerprint(DEFAULT_NETWORK_KEY)


def test_the_daemon_loads_the_configured_key_else_the_joined_one_else_the_default(tmp_path: Path) -> None:
    config = DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock")
    assert load_network_key(config) == DEFAULT_NETWORK_KEY
    config.data_dir.mkdir()
    joined = write_network_key(config.network_key_path)
    assert load_network_key(config) == joined
    configured = write_network_key(tmp_path / "configured.key")
    assert (
        load_network_key(
            DaemonConfig(
                data_dir=config.data_dir,
                socket_path=config.socket_path,
                network_key_file=tmp_path / "configured.key",
            )
        )
        == configured
    )
    with pytest.raises(NotFoundError):
        load_network_key(
            DaemonConfig(
                data_dir=config.data_dir,
                socket_path=config.socket_path,
                network_key_file=tmp_path / "absent.key",
            )
        )
