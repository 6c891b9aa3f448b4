"""The optional compiled batch sealer (latticed/privacy/_seal_build.py): the same envelopes, byte for byte,
as the pure-Python path, which stays the fallback where it was not built.

Where it is missing these tests skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by .ci/run: CI installs
with a compiler) makes them fail instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import not_built
from support.paths import ROOT

from latticed.crdt.core_errors import MalformedError, NotReaderError, TamperedError
from latticed.crdt.head import queue_id
from latticed.crdt.records import Record, RecordRun, check_records
from latticed.crdt.signing import Identity
from latticed.host.checklist import check_sealer, daemon_checks
from latticed.host.config import DaemonConfig
from latticed.privacy import compiled, crypto

KEY = bytes(range(32))
QID = hashlib.blake2b(b"some queue", digest_size=32).digest()


@pytest.fixture(scope="module")
def built() -> None:
    """Skip where the compiled sealer was not built, unless it is required there."""
    if not crypto.accelerated():
        not_built("the compiled sealer latticed.privacy._sealbatch")


@contextmanager
def sealer(*, accel: bool) -> Iterator[None]:
    """Seal and open with the compiled sealer or without."""
    saved = crypto._compiled
    if not accel:
        crypto._compiled = None
    try:
        yield
    finally:
        crypto._compiled = saved


def seal(records: list[Record], nonces: bytes, epoch: int = 5, key: bytes = KEY, **how: Any) -> RecordRun:
    with sealer(**how):
        return crypto.seal_run(key, QID, epoch, records, nonces)


names = st.text(max_size=8)
values = st.binary(max_size=64) | st.just(b"") | st.binary(min_size=4000, max_size=70_000)
records_strategy = st.lists(
    st.builds(
        Record,
        value=values,
        key=st.none() | st.binary(max_size=16),
        timestamp=st.integers(-(2**63), 2**63 - 1),
        headers=st.lists(st.tuples(names, st.binary(max_size=16)), max_size=3).map(tuple),
    )
    | st.builds(Record, value=values),  # bare values: the common case, its own path
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    records=records_strategy,
    key=st.binary(min_size=32, max_size=32),
    epoch=st.integers(0, crypto.MAX_EPOCH),
    data=st.data(),
)
def test_the_compiled_sealer_writes_the_pure_python_envelopes_and_they_open(
    built: None, records: list[Record], key: bytes, epoch: int, data: st.DataObject
) -> None:
    nonces = data.draw(st.binary(min_size=24 * len(records), max_size=24 * len(records)))
    fast = seal(records, nonces, epoch, key, accel=True)
    slow = seal(records, nonces, epoch, key, accel=False)
    assert fast.values == slow.values  # byte for byte
    assert fast == slow and fast.timestamps == tuple(r.timestamp for r in records)
    check_records(fast)
    inner = [crypto.encode_inner(r.key, r.value, r.headers) for r in records]
    for how in (True, False):  # the compiled and the pure-Python opener give back each inner record
        with sealer(accel=how):
            assert crypto.open_values(QID, fast.values, lambda e: key) == inner


def test_a_bare_record_seals_to_the_documented_vector_on_both_paths(built: None) -> None:
    """docs/privacy.md's bare_envelope (tests/vectors/sealed.json), from the compiled sealer too."""
    vectors = json.loads((ROOT / "tests" / "vectors" / "sealed.json").read_text())
    inputs, outputs = vectors["inputs"], vectors["outputs"]
    owner = Identity.from_seed(bytes.fromhex(inputs["owner_seed"]))
    qid = queue_id(owner.public_key, inputs["queue_name"])
    record = Record(inputs["bare_value"].encode())
    for how in (True, False):
        with sealer(accel=how):
            run = crypto.seal_run(
                bytes.fromhex(inputs["content_key"]),
                qid,
                int(inputs["epoch"]),
                [record],
                bytes.fromhex(inputs["bare_nonce"]),
            )
        assert run.values[0].hex() == outputs["bare_envelope"]


def test_the_compiled_opener_opens_each_epoch_with_its_key_and_names_a_tampered_record(
    built: None,
) -> None:
    keys = {0: bytes(32), 1: KEY, 2: bytes(range(1, 33))}
    records = [Record(bytes([i]) * i, b"k" if i % 3 else None) for i in range(30)]
    values: list[bytes] = []
    for epoch, part in ((0, records[:10]), (1, records[10:25]), (0, records[25:]), (2, records[:1])):
        values += seal(part, os.urandom(24 * len(part)), epoch, keys[epoch], accel=True).values
    opened = crypto.open_values(QID, values, keys.__getitem__)
    expected = [crypto.encode_inner(r.key, r.value, r.headers) for r in records + records[:1]]
    assert opened == expected

    tampered = list(values)
    broken = bytearray(tampered[12])
    broken[-1] ^= 1  # the tag of a record of epoch 1
    tampered[12] = bytes(broken)
    with pytest.raises(TamperedError, match="key epoch 1"):
        crypto.open_values(QID, tampered, keys.__getitem__)

    def only_epoch_0(epoch: int) -> bytes:
        if epoch:
            raise NotReaderError(f"no key for epoch {epoch}")
        return keys[0]

    with pytest.raises(NotReaderError):
        crypto.open_values(QID, values, only_epoch_0)
    with pytest.raises(MalformedError):
        crypto.open_values(QID, [*values[:3], b"\x01short"], keys.__getitem__)


def test_the_compiled_sealer_refuses_what_the_python_one_refuses(built: None) -> None:
    fits = Record(b"x" * (crypto.MAX_INNER_BYTES - 1))  # + the flags byte: exactly the most an envelope holds
    too_big = Record(b"x" * (crypto.MAX_INNER_BYTES - 5), b"k")
    for how in (True, False):
        run = seal([fits], bytes(24), accel=how)
        assert len(run.values[0]) == crypto.MAX_INNER_BYTES + crypto.OVERHEAD
        with pytest.raises(MalformedError, match="at most"):
            seal([Record(b"v"), too_big], bytes(48), accel=how)
        with pytest.raises(MalformedError, match="nonces"):
            seal([Record(b"v")], bytes(25), accel=how)
    assert seal([], b"", accel=True) == seal([], b"", accel=False) == RecordRun([], [], [])


def test_the_c_helpers_refuse_sizes_that_disagree_before_writing(built: None) -> None:
    """The bounds the C code trusts are checked in C too: a wrong size returns -1 and writes nothing."""
    assert crypto._compiled is not None and compiled.OVERHEAD == crypto.OVERHEAD
    ffi, lib = crypto._compiled.ffi, crypto._compiled.lib
    ad = crypto.associated_data(QID, 0)
    lengths = ffi.new("uint32_t[]", [3, 4])
    out = bytearray(7 + 2 * crypto.OVERHEAD + 2)
    bounds = ffi.new("uint64_t[]", 3)
    args = (crypto._compiled.encrypt, KEY, ad, len(ad), b"\x01\0\0\0\0", b"\0", 1)

    def seal_batch(parts: bytes, nonces: bytes, out_size: int) -> int:
        status: int = lib.latticed_seal_batch(
            *args, parts, len(parts), lengths, 2, crypto.MAX_INNER_BYTES, nonces, len(nonces),
            ffi.from_buffer(out), out_size, bounds,
        )  # fmt: skip
        return status

    assert seal_batch(b"abcdefgh", bytes(48), len(out)) == -1  # parts longer than the lengths say
    assert seal_batch(b"abcdefg", bytes(47), len(out)) == -1  # a nonce short
    assert seal_batch(b"abcdefg", bytes(48), len(out) - 1) == -1  # no room for the last tag
    assert out == bytearray(len(out))
    assert seal_batch(b"abcdefg", bytes(48), len(out)) == 0 and list(bounds) == [0, 49, 99]

    envelopes = bytes(out)
    sizes = ffi.new("uint32_t[]", [49, 50])
    buffer = bytearray(9)
    opened = ffi.from_buffer(buffer)
    decrypt = crypto._compiled.decrypt
    assert lib.latticed_open_batch(decrypt, KEY, ad, len(ad), envelopes, 99, sizes, 2, opened, 9) == 0
    assert buffer == b"\0abc\0defg"
    short = ffi.new("uint32_t[]", [44, 55])  # an "envelope" shorter than the overhead
    assert lib.latticed_open_batch(decrypt, KEY, ad, len(ad), envelopes, 99, short, 2, opened, 9) == -1
    assert lib.latticed_open_batch(decrypt, KEY, ad, len(ad), envelopes, 98, sizes, 2, opened, 9) == -1
    flipped = envelopes[:60] + bytes([envelopes[60] ^ 1]) + envelopes[61:]
    assert lib.latticed_open_batch(decrypt, KEY, ad, len(ad), flipped, 99, sizes, 2, opened, 9) == 2


def test_without_the_compiled_sealer_the_pure_python_path_seals_the_same_bytes() -> None:
    """A Python where the extension does not import (not built: no compiler at install) falls back."""
    script = (
        "import sys\n"
        "sys.modules['latticed.privacy._sealbatch'] = None  # import fails, as when it was not built\n"
        "from latticed.crdt.records import Record\n"
        "from latticed.privacy import crypto\n"
        "assert not crypto.accelerated()\n"
        "records = [Record(b'v' * 300, b'k'), Record(b'')] * 300\n"
        "run = crypto.seal_run(bytes(range(32)), bytes(32), 9, records, bytes(range(24)) * 600)\n"
        "assert crypto.open_values(bytes(32), run.values, lambda e: bytes(range(32)))[1] == b'\\0'\n"
        "print(run.values[0].hex(), run.values[1].hex())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", script]
    out = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    here = crypto.seal_run(KEY, bytes(32), 9, [Record(b"v" * 300, b"k"), Record(b"")], bytes(range(24)) * 2)
    assert out.stdout.split() == [value.hex() for value in here.values]


def test_the_daemon_doctor_says_which_sealer_it_uses(tmp_path: Path) -> None:
    assert check_sealer(True).ok is True
    slow = check_sealer(False)
    assert slow.ok is None and "pure-Python" in slow.detail  # optional: not a problem doctor fails on
    config = DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock")
    facts: dict[str, Any] = {"public_key": False, "listen": None, "advertised": [], "peers": []}
    facts |= {"forks": [], "skew": [], "disk": None}
    rows = daemon_checks(config, sealer_accelerated=crypto.accelerated(), **facts)
    assert [(c.check, c.ok) for c in rows if c.check == "sealer"] == [
        ("sealer", True if crypto.accelerated() else None)
    ]
    assert "sealer" not in {c.check for c in daemon_checks(config, **facts)}
