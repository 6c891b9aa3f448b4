"""A live compact DELTA2 read in C (``compact_delta`` in latticed/crdt/_columns.c, through
``Compact2Link._live_delta``) only ever gives the message the Python path gives (``_decode_delta`` read
field by field, the reference and the fallback): over live pushes, and over pushes with fields of the
message, its log, its tip, its steps or its rows replaced by other types, sizes and ranges, the two
answer equal messages and leave the link remembering the same ref, or raise the same error; the pass
never changes its input and survives a collection inside it that empties what it reads. Sans-IO."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import replace
from types import ModuleType
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required
from support.gc_inside import collected_inside

from latticed.crdt import columns_compiled, queue2
from latticed.crdt.records import MAX_KEY_BYTES, MAX_VALUE_BYTES, Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack
from latticed.errors import RemoteProtocolError
from latticed.protocol.core2_compact import Compact2Link, _as_received
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import Delta2, link_summary
from latticed.protocol.replication_messages import unpack_message

OWNER = Identity.from_seed(b"d" * 32)
KEY = (OWNER.public_key, "live", 0)


class Bytes(bytes):
    """A bytes subclass (the pass takes exact bytes only)."""


class Items(list[Any]):
    """A list subclass (the pass takes exact lists only)."""


ODD: list[Any] = [
    0, 1, -1, 2, 39, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, True, False, 1.0, None, "x", b"", b"k",
    b"\x00" * 32, b"\x00" * 40, Bytes(b""), bytearray(b""), [], [0], [None], [b""], [[]], [["a", "b"]],
    (), Items(),
]  # fmt: skip
odd = st.one_of(st.sampled_from(ODD), st.integers(-(2**65), 2**65), st.binary(max_size=48))


def _pushes() -> list[list[Any]]:
    """A writer's compact DELTA2s as a relay reads them: its first (the queue named, no ref), then live
    one-record pushes (with their steps), a keyed chunk of three, and a push with metadata."""
    state = queue2.empty_state(OWNER.public_key, "live")
    link, out = Compact2Link(), []
    for i in range(8):
        before, now = state, 1_700_000_000_000 + 5 * i
        count = 3 if i == 5 else 1
        records = [Record(b"%d-%d" % (i, j), key=b"k%d" % j if i == 5 else None) for j in range(count)]
        meta = {"owner": "me"} if i == 7 else None
        state = queue2.commit(state, OWNER, now_ms=now, records=records, meta_updates=meta)
        sent = outgoing(state, queue2.summary(before) if i else None, 4096)
        message = Delta2(i, link_summary(state), sent.delta, sent.steps)
        out.append(unpack_message(link.encode(message)))
    return out


PUSHES = _pushes()


def _comparable(m: Any) -> Any:
    if isinstance(m, Delta2):  # a run of records compares by its records
        return ("delta", replace(m, delta=replace(m.delta, records=tuple(m.delta.records))))
    return ("other", m)


def _outcome(link: Compact2Link, raw: Any) -> tuple[str, Any]:
    try:
        return _comparable(link.decode(raw))
    except Exception as exc:  # compared: the two paths raise alike
        return "error", (type(exc), str(exc))


def _links(upto: int) -> tuple[Compact2Link, Compact2Link]:
    """Two receivers that read the pushes before ``upto`` (one with the pass, one without)."""
    mine, theirs = Compact2Link(), Compact2Link()
    for raw in PUSHES[:upto]:
        mine.decode(copy.deepcopy(raw))
        with mock.patch.object(Compact2Link, "_live_delta", return_value=None):
            theirs.decode(copy.deepcopy(raw))
    return mine, theirs


def _same(at: int, raw: Any) -> tuple[str, Any]:
    """``raw`` read after the pushes before ``at`` with the pass and by the Python path alone: the one
    outcome, the same ref remembered; the pass leaves its input as it was."""
    mine, theirs = _links(at)
    columns = required(columns_compiled.load(), "latticed.crdt._columns")
    kept, before = copy.deepcopy(raw), copy.deepcopy(raw)
    columns.compact_delta(kept, 0, MAX_VALUE_BYTES, MAX_KEY_BYTES)
    assert kept == before
    got = _outcome(mine, copy.deepcopy(raw))
    with mock.patch.object(Compact2Link, "_live_delta", return_value=None):
        expected = _outcome(theirs, copy.deepcopy(raw))
    assert got == expected
    assert mine._in.ref(KEY) == theirs._in.ref(KEY)
    return expected


def test_every_live_push_is_read_by_the_pass_as_python_reads_it() -> None:
    required(columns_compiled.load(), "latticed.crdt._columns")
    taken = []
    real = Compact2Link._live_delta

    def spy(self: Compact2Link, raw: list[Any]) -> Any:
        found = real(self, raw)
        taken.append(found is not None)
        return found

    with mock.patch.object(Compact2Link, "_live_delta", spy):
        for at, raw in enumerate(PUSHES):
            taken.clear()
            assert _same(at, raw)[0] == "delta"
            assert taken[-1] == (at not in (0, 7)), at  # the first (no ref) and metadata: Python's


#: Where an edit lands: the message, its log, its tip, the tip's head, its steps, its first row.
PLACES = {"top": (), "log": (4,), "tip": (4, 4, 0), "head": (4, 4, 0, 0), "steps": (9,), "row": (7, 0)}


@settings(max_examples=500, deadline=None)
@given(
    st.integers(1, len(PUSHES) - 1),
    st.lists(st.tuples(st.sampled_from(sorted(PLACES)), st.integers(0, 9), odd), min_size=1, max_size=3),
)
def test_any_field_replaced_reads_as_python_reads_it(at: int, edits: list[tuple[str, int, Any]]) -> None:
    raw = copy.deepcopy(PUSHES[at])
    for where, index, value in edits:
        target: Any = raw
        for i in PLACES[where]:  # an earlier edit may have replaced what held it
            target = target[i] if type(target) is list and i < len(target) else None
        if type(target) is list and target:
            target[index % len(target)] = copy.deepcopy(value)
    _same(at, raw)


def test_a_push_not_the_live_shape_is_left_to_python() -> None:
    columns = required(columns_compiled.load(), "latticed.crdt._columns")
    limits = (MAX_VALUE_BYTES, MAX_KEY_BYTES)
    live = PUSHES[1]
    assert columns.compact_delta(copy.deepcopy(live), 0, *limits) is not None
    for edit in (
        lambda r: r.__setitem__(0, 40),  # another message (decode reads its code first)
        lambda r: r.__setitem__(3, []),  # a summary sent
        lambda r: r[4].__setitem__(3, b"\x00" * 40),  # a shared leaf
        lambda r: r[4][4].append(r[4][4][0]),  # two tips
        lambda r: r[4].__setitem__(5, None),  # no start head
        lambda r: r.__setitem__(8, [b""]),  # a body
        lambda r: r.__setitem__(6, -1),  # an offset below 0
        lambda r: r.__setitem__(1, 2**64),  # a sequence number past 64 bits
        lambda r: r.__setitem__(9, [0, Bytes(b"")]),  # steps not exact bytes
        lambda r: r.__setitem__(7, []),  # no rows
        lambda r: r.__setitem__(5, Items()),
    ):
        raw = copy.deepcopy(live)
        edit(raw)
        assert columns.compact_delta(raw, 0, *limits) is None
        _same(1, raw)
    assert columns.compact_delta(copy.deepcopy(live), 2**63, *limits) is None  # a base past 64 bits


def test_a_finalizer_that_empties_the_message_or_its_rows_during_the_pass_is_seen() -> None:
    """The pass holds what it returns before its rows' allocations (which may collect, and so run a
    finalizer): emptied then, the message's answer is still read from what it held; emptied rows
    are seen (their size read again) and answer None."""
    columns = required(columns_compiled.load(), "latticed.crdt._columns")
    limits = (MAX_VALUE_BYTES, MAX_KEY_BYTES)
    expected = columns.compact_delta(copy.deepcopy(PUSHES[1]), 0, *limits)
    assert expected is not None

    def message() -> tuple[tuple[Any, ...], list[Any]]:
        raw = copy.deepcopy(PUSHES[1])
        return (raw, 0, *limits), raw

    runs = collected_inside(columns.compact_delta, message)
    assert runs
    for run in runs:
        assert run.sizes == [10] and run.victim == [] and run.answer == expected

    def rows() -> tuple[tuple[Any, ...], list[Any]]:
        raw = copy.deepcopy(PUSHES[1])
        raw[7] = raw[7] * 64
        return (raw, 0, *limits), raw[7]

    runs = collected_inside(columns.compact_delta, rows)
    assert runs and runs[0].answer is None  # the first due: at the rows' first tuple
    for run in runs:
        assert run.sizes == [64] and run.victim == []
        assert run.answer is None or len(run.answer[6][0]) == 64


def test_a_build_without_the_pass_reads_every_push_in_python() -> None:
    """A ``_columns`` built before ``compact_delta`` (and ``compact_rows``) existed, beside newer sources
    (a stale build copied into a tree): every push is read by the Python path, not an AttributeError
    out of ``decode`` on each live push (review24b)."""
    columns = required(columns_compiled.load(), "latticed.crdt._columns")
    stale = ModuleType(columns.__name__)
    for name in dir(columns):
        if name not in ("compact_delta", "compact_rows"):
            setattr(stale, name, getattr(columns, name))
    mine, theirs = Compact2Link(), Compact2Link()
    for raw in PUSHES:
        with mock.patch.object(columns_compiled, "load", return_value=stale):
            got = _outcome(mine, copy.deepcopy(raw))
        with mock.patch.object(Compact2Link, "_live_delta", return_value=None):
            expected = _outcome(theirs, copy.deepcopy(raw))
        assert got[0] == "delta"
        assert got == expected
    assert mine._in.ref(KEY) == theirs._in.ref(KEY) is not None


def _lists(x: Any, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], list[Any]]]:
    """Every list inside ``x`` (``x`` too) with its path."""
    if type(x) is not list:
        return []
    found = [(path, x)]
    for i, item in enumerate(x):
        found += _lists(item, (*path, i))
    return found


EDGES = [0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]
shift = st.one_of(st.sampled_from(EDGES), st.integers(-5, 5), st.integers(-(2**66), 2**66))


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[int, list[Any]]:
    """A live push with one to four edits anywhere in it (not only the places above): an item set to an
    odd value, an int shifted, an item deleted, doubled or appended, or bytes of its msgpack changed."""
    at = draw(st.integers(1, len(PUSHES) - 1))
    raw: Any = copy.deepcopy(PUSHES[at])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "shift", "delete", "double", "append", "bytes"]))
        if kind == "bytes":
            try:
                data = bytearray(pack(raw))
            except (OverflowError, TypeError):  # an int past 64 bits, a type msgpack does not write
                continue
            for _ in range(draw(st.integers(1, 3))):
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            try:
                raw = unpack_message(bytes(data))
            except RemoteProtocolError:
                continue
            if len(raw) != 10 or raw[0] != 39:  # another message: not this pass's
                raw = copy.deepcopy(PUSHES[at])
            continue
        path, node = draw(st.sampled_from(_lists(raw)))
        if not node or (kind != "append" and path == () and len(node) == 1):
            continue
        i = draw(st.integers(1 if path == () else 0, len(node) - 1)) if len(node) > 1 else 0
        if path == () and i == 0:
            continue  # the code: decode's choice of message
        if kind == "set":
            node[i] = copy.deepcopy(draw(odd))
        elif kind == "shift" and type(node[i]) is int:
            node[i] += draw(shift)
        elif kind == "delete":
            del node[i]
        elif kind == "double":
            node.insert(i, copy.deepcopy(node[i]))
        elif kind == "append":
            node.append(copy.deepcopy(draw(odd)))
    return at, raw


@settings(max_examples=300, deadline=None)
@given(_mutated())
def test_a_push_edited_anywhere_reads_as_python_reads_it(case: tuple[int, list[Any]]) -> None:
    """Edits at any depth (a later row, the head's fields, the steps' bytes, msgpack's own bytes): the
    pass and the Python path answer alike and remember the same ref, and the fields a relay passes on
    as they came are the same (review24b ran this 5,000 examples, also under .ci/sanitize's build)."""
    at, raw = case
    if len(raw) != 10:
        return
    mine, theirs = _links(at)
    _as_received[0] = None
    got = _outcome(mine, copy.deepcopy(raw))
    came = _as_received[0]
    _as_received[0] = None
    with mock.patch.object(Compact2Link, "_live_delta", return_value=None):
        expected = _outcome(theirs, copy.deepcopy(raw))
    assert got == expected
    assert (came and (came.fields, came.steps, came.ref)) == (
        _as_received[0] and (_as_received[0].fields, _as_received[0].steps, _as_received[0].ref)
    )
    assert mine._in.ref(KEY) == theirs._in.ref(KEY)


def test_a_queue_whose_name_is_refused_never_gets_a_ref_so_the_pass_never_skips_its_check() -> None:
    """relay27: ``_live_delta`` does not check the name again because a ref is set only after the name
    passed ``check_name``. A peer that names a queue ``li/ve`` (learnt by the numbering, refused by the
    decode) has every later push of that number refused by both paths, and no ref is ever kept."""
    bad_key = (OWNER.public_key, "li/ve", 0)
    for live in (True, False):
        link = Compact2Link()
        python_only = mock.patch.object(Compact2Link, "_live_delta", return_value=None)
        with contextlib.nullcontext() if live else python_only:
            for i, sent in enumerate(PUSHES):
                raw = copy.deepcopy(sent)
                if i == 0:
                    raw[2] = [OWNER.public_key, "li/ve", 0]
                outcome = _outcome(link, raw)
                assert outcome[0] == "error" and outcome[1][0] is RemoteProtocolError, (live, i, outcome)
                assert link._in.keys == [bad_key] and link._in.ref(bad_key) is None
