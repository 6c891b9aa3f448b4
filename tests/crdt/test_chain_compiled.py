"""The optional compiled chain hasher (latticed/crdt/_chain_build.py): the same chain values, byte for byte,
as the pure-Python path (and as the per-record definition, ``record_digest`` and ``chain_next``), which
stays the fallback where it was not built.

Where it is missing the tests that need it skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by .ci/run: CI
installs with a compiler) makes them fail instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required
from support.chains import by_definition
from support.paths import ROOT

from latticed.crdt import chain_compiled
from latticed.crdt import records as records_module
from latticed.crdt.records import Record, RecordRun, chain_extend


@pytest.fixture(scope="module")
def built() -> None:
    """Skip where the compiled chain hasher was not built, unless it is required there."""
    required(chain_compiled.load(), "the compiled chain hasher latticed.crdt._chainhash")


@pytest.fixture
def python_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make ``chain_extend`` take its pure-Python path, as where the extension was not built."""
    monkeypatch.setattr(chain_compiled, "load", lambda: None)
    yield


def python_chain(base: bytes, first: int, records: object) -> list[bytes]:
    saved = chain_compiled.load
    chain_compiled.load = lambda: None  # type: ignore[assignment]
    try:
        return chain_extend(base, first, records)  # type: ignore[arg-type]
    finally:
        chain_compiled.load = saved  # type: ignore[assignment]


names = st.text(max_size=12)
header_lists = st.lists(st.tuples(names, st.binary(max_size=40)), max_size=3).map(tuple)
record_lists = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=300),
        key=st.none() | st.binary(max_size=40),
        timestamp=st.integers(-(2**63), 2**63 - 1),
        headers=header_lists,
    ),
    min_size=5,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    records=record_lists,
    base=st.binary(min_size=32, max_size=32),
    first=st.integers(0, 2**63 - 100),
    shared=st.none() | header_lists,
)
def test_the_compiled_chain_equals_the_python_chain_and_the_definition(
    built: None, records: list[Record], base: bytes, first: int, shared: tuple[tuple[str, bytes], ...] | None
) -> None:
    """Random records (keys or none, any timestamps, mixed headers, or one set of headers shared by all,
    as a producer's records carry) give the same chain values through C, through Python and one at a
    time by the definition; as a run and as a list of records."""
    if shared is not None:
        records = [Record(r.value, r.key, r.timestamp, shared) for r in records]
    expected = by_definition(base, first, records)
    assert python_chain(base, first, RecordRun.of(records)) == expected
    assert chain_extend(base, first, RecordRun.of(records)) == expected
    assert chain_extend(base, first, records) == expected


def test_a_big_batch_of_keyed_records_hashes_alike(built: None) -> None:
    """A sink's chunk: 10,000 keyed records of 100 B with the producer header on each, past the Python
    path's 1,024-record steps."""
    n = 10_000
    run = RecordRun(
        [b"x" * 88 + b"%012d" % i for i in range(n)],
        [b"%d" % i for i in range(n)],
        [1_700_000_000_000 + i for i in range(n)],
        [(("lattice.producer", b"ab" * 32),)] * n,
    )
    base = bytes(range(32))
    assert chain_extend(base, 12_345, run) == python_chain(base, 12_345, run)


@pytest.mark.parametrize("n", [2_047, 2_048, 5_003])
def test_a_batch_digested_on_two_threads_chains_alike(built: None, n: int) -> None:
    """From 2,048 records a helper thread digests chunks of 128 beside the caller: ragged columns (keys
    or none, values and headers of every length, each record its own headers) across the chunks' edges
    give the chain of the Python path, whichever thread digested which chunk."""
    run = RecordRun(
        [b"v" * (i % 300) for i in range(n)],
        [None if i % 7 == 0 else b"k" * (i % 13) for i in range(n)],
        [i * 1_000 for i in range(n)],
        [(("h", b"x" * (i % 5)),) if i % 3 else () for i in range(n)],
    )
    base = bytes(range(32))
    assert chain_extend(base, 77, run) == python_chain(base, 77, run)


def test_batches_hashed_from_several_threads_at_once_chain_alike(built: None) -> None:
    """The daemon verifies on the event loop's workers while its storage thread signs: concurrent calls,
    each with its own helper, do not mix their chunks."""
    runs = [
        RecordRun([b"%d-%d" % (t, i) for i in range(4_000)], [None] * 4_000, [t] * 4_000) for t in range(4)
    ]
    expected = [python_chain(bytes(32), 0, run) for run in runs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert list(pool.map(lambda run: chain_extend(bytes(32), 0, run), runs)) == expected


def test_columns_the_c_call_cannot_take_go_the_python_way(built: None) -> None:
    """A timestamp past 64 bits or a value that is not bytes: the Python path decides (and raises what it
    always raised); the compiled call is never given it."""
    base = bytes(32)
    wide = RecordRun([b"v"] * 6, [None] * 6, [2**64] * 6)
    with pytest.raises(Exception) as from_python:
        python_chain(base, 0, wide)
    with pytest.raises(type(from_python.value)):
        chain_extend(base, 0, wide)
    assert chain_compiled.extend(
        chain_compiled.load(),  # type: ignore[arg-type]
        records_module._PERSONS, base, 0, values=[b"v"] * 6, keys=[None] * 6, timestamps=[2**64] * 6,
        tails=b"\0\0",
    ) is None  # fmt: skip
    assert chain_compiled.extend(
        chain_compiled.load(),  # type: ignore[arg-type]
        records_module._PERSONS, base, 0, values=["text"] * 6, keys=[None] * 6, timestamps=[0] * 6,
        tails=b"\0\0",
    ) is None  # fmt: skip


@pytest.mark.parametrize("stamp", [0, -1, 1_700_000_000_000, 2**63 - 1, -(2**63)])
def test_one_clock_reading_on_every_record_chains_as_the_definition(built: None, stamp: int) -> None:
    """A batch's timestamps all equal (the owner's clock): the int64 column is built by repeating the
    first, the chain is the same; a mixed column and one with a bool are converted item by item."""
    records = [Record(b"v%d" % i, b"k" if i % 2 else None, stamp, ()) for i in range(300)]
    expected = by_definition(bytes(32), 9, records)
    assert (
        chain_extend(bytes(32), 9, RecordRun.of(records)) == expected == python_chain(bytes(32), 9, records)
    )
    mixed = [*records[:-1], Record(b"last", None, 5, ())]
    assert chain_extend(bytes(32), 9, RecordRun.of(mixed)) == by_definition(bytes(32), 9, mixed)
    with_bool = [Record(b"v", None, 1, ()), Record(b"w", None, True, ())]
    assert chain_extend(bytes(32), 0, with_bool) == python_chain(bytes(32), 0, with_bool)


def test_the_python_path_is_used_when_the_extension_is_missing(python_only: None) -> None:
    records = [
        Record(b"v%d" % i, b"k" if i % 2 else None, i, (("h", b"x"),) if i % 3 else ()) for i in range(9)
    ]
    assert chain_extend(bytes(32), 4, RecordRun.of(records)) == by_definition(bytes(32), 4, records)


def test_without_the_compiled_chain_hasher_the_chain_is_the_same() -> None:
    """A Python where the extension does not import (not built: no compiler at install) falls back."""
    script = (
        "import sys\n"
        "sys.modules['latticed.crdt._chainhash'] = None  # import fails, as when it was not built\n"
        "from latticed.crdt import chain_compiled\n"
        "from latticed.crdt.records import Record, chain_extend\n"
        "assert chain_compiled.load() is None\n"
        "records = [Record(b'v' * 300, b'k', 5), Record(b'', None, 6, (('h', b'x'),))] * 300\n"
        "print(chain_extend(bytes(32), 9, records)[-1].hex())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    records = [Record(b"v" * 300, b"k", 5), Record(b"", None, 6, (("h", b"x"),))] * 300
    assert out.stdout.split() == [by_definition(bytes(32), 9, records)[-1].hex()]
