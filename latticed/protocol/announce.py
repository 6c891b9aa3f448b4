"""Sans-IO mDNS announcements that only holders of the network key can read or forge.

A daemon advertises ``_latticed._tcp.local.`` on the LAN. Anyone there can see that service; the TXT record
must not tell a stranger *which* identity runs it, and must not let a stranger point us at an address of its
choosing under a member's name. So the TXT value is a sealed blob (``docs/discovery.md`` is the spec)::

    token     = base64url-nopad(version ‖ nonce ‖ AEAD(k_ann, nonce, plaintext, ad = version ‖ service type))
    plaintext = identity public key (32) ‖ listen port (u16) ‖ timestamp ms (u64)
    k_ann     = BLAKE2b-256(key = network key, person = "latticed/v1/mdns")

The timestamp bounds replays of a recorded announcement to a freshness window. Times are passed in
(``now_ms``), nothing here reads a clock or does I/O; randomness is used only when no nonce is injected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
import struct
from dataclasses import dataclass
from typing import Final

import nacl.bindings as sodium
import nacl.exceptions

from latticed.errors import IntegrityError, MalformedError

__all__ = [
    "ANNOUNCEMENT_SIZE",
    "DEFAULT_MAX_AGE_MS",
    "DEFAULT_MAX_FUTURE_MS",
    "KEY_SIZE",
    "NONCE_SIZE",
    "SERVICE_TYPE",
    "TOKEN_LENGTH",
    "TXT_KEY",
    "VERSION",
    "Announcement",
    "ForeignAnnouncementError",
    "OtherNetworks",
    "announcement_key",
    "new_instance_name",
    "open_announcement",
    "seal_announcement",
]

SERVICE_TYPE: Final = "_latticed._tcp.local."
#: The one TXT key we publish; its value is the token.
TXT_KEY: Final = b"a"
VERSION: Final = 1
KEY_SIZE: Final = 32
NONCE_SIZE: Final = 24
_TAG_SIZE: Final = 16
_PLAIN: Final = struct.Struct(">32sHQ")  # public key, port, timestamp ms
#: Bytes of a sealed announcement: version, nonce, ciphertext of the 42-byte plaintext, tag.
ANNOUNCEMENT_SIZE: Final = 1 + NONCE_SIZE + _PLAIN.size + _TAG_SIZE
#: Characters of its base64url form (no padding): fits one TXT string (255 bytes) with room to spare.
TOKEN_LENGTH: Final = (ANNOUNCEMENT_SIZE * 8 + 5) // 6
#: Announcements older than this are refused: it bounds how long a recorded one can be replayed. Senders
#: re-announce well within it.
DEFAULT_MAX_AGE_MS: Final = 10 * 60 * 1000
#: Clock skew tolerated in the other direction: an announcement dated further ahead is refused.
DEFAULT_MAX_FUTURE_MS: Final = 2 * 60 * 1000

# 16 bytes, same scheme as docs/protocol.md's labels, so a future version changes it with the others.
_P_MDNS: Final = b"latticed/v1/mdns"
_AD: Final = bytes([VERSION]) + SERVICE_TYPE.encode("ascii")
_TOKEN_RE: Final = re.compile(rb"[A-Za-z0-9_-]{%d}" % TOKEN_LENGTH)


#: At most one INFO line per this many seconds about daemons of other networks (the rest go to debug).
OTHER_NETWORK_LOG_INTERVAL_S: Final = 600.0


class ForeignAnnouncementError(IntegrityError):
    """An announcement that does not open under our key: a daemon of another network (or a modified
    token; the receiver cannot tell which). Routine on a shared LAN, and counted, not alarmed about."""


@dataclass(frozen=True, slots=True)
class Announcement:
    """An authenticated, fresh announcement of another member of our network."""

    public_key: bytes
    port: int
    timestamp_ms: int


def _check_key(name: str, value: bytes) -> bytes:
    if not isinstance(value, bytes) or len(value) != KEY_SIZE:
        raise MalformedError(f"{name} must be {KEY_SIZE} bytes")
    return value


def _check_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise MalformedError(f"port must be in 1..65535, got {port!r}")
    return port


def announcement_key(network_key: bytes) -> bytes:
    """``k_ann``: the AEAD key of announcements, bound to the network key and to this purpose only."""
    return hashlib.blake2b(
        digest_size=32, key=_check_key("network key", network_key), person=_P_MDNS
    ).digest()


def new_instance_name() -> str:
    """A fresh random mDNS instance label (16 hex digits) for one run.

    Random rather than derived from the identity, so a stranger cannot link a daemon across restarts or
    networks by its name; members tell daemons apart by the sealed public key instead.
    """
    return secrets.token_hex(8)


def seal_announcement(
    *, network_key: bytes, public_key: bytes, port: int, now_ms: int, nonce: bytes | None = None
) -> str:
    """The TXT value announcing ``public_key`` listening on ``port`` at ``now_ms`` (Unix time, ms).

    ``nonce`` (24 bytes) is for test vectors only: a fresh random one makes every announcement distinct.
    """
    _check_key("public key", public_key)
    if isinstance(now_ms, bool) or not isinstance(now_ms, int) or not 0 <= now_ms < 1 << 64:
        raise MalformedError(f"timestamp must be a u64 of milliseconds, got {now_ms!r}")
    if nonce is None:
        nonce = secrets.token_bytes(NONCE_SIZE)
    elif not isinstance(nonce, bytes) or len(nonce) != NONCE_SIZE:
        raise MalformedError(f"nonce must be {NONCE_SIZE} bytes")
    plaintext = _PLAIN.pack(public_key, _check_port(port), now_ms)
    sealed = sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
        plaintext, _AD, nonce, announcement_key(network_key)
    )
    blob = bytes([VERSION]) + nonce + sealed
    return base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii")


def open_announcement(
    token: str | bytes,
    *,
    network_key: bytes,
    now_ms: int,
    own_public_key: bytes | None = None,
    max_age_ms: int = DEFAULT_MAX_AGE_MS,
    max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
) -> Announcement | None:
    """Authenticate and check a TXT value; None means it is our own announcement (ignore it).

    Raises :class:`MalformedError` for anything that is not a v1 token, :class:`ForeignAnnouncementError`
    (an :class:`IntegrityError`) when it fails authentication (another network key, or modified), and
    :class:`IntegrityError` when it lies outside the freshness window
    ``[now - max_age_ms, now + max_future_ms]``. Both are routine on a shared LAN: log, do not alarm.
    """
    text = token.encode("ascii", "replace") if isinstance(token, str) else bytes(token)
    if not _TOKEN_RE.fullmatch(text):
        raise MalformedError(f"announcement must be {TOKEN_LENGTH} base64url characters")
    try:
        blob = base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as error:  # pragma: no cover - excluded by the pattern above
        raise MalformedError("announcement is not base64url") from error
    if len(blob) != ANNOUNCEMENT_SIZE or base64.urlsafe_b64encode(blob).rstrip(b"=") != text:
        raise MalformedError("announcement is not canonical base64url")
    if blob[0] != VERSION:
        raise MalformedError(f"unknown announcement version {blob[0]}")
    nonce, sealed = blob[1 : 1 + NONCE_SIZE], blob[1 + NONCE_SIZE :]
    try:
        plaintext = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(
            sealed, _AD, nonce, announcement_key(network_key)
        )
    except nacl.exceptions.CryptoError:
        raise ForeignAnnouncementError(
            "announcement fails authentication (another network key, or modified)"
        ) from None
    public_key, port, timestamp_ms = _PLAIN.unpack(plaintext)
    if port == 0:
        raise MalformedError("announcement names port 0")
    age = now_ms - timestamp_ms
    if age > max_age_ms:
        raise IntegrityError(f"stale announcement: {age} ms old, limit {max_age_ms} ms")
    if -age > max_future_ms:
        raise IntegrityError(f"announcement from the future: {-age} ms ahead, limit {max_future_ms} ms")
    if own_public_key is not None and public_key == own_public_key:
        return None
    return Announcement(public_key=public_key, port=port, timestamp_ms=timestamp_ms)


class OtherNetworks:
    """mDNS instances whose announcements do not open under our key: daemons of other networks on this LAN.

    Counted by instance name and nothing else, since nothing else of them can be read: the count tells an
    operator who "sees no peers" that daemons are there under another key. A name leaves the count when
    mDNS removes it (a goodbye, or its records expire) or when it opens after all. A daemon that crashed
    and restarted under a new name counts twice until its old records expire (~19 minutes). Times
    (``now``, seconds on any monotonic clock) are passed in.
    """

    def __init__(self, *, log_interval_s: float = OTHER_NETWORK_LOG_INTERVAL_S) -> None:
        self._names: set[str] = set()
        self._log_interval_s = log_interval_s
        self._last_logged: float | None = None

    @property
    def count(self) -> int:
        """Instances of other networks heard and not removed since."""
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._names

    def heard(self, name: str, now: float) -> bool:
        """``name`` announced something we cannot open; True when this is worth an INFO line: a name not
        counted yet, and none logged in the last ``log_interval_s`` (a LAN full of them logs rarely)."""
        key = name.lower()
        if key in self._names:
            return False
        self._names.add(key)
        if self._last_logged is not None and now - self._last_logged < self._log_interval_s:
            return False
        self._last_logged = now
        return True

    def forget(self, name: str) -> bool:
        """``name`` was removed by mDNS, or opened under our key: not counted any more. True if it was."""
        key = name.lower()
        if key in self._names:
            self._names.discard(key)
            return True
        return False
