"""A few records' chain hashed from their columns in C (``_columns.chain_run``, through
``records._chain_small``): the same chain values, byte for byte, as the record-at-a-time Python loop
(``_chain_records``, the reference and the fallback) and as the per-record definition; on anything but
the plain shape the pass answers None and the Python path hashes or raises what it raises."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required
from support.chains import by_definition

from latticed.crdt import records as records_module
from latticed.crdt.records import Record, RecordRun, chain_extend, chain_next

U64 = 2**64
I64 = 2**63
#: The pass's stack buffer for one record's bytes (CR_SMALL in _columns.c): past it, a heap one.
CR_SMALL = 2048


@pytest.fixture(scope="module")
def run_pass() -> Callable[..., Any]:
    """``chain_run`` bound to its address and the two personalisations (skips where not built)."""
    found = required(records_module._run_hasher(), "latticed.crdt._columns.chain_run")
    run, address = found

    def call(base: Any, first: Any, values: Any, keys: Any, stamps: Any, tail: Any = b"\x00\x00") -> Any:
        return run(address, *records_module._PERSONS, base, first, values, keys, stamps, tail)

    return call


def by_columns(base: bytes, first: int, values: Any, keys_: Any, stamps_: Any, tail: bytes) -> list[bytes]:
    """The chain by encode_record's layout with ``tail`` after each value (the headers' bytes)."""
    out, current = [], base
    for offset, (value, key, stamp) in enumerate(zip(values, keys_, stamps_, strict=True), first):
        fixed = records_module._FIXED.pack(offset, stamp, key is not None, len(key or b""), len(value))
        digest = hashlib.blake2b(
            fixed + (key or b"") + value + tail, digest_size=32, person=b"latticed.rec.v1"
        )
        current = chain_next(current, digest.digest())
        out.append(current)
    return out


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """What a call gives: its value, or its error's type and text."""
    try:
        return ("value", fn())
    except Exception as error:  # the error itself is what is compared
        return ("error", (type(error), str(error)))


keys = st.one_of(st.none(), st.binary(max_size=40))
stamps = st.one_of(st.integers(-I64, I64 - 1), st.sampled_from([0, -1, -I64, I64 - 1]))
runs = st.lists(
    st.tuples(st.binary(max_size=300), keys, stamps), min_size=1, max_size=records_module._CHAIN_SMALL
)


@settings(max_examples=400, deadline=None)
@given(
    base=st.binary(min_size=32, max_size=32),
    rows=runs,
    first=st.one_of(st.integers(0, 2**20), st.integers(U64 - 8, U64 - 1)),
)
def test_a_run_chains_as_the_python_loop_and_the_definition(
    run_pass: Callable[..., Any], base: bytes, rows: list[tuple[bytes, bytes | None, int]], first: int
) -> None:
    run = RecordRun([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    expected = outcome(lambda: records_module._chain_records(base, first, list(run)))
    assert outcome(lambda: chain_extend(base, first, run)) == expected
    if first + len(rows) <= U64:
        assert expected == ("value", by_definition(base, first, list(run)))
        assert run_pass(base, first, run.values, run.keys, run.timestamps) == expected[1]
    else:  # an offset past 64 bits: the pass leaves it to Python, which refuses
        assert expected[0] == "error"
        assert run_pass(base, first, run.values, run.keys, run.timestamps) is None


def test_the_pass_hashes_a_run_without_headers(monkeypatch: pytest.MonkeyPatch, run_pass: Any) -> None:
    """``_chain_small`` takes the C pass for a run (the Python loop is not run), not for Records."""
    calls: list[int] = []
    reference = records_module._chain_records
    monkeypatch.setattr(records_module, "_chain_records", lambda *a: calls.append(1) or reference(*a))
    run = RecordRun([b"v1", b"v2"], [None, b"k"], [5, 6])
    chains = chain_extend(b"\x01" * 32, 7, run)
    assert calls == []
    assert chains == by_definition(b"\x01" * 32, 7, list(run))
    assert chain_extend(b"\x01" * 32, 7, list(run)) == chains
    assert calls == [1]


def test_a_run_with_headers_is_left_to_python() -> None:
    run = RecordRun([b"v"], [None], [1], [(("h", b"x"),)])
    assert chain_extend(b"\x02" * 32, 0, run) == by_definition(b"\x02" * 32, 0, list(run))


def test_a_record_past_the_stack_buffer_and_a_tail(run_pass: Callable[..., Any]) -> None:
    """A record bigger than the pass's stack buffer is hashed from a heap one; the tail is each record's."""
    headers = (("name", b"value"),)
    records = [Record(b"x" * 70_000, b"k" * 300, 3, headers), Record(b"", None, -1, headers)]
    tail = records_module._headers_bytes(headers)
    values = tuple(r.value for r in records)
    found = run_pass(b"\x03" * 32, 9, values, tuple(r.key for r in records), (3, -1), tail)
    assert found == by_definition(b"\x03" * 32, 9, records)


class Bytes(bytes):
    pass


class Int(int):
    pass


class Tuple(tuple):  # type: ignore[type-arg]
    pass


ODD = [
    "x",
    bytearray(b"v"),
    Bytes(b"v"),
    memoryview(b"v"),
    1,
    True,
    1.5,
    Int(3),
    I64,
    -I64 - 1,
    U64,
    -1,
    None,
    b"",
    (),
    [b"v"],
]


@settings(max_examples=500, deadline=None)
@given(
    rows=runs,
    where=st.sampled_from(["value", "key", "stamp", "first", "base", "tail"]),
    index=st.integers(0, records_module._CHAIN_SMALL - 1),
    odd=st.sampled_from(ODD),
)
def test_odd_input_gives_none_or_the_reference(
    run_pass: Callable[..., Any],
    rows: list[tuple[bytes, bytes | None, int]],
    where: str,
    index: int,
    odd: Any,
) -> None:
    """An odd column item, offset, base or tail: the pass answers None or exactly what the Python path
    hashes for the same columns, and ``chain_extend`` gives what the Python loop gives (value or error)."""
    values, keys_, stamps_ = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    first, base, tail = 5, b"\x04" * 32, b"\x00\x00"
    at = index % len(rows)
    if where == "value":
        values[at] = odd
    elif where == "key":
        keys_[at] = odd
    elif where == "stamp":
        stamps_[at] = odd
    elif where == "first":
        first = odd
    elif where == "base":
        base = odd
    else:
        tail = odd
    columns = (tuple(values), tuple(keys_), tuple(stamps_))
    found = outcome(lambda: run_pass(base, first, *columns, tail))
    assert found[0] == "value"
    if found[1] is not None:
        # only the plain shape is taken: exact bytes, ints within their fields, a 32-byte base
        assert all(type(v) is bytes for v in values) and type(base) is bytes and len(base) == 32
        assert all(k is None or type(k) is bytes for k in keys_) and type(tail) is bytes
        assert all(type(s) is int and -I64 <= s < I64 for s in stamps_) and type(first) is int
        assert found[1] == by_columns(base, first, *columns, tail)
    if tail == b"\x00\x00":
        run = RecordRun(*columns)
        assert outcome(lambda: chain_extend(base, first, run)) == outcome(
            lambda: records_module._chain_records(base, first, list(run))
        )


@pytest.mark.parametrize(
    "change",
    [
        "list values",
        "tuple subclass",
        "no records",
        "too many",
        "lengths differ",
        "more keys",
        "fewer stamps",
        "more stamps",
        "short person",
        "short chain person",
        "long person",
        "short base",
        "long base",
        "no address",
    ],
)
def test_shapes_the_pass_does_not_take(change: str) -> None:
    hasher = required(records_module._run_hasher(), "latticed.crdt._columns.chain_run")
    run, address = hasher
    record_person, chain_person = records_module._PERSONS
    values: Any = (b"a", b"b")
    keys_: Any = (None, None)
    stamps_: Any = (1, 2)
    base = b"\x05" * 32
    if change == "list values":
        values = list(values)
    elif change == "tuple subclass":
        values = Tuple(values)
    elif change == "no records":
        values, keys_, stamps_ = (), (), ()
    elif change == "too many":
        values, keys_, stamps_ = (b"a",) * 65, (None,) * 65, (1,) * 65
    elif change == "lengths differ":
        keys_ = (None,)
    elif change == "more keys":  # a pass reading only values' count of keys would answer a chain
        keys_ = (None, None, None)
    elif change in ("fewer stamps", "more stamps"):
        stamps_ = (1,) if change == "fewer stamps" else (1, 2, 3)
    elif change == "short person":
        record_person = record_person[:15]
    elif change == "short chain person":
        chain_person = chain_person[:15]
    elif change == "long person":
        record_person = record_person + b"\0"
    elif change in ("short base", "long base"):
        base = b"\x05" * (31 if change == "short base" else 33)
    else:
        address = 0
    assert run(address, record_person, chain_person, base, 0, values, keys_, stamps_, b"\x00\x00") is None
    # the same columns, plain: taken, and equal to the reference
    plain = run(hasher[1], *records_module._PERSONS, b"\x05" * 32, 0, (b"a",), (None,), (1,), b"\x00\x00")
    assert plain == records_module._chain_records(b"\x05" * 32, 0, [Record(b"a", None, 1, ())])


def test_sixty_four_records_in_one_call(run_pass: Callable[..., Any]) -> None:
    records = [Record(bytes([i]) * i, None if i % 3 else bytes(i), i * 1000, ()) for i in range(64)]
    found = run_pass(
        b"\x06" * 32,
        U64 - 64,
        tuple(r.value for r in records),
        tuple(r.key for r in records),
        tuple(r.timestamp for r in records),
    )
    assert found == by_definition(b"\x06" * 32, U64 - 64, records)
    assert (
        run_pass(
            b"\x06" * 32,
            U64 - 63,
            *(tuple(getattr(r, f) for r in records) for f in ("value", "key", "timestamp")),
        )
        is None
    )


def _sized(total: int, keyed: bool) -> Record:
    """A record whose canonical bytes (25 fixed, key, value, the 2-byte empty tail) are ``total`` long."""
    key = b"k" * 7 if keyed else None
    return Record(b"v" * (total - 27 - (7 if keyed else 0)), key, total, ())


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("total", range(CR_SMALL - 2, CR_SMALL + 10))
def test_records_at_the_stack_buffers_edge(run_pass: Callable[..., Any], total: int, keyed: bool) -> None:
    """Records whose bytes just fit the pass's 2048-byte stack buffer, or overflow it by 1-9 bytes (then a
    heap buffer of the biggest record's size): the chain equals the definition's wherever the biggest
    record stands (under .ci/sanitize a byte written past either buffer is a report)."""
    small = Record(b"s", None, 1, ())
    for records in ([_sized(total, keyed)], [small, _sized(total, keyed)], [_sized(total, keyed), small]):
        found = run_pass(
            b"\x07" * 32,
            3,
            tuple(r.value for r in records),
            tuple(r.key for r in records),
            tuple(r.timestamp for r in records),
        )
        assert found == by_definition(b"\x07" * 32, 3, records)


class LyingBytes(bytes):
    """Bytes whose ``len`` is not their size: the Python path encodes the lie, the pass must not differ."""

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize("where", ["value", "key", "tail"])
def test_a_bytes_subclass_with_its_own_len_is_left_to_python(
    run_pass: Callable[..., Any], where: str
) -> None:
    values: Any = (b"value", b"v2")
    keys_: Any = (b"key", None)
    tail: Any = b"\x00\x00"
    if where == "value":
        values = (LyingBytes(b"value"), b"v2")
    elif where == "key":
        keys_ = (LyingBytes(b"key"), None)
    else:
        tail = LyingBytes(b"\x00\x00")
    assert run_pass(b"\x08" * 32, 0, values, keys_, (1, 2), tail) is None
    run = RecordRun(values, keys_, (1, 2))
    assert outcome(lambda: chain_extend(b"\x08" * 32, 0, run)) == outcome(
        lambda: records_module._chain_records(b"\x08" * 32, 0, list(run))
    )
