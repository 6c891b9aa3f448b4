"""Sealed records, pure part (latticed/privacy): envelopes, wrapped keys, key epochs in metadata, and the
test vectors of docs/privacy.md.

Run ``python tests/privacy/test_sealed_crypto.py`` to print the vectors recomputed from
``tests/vectors/sealed.json``'s inputs (after a deliberate change of the construction).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import nacl.bindings as sodium
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt.core_errors import MalformedError, NotReaderError, TamperedError
from latticed.crdt.head import queue_id
from latticed.crdt.records import Record, RecordRun
from latticed.crdt.signing import Identity
from latticed.privacy import crypto, meta

ROOT = Path(__file__).resolve().parents[2]  # not support.paths: this file also runs as a script
VECTORS = ROOT / "tests" / "vectors" / "sealed.json"
PRIVACY_DOC = ROOT / "docs" / "privacy.md"

KEY = bytes(range(32))
QID = hashlib.blake2b(b"some queue", digest_size=32).digest()
OWNER = Identity.from_seed(b"\x01" * 32)
READER = Identity.from_seed(b"\x02" * 32)
STRANGER = Identity.from_seed(b"\x03" * 32)


def counter_rand(start: int = 0) -> meta.Random:
    """Distinct, reproducible "random" bytes for wraps."""
    state = [start]

    def rand(n: int) -> bytes:
        state[0] += 1
        return hashlib.blake2b(state[0].to_bytes(8, "big"), digest_size=n if n <= 64 else 64).digest()[:n]

    return rand


def opened(records: list[Record], run: RecordRun, qid: bytes = QID, key: bytes = KEY) -> list[Record]:
    inner = crypto.open_values(qid, run.values, lambda epoch: key)
    return [
        Record(value, k, r.timestamp, headers)
        for (k, value, headers), r in zip(map(crypto.decode_inner, inner), records, strict=True)
    ]


# ------------------------------------------------------------------ envelopes

names = st.text(max_size=8)
records_strategy = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=64),
        key=st.none() | st.binary(max_size=16),
        timestamp=st.integers(-(2**63), 2**63 - 1),
        headers=st.lists(st.tuples(names, st.binary(max_size=16)), max_size=3).map(tuple),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(records=records_strategy, epoch=st.integers(0, crypto.MAX_EPOCH), data=st.data())
def test_seal_then_open_gives_back_key_value_headers_and_keeps_the_nonce_it_was_given(
    records: list[Record], epoch: int, data: st.DataObject
) -> None:
    nonces = data.draw(st.binary(min_size=24 * len(records), max_size=24 * len(records)))
    run = crypto.seal_run(KEY, QID, epoch, records, nonces)
    assert run.keys == (None,) * len(records) and run.headers is None
    assert run.timestamps == tuple(r.timestamp for r in records)
    for i, (record, envelope) in enumerate(zip(records, run.values, strict=True)):
        # The format: version, epoch, exactly the nonce given for this record, then inner + tag.
        assert envelope[0] == crypto.VERSION
        assert crypto.envelope_epoch(envelope) == epoch
        assert crypto.envelope_nonce(envelope) == nonces[24 * i : 24 * (i + 1)]
        inner = crypto.encode_inner(record.key, record.value, record.headers)
        assert len(envelope) == len(inner) + crypto.OVERHEAD
        # Standard XChaCha20-Poly1305 (libsodium through nacl.bindings) opens it, with the documented ad.
        ad = b"latticed/sealed-record/v1\n" + QID + epoch.to_bytes(4, "big")
        plain = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(envelope[29:], ad, envelope[5:29], KEY)
        assert plain == inner
    assert opened(records, run) == records


@settings(max_examples=60, deadline=None)
@given(records=records_strategy, data=st.data())
def test_any_changed_byte_of_an_envelope_is_refused(records: list[Record], data: st.DataObject) -> None:
    run = crypto.seal_run(KEY, QID, 7, records, bytes(24 * len(records)))
    index = data.draw(st.integers(0, len(records) - 1))
    envelope = bytearray(run.values[index])
    at = data.draw(st.integers(0, len(envelope) - 1))
    envelope[at] ^= data.draw(st.integers(1, 255))

    def key_for(epoch: int) -> bytes:
        if epoch != 7:
            raise NotReaderError(f"no key for epoch {epoch}")
        return KEY

    with pytest.raises((TamperedError, MalformedError, NotReaderError)):
        crypto.open_values(QID, [bytes(envelope)], key_for)


def test_an_envelope_opens_only_in_its_queue_with_its_epochs_key() -> None:
    records = [Record(b"v", b"k")]
    run = crypto.seal_run(KEY, QID, 3, records, b"\x09" * 24)
    with pytest.raises(TamperedError):
        crypto.open_values(bytes(32), run.values, lambda epoch: KEY)  # another queue id
    with pytest.raises(TamperedError):
        crypto.open_values(QID, run.values, lambda epoch: bytes(32))  # another key
    with pytest.raises(MalformedError):
        crypto.open_values(QID, [b"not an envelope"], lambda epoch: KEY)


def test_limits_of_what_is_sealed() -> None:
    too_big = Record(b"x" * (crypto.MAX_INNER_BYTES - 1), b"k")  # fits as a record, not as an envelope
    with pytest.raises(MalformedError, match="at most"):
        crypto.seal_run(KEY, QID, 0, [too_big], bytes(24))
    with pytest.raises(MalformedError, match="nonces"):
        crypto.seal_run(KEY, QID, 0, [Record(b"v")], bytes(23))
    with pytest.raises(MalformedError, match="content key"):
        crypto.seal_run(b"short", QID, 0, [Record(b"v")], bytes(24))
    with pytest.raises(MalformedError):
        crypto.decode_inner(b"\x04rest")  # unknown flags
    with pytest.raises(MalformedError):
        crypto.decode_inner(b"\x01\x00\x00\x00\x09ab")  # a key longer than the record


# ------------------------------------------------------------------ wrapped content keys


def test_a_wrap_is_a_libsodium_sealed_box_to_the_readers_x25519_key() -> None:
    wrapped = crypto.wrap_content_key(KEY, READER.public_key, b"\x05" * 32)
    assert len(wrapped) == crypto.WRAP_SIZE
    assert wrapped == crypto.wrap_content_key(KEY, READER.public_key, b"\x05" * 32)  # deterministic
    pk = sodium.crypto_sign_ed25519_pk_to_curve25519(READER.public_key)
    sk = sodium.crypto_sign_ed25519_sk_to_curve25519(READER.seed + READER.public_key)
    assert sodium.crypto_scalarmult_base(sk) == pk == crypto.reader_public_key(READER.public_key)
    assert sodium.crypto_box_seal_open(wrapped, pk, sk) == KEY  # libsodium's own sealed-box opener
    assert crypto.unwrap_content_key(wrapped, READER) == KEY
    with pytest.raises(TamperedError):
        crypto.unwrap_content_key(wrapped, STRANGER)
    with pytest.raises(MalformedError):
        crypto.reader_public_key(bytes(32))  # not a point with an X25519 form


# ------------------------------------------------------------------ key epochs in metadata


def test_epochs_shares_and_rotations_in_metadata() -> None:
    rand = counter_rand()
    first = meta.seal_new(OWNER.public_key, [READER.public_key], KEY, rand)
    sealing = meta.parse(first, OWNER.public_key)
    assert sealing is not None and sealing.current.number == 0 and sealing.current.start == 0
    assert sealing.readers == {OWNER.public_key, READER.public_key}
    wrapped = base64.b64decode(first[meta.wrap_key(0, READER.public_key)])
    assert crypto.unwrap_content_key(wrapped, READER) == KEY

    second_key = bytes(range(1, 33))
    rotated = {**first, **meta.rotate(sealing, second_key, sealing.readers - {READER.public_key}, 40, rand)}
    after = meta.parse(rotated, OWNER.public_key)
    assert after is not None and after.current.number == 1 and after.current.start == 40
    assert after.readers == {OWNER.public_key}
    assert READER.public_key in after.epochs[0].wraps  # what it could read, it still can
    assert after.epoch_at(39).number == 0 and after.epoch_at(40).number == 1

    shared = meta.share(after, STRANGER.public_key, {0: KEY, 1: second_key}, rand)
    assert set(shared) == {meta.wrap_key(0, STRANGER.public_key), meta.wrap_key(1, STRANGER.public_key)}
    assert meta.share(after, OWNER.public_key, {0: KEY, 1: second_key}, rand) == {}
    assert meta.parse({"team": "shop"}, OWNER.public_key) is None
    assert meta.is_reserved("sealed.epoch") and not meta.is_reserved("sealedness")


@pytest.mark.parametrize(
    "broken",
    [
        {"sealed.epoch": "01"},
        {"sealed.epoch": "1"},  # epoch 0's start is missing
        {"sealed.epoch": "0", "sealed.epoch.0": "x"},
        {"sealed.epoch": "0", "sealed.epoch.0": "0"},  # not wrapped to its owner
        {"sealed.epoch": "0", "sealed.epoch.0": "0", "sealed.key.1.00": "AA=="},
        {"sealed.epoch": "4294967296"},
    ],
)
def test_broken_sealing_metadata_is_refused(broken: dict[str, str]) -> None:
    with pytest.raises(MalformedError):
        meta.parse(broken, OWNER.public_key)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["sealed.epoch", "sealed.epoch.0", "sealed.epoch.1", "sealed.key.0.", "sealed.x"]
        ).flatmap(lambda k: st.just(k) if not k.endswith(".") else st.text(max_size=70).map(lambda t: k + t)),
        st.text(max_size=12) | st.sampled_from(["0", "1", "7", base64.b64encode(bytes(80)).decode()]),
    )
)
def test_parsing_any_sealing_metadata_gives_a_sealing_or_a_typed_error(raw: dict[str, str]) -> None:
    try:
        sealing = meta.parse(raw, OWNER.public_key)
    except MalformedError:
        return
    assert sealing is None or OWNER.public_key in sealing.readers


# ------------------------------------------------------------------ test vectors (docs/privacy.md)


def compute_vectors(inputs: dict[str, str]) -> dict[str, str]:
    """Every derived value of the vectors, from their inputs, through the code."""
    owner = Identity.from_seed(bytes.fromhex(inputs["owner_seed"]))
    reader = Identity.from_seed(bytes.fromhex(inputs["reader_seed"]))
    content_key = bytes.fromhex(inputs["content_key"])
    epoch = int(inputs["epoch"])
    qid = queue_id(owner.public_key, inputs["queue_name"])
    record = Record(
        inputs["value"].encode(),
        inputs["key"].encode(),
        0,
        ((inputs["header_name"], inputs["header_value"].encode()),),
    )
    bare = Record(inputs["bare_value"].encode())
    nonces = bytes.fromhex(inputs["nonce"]) + bytes.fromhex(inputs["bare_nonce"])
    run = crypto.seal_run(content_key, qid, epoch, [record, bare], nonces)
    wrapped = crypto.wrap_content_key(
        content_key, reader.public_key, bytes.fromhex(inputs["ephemeral_secret"])
    )
    return {
        "owner_public_key": owner.public_key.hex(),
        "reader_public_key": reader.public_key.hex(),
        "reader_x25519_public": crypto.reader_public_key(reader.public_key).hex(),
        "reader_x25519_secret": crypto.reader_secret_key(reader).hex(),
        "queue_id": qid.hex(),
        "associated_data": crypto.associated_data(qid, epoch).hex(),
        "inner": crypto.encode_inner(record.key, record.value, record.headers).hex(),
        "envelope": run.values[0].hex(),
        "bare_inner": crypto.encode_inner(None, bare.value, ()).hex(),
        "bare_envelope": run.values[1].hex(),
        "wrapped_key": wrapped.hex(),
        "wrap_meta_key": meta.wrap_key(epoch, reader.public_key),
        "wrap_meta_value": base64.b64encode(wrapped).decode(),
    }


def load_vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTORS.read_text())
    return data


def test_vectors_match_code() -> None:
    vectors = load_vectors()
    assert compute_vectors(vectors["inputs"]) == vectors["outputs"]


def test_vectors_match_privacy_doc() -> None:
    """docs/privacy.md lists exactly the JSON's values, in its fenced ``test-vectors`` block."""
    vectors = load_vectors()
    block = re.search(r"```text test-vectors\n(.*?)```", PRIVACY_DOC.read_text(), re.S)
    assert block, "docs/privacy.md lacks its test-vectors block"
    listed = dict(line.split(" = ", 1) for line in block.group(1).splitlines() if " = " in line)
    expected = {**vectors["inputs"], **vectors["outputs"]}
    assert {k: v.strip().strip('"') for k, v in listed.items()} == expected


def test_vectors_by_hand() -> None:
    """The envelope and the wrap from the vectors, opened with bare libsodium calls and the documented
    layouts, independently of latticed.privacy."""
    vectors = load_vectors()
    inp, out = vectors["inputs"], vectors["outputs"]
    qid = bytes.fromhex(out["queue_id"])
    owner_pk = bytes.fromhex(out["owner_public_key"])
    name = inp["queue_name"].encode()
    assert (
        qid
        == hashlib.blake2b(
            b"\x00" + owner_pk + bytes([len(name)]) + name, digest_size=32, person=b"latticed.qid.v1"
        ).digest()
    )
    epoch = int(inp["epoch"]).to_bytes(4, "big")
    ad = b"latticed/sealed-record/v1\n" + qid + epoch
    assert ad.hex() == out["associated_data"]
    envelope = bytes.fromhex(out["envelope"])
    assert envelope[:5] == b"\x01" + epoch and envelope[5:29] == bytes.fromhex(inp["nonce"])
    inner = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(
        envelope[29:], ad, envelope[5:29], bytes.fromhex(inp["content_key"])
    )
    key, header_name, header_value, value = (
        inp[k].encode() for k in ("key", "header_name", "header_value", "value")
    )
    assert inner == (
        b"\x03"
        + len(key).to_bytes(4, "big")
        + key
        + b"\x00\x01"
        + len(header_name).to_bytes(2, "big")
        + len(header_value).to_bytes(4, "big")
        + header_name
        + header_value
        + value
    )
    wrapped = bytes.fromhex(out["wrapped_key"])
    epk = sodium.crypto_scalarmult_base(bytes.fromhex(inp["ephemeral_secret"]))
    assert wrapped[:32] == epk
    pk, sk = bytes.fromhex(out["reader_x25519_public"]), bytes.fromhex(out["reader_x25519_secret"])
    assert sodium.crypto_box_seal_open(wrapped, pk, sk) == bytes.fromhex(inp["content_key"])


if __name__ == "__main__":
    json.dump({**load_vectors(), "outputs": compute_vectors(load_vectors()["inputs"])}, sys.stdout, indent=2)
    sys.stdout.write("\n")
