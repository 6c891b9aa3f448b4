"""A compact DELTA2's records read in C (``compact_rows`` in latticed/crdt/_columns.c, through
``core2_compact._records_in``) only ever give the run the Python path (``_restamped`` then
``records_from_wire``) gives: over live pushes' rows, and over rows altered (their list, a row's length
or type, a key, a value, a step or the headers replaced by other types, sizes and ranges, subclasses;
the base past 64 bits), the two answer runs of the same columns, checked alike, or raise the same error;
the pass never changes its input. Sans-IO, no sockets."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required
from support.gc_inside import collected_inside

from latticed.crdt import columns_compiled, queue2
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.records import MAX_KEY_BYTES, MAX_VALUE_BYTES, Record, RecordRun
from latticed.crdt.signing import Identity
from latticed.crdt.wire import records_from_wire
from latticed.protocol import core2_compact
from latticed.protocol.core2_compact import Compact2Link
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import Delta2, link_summary
from latticed.protocol.replication_messages import unpack_message

OWNER = Identity.from_seed(b"w" * 32)


class Bytes(bytes):
    """A bytes subclass (the pass takes exact bytes only)."""


class Rows(list[Any]):
    """A list subclass (the pass takes exact lists only)."""


class Big(bytes):
    """Bytes that claim another length (the pass reads the object's size, Python calls ``len``)."""

    def __len__(self) -> int:
        return MAX_VALUE_BYTES + 1


ODD: list[Any] = [
    0, 1, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, True, False, 1.0, None, "x", b"", b"k",
    b"\x00" * 100, Bytes(b"v"), bytearray(b"v"), Big(b"v"), [], [1], [["h", b"v"]], (), Rows(),
]  # fmt: skip
fields = st.one_of(st.sampled_from(ODD), st.integers(-(2**65), 2**65), st.binary(max_size=40))


def _python(raw: Any, base: int) -> RecordRun:
    """The path the pass stands in for."""
    return records_from_wire(core2_compact._restamped(raw, base))


def _outcome(read: Any, raw: Any, base: int) -> tuple[str, Any]:
    try:
        run = read(raw, base)
    except MalformedError as exc:
        return "error", type(exc)
    return "run", (run.values, run.keys, run.timestamps, run.headers, run._checked)


def _same(raw: Any, base: int) -> tuple[str, Any]:
    """Both paths on ``raw`` (each its own copy: Python's restamps in place), the one outcome; the
    compiled pass leaves its copy as it was."""
    mine, theirs = copy.deepcopy(raw), copy.deepcopy(raw)
    columns = required(columns_compiled.load(), "latticed.crdt._columns")
    before = copy.deepcopy(mine)
    found = columns.compact_rows(mine, base, MAX_VALUE_BYTES, MAX_KEY_BYTES)
    assert mine == before  # read, not restamped in place
    expected = _outcome(_python, theirs, base)
    if found is not None:  # the pass answers only what Python accepts, with the same columns
        assert expected == ("run", (*found, None, True))
    assert _outcome(core2_compact._records_in, copy.deepcopy(raw), base) == expected
    return expected


def _live_rows() -> list[tuple[list[Any], int, tuple[int, ...]]]:
    """Compact DELTA2s' rows as a relay decodes them (the one-record live pushes and a chunk of four
    keyed records), with the ref's timestamp each is read against and the records' own."""
    state = queue2.empty_state(OWNER.public_key, "rows")
    state = queue2.commit(state, OWNER, now_ms=1_700_000_000_000, records=[Record(b"first")])
    link, out = Compact2Link(), []
    for i in range(4):
        before, now = state, 1_700_000_001_000 + 7 * i
        keys = [b"k%d" % j if i == 3 else None for j in range(i + 1)]
        records = [Record(bytes([i]) * 50, key=key, timestamp=now) for key in keys]
        state = queue2.commit(state, OWNER, now_ms=now, records=records)
        sent = outgoing(state, queue2.summary(before) if i else None, 4096)
        ref = link._out.ref((OWNER.public_key, "rows", 0))
        raw = unpack_message(link.encode(Delta2(i, link_summary(state), sent.delta, sent.steps)))
        stamps = tuple(r.timestamp for r in sent.delta.records)
        out.append((raw[7], ref.timestamp if ref else 0, stamps))
    return out


LIVE = _live_rows()


def test_the_pass_reads_every_live_push_as_python_does() -> None:
    columns = required(columns_compiled.load(), "latticed.crdt._columns")
    for raw, base, stamps in LIVE:
        assert columns.compact_rows(copy.deepcopy(raw), base, MAX_VALUE_BYTES, MAX_KEY_BYTES) is not None
        kind, run = _same(raw, base)
        assert kind == "run" and run[2] == stamps and run[3:] == (None, True)


@pytest.mark.parametrize(
    ("raw", "base"),
    [
        ([], 0),  # no rows: Python's empty run
        ([[None, b"v", 1, None]], 5),  # nil headers on the first row repeat nothing
        ([[None, b"v", 1, []], [None, b"w", 2, None]], 2**63 - 3),  # a sum past 64 bits
        ([[None, b"v", 2**63, []], [None, b"w", -2, []]], 0),  # a step past 64 bits, back in range
        ([[None, b"v", 1, []]], 2**63),  # a base past 64 bits
        ([[None, b"v", 1, [["h", b"x"]]]], 0),  # headers: Python's
        ([[None, b"v", 1, []], [None, b"w", 1, [["h", b"x"]]], [None, b"u", 1, None]], 0),
        ([[b"k" * (MAX_KEY_BYTES + 1), b"v", 1, []]], 0),  # a key past its limit
        ([[None, b"v" * (MAX_VALUE_BYTES + 1), 1, []]], 0),  # a value past its limit
        ([[None, b"v", 1, []], [None, b"w", -(2**63) - 1, []]], 2**63 - 1),  # a step below 64 bits
        ([[None, Big(b"v"), 1, []]], 0),  # a subclass claiming another length
        ((), 0),  # not a list
        (Rows([[None, b"v", 1, []]]), 0),
        ([(None, b"v", 1, [])], 0),  # a row that is a tuple
        ([Rows([None, b"v", 1, []])], 0),  # a row that is a list subclass
        ([[None, b"v", True, []]], 0),  # a bool step
    ],
)
def test_rows_the_pass_leaves_to_python_read_as_python_reads_them(raw: Any, base: int) -> None:
    _same(raw, base)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(range(len(LIVE))),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), fields), min_size=1, max_size=3),
    st.one_of(st.just(None), fields),
)
def test_any_row_field_replaced_reads_as_python_reads_it(
    which: int, edits: list[tuple[int, int, Any]], base: Any
) -> None:
    raw, ref_stamp, _ = copy.deepcopy(LIVE[which])
    for row, index, field in edits:
        value = copy.deepcopy(field)  # ODD's lists are shared: an edit into one must not change it
        target = raw[row % len(raw)]
        if index == 4 or type(target) is not list or index >= len(target):
            raw[row % len(raw)] = value  # the whole row replaced (also a row too short for that field)
        else:
            target[index] = value
    _same(raw, ref_stamp if type(base) is not int else base)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(st.none(), st.binary(max_size=8), st.integers(-(2**64), 2**64), st.just([])),
            min_size=3,
            max_size=5,
        ),
        max_size=6,
    ),
    st.integers(-(2**64), 2**64),
)
def test_random_rows_read_as_python_reads_them(raw: list[list[Any]], base: int) -> None:
    _same(raw, base)


def test_a_finalizer_that_empties_the_rows_during_the_pass_is_seen() -> None:
    """The passes allocate their tuples (which may collect garbage, and so run a finalizer) after they
    read the list's size: they read it again after them, else they read items past a cleared list."""
    columns = required(columns_compiled.load(), "latticed.crdt._columns")
    limits = (MAX_VALUE_BYTES, MAX_KEY_BYTES)
    cases: list[tuple[Callable[..., Any], list[Any], tuple[Any, ...]]] = [
        (columns.compact_rows, [None, b"v", 1, []], (0, *limits)),
        (columns.offered, [b"v", None, []], (99, *limits)),
    ]
    for read, row, rest in cases:

        def make(row: list[Any] = row, rest: tuple[Any, ...] = rest) -> tuple[tuple[Any, ...], list[Any]]:
            rows = [list(row) for _ in range(64)]
            return (rows, *rest), rows

        runs = collected_inside(read, make)
        assert runs and runs[0].answer is None, read  # the first due: a collection at the first tuple
        for run in runs:  # a later one may land on the answer's tuple, after every row was read
            assert run.sizes == [64] and run.victim == [], read
            assert run.answer is None or len(run.answer[0]) == 64, read
