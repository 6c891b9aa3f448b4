"""The network key: 32 random bytes every daemon of one network shares, kept in a file of one hex line.

Without it a peer cannot get past the first handshake message, so it learns nothing, not even which
identities a daemon has (see ``docs/protocol.md``). It is a shared secret: write it with mode 0600 and hand it
to other hosts out of band. Hex text, because people copy it between machines, config files and environment
variables; one line, because that is what ``echo``, ``cat`` and secret stores produce.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import secrets
from typing import Final

from latticed.errors import AlreadyExistsError, MalformedError, NotFoundError, StorageError
from latticed.host.config import DaemonConfig

__all__ = [
    "DEFAULT_NETWORK_KEY",
    "NETWORK_KEY_SIZE",
    "check_listen_key",
    "decode_network_key",
    "encode_network_key",
    "network_key_fingerprint",
    "new_network_key",
    "is_loopback_host",
    "load_network_key",
    "read_network_key",
    "replace_network_key",
    "write_network_key",
]

NETWORK_KEY_SIZE: Final = 32
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")

#: INSECURE, public, fixed: ``BLAKE2b-256(b"latticed default network key -- INSECURE")``. It lets demos and
#: tests run without setup; anyone can compute it, so a network using it admits everyone.
DEFAULT_NETWORK_KEY: Final = hashlib.blake2b(
    b"latticed default network key -- INSECURE", digest_size=32
).digest()


def new_network_key() -> bytes:
    """32 bytes from the OS CSPRNG."""
    return secrets.token_bytes(NETWORK_KEY_SIZE)


def encode_network_key(key: bytes) -> str:
    """The file / environment form: 64 lowercase hex digits."""
    if not isinstance(key, bytes) or len(key) != NETWORK_KEY_SIZE:
        raise MalformedError(f"a network key is {NETWORK_KEY_SIZE} bytes")
    return key.hex()


def decode_network_key(text: str, *, source: str = "network key") -> bytes:
    """Parse 64 hex digits (surrounding whitespace allowed); errors never echo the text, which is secret."""
    stripped = text.strip()
    if len(stripped) != 2 * NETWORK_KEY_SIZE:
        raise MalformedError(
            f"{source}: expected {2 * NETWORK_KEY_SIZE} hex digits ({NETWORK_KEY_SIZE} bytes) on one line, "
            f"got {len(stripped)} characters"
        )
    if not all(c in _HEX_DIGITS for c in stripped):
        raise MalformedError(f"{source}: not hexadecimal")
    return bytes.fromhex(stripped)


def network_key_fingerprint(key: bytes) -> str:
    """A short tag of a key (16 hex digits) for logs: tells networks apart without revealing the key."""
    return hashlib.blake2b(key, digest_size=8, person=b"latticed/v1/nkfp").hexdigest()


def write_network_key(path: str | os.PathLike[str], key: bytes | None = None) -> bytes:
    """Write ``key`` (default: a new one) to a new file with mode 0600; refuses to replace an existing file.

    Refusing matters: overwriting a network key silently cuts a daemon off from its network.
    """
    if key is None:
        key = new_network_key()
    line = (encode_network_key(key) + "\n").encode("ascii")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    except FileExistsError:
        raise AlreadyExistsError(f"network key file {os.fspath(path)!r} exists; not overwriting it") from None
    except OSError as error:
        raise StorageError(f"cannot create network key file {os.fspath(path)!r}: {error}") from error
    try:
        os.fchmod(fd, 0o600)  # the umask can only remove bits, but be explicit about the result
        os.write(fd, line)
        os.fsync(fd)
    except OSError as error:
        os.close(fd)
        os.unlink(path)
        raise StorageError(f"cannot write network key file {os.fspath(path)!r}: {error}") from error
    os.close(fd)
    return key


def read_network_key(path: str | os.PathLike[str]) -> bytes:
    """Read a key written by :func:`write_network_key` (or by hand: 64 hex digits on one line)."""
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            text = file.read(4096)
    except FileNotFoundError:
        raise NotFoundError(f"network key file {os.fspath(path)!r} not found") from None
    except OSError as error:
        raise StorageError(f"cannot read network key file {os.fspath(path)!r}: {error}") from error
    return decode_network_key(text, source=f"network key file {os.fspath(path)!r}")


def load_network_key(config: DaemonConfig) -> bytes:
    """The configured key file's key; with none configured, the key ``join`` kept in the data directory,
    else the public default."""
    if config.network_key_file is None and not config.network_key_path.exists():
        return DEFAULT_NETWORK_KEY
    return read_network_key(config.network_key_path)


def replace_network_key(path: str | os.PathLike[str], key: bytes) -> None:
    """Atomically put ``key`` in ``path``, replacing what is there (``latticectl join``, a rotation).

    Temporary file, fsync, rename, fsync of the directory: a crash leaves the old key or the new one, never
    a half-written file that would cut the daemon off from both networks.
    """
    line = (encode_network_key(key) + "\n").encode("ascii")
    target = os.fspath(path)
    tmp = f"{target}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        dir_fd = os.open(os.path.dirname(os.path.abspath(target)), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageError(f"cannot write network key file {target!r}: {error.strerror or error}") from error


def is_loopback_host(host: str) -> bool:
    """Whether a listen host only accepts connections from this machine: ``localhost``, 127.0.0.0/8, ``::1``.

    Any other name counts as beyond loopback: it may resolve to anything.
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen_key(listen: tuple[str, int] | None, key: bytes, *, insecure_ok: bool) -> None:
    """Refuse to accept peers from the network under the public default key, unless explicitly allowed.

    The default key admits anyone who has read our documentation; on loopback (demos, tests) only this
    machine can connect, so it stays usable there without set-up.
    """
    if listen is None or insecure_ok or key != DEFAULT_NETWORK_KEY or is_loopback_host(listen[0]):
        return
    host, port = listen
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    raise MalformedError(
        f"refusing to listen on {where} with the public default network key, which lets anyone join: make "
        "a private one with `latticed network-key new PATH` and pass --network-key-file PATH (config key "
        "network_key_file), or run `latticed init`; --insecure-public-network-key (config key "
        "insecure_public_network_key) overrides this"
    )
