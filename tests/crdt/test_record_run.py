"""``RecordRun``: records held as columns. It must behave as the sequence of Records it stands for, be as
immutable as a Record, be checked exactly as each of its records would be, and hash to the same chain."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.chains import by_definition

from latticed.crdt import queue as core
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.records import (
    MAX_HEADER_KEY_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Record,
    RecordRun,
    chain_extend,
    check_record,
    check_records,
    join_records,
)
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(bytes(range(32)))


def sample(n: int, *, keys: bool = True, headers: bool = True) -> list[Record]:
    return [
        Record(
            b"v%d" % i,
            b"k%d" % i if keys and i % 3 == 0 else None,
            1_700_000_000_000 + i,
            (("h", b"x%d" % i),) if headers and i % 5 == 0 else (),
        )
        for i in range(n)
    ]


def test_a_run_is_the_sequence_of_its_records() -> None:
    records = sample(20)
    run = RecordRun.of(records)
    assert len(run) == 20
    assert list(run) == records
    assert run[0] == records[0] and run[-1] == records[-1] and run[7] == records[7]
    assert all(type(r) is Record for r in run)
    assert isinstance(run[2:9], RecordRun) and list(run[2:9]) == records[2:9]
    assert run == records and run == tuple(records) and records == list(run)
    assert run == RecordRun.of(tuple(records)) and hash(run) == hash(RecordRun.of(records))
    assert run != records[:-1] and run != RecordRun.of(records[1:])
    assert RecordRun.of(run) is run


def test_a_run_without_headers_keeps_none_for_the_column() -> None:
    run = RecordRun([b"a", b"b"], [None, b"k"], [1, 2], [(), ()])
    assert run.headers is None
    assert run[1] == Record(b"b", b"k", 2, ())
    assert run.headers_column() == ((), ())


def test_a_run_is_immutable() -> None:
    run = RecordRun.of(sample(3))
    assert all(type(c) is tuple for c in (run.values, run.keys, run.timestamps, run.headers))
    with pytest.raises(AttributeError):
        run.values = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del run.keys  # type: ignore[misc]
    with pytest.raises(AttributeError):
        run.extra = 1  # type: ignore[attr-defined]


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(MalformedError):
        RecordRun([b"a", b"b"], [None], [1, 2])
    with pytest.raises(MalformedError):
        RecordRun([b"a"], [None], [1], [(("h", b"v"),), ()])


def test_joining_runs_and_records() -> None:
    a, b = sample(4), sample(3, headers=False)
    joined = RecordRun.join([RecordRun.of(a), RecordRun.of(b)])
    assert list(joined) == a + b
    assert joined.headers is not None and len(joined.headers) == 7
    assert RecordRun.join([RecordRun.of(b), RecordRun.of(b)]).headers is None
    assert isinstance(join_records(RecordRun.of(a), RecordRun.of(b)), RecordRun)
    assert list(join_records(RecordRun.of(a), RecordRun.of(b))) == a + b
    assert join_records(tuple(a), RecordRun.of(b)) == tuple(a + b)
    assert join_records((), a) == tuple(a)
    run = RecordRun.of(b)
    assert join_records((), run) is run and join_records(run, ()) is run


@pytest.mark.parametrize(
    ("n", "keys", "headers"),
    [(0, False, False), (1, False, False), (5, True, True), (1500, False, False), (2500, True, False)],
)
def test_the_chain_of_a_run_is_the_chain_of_its_records(n: int, keys: bool, headers: bool) -> None:
    records = sample(n, keys=keys, headers=headers)
    base = hashlib.blake2b(b"base", digest_size=32).digest()
    expected = by_definition(base, 42, records)
    assert chain_extend(base, 42, records) == expected
    assert chain_extend(base, 42, tuple(records)) == expected
    assert chain_extend(base, 42, RecordRun.of(records)) == expected


@pytest.mark.parametrize("keys", [False, True])
def test_a_run_whose_records_share_their_headers_chains_as_its_records(keys: bool) -> None:
    """Headers every record carries (a producer's stamp) are encoded once for the run: same chain."""
    stamp = (("lattice.producer", b"ab" * 32), ("h", b""))
    records = [Record(b"v%d" % i, b"k%d" % i if keys else None, 1_700 + i, stamp) for i in range(40)]
    base = hashlib.blake2b(b"base", digest_size=32).digest()
    expected = by_definition(base, 3, records)
    shared = RecordRun(
        [r.value for r in records], [r.key for r in records], [r.timestamp for r in records], [stamp] * 40
    )
    assert chain_extend(base, 3, shared) == expected
    equal_not_same = [tuple(list(stamp)) for _ in records]  # equal tuples, not one object
    run = RecordRun(shared.values, shared.keys, shared.timestamps, equal_not_same)
    assert chain_extend(base, 3, run) == expected


def test_a_run_whose_records_share_a_bad_header_is_refused() -> None:
    bad = (("h", b"v" * (MAX_HEADER_VALUE_BYTES + 1)),)
    with pytest.raises(MalformedError):
        check_records(RecordRun([b"v"] * 20, [None] * 20, [1] * 20, [bad] * 20))


def test_the_chain_is_unchanged_from_earlier_releases() -> None:
    """Pinned output of the per-record implementation this one replaced (signatures depend on it)."""
    records = sample(3000)
    chains = chain_extend(bytes(32), 7, RecordRun.of(records))
    assert chains[-1].hex() == "72592b8aa015452631f4dc6c3ad4c6484dadf49c034cdafe778cb71cde29e95a"
    assert hashlib.blake2b(b"".join(chains), digest_size=16).hexdigest() == "ebda008f360effba89793bbf7832bd0c"
    assert chain_extend(bytes(32), 7, records) == chains


GOOD: dict[str, Any] = {"value": b"v", "key": None, "timestamp": 1, "headers": ()}


@pytest.mark.parametrize(
    "change",
    [
        {"value": "text"},
        {"value": bytearray(b"v")},
        {"value": b"x" * (MAX_VALUE_BYTES + 1)},
        {"key": "text"},
        {"key": b"k" * (MAX_KEY_BYTES + 1)},
        {"timestamp": True},
        {"timestamp": 1.5},
        {"timestamp": 2**63},
        {"timestamp": -(2**63) - 1},
        {"headers": (("h", "text"),)},
        {"headers": ((1, b"v"),)},
        {"headers": [("h", b"v")]},
        {"headers": (("h", b"v", b"w"),)},
        {"headers": (("h", b"v"),) * (MAX_HEADERS + 1)},
        {"headers": (("\u00e9" * (MAX_HEADER_KEY_BYTES // 2 + 1), b"v"),)},  # 1 char, 2 bytes
        {"headers": (("h", b"v" * (MAX_HEADER_VALUE_BYTES + 1)),)},
        {"headers": (("h", b"v"), ("h", bytearray(b"v")))},
    ],
)
def test_a_run_is_checked_as_each_of_its_records(change: dict[str, Any]) -> None:
    bad = dict(GOOD, **change)
    record = Record(bad["value"], bad["key"], bad["timestamp"], bad["headers"])
    with pytest.raises(MalformedError):
        check_record(record)
    fine = Record(b"ok", b"k", 5, (("h", b"v"),))
    for position in range(3):
        records = [fine, fine]
        records.insert(position, record)
        run = RecordRun(
            [r.value for r in records],
            [r.key for r in records],
            [r.timestamp for r in records],
            [r.headers for r in records],
        )
        with pytest.raises(MalformedError):
            check_records(run)


def test_good_runs_pass_the_check() -> None:
    check_records(RecordRun.of(sample(50)))
    check_records(RecordRun([], [], []))
    check_records(RecordRun([b"x" * MAX_VALUE_BYTES], [b"k" * MAX_KEY_BYTES], [2**63 - 1]))
    check_records(RecordRun([b""], [b""], [-(2**63)]))


class Name(str):
    """A str subclass: check_record takes it as a header name, so a run must too."""


def test_runs_at_the_header_limits_pass_as_their_records_do() -> None:
    limits = (
        (("\u00e9" * (MAX_HEADER_KEY_BYTES // 2), b"v" * MAX_HEADER_VALUE_BYTES),),
        (("h", b""),) * MAX_HEADERS,
        ((Name("n"), b"v"),),
        (),
    )
    for headers in limits:
        check_record(Record(b"v", None, 1, headers))
    check_records(RecordRun([b"v"] * len(limits), [None] * len(limits), [1] * len(limits), limits))


def test_committing_a_run_equals_committing_its_records() -> None:
    records = sample(300)
    clock = itertools.count(1)
    empty = core.empty_state(OWNER.public_key, "q")
    a = core.commit(empty, OWNER, now_ms=next(clock), records=records, checkpoint_bytes=500)
    b = core.commit(empty, OWNER, now_ms=1, records=RecordRun.of(records), checkpoint_bytes=500)
    assert a == b and a.head == b.head
    assert [c.end for c in a.checkpoints] == [c.end for c in b.checkpoints]
    assert len(a.checkpoints) > 2
    assert a.entries.records() == records == b.entries.records()


def test_a_checked_run_stays_checked_and_so_do_its_parts() -> None:
    run = RecordRun.of(sample(10))
    assert not run._checked
    check_records(run)
    assert run._checked and run[2:5]._checked and RecordRun.join([run, run])._checked
    assert not RecordRun.join([run, RecordRun.of(sample(2))])._checked
    with pytest.raises(AttributeError):
        run._checked = False  # type: ignore[misc]


@pytest.mark.parametrize(
    "keys", [[None, None, None], [b"ab", b"", None], [b"k", b"key", b"x" * 300], [None, b"kk", b""]]
)
def test_payload_bytes_counts_each_records_value_and_key(keys: list[bytes | None]) -> None:
    values = [b"v", b"", b"value" * 60]
    run = RecordRun(values, keys, [0, 1, 2])
    assert run.payload_bytes() == sum(len(v) + len(k or b"") for v, k in zip(values, keys, strict=True))


_ROWS = st.lists(
    st.tuples(st.binary(max_size=8), st.none() | st.binary(max_size=4), st.integers(0, 2**63 - 1)),
    max_size=6,
)


def _generic(values: Any, keys: Any, timestamps: Any, checked: bool) -> RecordRun:
    run = RecordRun(list(values), list(keys), list(timestamps))  # lists: the constructor's own copy
    if checked:
        object.__setattr__(run, "_checked", True)
    return run


@settings(max_examples=200, deadline=None)
@given(_ROWS, _ROWS, st.booleans(), st.booleans())
def test_runs_joined_and_checked_from_tuple_columns_are_the_generic_ones(
    first: list[tuple[bytes, bytes | None, int]],
    second: list[tuple[bytes, bytes | None, int]],
    checked_a: bool,
    checked_b: bool,
) -> None:
    """relay27's shortcuts (two header-less runs joined by their columns' concatenation, ``checked`` on
    exact tuple columns, ``join_records`` reading lengths off columns) give what the generic
    constructor gives: the same columns, records, headers (None) and checked flag."""
    cols_a, cols_b = (tuple(zip(*rows, strict=True)) or ((), (), ()) for rows in (first, second))
    a, b = _generic(*cols_a, checked_a), _generic(*cols_b, checked_b)
    fast = RecordRun.join([a, b])
    both = checked_a and checked_b
    slow = _generic(a.values + b.values, a.keys + b.keys, a.timestamps + b.timestamps, both)
    assert (fast.values, fast.keys, fast.timestamps, fast.headers) == (
        slow.values,
        slow.keys,
        slow.timestamps,
        slow.headers,
    )
    assert fast._checked == slow._checked and list(fast) == list(slow)
    joined = join_records(a, b)
    assert list(joined) == list(a) + list(b) and type(joined) is RecordRun
    assert joined is (b if not a.values else a if not b.values else joined)
    if first:
        run = RecordRun.checked(*cols_a)
        assert run == _generic(*cols_a, True) and run._checked and run.headers is None
        assert type(run.values) is tuple and run.values is cols_a[0]  # the columns as they came
    with pytest.raises(MalformedError):
        RecordRun.checked((b"v",), (None, None), (1,))  # columns of two lengths: still refused
    with pytest.raises(AttributeError):
        fast._checked = False  # type: ignore[misc]
