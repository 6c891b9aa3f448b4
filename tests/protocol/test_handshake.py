"""The sans-IO secret handshake: success, every failure path, what an outsider sees, and the test vectors.

Run ``python tests/protocol/test_handshake.py`` to print the vectors recomputed from
``tests/vectors/handshake.json``'s inputs (to update the JSON and docs/protocol.md after a deliberate
protocol change).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nacl.bindings as sodium
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from latticed.errors import HandshakeError, LatticedError, LocalProtocolError, MalformedError
from latticed.protocol.handshake import (
    DEFAULT_REPLAY_CAPACITY,
    FRESHNESS_WINDOW_MS,
    MSG1_SIZE,
    MSG2_SIZE,
    MSG3_SIZE,
    MSG4_SIZE,
    Handshake,
    HandshakeResult,
    HandshakeState,
    Initiator,
    ReplayCache,
    Responder,
    Role,
    ephemeral_public_key,
    public_key_from_seed,
)
from latticed.protocol.secure import SecureChannel

ROOT = Path(__file__).resolve().parents[2]  # not support.paths: this file also runs as a script
VECTORS = ROOT / "tests" / "vectors" / "handshake.json"
PROTOCOL_DOC = ROOT / "docs" / "protocol.md"

K = bytes(range(32))
OTHER_K = bytes(range(1, 33))
SEED_A = b"\x11" * 32
SEED_B = b"\x22" * 32
SEED_C = b"\x55" * 32
PK_A = public_key_from_seed(SEED_A)
PK_B = public_key_from_seed(SEED_B)
PK_C = public_key_from_seed(SEED_C)
NOW = 1_700_000_000_000  # Unix ms, the handshakes' clock


def b2(key: bytes, person: bytes, data: bytes, size: int = 32) -> bytes:
    return hashlib.blake2b(data, digest_size=size, key=key, person=person).digest()


def make_pair(**overrides: Any) -> tuple[Initiator, Responder]:
    i_kw: dict[str, Any] = {"seed": SEED_A, "network_key": K, "now_ms": NOW}
    r_kw: dict[str, Any] = {"seed": SEED_B, "network_key": K, "now_ms": NOW}
    for name, value in overrides.items():
        side, _, arg = name.partition("_")
        (i_kw if side == "i" else r_kw)[arg] = value
    return Initiator(**i_kw), Responder(**r_kw)


def run(
    initiator: Initiator,
    responder: Responder,
    tamper: Callable[[int, bytes], bytes] = lambda n, m: m,
) -> list[bytes]:
    """Drive both sides over a fake link; ``tamper(n, msg)`` may alter message n (1..4) in flight."""
    sent: list[bytes] = []
    msg = tamper(1, initiator.initiate())
    sent.append(msg)
    msg = tamper(2, responder.receive_data(msg))
    sent.append(msg)
    msg = tamper(3, initiator.receive_data(msg))
    sent.append(msg)
    msg = tamper(4, responder.receive_data(msg))
    sent.append(msg)
    assert initiator.receive_data(msg) == b""
    return sent


# -- success -------------------------------------------------------------------------------------------


def test_success_both_sides_agree() -> None:
    initiator, responder = make_pair()
    sizes = [len(m) for m in run(initiator, responder)]
    assert sizes == [MSG1_SIZE, MSG2_SIZE, MSG3_SIZE, MSG4_SIZE] == [64, 64, 112, 112]
    assert initiator.done and responder.done
    ri, rr = initiator.result, responder.result
    assert (ri.role, rr.role) == (Role.INITIATOR, Role.RESPONDER)
    assert ri.remote_public_key == PK_B == rr.local_public_key
    assert rr.remote_public_key == PK_A == ri.local_public_key
    assert ri.session_id == rr.session_id
    assert (ri.send_key, ri.send_header) == (rr.receive_key, rr.receive_header)
    assert (ri.receive_key, ri.receive_header) == (rr.send_key, rr.send_header)
    assert ri.send_key != ri.receive_key
    assert len(ri.send_key) == 32 and len(ri.send_header) == 24


def test_fresh_ephemerals_give_fresh_sessions() -> None:
    first, second = make_pair(), make_pair()
    run(*first)
    run(*second)
    assert first[0].result.session_id != second[0].result.session_id
    assert first[0].result.send_key != second[0].result.send_key


def test_keys_are_not_in_repr() -> None:
    initiator, responder = make_pair()
    run(initiator, responder)
    text = repr(initiator.result)
    assert initiator.result.send_key.hex() not in text and "send_key" not in text
    assert isinstance(initiator.result, HandshakeResult)
    with pytest.raises(AttributeError):
        initiator.result.remote_public_key = b""  # type: ignore[misc]


def test_the_session_id_is_not_in_repr() -> None:
    """The session id keys the redial's word (``link-gone``): a logged handshake must not let a reader of
    the log name the link."""
    initiator, responder = make_pair()
    run(initiator, responder)
    for result in (initiator.result, responder.result):
        text = repr(result)
        assert "session_id" not in text and repr(result.session_id) not in text


def test_byte_at_a_time_and_trailing_data() -> None:
    initiator, responder = make_pair()
    msg1 = initiator.initiate()
    out = b"".join(responder.receive_data(msg1[i : i + 1]) for i in range(len(msg1)))
    assert len(out) == MSG2_SIZE
    msg3 = b"".join(initiator.receive_data(out[i : i + 1]) for i in range(len(out)))
    assert initiator.bytes_needed == MSG4_SIZE
    msg4 = responder.receive_data(msg3)
    # The responder may pipeline its first frame right behind msg4.
    first = SecureChannel(responder.result).seal(b"pipelined")
    assert initiator.receive_data(msg4 + first) == b""
    assert initiator.trailing_data == first
    channel = SecureChannel(initiator.result)
    channel.receive_data(initiator.trailing_data)
    assert channel.next_message() == b"pipelined"


def test_allow_list_set_and_callable_accept() -> None:
    initiator, responder = make_pair(i_allowed={PK_B}, r_allowed=lambda pk: pk == PK_A)
    run(initiator, responder)
    assert initiator.done and responder.done


def test_public_key_checked_against_seed() -> None:
    Initiator(seed=SEED_A, public_key=PK_A, network_key=K, now_ms=NOW)
    with pytest.raises(MalformedError, match="does not belong"):
        Initiator(seed=SEED_A, public_key=PK_B, network_key=K, now_ms=NOW)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seed": b"short", "network_key": K, "now_ms": NOW},
        {"seed": SEED_A, "network_key": K[:31], "now_ms": NOW},
        {"seed": SEED_A, "network_key": K, "ephemeral_secret": b"x", "now_ms": NOW},
        {"seed": SEED_A, "network_key": K, "allowed": {b"not a key"}, "now_ms": NOW},
        {"seed": "11" * 32, "network_key": K, "now_ms": NOW},
        {"seed": SEED_A, "network_key": K, "now_ms": -1},
        {"seed": SEED_A, "network_key": K, "now_ms": 1.5},
    ],
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(MalformedError):
        Initiator(**kwargs)


def test_misuse_is_a_local_error() -> None:
    initiator, responder = make_pair()
    with pytest.raises(LocalProtocolError):
        responder.initiate()
    with pytest.raises(LocalProtocolError):
        initiator.receive_data(b"x")  # before initiate()
    with pytest.raises(LocalProtocolError):
        _ = initiator.result
    run(initiator, responder)
    with pytest.raises(LocalProtocolError):
        initiator.initiate()
    with pytest.raises(LocalProtocolError):
        responder.receive_data(b"more")


# -- network key ---------------------------------------------------------------------------------------


def test_wrong_network_key_responder_says_nothing() -> None:
    initiator, responder = make_pair(i_network_key=OTHER_K)
    msg1 = initiator.initiate()
    with pytest.raises(HandshakeError, match="network key"):
        responder.receive_data(msg1)
    assert responder.state is HandshakeState.FAILED
    with pytest.raises(LocalProtocolError):
        responder.receive_data(b"")


def test_wrong_network_key_initiator_rejects_msg2() -> None:
    # A responder with another key that answered anyway (a probe, or a buggy peer): the initiator stops
    # before revealing its identity in msg3.
    initiator = Initiator(seed=SEED_A, network_key=K, now_ms=NOW)
    msg1 = initiator.initiate()
    b_pub, _ = sodium.crypto_kx_keypair()
    msg2 = b_pub + b2(OTHER_K, b"latticed/v2/mac2", msg1[:40] + b_pub)
    with pytest.raises(HandshakeError, match="msg2"):
        initiator.receive_data(msg2)
    assert initiator.state is HandshakeState.FAILED


def test_outsider_sees_no_identity_and_no_plaintext_structure() -> None:
    initiator, responder = make_pair()
    wire = b"".join(run(initiator, responder))
    for secret in (PK_A, PK_B, PK_A[:8], PK_B[:8]):
        assert secret not in wire


# -- allow-list ----------------------------------------------------------------------------------------


def test_responder_rejects_unlisted_initiator_before_revealing_itself() -> None:
    initiator, responder = make_pair(r_allowed={PK_C})
    msg2 = responder.receive_data(initiator.initiate())
    msg3 = initiator.receive_data(msg2)
    with pytest.raises(HandshakeError, match=f"{PK_A.hex()} is not in the allow-list"):
        responder.receive_data(msg3)
    # The responder wrote msg2 only: an ephemeral key and a MAC.
    assert PK_B not in msg2


def test_initiator_rejects_unlisted_responder() -> None:
    initiator, responder = make_pair(i_allowed=lambda pk: False)
    with pytest.raises(HandshakeError, match=f"{PK_B.hex()} is not in the allow-list"):
        run(initiator, responder)
    assert initiator.state is HandshakeState.FAILED


# -- tampering -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", [1, 2, 3, 4])
def test_every_flipped_bit_of_every_message_is_caught(which: int) -> None:
    size = {1: MSG1_SIZE, 2: MSG2_SIZE, 3: MSG3_SIZE, 4: MSG4_SIZE}[which]
    for position in range(size):
        initiator, responder = make_pair()

        def flip(n: int, msg: bytes, position: int = position) -> bytes:
            if n != which:
                return msg
            return msg[:position] + bytes([msg[position] ^ 0x01]) + msg[position + 1 :]

        with pytest.raises(HandshakeError):
            run(initiator, responder, flip)
        receiver = responder if which % 2 else initiator
        assert receiver.state is HandshakeState.FAILED


def test_replayed_handshake_fails_at_msg3() -> None:
    initiator, responder = make_pair()
    recorded = run(initiator, responder)
    # A responder that does not remember the opening (no cache: a restarted daemon, within the window)
    # answers msg1, but the replay goes no further: msg3 is bound to the responder's new ephemeral key.
    fresh = Responder(seed=SEED_B, network_key=K, now_ms=NOW)
    fresh.receive_data(recorded[0])
    with pytest.raises(HandshakeError, match="msg3"):
        fresh.receive_data(recorded[2])


def test_replayed_opening_draws_no_answer() -> None:
    """An eavesdropper replaying a recorded msg1 to the daemon it was sent to learns nothing: not even that
    the daemon shares the initiator's network key."""
    cache = ReplayCache()
    initiator, responder = make_pair(r_replay_cache=cache)
    msg1 = initiator.initiate()
    assert len(responder.receive_data(msg1)) == MSG2_SIZE  # the genuine opening is answered
    for later in (NOW, NOW + 1, NOW + FRESHNESS_WINDOW_MS):
        replayed = Responder(seed=SEED_B, network_key=K, now_ms=later, replay_cache=cache)
        with pytest.raises(HandshakeError, match="seen before"):
            replayed.receive_data(msg1)
        assert replayed.state is HandshakeState.FAILED
    # Long after, the window refuses it, although the cache has forgotten it by then.
    much_later = NOW + 10 * FRESHNESS_WINDOW_MS
    late = Responder(seed=SEED_B, network_key=K, now_ms=much_later, replay_cache=cache)
    with pytest.raises(HandshakeError, match="not fresh"):
        late.receive_data(msg1)
    assert cache.admit(b"x" * 32, much_later, much_later) and len(cache) == 1


@pytest.mark.parametrize("skew", [FRESHNESS_WINDOW_MS + 1, -FRESHNESS_WINDOW_MS - 1])
def test_stale_or_future_opening_draws_no_answer(skew: int) -> None:
    initiator = Initiator(seed=SEED_A, network_key=K, now_ms=NOW + skew)
    responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW, replay_cache=ReplayCache())
    with pytest.raises(HandshakeError, match="not fresh"):
        responder.receive_data(initiator.initiate())
    assert responder.state is HandshakeState.FAILED


@pytest.mark.parametrize("skew", [FRESHNESS_WINDOW_MS, -FRESHNESS_WINDOW_MS, 0])
def test_clocks_within_the_window_complete(skew: int) -> None:
    initiator, responder = make_pair(i_now_ms=NOW + skew, r_replay_cache=ReplayCache())
    run(initiator, responder)
    assert initiator.done and responder.done
    # Both ends know when the initiator opened the link (its clock): what orders one initiator's links.
    assert initiator.result.opening_ms == responder.result.opening_ms == NOW + skew


def test_msg2_is_bound_to_the_opening_time() -> None:
    """A key holder in the middle cannot re-date msg1 and pass the answer to the original initiator."""
    initiator = Initiator(seed=SEED_A, network_key=K, now_ms=NOW)
    msg1 = initiator.initiate()
    redated = msg1[:32] + (NOW + 1).to_bytes(8, "big")
    responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW)
    msg2 = responder.receive_data(redated + b2(K, b"latticed/v2/mac1", redated, 24))
    with pytest.raises(HandshakeError, match="msg2"):
        initiator.receive_data(msg2)


def test_a_version_1_opening_is_recognised_and_not_answered() -> None:
    a_pub = ephemeral_public_key(b"\x33" * 32)
    v1_msg1 = a_pub + b2(K, b"latticed/v1/mac1", a_pub)
    responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW, replay_cache=ReplayCache())
    with pytest.raises(HandshakeError, match=r"version 1 .* must be upgraded"):
        responder.receive_data(v1_msg1)
    # Under another network key it is just noise.
    stranger = Responder(seed=SEED_B, network_key=OTHER_K, now_ms=NOW)
    with pytest.raises(HandshakeError, match="another network key"):
        stranger.receive_data(v1_msg1)


def test_replay_cache_is_bounded_and_never_answers_a_replay() -> None:
    """A source gets its share and is then refused (nothing is forgotten for it); when the whole cache is
    full the source holding the most loses its oldest opening, and only its own floor rises."""
    cache = ReplayCache(capacity=4, per_source=2)
    a = [(bytes([i]) * 32, NOW + i) for i in range(3)]
    b = [(bytes([10 + i]) * 32, NOW + 10 + i) for i in range(2)]
    assert [cache.admit(key, at, NOW, "a") for key, at in a] == [True, True, False]  # a's share: 2
    assert all(cache.admit(key, at, NOW, "b") for key, at in b) and len(cache) == 4
    assert not any(cache.admit(key, at, NOW, source) for key, at in a[:2] + b for source in "abc")
    # Full: a newcomer takes the oldest opening of the largest source (a, first of the two with 2).
    assert cache.admit(b"c" * 32, NOW - 5, NOW, "c") and len(cache) == 4
    assert cache.source_floor_ms("a") == NOW and cache.floor_ms == -1
    assert not cache.admit(a[0][0], a[0][1], NOW, "a")  # forgotten, but under a's floor
    assert cache.admit(b"n" * 32, NOW - 10, NOW, "d")  # another source is not under a's floor
    assert cache.source_floor_ms("b") == NOW + 10  # b held the most this time
    assert cache.held_by("a") == 1 and cache.held_by("b") == 1 and len(cache) == 4


def test_a_flood_from_one_source_locks_out_no_other() -> None:
    """A key holder floods openings dated near the end of the window (what refused every honest opening
    for ~110 s): it fills its own share and then only its own openings are refused."""
    cache = ReplayCache()
    future = NOW + FRESHNESS_WINDOW_MS - 5000
    admitted = sum(cache.admit(i.to_bytes(32, "big"), future, NOW, "flooder") for i in range(10_000))
    assert admitted == cache.future_per_source  # future-dated ones: a small quota per source
    admitted += sum(cache.admit((10**6 + i).to_bytes(32, "big"), NOW, NOW, "flooder") for i in range(10_000))
    assert admitted == cache.held_by("flooder") == cache.per_source
    assert cache.floor_ms == -1 and cache.source_floor_ms("honest") == -1
    assert cache.admit(b"h" * 32, NOW - 1000, NOW, "honest")  # an honest opening, a second old
    assert not cache.admit(b"h" * 32, NOW - 1000, NOW, "flooder")  # its replay, from anywhere: refused
    # Many sources flooding evict each other, never the honest one's opening.
    for n in range(20):
        for i in range(cache.per_source):
            cache.admit(f"{n}/{i}".encode().ljust(32, b"."), NOW, NOW, f"flooder{n}")
    assert len(cache) <= DEFAULT_REPLAY_CAPACITY and cache.held_by("honest") == 1
    assert not cache.admit(b"h" * 32, NOW - 1000, NOW + 1, "elsewhere")


def test_replay_cache_survives_a_clock_jumping_back() -> None:
    cache = ReplayCache(window_ms=1000)
    assert cache.admit(b"a" * 32, NOW, NOW)
    assert cache.admit(b"b" * 32, NOW + 5000, NOW + 5000)  # the clock moved on: "a" is forgotten...
    assert len(cache) == 1
    assert not cache.admit(b"a" * 32, NOW, NOW)  # ...but its replay is refused after a jump back
    with pytest.raises(MalformedError):
        ReplayCache(capacity=0)


def test_replayed_msg2_from_another_session_is_caught() -> None:
    old_i, old_r = make_pair()
    old = run(old_i, old_r)
    initiator = Initiator(seed=SEED_A, network_key=K, now_ms=NOW)
    initiator.initiate()
    with pytest.raises(HandshakeError, match="msg2"):
        initiator.receive_data(old[1])


def test_signature_is_bound_to_role_and_session() -> None:
    """A man in the middle holding K but not B's key cannot splice two sessions together."""
    initiator = Initiator(seed=SEED_A, network_key=K, now_ms=NOW)
    mitm_to_a = Responder(seed=SEED_C, network_key=K, now_ms=NOW)
    mitm_to_b = Initiator(seed=SEED_C, network_key=K, now_ms=NOW)
    responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW)
    msg3_from_a = initiator.receive_data(mitm_to_a.receive_data(initiator.initiate()))
    mitm_to_b.receive_data(responder.receive_data(mitm_to_b.initiate()))
    with pytest.raises(HandshakeError):
        responder.receive_data(msg3_from_a)  # A's proof is for the other leg


def test_low_order_ephemeral_is_rejected() -> None:
    initiator, _ = make_pair()
    opening = initiator.initiate()[:40]
    zero = bytes(32)
    msg2 = zero + b2(K, b"latticed/v2/mac2", opening + zero)
    with pytest.raises(HandshakeError, match="low-order"):
        initiator.receive_data(msg2)


def test_identity_with_forged_signature_is_rejected() -> None:
    """A K holder claiming someone else's identity (valid msg3 encryption, bad signature)."""
    a_sec = b"\x33" * 32
    a_pub = ephemeral_public_key(a_sec)
    responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW)
    opening = a_pub + NOW.to_bytes(8, "big")
    msg2 = responder.receive_data(opening + b2(K, b"latticed/v2/mac1", opening, 24))
    b_pub = msg2[:32]
    kx = hashlib.blake2b(sodium.crypto_scalarmult(a_sec, b_pub) + a_pub + b_pub, digest_size=64).digest()
    ck = b2(K, b"latticed/v2/ckey", kx)
    # A real signature by C, but over the wrong bytes (no context label): must not verify.
    bad_sig = SigningKey(SEED_C).sign(b2(ck, b"latticed/v2/sigi", PK_C)).signature
    plain = PK_C + bad_sig
    forged = sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
        plain, b"", bytes(24), b2(ck, b"latticed/v2/key3", b"")
    )
    with pytest.raises(HandshakeError, match="signature"):
        responder.receive_data(forged)


# -- fuzzing -------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=1, max_value=64))
def test_responder_fuzz_only_raises_handshake_errors(data: bytes, chunk: int) -> None:
    responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW)
    try:
        for i in range(0, len(data), chunk):
            responder.receive_data(data[i : i + chunk])
    except HandshakeError:
        assert responder.state is HandshakeState.FAILED


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.booleans())
def test_initiator_fuzz_only_raises_handshake_errors(data: bytes, valid_msg2: bool) -> None:
    initiator, responder = make_pair()
    msg1 = initiator.initiate()
    try:
        if valid_msg2:
            initiator.receive_data(responder.receive_data(msg1))
        initiator.receive_data(data)
    except HandshakeError:
        pass
    except LatticedError as error:  # pragma: no cover - would be a bug
        pytest.fail(f"unexpected {error!r}")


# -- test vectors --------------------------------------------------------------------------------------


def compute_vectors(inputs: dict[str, str]) -> dict[str, str]:
    """Everything derived from the fixed inputs, as hex."""
    h = {name: bytes.fromhex(value) for name, value in inputs.items() if not name.startswith("message_")}
    now_ms = int.from_bytes(h["time"], "big")
    initiator = Initiator(
        seed=h["initiator_seed"],
        network_key=h["network_key"],
        now_ms=now_ms,
        ephemeral_secret=h["initiator_ephemeral_secret"],
    )
    responder = Responder(
        seed=h["responder_seed"],
        network_key=h["network_key"],
        now_ms=now_ms,
        ephemeral_secret=h["responder_ephemeral_secret"],
    )
    msg1, msg2, msg3, msg4 = run(initiator, responder)
    i_channel = SecureChannel(initiator.result)
    r_channel = SecureChannel(responder.result)
    i2r = i_channel.seal(inputs["message_i2r"].encode())
    r2i = r_channel.seal(inputs["message_r2i"].encode())
    final = i_channel.close()
    r_channel.receive_data(i2r + final)
    assert r_channel.next_message() == inputs["message_i2r"].encode()
    assert r_channel.next_message() is None and r_channel.remote_closed
    result = initiator.result
    # Intermediate values for implementers, by bare primitives (the module never exposes them).
    a_pub, b_pub = msg1[:32], msg2[:32]
    q = sodium.crypto_scalarmult(h["initiator_ephemeral_secret"], b_pub)
    kx = hashlib.blake2b(q + a_pub + b_pub, digest_size=64).digest()
    return {
        "initiator_public_key": result.local_public_key.hex(),
        "responder_public_key": result.remote_public_key.hex(),
        "initiator_ephemeral_public": ephemeral_public_key(h["initiator_ephemeral_secret"]).hex(),
        "responder_ephemeral_public": ephemeral_public_key(h["responder_ephemeral_secret"]).hex(),
        "msg1": msg1.hex(),
        "msg2": msg2.hex(),
        "shared_secret": q.hex(),
        "kx": kx.hex(),
        "chaining_key": b2(h["network_key"], b"latticed/v2/ckey", kx).hex(),
        "msg3": msg3.hex(),
        "msg4": msg4.hex(),
        "key_i2r": result.send_key.hex(),
        "header_i2r": result.send_header.hex(),
        "key_r2i": result.receive_key.hex(),
        "header_r2i": result.receive_header.hex(),
        "session_id": result.session_id.hex(),
        "frame1_i2r": i2r.hex(),
        "frame1_r2i": r2i.hex(),
        "final_i2r": final.hex(),
    }


def load_vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTORS.read_text())
    return data


def test_vectors_match_code() -> None:
    vectors = load_vectors()
    assert compute_vectors(vectors["inputs"]) == vectors["outputs"]


def test_vectors_match_protocol_doc() -> None:
    """docs/protocol.md lists exactly the JSON's values, in its fenced ``test-vectors`` block."""
    vectors = load_vectors()
    doc = PROTOCOL_DOC.read_text()
    block = re.search(r"```text test-vectors\n(.*?)```", doc, re.S)
    assert block, "docs/protocol.md lacks its test-vectors block"
    listed = dict(line.split(" = ", 1) for line in block.group(1).splitlines() if " = " in line)
    expected = {**vectors["inputs"], **vectors["outputs"]}
    assert {k: v.strip().strip('"') for k, v in listed.items()} == expected


def test_vector_derivations_by_hand() -> None:
    """Recompute the key schedule from the spec with bare primitives, independently of the module."""
    vectors = load_vectors()
    inp = {k: bytes.fromhex(v) for k, v in vectors["inputs"].items() if not k.startswith("message_")}
    out = {k: bytes.fromhex(v) for k, v in vectors["outputs"].items()}
    net = inp["network_key"]
    a_pub, b_pub = out["initiator_ephemeral_public"], out["responder_ephemeral_public"]
    opening = a_pub + inp["time"]
    assert out["msg1"] == opening + b2(net, b"latticed/v2/mac1", opening, 24)
    assert out["msg2"] == b_pub + b2(net, b"latticed/v2/mac2", opening + b_pub)
    q = sodium.crypto_scalarmult(inp["responder_ephemeral_secret"], a_pub)  # the responder's view
    assert q == out["shared_secret"]
    kx = hashlib.blake2b(q + a_pub + b_pub, digest_size=64).digest()
    ck = b2(net, b"latticed/v2/ckey", kx)
    assert (kx, ck) == (out["kx"], out["chaining_key"])
    a_pk, b_pk = out["initiator_public_key"], out["responder_public_key"]
    plain3 = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(
        out["msg3"], b"", bytes(24), b2(ck, b"latticed/v2/key3", b"")
    )
    assert plain3[:32] == a_pk
    signed3 = b"latticed handshake v2 initiator\n" + b2(ck, b"latticed/v2/sigi", a_pk)
    sodium.crypto_sign_open(plain3[32:] + signed3, a_pk)
    plain4 = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(
        out["msg4"], b"", bytes(24), b2(ck, b"latticed/v2/key4", b"")
    )
    assert plain4[:32] == b_pk
    signed4 = b"latticed handshake v2 responder\n" + b2(ck, b"latticed/v2/sigr", a_pk + plain3[32:] + b_pk)
    sodium.crypto_sign_open(plain4[32:] + signed4, b_pk)
    i2r = b2(ck, b"latticed/v2/ki2r", a_pk + b_pk, 64)
    r2i = b2(ck, b"latticed/v2/kr2i", a_pk + b_pk, 64)
    assert (out["key_i2r"], out["header_i2r"]) == (i2r[:32], i2r[32:56])
    assert (out["key_r2i"], out["header_r2i"]) == (r2i[:32], r2i[32:56])
    assert out["session_id"] == b2(ck, b"latticed/v2/sess", a_pk + b_pk)
    # The first frame decrypts with a plain secretstream pull over the derived header.
    state = sodium.crypto_secretstream_xchacha20poly1305_state()
    sodium.crypto_secretstream_xchacha20poly1305_init_pull(state, out["header_i2r"], out["key_i2r"])
    frame = out["frame1_i2r"]
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    message, tag = sodium.crypto_secretstream_xchacha20poly1305_pull(state, frame[4:])
    assert message == vectors["inputs"]["message_i2r"].encode() and tag == 0


def test_kx_matches_libsodium_definition() -> None:
    """Both roles feed the same 64 bytes (BLAKE2b-512(q ‖ a_pub ‖ b_pub)) into the chaining key."""
    a_pub, a_sec = sodium.crypto_kx_keypair()
    b_pub, b_sec = sodium.crypto_kx_keypair()
    rx, tx = sodium.crypto_kx_client_session_keys(a_pub, a_sec, b_pub)
    srx, stx = sodium.crypto_kx_server_session_keys(b_pub, b_sec, a_pub)
    q = sodium.crypto_scalarmult(a_sec, b_pub)
    assert rx + tx == stx + srx == hashlib.blake2b(q + a_pub + b_pub, digest_size=64).digest()
    assert ephemeral_public_key(a_sec) == a_pub


def test_handshake_class_roles() -> None:
    assert Initiator(seed=SEED_A, network_key=K, now_ms=NOW).role is Role.INITIATOR
    assert Handshake(Role.RESPONDER, seed=SEED_A, network_key=K, now_ms=NOW).state is HandshakeState.WAIT_MSG1


def test_each_side_takes_only_its_own_arguments() -> None:
    keys = {"seed": SEED_A, "network_key": K, "now_ms": NOW}
    assert Responder(**keys, replay_cache=ReplayCache()).role is Role.RESPONDER  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Initiator(**keys, replay_cache=ReplayCache())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Responder(**keys, role=Role.INITIATOR)  # type: ignore[arg-type]


if __name__ == "__main__":
    vectors = load_vectors()
    vectors["outputs"] = compute_vectors(vectors["inputs"])
    json.dump(vectors, sys.stdout, indent=2)
    sys.stdout.write("\n")
