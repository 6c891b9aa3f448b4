"""A compact DELTA2's head read in C (``compact_head`` in latticed/crdt/_columns.c, through
:mod:`latticed.protocol.core2_head_compiled`) only ever gives the head the Python path of
``core2_compact._head_in`` gives: over live pushes' heads, and over any of their ten fields, the list's
length or type, the ref, the shared fold, the tail, the records or the metadata altered (other types,
sizes and ranges, bytes subclasses), ``_head_in`` answers the same head (each field the same type and
value) or raises the same error with the pass and without it, and a whole compact DELTA2 decodes the
same. Sans-IO, no sockets."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core2_push import push_delta2
from support.queue2_histories import OWNER, empty

from latticed.crdt import chain_memo, queue2
from latticed.crdt.head2 import HeadV2
from latticed.crdt.records import Record
from latticed.protocol import core2_compact, core2_head_compiled
from latticed.protocol.core2_compact import Compact2Link
from latticed.protocol.core2_wire import Delta2
from latticed.protocol.replication_messages import unpack_message


class Bytes(bytes):
    """A bytes subclass (the C pass takes exact bytes only; Python's checks take it where they do)."""


class Ints(list[Any]):
    """A list subclass (the C pass takes an exact list only)."""


class Added(bytes):
    """A digest whose joining to a log answers other bytes (Python's fold adds it; C reads its storage)."""

    def __radd__(self, other: bytes) -> bytes:
        return other + b"\x01" * 32


class Pair(tuple[Any, ...]):
    """A leaf whose iteration answers other items than its storage holds."""

    def __iter__(self) -> Any:
        return iter((b"\x06" * 32, 40))


#: Values a field off the wire may hold: other types, sizes, ranges (the valid ones among them too).
ODD: list[Any] = [
    0, 1, -1, 2, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, -(2**64), True, False, 1.0,
    None, "x", b"", b"\x00" * 31, b"\x00" * 32, b"\x01" * 32, b"\x00" * 33, b"\x00" * 64, b"\x02" * 64,
    Bytes(32), Bytes(64), bytearray(32), [], [1], (b"\x00" * 32, 1),
]  # fmt: skip
values = st.one_of(
    st.sampled_from(ODD),
    st.integers(-(2**66), 2**66),
    st.binary(min_size=0, max_size=70),
    st.binary(min_size=32, max_size=32).map(Bytes),
)


def _live(n: int) -> list[Delta2]:
    """``n`` live one-record DELTA2s of a 20-record queue, each from the summary the one before left."""
    state = empty()
    for i in range(20):
        state = queue2.commit(state, OWNER, now_ms=1_700_000_000_000 + i, records=[Record(bytes(100))])
    out = []
    for i in range(n):
        before = state
        now = 1_700_000_001_000 + 200 * i
        state = queue2.commit(state, OWNER, now_ms=now, records=[Record(bytes([i]) * 100, timestamp=now)])
        out.append(push_delta2(before, state, 300 + i))
    return out


PUSHES = _live(4)
_SENDER = Compact2Link()
WIRES = [unpack_message(_SENDER.encode(m)) for m in PUSHES]


def _captured() -> list[tuple[Any, Any, Any]]:
    """Each push's head as ``_head_in`` is called with it: (raw, context, tail), read field by field (a
    live push's whole-message pass, ``compact_delta``, calls ``_compiled_head`` itself)."""
    calls: list[tuple[Any, Any, Any]] = []
    real = core2_compact._head_in
    with pytest.MonkeyPatch.context() as m:

        def capture(raw: Any, c: Any, tail: Any) -> HeadV2:
            calls.append((list(raw) if type(raw) is list else raw, c, tail))
            return real(raw, c, tail)

        m.setattr(core2_compact, "_head_in", capture)
        m.setattr(Compact2Link, "_live_delta", lambda *_: None)  # the path that reads a head apart
        receiver = Compact2Link()
        for raw in WIRES:
            receiver.decode(_copy(raw))
    return calls


def _copy(raw: Any) -> Any:
    return [_copy(i) for i in raw] if type(raw) is list else raw


CALLS = _captured()
#: The pushes read against a ref (the first names its queue and goes whole or against none).
LIVE = [c for c in CALLS if c[1].ref is not None]


def _typed(value: Any) -> Any:
    """A head as its fields' types and values (equality alone would take a bytes subclass as bytes)."""
    if isinstance(value, HeadV2):
        return type(value), [(type(getattr(value, f)), getattr(value, f)) for f in HeadV2.__slots__]
    return value


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", _typed(call())
    except Exception as exc:  # the type and text are what is compared
        return type(exc).__name__, str(exc)


def _memo() -> Any:
    """What the chain memo holds (a head hash rebuilt from the records keeps their chain): its base,
    first offset and chain."""
    entry = chain_memo._slot[0]
    return None if entry is None else (entry[0][0], entry[0][1], entry[1])


def _both(raw: Any, c: Any, tail: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], bool]:
    """``_head_in``'s outcome with the pass, without it (the reference), and whether the pass answered;
    each outcome with what the chain memo holds after it. The reference is ``_head_in`` without
    ``_compiled_head`` at all (as before the pass): its chain hashed ahead of the Python checks must
    change neither the outcome nor the memo."""
    answered = []
    real = core2_head_compiled.compact_head

    def counted(*args: Any, **kwargs: Any) -> HeadV2 | None:
        found = real(*args, **kwargs)
        answered.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as m:
        m.setattr(core2_head_compiled, "compact_head", counted)
        m.setattr(chain_memo, "_slot", [None])
        compiled = (*_outcome(lambda: core2_compact._head_in(_copy(raw), c, tail)), _memo())
        m.setattr(core2_compact, "_compiled_head", lambda *_: None)
        m.setattr(chain_memo, "_slot", [None])
        reference = (*_outcome(lambda: core2_compact._head_in(_copy(raw), c, tail)), _memo())
    return compiled, reference, any(answered)


def test_the_pass_is_built_and_reads_every_live_push_as_python_does() -> None:
    nothing = core2_head_compiled.compact_head(
        [], None, queue_id=bytes(32), epoch=0, shared_fold=None, tail=(), chained=None, records_end=0,
        empty_meta=None,
    )  # fmt: skip
    assert nothing is None and core2_head_compiled.fold_compiled.load() is not None
    assert len(LIVE) == 3
    for raw, c, tail in LIVE:
        assert type(raw) is list and raw[5] is None  # the head hash left out: rebuilt from the records
        compiled, reference, answered = _both(raw, c, tail)
        assert answered and compiled == reference and compiled[0] == "value"


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(LIVE), st.integers(0, 9), values)
def test_any_field_replaced_reads_as_python_reads_it(call: Any, index: int, value: Any) -> None:
    raw, c, tail = call
    changed = list(raw)
    changed[index] = value
    compiled, reference, answered = _both(changed, c, tail)
    assert compiled == reference
    assert not answered or reference[0] == "value"  # it confirms only what Python accepts


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(LIVE), st.lists(st.tuples(st.integers(0, 9), values), min_size=2, max_size=5))
def test_several_fields_replaced_read_as_python_reads_them(call: Any, edits: list[tuple[int, Any]]) -> None:
    raw, c, tail = call
    changed = list(raw)
    for index, value in edits:
        changed[index] = value
    compiled, reference, _ = _both(changed, c, tail)
    assert compiled == reference


@pytest.mark.parametrize(
    "shape",
    ["short", "long", "empty", "tuple", "subclass", "bytes", "none"],
)
def test_a_head_of_another_shape_reads_as_python_reads_it(shape: str) -> None:
    raw, c, tail = LIVE[-1]
    changed: Any = {
        "short": raw[:9],
        "long": [*raw, None],
        "empty": [],
        "tuple": tuple(raw),
        "subclass": Ints(raw),
        "bytes": b"\0" * 296,
        "none": None,
    }[shape]
    compiled, reference, answered = _both(changed, c, tail)
    assert compiled == reference and compiled[0] != "value" and not answered


class SubHead(HeadV2):
    """A head of a subclass (the pass takes a ref exactly of ``HeadV2`` only)."""

    __slots__ = ()


def _as(cls: type[HeadV2], head: HeadV2) -> HeadV2:
    return cls(*(getattr(head, f.name) for f in dataclasses.fields(HeadV2) if f.init))


def _without(head: HeadV2, name: str) -> HeadV2:
    """``head`` with the slot ``name`` empty (reading it raises AttributeError)."""
    out = object.__new__(HeadV2)
    for f in dataclasses.fields(HeadV2):
        if f.name != name:
            object.__setattr__(out, f.name, getattr(head, f.name))
    return out


def _other_head(c: Any, **changes: Any) -> HeadV2:
    return dataclasses.replace(c.ref, **changes)


CONTEXTS: dict[str, Any] = {
    "no ref": lambda c: dataclasses.replace(c, ref=None),
    "an older ref": lambda c: dataclasses.replace(c, ref=LIVE[0][1].ref),
    "ref at another start": lambda c: dataclasses.replace(c, ref=_other_head(c, start=c.ref.start + 1)),
    "ref at another end": lambda c: dataclasses.replace(c, ref=_other_head(c, end=c.ref.end - 1)),
    "ref at another meta version": lambda c: dataclasses.replace(c, ref=_other_head(c, meta_version=3)),
    "ref with a short hash": lambda c: dataclasses.replace(c, ref=_other_head(c, base_hash=b"x")),
    "ref with a bytes subclass": lambda c: dataclasses.replace(
        c, ref=_other_head(c, meta_hash=Bytes(c.ref.meta_hash))
    ),
    "ref with a huge counter": lambda c: dataclasses.replace(c, ref=_other_head(c, timestamp=2**64 - 1)),
    "ref with a bool counter": lambda c: dataclasses.replace(c, ref=_other_head(c, meta_version=False)),
    "ref of another type": lambda c: dataclasses.replace(c, ref=object()),
    "no shared fold": lambda c: dataclasses.replace(c, shared_fold=None),
    "another shared fold": lambda c: dataclasses.replace(c, shared_fold=b"\x07" * 32),
    "a shared fold subclass": lambda c: dataclasses.replace(c, shared_fold=Bytes(c.shared_fold)),
    "another epoch": lambda c: dataclasses.replace(c, epoch=c.epoch + 1),
    "another queue": lambda c: dataclasses.replace(c, qid=b"\x09" * 32),
    "no records": lambda c: dataclasses.replace(c, records=()),
    "another first offset": lambda c: dataclasses.replace(c, from_offset=c.from_offset + 1),
    "metadata": lambda c: dataclasses.replace(c, meta=(("a", "b"),)),
    "ref of a subclass": lambda c: dataclasses.replace(c, ref=_as(SubHead, c.ref)),
    "ref without a timestamp": lambda c: dataclasses.replace(c, ref=_without(c.ref, "timestamp")),
    "ref without a base hash": lambda c: dataclasses.replace(c, ref=_without(c.ref, "base_hash")),
    "ref without a head hash": lambda c: dataclasses.replace(c, ref=_without(c.ref, "head_hash")),
    "ref without a meta hash": lambda c: dataclasses.replace(c, ref=_without(c.ref, "meta_hash")),
}
TAILS: dict[str, Any] = {
    "a leaf": ((b"\x03" * 32, 40),),
    "two leaves": ((b"\x03" * 32, 40), (b"\x04" * 32, 41)),
    "65 leaves": tuple((bytes([i]) * 32, 40) for i in range(65)),
    "a short leaf": ((b"\x03" * 31, 40),),
    "a leaf past the offsets": ((b"\x03" * 32, 2**63),),
    "a list": [(b"\x03" * 32, 40)],
    "a digest subclass": ((Added(b"\x03" * 32), 40),),
    "a tuple subclass": (Pair((b"\x03" * 32, 40)),),
    "a bool end": ((b"\x03" * 32, True),),
    "three leaves": tuple((bytes([i]) * 32, 40 + i) for i in range(3)),
    "64 leaves": tuple((bytes([i]) * 32, 40) for i in range(64)),
    "a leaf at 0": ((b"\x03" * 32, 0),),
    "a leaf at the last offset": ((b"\x03" * 32, 2**63 - 1),),
    "a leaf past 2^64": ((b"\x03" * 32, 2**64),),
    "a negative leaf end": ((b"\x03" * 32, -1),),
    "a leaf of 3": ((b"\x03" * 32, 40, 0),),
    "a leaf list": ([b"\x03" * 32, 40],),
}


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_another_context_reads_as_python_reads_it(name: str) -> None:
    for raw, c, tail in LIVE:
        compiled, reference, answered = _both(raw, CONTEXTS[name](c), tail)
        assert compiled == reference, name
        assert not answered or reference[0] == "value"


@pytest.mark.parametrize("name", sorted(TAILS))
def test_a_tail_reads_as_python_reads_it(name: str) -> None:
    """A tip's tail folds into its log where the log is left out (the pass folds it in C)."""
    raw, c, _ = LIVE[-1]
    compiled, reference, _ = _both(raw, c, TAILS[name])
    assert compiled == reference
    with_log = list(raw)
    with_log[1] = b"\x05" * 32  # sent: the tail is not read
    assert _both(with_log, c, TAILS[name])[:2] == _both(with_log, c, ())[:2]


def _decoded(raws: list[Any], compiled: bool) -> list[tuple[str, Any]]:
    receiver, out = Compact2Link(), []
    with pytest.MonkeyPatch.context() as m:
        if not compiled:
            m.setattr(core2_compact, "_compiled_head", lambda *_: None)
        for raw in raws:
            out.append(_outcome(lambda raw=raw: receiver.decode(_copy(raw))))
    return out


def _paths(value: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    out = [prefix]
    if type(value) is list:
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_whole_delta2_with_any_nested_field_replaced_decodes_as_python_decodes_it(data: Any) -> None:
    """The last push with any item at any depth replaced, after the ones before it: the same message or
    the same RemoteProtocolError with the pass and without it."""
    last = _copy(WIRES[-1])
    path = data.draw(st.sampled_from(_paths(last)[1:]))
    value = data.draw(values)
    holder = last
    for i in path[:-1]:
        holder = holder[i]
    holder[path[-1]] = value
    raws = [*WIRES[:-1], last]
    assert _decoded(raws, True) == _decoded(raws, False)


def _sent_whole(call: Any) -> list[Any]:
    """The head's list with every hash sent (so no rule reads the counters: only their ranges do)."""
    raw, c, tail = call
    head = core2_compact._head_in(_copy(raw), c, tail)
    whole = list(raw)
    whole[1], whole[4], whole[5], whole[7] = head.log, head.base_hash, head.head_hash, head.meta_hash
    return whole


counters = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**64)]),
    st.integers(-(2**64), 2**64),
)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(LIVE), st.lists(st.tuples(st.sampled_from([0, 2, 3, 6, 8]), counters), max_size=4))
def test_counters_at_and_past_their_ranges_read_as_python_reads_them(
    call: Any, edits: list[tuple[int, int]]
) -> None:
    """Version 0, start past end, end past 2^63-1, a sum below 0 or past 2^64-1: the pass builds no head
    Python's check refuses."""
    _, c, tail = call
    changed = _sent_whole(call)
    for index, delta in edits:
        changed[index] = delta
    compiled, reference, answered = _both(changed, c, tail)
    assert compiled == reference
    # Every hash sent: it reads every head Python accepts whose differences fit a signed 64-bit int.
    plain = all(-(2**63) <= changed[i] < 2**63 for i in (0, 2, 3, 6, 8))
    assert answered == (reference[0] == "value") if plain else not answered or reference[0] == "value"


@pytest.mark.parametrize(
    ("index", "value"),
    [(0, "version 0"), (2, "start past end"), (3, "end past the offsets"), (8, "timestamp past 2^64-1")],
)
def test_each_counter_range_is_the_checks(index: int, value: str) -> None:
    _, c, tail = LIVE[-1]
    ref = c.ref
    changed = _sent_whole(LIVE[-1])
    changed[index] = {
        "version 0": -ref.version,
        "start past end": ref.end - ref.start + 2,
        "end past the offsets": 2**63 - ref.end,
        "timestamp past 2^64-1": 2**64 - ref.timestamp,
    }[value]
    compiled, reference, answered = _both(changed, c, tail)
    assert compiled == reference and reference[0] == "MalformedError" and not answered


EXTREMES = [0, 1, 2**63 - 1, 2**63, 2**64 - 1]
DELTAS = [-(2**63) - 1, -(2**63), -(2**63) + 1, -1, 0, 1, 2**63 - 1, 2**63, 2**64 - 1]


@pytest.mark.parametrize("name", ["meta_version", "timestamp"])
@pytest.mark.parametrize("at", EXTREMES)
def test_a_counter_added_to_a_ref_at_its_extremes_reads_as_python_reads_it(name: str, at: int) -> None:
    """The sums at their edges: a difference of -2^63 (whose magnitude C takes without negating it) or
    2^63-1 onto a ref's counter at 0, 2^63 or 2^64-1; the pass answers exactly where Python accepts and
    the difference fits a signed 64-bit int."""
    call = LIVE[-1]
    whole = _sent_whole(call)  # every hash sent: no rule reads the metadata version
    c = dataclasses.replace(call[1], ref=_other_head(call[1], **{name: at}))
    index = {"meta_version": 6, "timestamp": 8}[name]
    seen = set()
    for delta in DELTAS:
        changed = list(whole)
        changed[index] = delta
        compiled, reference, answered = _both(changed, c, call[2])
        assert compiled == reference, delta
        accepted = reference[0] == "value"
        assert answered == (accepted and -(2**63) <= delta < 2**63), delta
        if accepted:
            assert getattr(core2_compact._head_in(changed, c, call[2]), name) == at + delta
        seen.add(accepted)
    assert seen == {True, False}


@pytest.mark.parametrize("end", [0, 2, 2**63, "1", None])
def test_the_records_are_hashed_only_where_python_hashes_them(end: Any) -> None:
    """A head whose end is not the records' (or not an int): the pass's caller hashes no records for a
    head hash that Python's rule would not rebuild from them (a peer's bad head costs no hashing)."""
    raw, c, tail = LIVE[-1]
    assert len(c.records) == 1 and raw[3] == 1
    changed = list(raw)
    changed[3] = end
    hashed = {True: 0, False: 0}
    real = core2_compact.chain_extend
    for compiled in (True, False):

        def counting(*args: Any, compiled: bool = compiled) -> list[bytes]:
            hashed[compiled] += 1
            return real(*args)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(core2_compact, "chain_extend", counting)
            if not compiled:
                m.setattr(core2_compact, "_compiled_head", lambda *_: None)
            _outcome(lambda: core2_compact._head_in(_copy(changed), c, tail))
    assert hashed == {True: 0, False: 0}
