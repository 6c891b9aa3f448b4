"""The optional column passes in C (latticed/crdt/_columns.c): every path that uses them gives what its
pure-Python path gives — the same runs, verdicts and error messages for an offer's records, the same
retry digests, chain values, signed slices, stored segment bytes — and the pure-Python path stays
the fallback where the extension was not built.

Where it is missing the tests that need it skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by .ci/run: CI
installs with a compiler) makes them fail instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required

from latticed.crdt import chain_compiled, columns_compiled
from latticed.crdt import queue as core
from latticed.crdt.core_errors import NotOwnerError
from latticed.crdt.queue.commit import _commit_once, checkpoint_cuts
from latticed.crdt.records import MAX_KEY_BYTES, MAX_VALUE_BYTES, RecordRun, chain_extend
from latticed.crdt.signing import Identity
from latticed.errors import LatticedError
from latticed.produce.dedup import offered_digest, packed_size
from latticed.produce.owner import MAX_RECORDS, _plain_run, produced_run, retry_digest
from latticed.storage import segments

OWNER = Identity.from_seed(bytes(range(32)))
PRODUCER = "ab" * 32
T = TypeVar("T")


@pytest.fixture(scope="module")
def built() -> Any:
    """The compiled module; skip where it was not built, unless it is required there."""
    return required(columns_compiled.load(), "the compiled column passes latticed.crdt._columns")


def python_only(call: Callable[[], T]) -> T:
    """``call()`` as where the extension was not built (every user loads it through ``load``)."""
    saved = columns_compiled.load
    columns_compiled.load = lambda: None  # type: ignore[assignment]
    try:
        return call()
    finally:
        columns_compiled.load = saved  # type: ignore[assignment]


def outcome(call: Callable[[], T]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except LatticedError as exc:
        return type(exc).__name__, str(exc)


# Records as a producer sends them: mostly the sink's [value, key, []], sometimes anything else.
plain_records = st.lists(
    st.tuples(st.binary(max_size=300), st.none() | st.binary(max_size=300), st.sampled_from([[], None])).map(
        list
    ),
    min_size=1,
    max_size=40,
)
odd_item = st.one_of(
    st.just("text"),
    st.integers(),
    st.just([["h", b"v"]]),
    st.just([["lattice.producer", b"x"]]),
    st.just({}),
    st.tuples(st.binary(max_size=3)),
)


@st.composite
def offered_records(draw: st.DrawFn) -> Any:
    raw = draw(plain_records)
    spoil = draw(st.integers(0, 6))
    if spoil == 1:  # one record of another shape
        i = draw(st.integers(0, len(raw) - 1))
        raw[i] = draw(st.sampled_from([tuple(raw[i]), raw[i][:2], [*raw[i], 5], [*raw[i], None], "r"]))
    elif spoil == 2:  # one item of another type
        i, j = draw(st.integers(0, len(raw) - 1)), draw(st.integers(0, 2))
        raw[i][j] = draw(odd_item)
    elif spoil == 3:
        return draw(st.sampled_from([[], (), None, "records", tuple(raw)]))
    elif spoil == 4:  # timestamps on every record
        raw = [[*r, draw(st.none() | st.integers(-5, 2**40))] for r in raw]
    return raw


def run_columns(run: RecordRun) -> tuple[Any, ...]:
    return run.values, run.keys, run.timestamps, run.headers, run._checked


@settings(max_examples=400, deadline=None)
@given(raw=offered_records(), now=st.integers(0, 2**62))
def test_an_offer_becomes_the_run_the_python_path_makes(built: Any, raw: Any, now: int) -> None:
    """The same run (columns, and checked), or the same refusal with the same message, and the same
    retry digest from the bytes the records came in, as the definition gives (packing them anew)."""
    expected = outcome(lambda: python_only(lambda: produced_run(raw, PRODUCER, now)))
    got = outcome(lambda: produced_run(raw, PRODUCER, now))
    if expected[0] != "ok":
        assert got == expected
        return
    assert got[0] == "ok"
    assert run_columns(got[1]) == run_columns(expected[1])
    plain = _plain_run(raw, PRODUCER, now)
    if plain is None:
        return
    run, size = plain
    packed = msgpack.packb(raw, use_bin_type=True)
    assert size == len(packed) == packed_size(run.values, run.keys)
    defined = offered_digest(raw)
    assert retry_digest(raw, run, packed, size) == defined == retry_digest(raw, run, packed)
    longer = packed[:-1] + b"\xc4\x00"  # not the bytes packing gives: packed anew, the same digest
    assert retry_digest(raw, run, memoryview(longer), size) == defined


def test_records_past_the_limits_go_the_python_way(built: Any) -> None:
    """A value, key or record count past the limits is not split in C: the Python path refuses it with
    its own words."""
    cases = [
        [[b"v" * (MAX_VALUE_BYTES + 1), None, []]],
        [[b"v", b"k" * (MAX_KEY_BYTES + 1), []]],
        [[b"v", None, []]] * (MAX_RECORDS + 1),
    ]
    for raw in cases:
        assert built.offered(raw, MAX_RECORDS, MAX_VALUE_BYTES, MAX_KEY_BYTES) is None
        expected = outcome(lambda raw=raw: python_only(lambda: produced_run(raw, PRODUCER, 1)))
        assert expected[0] == "MalformedError"
        assert outcome(lambda raw=raw: produced_run(raw, PRODUCER, 1)) == expected
    at_limits = [[b"v" * MAX_VALUE_BYTES, b"k" * MAX_KEY_BYTES, []]]
    split = built.offered(at_limits, MAX_RECORDS, MAX_VALUE_BYTES, MAX_KEY_BYTES)
    assert split is not None and split[2] == len(msgpack.packb(at_limits))


def test_a_clock_or_producer_the_plain_path_does_not_take_goes_the_python_way(built: Any) -> None:
    raw = [[b"v", b"k", []]]
    assert _plain_run(raw, PRODUCER, -1) is None
    assert _plain_run(raw, PRODUCER, 2**63) is None
    assert _plain_run(raw, "x" * 2000, 1) is None
    wide = outcome(lambda: produced_run(raw, PRODUCER, 2**63))
    assert wide == outcome(lambda: python_only(lambda: produced_run(raw, PRODUCER, 2**63)))
    assert wide[0] == "MalformedError"


def reference_cuts(records: RecordRun, checkpoint_bytes: int) -> list[int]:
    """The definition: a slice ends after the record that brings it to ``checkpoint_bytes``, unless that
    record is the last."""
    cuts, size = [], 0
    for index, record in enumerate(records):
        size += len(record.value) + len(record.key or b"")
        if size >= checkpoint_bytes and index < len(records) - 1:
            cuts.append(index + 1)
            size = 0
    return cuts


sized_runs = st.lists(
    st.tuples(st.binary(max_size=30), st.none() | st.binary(max_size=30)), min_size=0, max_size=80
).map(lambda rows: RecordRun([v for v, _ in rows], [k for _, k in rows], [1] * len(rows)))


@settings(max_examples=500, deadline=None)
@given(run=sized_runs, checkpoint_bytes=st.integers(0, 200))
def test_the_signed_slices_are_cut_alike(built: Any, run: RecordRun, checkpoint_bytes: int) -> None:
    expected = reference_cuts(run, checkpoint_bytes)
    assert checkpoint_cuts(run, checkpoint_bytes) == expected
    assert python_only(lambda: checkpoint_cuts(run, checkpoint_bytes)) == expected
    assert python_only(lambda: checkpoint_cuts(list(run), checkpoint_bytes)) == expected


def commit_slice_by_slice(
    state: core.QueueState, records: RecordRun, checkpoint_bytes: int
) -> core.QueueState:
    """The definition of a commit past ``checkpoint_bytes``: one signed head per slice, each slice
    chained and appended in turn."""
    first = 0
    for cut in reference_cuts(records, checkpoint_bytes):
        state = _commit_once(state, OWNER, now_ms=7, records=records[first:cut])
        first = cut
    return _commit_once(state, OWNER, now_ms=7, records=records[first:])


@settings(max_examples=60, deadline=None)
@given(run=sized_runs, before=sized_runs, checkpoint_bytes=st.integers(1, 120))
def test_a_commit_in_slices_signs_what_slice_by_slice_signs(
    run: RecordRun, before: RecordRun, checkpoint_bytes: int
) -> None:
    """One chain pass and one extension of the entries for the whole batch: the same heads, checkpoints,
    records and chain values as chaining and appending each slice in turn (after some records already
    held, and through either path of the column passes)."""
    state = core.empty_state(OWNER.public_key, "q")
    if len(before):
        state = core.commit(state, OWNER, now_ms=3, records=before)
    expected = commit_slice_by_slice(state, run, checkpoint_bytes)

    def attempt() -> core.QueueState:
        return core.commit(state, OWNER, now_ms=7, records=run, checkpoint_bytes=checkpoint_bytes)

    for got in (attempt(), python_only(attempt)):
        assert got.head == expected.head and got.tip == expected.tip
        assert got.checkpoints == expected.checkpoints
        assert got.entries.records() == expected.entries.records()
        n = len(expected.entries)
        assert [got.entries.chain(i) for i in range(n)] == [expected.entries.chain(i) for i in range(n)]


def test_a_commit_refused_before_its_slices_are_chained() -> None:
    """Not the owner, or a state missing records: refused as the first slice was, nothing computed."""
    other = Identity.from_seed(bytes(32))
    state = core.empty_state(OWNER.public_key, "q")
    run = RecordRun([b"x" * 10] * 10, [None] * 10, [1] * 10)
    with pytest.raises(NotOwnerError):
        core.commit(state, other, now_ms=1, records=run, checkpoint_bytes=20)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.binary(max_size=300), min_size=5, max_size=40),
    keyed=st.sampled_from(["all", "none", "some"]),
    base=st.binary(min_size=32, max_size=32),
)
def test_the_chain_from_packed_columns_is_the_chain(
    built: Any, values: list[bytes], keyed: str, base: bytes
) -> None:
    """The compiled chain hasher fed by the C column layout (and cut by it) gives the values it gives
    fed by the Python layout."""
    keys = [
        (b"k%d" % i if keyed == "all" or (keyed == "some" and i % 2) else None) for i in range(len(values))
    ]
    run = RecordRun(values, keys, range(len(values)))
    assert chain_compiled.load() is not None, "the chain hasher is built with the column passes"
    assert chain_extend(base, 9, run) == python_only(lambda: chain_extend(base, 9, run))


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.binary(max_size=40), max_size=20),
    keys=st.lists(st.none() | st.binary(max_size=40), max_size=20),
    stamps=st.lists(st.sampled_from([0, 1, 2**62, True, False, -3]), max_size=20),
    as_tuple=st.booleans(),
)
def test_the_segment_column_passes_are_the_python_ones(
    built: Any, values: list[bytes], keys: list[bytes | None], stamps: list[Any], as_tuple: bool
) -> None:
    n = min(len(values), len(keys))
    values, keys = values[:n], keys[:n]
    segment = segments.Segment(0, keys, values, [1] * n, [None] * n, bytes(32 * n))
    assert segments._largest_record(segment) == python_only(lambda: segments._largest_record(segment))
    column: Any = tuple(stamps) if as_tuple else stamps
    assert (
        segments._pack_same(column)
        == msgpack.packb(column)
        == python_only(lambda: segments._pack_same(column))
    )
    same = [stamps[0]] * len(stamps) if stamps else []
    assert segments._pack_same(same) == msgpack.packb(same) == python_only(lambda: segments._pack_same(same))


# Lengths either side of msgpack's edges: fixarray/array16 (16 items), bin8/bin16 (256 B), bin16/bin32.
edge_bytes = st.sampled_from([0, 1, 255, 256, 65535, 65536]).map(lambda n: b"v" * n) | st.binary(max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(edge_bytes, max_size=20) | st.lists(st.binary(max_size=3), min_size=15, max_size=17),
    keys=st.lists(st.none() | edge_bytes, min_size=20, max_size=20),
    headers=st.sampled_from([None, [["lattice.producer", b"p" * 40]]]),
    as_tuple=st.booleans(),
)
def test_a_segment_packed_in_one_pass_is_the_python_bytes(
    built: Any, values: list[bytes], keys: list[bytes | None], headers: Any, as_tuple: bool
) -> None:
    n = len(values)
    columns: Any = (tuple(keys[:n]), tuple(values)) if as_tuple else (keys[:n], values)
    segment = segments.Segment(7, *columns, [5] * n, [headers] * n, bytes(32 * n))
    stored = [headers] * n if headers is None or n == 0 else [headers] + [True] * (n - 1)  # schema 9
    expected = (n, bytes(32 * n), msgpack.packb([keys[:n], values, [5] * n, stored]))
    assert segment.encode() == expected == python_only(segment.encode)
    assert segments.Segment.decode(7, *segment.encode()) == segments.Segment(
        7, keys[:n], values, [5] * n, [headers] * n, bytes(32 * n)
    )


def test_odd_columns_are_left_to_python(built: Any) -> None:
    assert built.packed((b"v", "text"), (None, None)) is None
    assert built.packed((b"v",), (None, None)) is None
    assert built.cuts((b"v", 3), (None, None), 1) is None
    assert built.widest([b"v", "text"], [None, None]) is None
    assert built.widest([b"v"], [7]) is None
    assert built.same_int([1, True]) is False and built.same_int([]) is False
    assert built.same_int((5, 5, 5)) is True and built.same_int([2**70, 2**70]) is True
    assert built.segment_data([b"k", "text"], [b"v", b"w"], b"") is None
    assert built.segment_data([None], [bytearray(b"v")], b"") is None
    assert built.segment_data([None], [b"v", b"w"], b"") is None
    assert built.segment_data((None,), {b"v"}, b"") is None
    assert built.pieces(b"a" * 64, 32) == [b"a" * 32] * 2
    with pytest.raises(ValueError):
        built.pieces(b"a" * 33, 32)


def test_without_the_extension_nothing_differs_but_speed() -> None:
    """A Python where it is not built: every path above runs on its pure-Python branch."""
    raw = [[b"v%d" % i, None if i % 3 else b"k", []] for i in range(50)]
    run = python_only(lambda: produced_run(raw, PRODUCER, 5))
    assert run.values == tuple(r[0] for r in raw) and run._checked
    state = python_only(
        lambda: core.commit(
            core.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, records=run, checkpoint_bytes=30
        )
    )
    assert len(state.checkpoints) > 2
    assert state.entries.records() == list(run)


def test_a_producers_requests_share_one_headers_tuple() -> None:
    """The owner's passes over a commit's header column (equal headers once) compare by identity first:
    every request of one producer stamps its records with the very same tuple, on either path."""
    raw = [[b"v", b"k", []]] * 3
    for build in (
        lambda: produced_run(raw, PRODUCER, 1),
        lambda: python_only(lambda: produced_run(raw, PRODUCER, 2)),
    ):
        first, second = build(), build()
        assert first.headers is not None and second.headers is not None
        assert first.headers[0] is second.headers[0] == (("lattice.producer", PRODUCER.encode()),)


def test_a_pass_is_handed_pynacls_libsodium_function_or_none_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nacl._sodium import ffi, lib  # noqa: PLC0415

    for name in (columns_compiled.BLAKE2B, "crypto_sign_open"):
        want = int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
        assert columns_compiled.sodium_address(name) == want != 0
    monkeypatch.setitem(sys.modules, "nacl._sodium", None)  # PyNaCl's libsodium not at hand
    assert columns_compiled.sodium_address(columns_compiled.BLAKE2B) is None
