"""Sans-IO secret handshake: mutual Ed25519 authentication behind a network key, with forward secrecy.

The design follows Secure Scuttlebutt's secret handshake, reshaped so neither side needs to know the other's
identity in advance (as in Noise XX). ``docs/protocol.md`` is the specification, with test vectors; in short::

    msg1  I -> R   a_pub ‖ time ‖ MAC_K(a_pub ‖ time)                 64 bytes
    msg2  R -> I   b_pub ‖ MAC_K(a_pub ‖ time ‖ b_pub)                 64 bytes
    msg3  I -> R   AEAD_k3(A_pk ‖ sign_A(ctx_I ‖ H_ck(A_pk)))          112 bytes
    msg4  R -> I   AEAD_k4(B_pk ‖ sign_B(ctx_R ‖ H_ck(A_pk ‖ sig_A ‖ B_pk)))   112 bytes

where ``ck`` (the chaining key) is keyed BLAKE2b under the network key ``K`` of the ephemeral X25519 result
(libsodium ``crypto_kx``). Consequences, each of which a test checks:

* Without ``K`` nobody gets past msg1/msg2, and the responder answers a bad msg1 with *nothing*.
* msg1 is fresh: its sealed time must lie within :data:`FRESHNESS_WINDOW_MS` of the responder's clock,
  and a :class:`ReplayCache` refuses an opening seen before, so a recorded msg1 replayed to the daemon it
  was sent to draws nothing either (else an eavesdropper would learn which daemons share ``K``).
* Identities travel only inside msg3/msg4, encrypted under keys that need both ``K`` and an ephemeral secret.
* The responder reveals its identity only after the initiator proved its own and passed the allow-list.
* Each signature covers ``ck`` (so both ephemerals, the DH result and ``K``) and a role label, so it cannot be
  replayed into another session or reflected to the other role.
* Session keys come from the ephemeral DH only: later theft of ``K`` or of identity keys exposes no past
  traffic.

No I/O, clock or global randomness is used except ``crypto_kx_keypair`` when no ephemeral key is injected:
the time comes in as an argument (``now_ms``, Unix milliseconds).

Why one module: it is one protocol: the four messages and the key schedule are specified
together (docs/protocol.md, with test vectors), and a change to one step changes the transcript the others
sign.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import Final, NoReturn, NotRequired, TypeAlias, TypedDict, Unpack

import nacl.bindings as sodium
import nacl.exceptions
from nacl.signing import SigningKey, VerifyKey

from latticed.errors import HandshakeError, LatticedError, LocalProtocolError, MalformedError
from latticed.protocol.replay import (
    DEFAULT_REPLAY_CAPACITY,
    FRESHNESS_WINDOW_MS,
    OpeningCache,
    ReplayCache,
)

__all__ = [
    "DEFAULT_REPLAY_CAPACITY",
    "FRESHNESS_WINDOW_MS",
    "KEY_SIZE",
    "MSG1_SIZE",
    "MSG2_SIZE",
    "MSG3_SIZE",
    "MSG4_SIZE",
    "Allowed",
    "Handshake",
    "HandshakeKeys",
    "HandshakeResult",
    "HandshakeState",
    "Initiator",
    "OpeningCache",
    "ReplayCache",
    "Responder",
    "Role",
    "ephemeral_public_key",
    "public_key_from_seed",
]

#: Size of every key this module handles: network key, Ed25519 seed and public key, X25519 keys.
KEY_SIZE: Final = 32
_MAC_SIZE: Final = 32
_SIG_SIZE: Final = 64
_AEAD_TAG: Final = 16
_HEADER_SIZE: Final = 24  # secretstream header
_TIME = struct.Struct(">Q")  # msg1's time: Unix milliseconds
_MAC1_SIZE: Final = 24  # msg1 keeps v1's 64 bytes: 32 key + 8 time + 24 MAC

MSG1_SIZE: Final = KEY_SIZE + _TIME.size + _MAC1_SIZE
MSG2_SIZE: Final = KEY_SIZE + _MAC_SIZE
MSG3_SIZE: Final = KEY_SIZE + _SIG_SIZE + _AEAD_TAG
MSG4_SIZE: Final = KEY_SIZE + _SIG_SIZE + _AEAD_TAG

# BLAKE2b personalizations: exactly 16 bytes each, one per purpose, so no two derivations can collide.
# The version lives here: a peer speaking another version fails msg1's MAC like a wrong network key would.
_P_MAC1: Final = b"latticed/v2/mac1"
_P_MAC2: Final = b"latticed/v2/mac2"
_P_CKEY: Final = b"latticed/v2/ckey"
_P_KEY3: Final = b"latticed/v2/key3"
_P_KEY4: Final = b"latticed/v2/key4"
_P_SIGI: Final = b"latticed/v2/sigi"
_P_SIGR: Final = b"latticed/v2/sigr"
_P_KI2R: Final = b"latticed/v2/ki2r"
_P_KR2I: Final = b"latticed/v2/kr2i"
_P_SESS: Final = b"latticed/v2/sess"
# Only to recognise (and log) a peer still on version 1, which is never answered: v1's msg1 was
# `a_pub ‖ B2(32, K, "latticed/v1/mac1", a_pub)`, with no time, so anyone could replay it.
_P_MAC1_V1: Final = b"latticed/v1/mac1"
# Signed bytes are `context (32) ‖ digest (32)`: fixed layout, namespaced, role-specific.
_CTX_INITIATOR: Final = b"latticed handshake v2 initiator\n"
_CTX_RESPONDER: Final = b"latticed handshake v2 responder\n"
_ZERO_NONCE: Final = bytes(24)  # each AEAD key is used exactly once

#: Who may connect: a set of 32-byte Ed25519 public keys, or a predicate over one.
Allowed: TypeAlias = Callable[[bytes], bool] | Set[bytes]


def _b2(key: bytes, person: bytes, data: bytes, size: int = 32) -> bytes:
    # hashlib's keyed BLAKE2b is libsodium's crypto_generichash_blake2b_salt_personal with a zero salt,
    # at a fraction of the per-call cost.
    return hashlib.blake2b(data, digest_size=size, key=key, person=person).digest()


def _check_key(name: str, value: bytes) -> bytes:
    if not isinstance(value, bytes) or len(value) != KEY_SIZE:
        got = f"{len(value)} bytes" if isinstance(value, bytes | bytearray) else type(value).__name__
        raise MalformedError(f"{name} must be {KEY_SIZE} bytes, got {got}")
    return value


def public_key_from_seed(seed: bytes) -> bytes:
    """The Ed25519 public key (32 bytes) of a 32-byte signing seed."""
    return bytes(SigningKey(_check_key("seed", seed)).verify_key)


def ephemeral_public_key(secret: bytes) -> bytes:
    """The X25519 public key of an injected ephemeral secret (as ``crypto_kx_keypair`` would pair them)."""
    return sodium.crypto_scalarmult_base(_check_key("ephemeral_secret", secret))


def _check_time(now_ms: int) -> int:
    if isinstance(now_ms, bool) or not isinstance(now_ms, int) or not 0 <= now_ms < 1 << 64:
        raise MalformedError(f"now_ms must be Unix milliseconds (an integer >= 0), got {now_ms!r}")
    return now_ms


class Role(enum.Enum):
    """Which side of the handshake: the initiator dialled, the responder accepted."""

    INITIATOR = "initiator"
    RESPONDER = "responder"


class HandshakeState(enum.Enum):
    """Where a handshake is; the name says what it waits for."""

    START = "start"  # initiator before initiate()
    WAIT_MSG1 = "wait_msg1"
    WAIT_MSG2 = "wait_msg2"
    WAIT_MSG3 = "wait_msg3"
    WAIT_MSG4 = "wait_msg4"
    DONE = "done"
    FAILED = "failed"


# Bytes each waiting state needs before it can act.
_MESSAGE_SIZE: Final[dict[HandshakeState, int]] = {
    HandshakeState.WAIT_MSG1: MSG1_SIZE,
    HandshakeState.WAIT_MSG2: MSG2_SIZE,
    HandshakeState.WAIT_MSG3: MSG3_SIZE,
    HandshakeState.WAIT_MSG4: MSG4_SIZE,
}


@dataclass(frozen=True)
class HandshakeResult:
    """What an authenticated handshake yields: who the peer is and the secretstream keys for each direction.

    ``session_id`` is a per-session value both sides share and outsiders cannot compute (channel binding).
    Keys, and the session id (it keys the redial's word, protocol/link_gone.py), are excluded from
    ``repr`` so they do not end up in logs.
    """

    role: Role
    local_public_key: bytes
    remote_public_key: bytes
    session_id: bytes = field(repr=False)
    send_key: bytes = field(repr=False)
    send_header: bytes = field(repr=False)
    receive_key: bytes = field(repr=False)
    receive_header: bytes = field(repr=False)
    #: Responder only: the initiator's clock (sealed in msg1) minus ours, in ms; None on the initiator.
    peer_clock_offset_ms: int | None = None
    #: msg1's time (the initiator's clock, Unix ms), the same on both ends: of two links one initiator
    #: opened, the later one is the newer (a recorded opening cannot complete a handshake again).
    opening_ms: int = 0


class Handshake:
    """One side of the secret handshake, as a state machine over bytes.

    The initiator calls :meth:`initiate` and writes what it returns; both sides then pass every received
    chunk to :meth:`receive_data` and write what it returns, until :attr:`done`. Bytes received past the
    last handshake message are kept in :attr:`trailing_data` for the secure channel.

    Any :class:`~latticed.errors.HandshakeError` is final: drop the connection without writing anything more.

    ``now_ms`` is the wall clock (Unix milliseconds) when the handshake starts: the initiator seals it into
    msg1, the responder checks msg1's time against it. A responder given a ``replay_cache`` (one per
    daemon, shared by all its handshakes) also refuses an opening it has seen before; without one only
    the freshness window protects it.
    """

    def __init__(
        self,
        role: Role,
        *,
        seed: bytes,
        network_key: bytes,
        now_ms: int,
        public_key: bytes | None = None,
        allowed: Allowed | None = None,
        ephemeral_secret: bytes | None = None,
        replay_cache: OpeningCache | None = None,
    ) -> None:
        self._role = role
        self._now_ms = _check_time(now_ms)
        self._replay_cache = replay_cache
        self._signing_key = SigningKey(_check_key("seed", seed))
        self._public_key = bytes(self._signing_key.verify_key)
        if public_key is not None and _check_key("public_key", public_key) != self._public_key:
            raise MalformedError("public_key does not belong to seed")
        self._network_key = _check_key("network_key", network_key)
        if allowed is not None and not callable(allowed):
            for key in allowed:
                _check_key("allowed public key", key)
        self._allowed = allowed
        if ephemeral_secret is None:
            self._eph_public, self._eph_secret = sodium.crypto_kx_keypair()
        else:
            self._eph_secret = ephemeral_secret
            self._eph_public = ephemeral_public_key(ephemeral_secret)
        self._state = HandshakeState.START if role is Role.INITIATOR else HandshakeState.WAIT_MSG1
        self._buffer = bytearray()
        self._remote_eph = b""
        self._opening = b""  # a_pub ‖ time, which msg2's MAC covers
        self._chaining_key = b""
        self._initiator_key = b""  # A_pk
        self._initiator_sig = b""
        self._peer_clock_offset_ms: int | None = None
        self._result: HandshakeResult | None = None

    @property
    def role(self) -> Role:
        """Initiator or responder."""
        return self._role

    @property
    def state(self) -> HandshakeState:
        """Current state."""
        return self._state

    @property
    def local_public_key(self) -> bytes:
        """Our Ed25519 public key."""
        return self._public_key

    @property
    def peer_clock_offset_ms(self) -> int | None:
        """Responder: msg1's sealed time minus ``now_ms``, once msg1 passed its MAC (only then is it the
        initiator's clock and not a stranger's number); None before that and on the initiator."""
        return self._peer_clock_offset_ms

    @property
    def done(self) -> bool:
        """Whether the peer is authenticated and :attr:`result` is available."""
        return self._state is HandshakeState.DONE

    @property
    def bytes_needed(self) -> int:
        """How many more bytes the current step needs (0 when not waiting for the peer)."""
        size = _MESSAGE_SIZE.get(self._state)
        return 0 if size is None else max(0, size - len(self._buffer))

    @property
    def result(self) -> HandshakeResult:
        """The outcome; only once :attr:`done`."""
        if self._result is None:
            raise LocalProtocolError(f"handshake not complete (state {self._state.value})")
        return self._result

    @property
    def trailing_data(self) -> bytes:
        """Bytes received after the last handshake message: the start of the encrypted stream."""
        return bytes(self._buffer) if self._state is HandshakeState.DONE else b""

    def initiate(self) -> bytes:
        """Initiator only: msg1, the first bytes to write."""
        if self._role is not Role.INITIATOR or self._state is not HandshakeState.START:
            raise LocalProtocolError(f"initiate() is for an initiator in state start, not {self._describe()}")
        self._state = HandshakeState.WAIT_MSG2
        self._opening = self._eph_public + _TIME.pack(self._now_ms)
        return self._opening + _b2(self._network_key, _P_MAC1, self._opening, _MAC1_SIZE)

    def receive_data(self, data: bytes | bytearray | memoryview) -> bytes:
        """Consume received bytes; returns the bytes to write now (often ``b""``)."""
        if self._state not in _MESSAGE_SIZE:
            raise LocalProtocolError(f"receive_data() while {self._describe()}")
        self._buffer += data
        out = b""
        while (size := _MESSAGE_SIZE.get(self._state)) is not None and len(self._buffer) >= size:
            message = bytes(self._buffer[:size])
            del self._buffer[:size]
            try:
                out += self._step(message)
            except LatticedError:
                self._state = HandshakeState.FAILED
                self._buffer.clear()
                raise
        return out

    def _describe(self) -> str:
        return f"{self._role.value} in state {self._state.value}"

    def _step(self, message: bytes) -> bytes:
        state = self._state
        if state is HandshakeState.WAIT_MSG1:
            return self._on_msg1(message)
        if state is HandshakeState.WAIT_MSG2:
            return self._on_msg2(message)
        if state is HandshakeState.WAIT_MSG3:
            return self._on_msg3(message)
        return self._on_msg4(message)

    # -- responder -------------------------------------------------------------------------------------

    def _on_msg1(self, msg1: bytes) -> bytes:
        # Every failure here says nothing: whoever sent this may not even learn that a latticed daemon is
        # listening, let alone that it shares the network key of whoever made the opening.
        opening, mac = msg1[: KEY_SIZE + _TIME.size], msg1[KEY_SIZE + _TIME.size :]
        a_pub = opening[:KEY_SIZE]
        (sent_ms,) = _TIME.unpack_from(opening, KEY_SIZE)
        if not hmac.compare_digest(mac, _b2(self._network_key, _P_MAC1, opening, _MAC1_SIZE)):
            if hmac.compare_digest(msg1[KEY_SIZE:], _b2(self._network_key, _P_MAC1_V1, a_pub)):
                _fail(
                    "msg1 is a version 1 opening under our network key: the peer runs an older latticed "
                    "(handshake v1) and must be upgraded, or someone replays one recorded from it; "
                    "not answered"
                )
            _fail("msg1 failed authentication: the peer has another network key (or is not latticed v2)")
        offset = sent_ms - self._now_ms
        self._peer_clock_offset_ms = offset
        cache = self._replay_cache
        if abs(offset) > (FRESHNESS_WINDOW_MS if cache is None else cache.window_ms):
            raise HandshakeError(
                f"msg1 is not fresh: sealed at {sent_ms} ms, our clock says {self._now_ms} ms (a replay, or "
                "the two hosts' clocks differ by more than the freshness window); not answered",
                clock_offset_ms=offset,
            )
        if cache is not None and not cache.admit(a_pub, sent_ms, self._now_ms):
            _fail("msg1 was seen before (a replayed opening); not answered")
        self._remote_eph = a_pub
        self._opening = opening
        b_pub = self._eph_public
        self._derive_chaining_key(initiator_eph=a_pub, responder_eph=b_pub)
        self._state = HandshakeState.WAIT_MSG3
        return b_pub + _b2(self._network_key, _P_MAC2, opening + b_pub)

    def _on_msg3(self, msg3: bytes) -> bytes:
        ck = self._chaining_key
        plain = _open(_b2(ck, _P_KEY3, b""), msg3, "msg3")
        a_pk, sig_a = plain[:KEY_SIZE], plain[KEY_SIZE:]
        _verify(a_pk, _CTX_INITIATOR + _b2(ck, _P_SIGI, a_pk), sig_a, "initiator")
        self._check_allowed(a_pk)
        b_pk = self._public_key
        sig_b = self._sign(_CTX_RESPONDER + _b2(ck, _P_SIGR, a_pk + sig_a + b_pk))
        msg4 = sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
            b_pk + sig_b, b"", _ZERO_NONCE, _b2(ck, _P_KEY4, b"")
        )
        self._finish(initiator_pk=a_pk, responder_pk=b_pk)
        return msg4

    # -- initiator -------------------------------------------------------------------------------------

    def _on_msg2(self, msg2: bytes) -> bytes:
        b_pub, mac = msg2[:KEY_SIZE], msg2[KEY_SIZE:]
        a_pub = self._eph_public
        if not hmac.compare_digest(mac, _b2(self._network_key, _P_MAC2, self._opening + b_pub)):
            _fail("msg2 failed authentication: the peer has another network key (or is not latticed v2)")
        self._remote_eph = b_pub
        self._derive_chaining_key(initiator_eph=a_pub, responder_eph=b_pub)
        ck = self._chaining_key
        a_pk = self._public_key
        sig_a = self._sign(_CTX_INITIATOR + _b2(ck, _P_SIGI, a_pk))
        self._initiator_sig = sig_a
        self._state = HandshakeState.WAIT_MSG4
        return sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
            a_pk + sig_a, b"", _ZERO_NONCE, _b2(ck, _P_KEY3, b"")
        )

    def _on_msg4(self, msg4: bytes) -> bytes:
        ck = self._chaining_key
        plain = _open(_b2(ck, _P_KEY4, b""), msg4, "msg4")
        b_pk, sig_b = plain[:KEY_SIZE], plain[KEY_SIZE:]
        a_pk = self._public_key
        _verify(
            b_pk, _CTX_RESPONDER + _b2(ck, _P_SIGR, a_pk + self._initiator_sig + b_pk), sig_b, "responder"
        )
        self._check_allowed(b_pk)
        self._finish(initiator_pk=a_pk, responder_pk=b_pk)
        return b""

    # -- both ------------------------------------------------------------------------------------------

    def _derive_chaining_key(self, *, initiator_eph: bytes, responder_eph: bytes) -> None:
        # crypto_kx hashes the X25519 result with both public keys: BLAKE2b-512(q ‖ a_pub ‖ b_pub), split
        # into (client rx, client tx). We use the whole 64 bytes, in the initiator's order, on both sides.
        try:
            if self._role is Role.INITIATOR:
                rx, tx = sodium.crypto_kx_client_session_keys(initiator_eph, self._eph_secret, responder_eph)
                kx = rx + tx
            else:
                rx, tx = sodium.crypto_kx_server_session_keys(responder_eph, self._eph_secret, initiator_eph)
                kx = tx + rx
        except nacl.exceptions.CryptoError:
            _fail("the peer's ephemeral key is a low-order point")
        self._chaining_key = _b2(self._network_key, _P_CKEY, kx)

    def _sign(self, message: bytes) -> bytes:
        signature: bytes = self._signing_key.sign(message).signature
        return signature

    def _check_allowed(self, remote_pk: bytes) -> None:
        allowed = self._allowed
        if allowed is None:
            return
        ok = allowed(remote_pk) if callable(allowed) else remote_pk in allowed
        if not ok:
            _fail(f"peer {remote_pk.hex()} is not in the allow-list")

    def _finish(self, *, initiator_pk: bytes, responder_pk: bytes) -> None:
        ck = self._chaining_key
        identities = initiator_pk + responder_pk
        i2r = _b2(ck, _P_KI2R, identities, 64)
        r2i = _b2(ck, _P_KR2I, identities, 64)
        if self._role is Role.INITIATOR:
            send, receive, remote = i2r, r2i, responder_pk
        else:
            send, receive, remote = r2i, i2r, initiator_pk
        self._result = HandshakeResult(
            role=self._role,
            local_public_key=self._public_key,
            remote_public_key=remote,
            session_id=_b2(ck, _P_SESS, identities),
            send_key=send[:KEY_SIZE],
            send_header=send[KEY_SIZE : KEY_SIZE + _HEADER_SIZE],
            receive_key=receive[:KEY_SIZE],
            receive_header=receive[KEY_SIZE : KEY_SIZE + _HEADER_SIZE],
            peer_clock_offset_ms=self._peer_clock_offset_ms,
            opening_ms=_TIME.unpack_from(self._opening, KEY_SIZE)[0],
        )
        self._state = HandshakeState.DONE
        # Nothing secret needs to outlive the handshake.
        self._eph_secret = b""
        self._chaining_key = b""
        self._replay_cache = None


class HandshakeKeys(TypedDict):
    """What either side is built from besides its role (see :class:`Handshake`); the last three may be
    left out. Written once so the two sides' constructors cannot drift apart."""

    seed: bytes
    network_key: bytes
    now_ms: int
    public_key: NotRequired[bytes | None]
    allowed: NotRequired[Allowed | None]
    ephemeral_secret: NotRequired[bytes | None]


class Initiator(Handshake):
    """The dialling side: call :meth:`initiate` first."""

    def __init__(self, **keys: Unpack[HandshakeKeys]) -> None:
        super().__init__(Role.INITIATOR, replay_cache=None, **keys)  # an initiator is never replayed to


class Responder(Handshake):
    """The accepting side: feed it what the initiator sends (give it the daemon's :class:`ReplayCache`)."""

    def __init__(self, *, replay_cache: OpeningCache | None = None, **keys: Unpack[HandshakeKeys]) -> None:
        super().__init__(Role.RESPONDER, replay_cache=replay_cache, **keys)


def _fail(reason: str) -> NoReturn:
    raise HandshakeError(reason)


def _open(key: bytes, ciphertext: bytes, what: str) -> bytes:
    try:
        plain: bytes = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(ciphertext, b"", _ZERO_NONCE, key)
    except nacl.exceptions.CryptoError:
        _fail(f"{what} failed decryption: tampered, replayed from another session, or another network key")
    return plain


def _verify(public_key: bytes, message: bytes, signature: bytes, who: str) -> None:
    try:
        VerifyKey(public_key).verify(message, signature)
    except nacl.exceptions.CryptoError:
        _fail(f"the {who}'s signature over the handshake does not verify (claimed key {public_key.hex()})")
