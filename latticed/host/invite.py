"""Invite tokens: one line that carries everything another daemon needs to join this one's network.

``latticectl invite`` prints one, ``latticectl join TOKEN`` consumes it. A token holds the **network key**
(a secret: whoever has the token can join the network), the inviting daemon's identity and the addresses it
accepts peers on. The text form is::

    latticed1:<base32 of msgpack({"k": key, "i": identity, "a": [[host, port], ...]}) + checksum>

The version is in the prefix so a future format is refused by name rather than misread. The checksum
(8 bytes of keyed BLAKE2b over the prefix and the payload) catches a mistyped or truncated copy before
anything is stored; it is not a signature, the token's secrecy is what protects it. Base32 (lower case, no
padding) because tokens are read aloud, retyped and double-clicked in terminals: no ``-``, ``_``, ``+`` or
``/`` to break a selection, and either case decodes. Whitespace anywhere is ignored, so a token wrapped by a
mail client still works. Unknown payload fields are ignored, so version 1 may gain optional ones.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Final

import msgpack

from latticed.errors import MalformedError
from latticed.host.netkey import NETWORK_KEY_SIZE
from latticed.protocol.addresses import HostPort

__all__ = ["MAX_ADDRESSES", "PREFIX", "VERSION", "Invite", "decode_invite", "encode_invite"]

VERSION: Final = 1
PREFIX: Final = f"latticed{VERSION}:"
#: More would only make the line longer: a daemon has a few interfaces, and one reachable address is enough.
MAX_ADDRESSES: Final = 16
_CHECKSUM_SIZE: Final = 8
_PERSON: Final = b"latticed/invite"
_MAX_HOST: Final = 253  # the longest DNS name
_MAX_TOKEN: Final = 4096
_VERSIONED = re.compile(r"latticed(\d+):", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Invite:
    """What a token carries; ``repr`` leaves the network key out, so logging one does not leak it."""

    network_key: bytes = field(repr=False)
    #: The inviting daemon's public key: the peer the joiner dials and expects at those addresses.
    identity: bytes
    addresses: tuple[HostPort, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.network_key, bytes) or len(self.network_key) != NETWORK_KEY_SIZE:
            raise MalformedError(f"an invite's network key is {NETWORK_KEY_SIZE} bytes")
        if not isinstance(self.identity, bytes) or len(self.identity) != 32:
            raise MalformedError("an invite's identity is a 32-byte public key")
        if not self.addresses:
            raise MalformedError("an invite needs at least one address to dial")
        if len(self.addresses) > MAX_ADDRESSES:
            raise MalformedError(f"an invite carries at most {MAX_ADDRESSES} addresses")
        for address in self.addresses:
            _check_address(address)


def _check_address(address: object) -> None:
    if not isinstance(address, tuple) or len(address) != 2:
        raise MalformedError(f"invite address must be (host, port), got {address!r}")
    host, port = address
    if (
        not isinstance(host, str)
        or not 0 < len(host) <= _MAX_HOST
        or host.startswith("[")
        or any(c.isspace() for c in host)
    ):
        raise MalformedError(f"invite address has a bad host {host!r}")
    if ":" in host:  # only IPv6 literals have colons; brackets are added where an address is printed
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise MalformedError(f"invite address has a bad host {host!r}") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise MalformedError(f"invite address has a bad port {port!r}")


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(
        PREFIX.encode("ascii") + payload, digest_size=_CHECKSUM_SIZE, person=_PERSON
    ).digest()


def encode_invite(invite: Invite) -> str:
    """The one-line text form (see the module docstring)."""
    payload = msgpack.packb(
        {"k": invite.network_key, "i": invite.identity, "a": [[h, p] for h, p in invite.addresses]},
        use_bin_type=True,
    )
    body = base64.b32encode(payload + _checksum(payload)).decode("ascii").rstrip("=").lower()
    return PREFIX + body


def decode_invite(text: str) -> Invite:
    """Parse a token; every error is a MalformedError that says what is wrong and never echoes the token."""
    if not isinstance(text, str):
        raise MalformedError("an invite token is text")
    compact = _WHITESPACE.sub("", text)
    if len(compact) > _MAX_TOKEN:
        raise MalformedError(f"not an invite token: {len(compact)} characters is far too long")
    versioned = _VERSIONED.match(compact)
    if versioned is None:
        raise MalformedError(f"not a latticed invite token (those start with {PREFIX!r})")
    version = int(versioned.group(1))
    if version != VERSION:
        raise MalformedError(
            f"invite token version {version} is not supported by this latticed, which reads version "
            f"{VERSION}: upgrade latticed on this machine"
        )
    body = compact[versioned.end() :].upper()
    try:
        raw = base64.b32decode(body + "=" * (-len(body) % 8))
    except (binascii.Error, ValueError):
        raise MalformedError(
            "invite token is damaged: it has characters or a length base32 cannot have (a typo or a "
            "truncated copy?)"
        ) from None
    if base64.b32encode(raw).decode().rstrip("=") != body:
        # The last character's unused low bits decode to nothing: a typo there would pass the checksum.
        raise MalformedError(
            "invite token is damaged: its last characters are not what latticed writes (a typo?)"
        )
    payload, checksum = raw[:-_CHECKSUM_SIZE], raw[-_CHECKSUM_SIZE:]
    if len(raw) <= _CHECKSUM_SIZE or not hmac.compare_digest(checksum, _checksum(payload)):
        raise MalformedError(
            "invite token is damaged: its checksum does not match (a typo or a truncated copy?)"
        )
    try:
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
    except Exception:  # a checksummed payload we wrote always unpacks: this is a forged or buggy token
        raise MalformedError("invite token payload is not readable") from None
    if not isinstance(doc, dict) or not {"k", "i", "a"} <= doc.keys():
        raise MalformedError("invite token payload lacks its key, identity or addresses")
    addresses = doc["a"]
    if not isinstance(addresses, list) or not all(isinstance(a, list) and len(a) == 2 for a in addresses):
        raise MalformedError("invite token addresses are not [host, port] pairs")
    return Invite(doc["k"], doc["i"], tuple((a[0], a[1]) for a in addresses))
