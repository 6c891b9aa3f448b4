"""The log's fold in C (``fold`` and ``are_leaves`` in latticed/crdt/_columns.c) gives exactly what the
Python fold gives, strides included, and leaves anything that is not a list or tuple of leaves to the
Python path: :func:`head2.fold`, :func:`fold_index.prefix_fold` and :func:`epochs.verify` answer alike
with and without it, a malformed leaf still refused.

Where the extension is missing the tests that need it skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by
.ci/run) makes them fail instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required
from support.v2_histories import OWNER, history

from latticed.crdt import epochs, fold_compiled, fold_index, head2
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head2 import fold_one, genesis, is_leaf
from latticed.crdt.records import MAX_OFFSET

digests = st.binary(min_size=32, max_size=32)
ends = st.integers(0, MAX_OFFSET)
leaf_lists = st.lists(st.tuples(digests, ends), max_size=80)
#: Items that are not leaves (head2.is_leaf says no) or that the C pass does not take as one.
odd_items: list[Any] = [
    (b"x" * 31, 1),
    (b"x" * 33, 1),
    (b"x" * 32, -1),
    (b"x" * 32, MAX_OFFSET + 1),
    (b"x" * 32, 2**64),
    (b"x" * 32, True),
    (b"x" * 32, 1.0),
    (bytearray(32), 1),
    [b"x" * 32, 1],
    (b"x" * 32, 1, 2),
    (b"x" * 32,),
    None,
]


@pytest.fixture(scope="module")
def built() -> fold_compiled.Compiled:
    return required(fold_compiled.load(), "the compiled fold latticed.crdt._columns.fold")


def python_fold(log: bytes, leaves: list[Any], stride: int = 0) -> tuple[bytes, list[bytes]]:
    folds = []
    for i, (digest, end) in enumerate(leaves):
        log = fold_one(log, digest, end)
        if stride and (i + 1) % stride == 0:
            folds.append(log)
    return log, folds


@settings(max_examples=200, deadline=None)
@given(digests, leaf_lists, st.integers(0, 40), st.booleans())
def test_the_compiled_fold_is_the_python_fold(
    built: fold_compiled.Compiled, log: bytes, leaves: list[tuple[bytes, int]], stride: int, as_tuple: bool
) -> None:
    items = tuple(leaves) if as_tuple else leaves
    assert fold_compiled.fold(log, items, stride) == python_fold(log, leaves, stride)
    assert head2.fold(log, items) == python_fold(log, leaves)[0]
    assert fold_compiled.all_leaves(items) is True


@settings(max_examples=200, deadline=None)
@given(leaf_lists, st.data())
def test_anything_but_leaves_is_left_to_python(
    built: fold_compiled.Compiled, leaves: list[tuple[bytes, int]], data: st.DataObject
) -> None:
    odd = data.draw(st.sampled_from(odd_items))
    items = [*leaves]
    items.insert(data.draw(st.integers(0, len(items))), odd)
    assert fold_compiled.all_leaves(items) is False
    assert all(map(is_leaf, items)) is False
    assert epochs.are_leaves(items) is False
    assert fold_compiled.fold(b"l" * 32, items) is None
    assert fold_compiled.fold(b"l" * 32, iter(leaves)) is None  # not a list or tuple
    assert fold_compiled.fold(b"l" * 31, leaves) is None  # a log of another size


class _Digest(bytes):
    """A digest whose storage is 32 bytes but whose ``len`` says otherwise (or agrees)."""

    def __len__(self) -> int:
        return 31


class _Leaf(tuple):  # type: ignore[type-arg]
    """A leaf whose storage is a good leaf but whose ``len`` and iteration say otherwise."""

    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Any:
        return iter((b"z" * 32, 7))


class _End(int):
    pass


#: Subclasses of each part, each with the storage of a leaf: the C reads storage, Python calls
#: ``len`` and unpacks, so only exact types can be decided alike (review21's next).
subclassed: list[Any] = [
    (_Digest(b"d" * 32), 5),
    (type("Plain", (bytes,), {})(b"d" * 32), 5),
    _Leaf((b"d" * 32, 5)),
    type("PlainLeaf", (tuple,), {})((b"d" * 32, 5)),
    (b"d" * 32, _End(5)),
    (b"d" * 32, True),
    (b"d" * 32, False),
]


@pytest.mark.parametrize(
    "item",
    subclassed,
    ids=lambda item: (
        type(item).__name__ + "/" + "-".join(type(part).__name__ for part in tuple.__iter__(item))
    ),
)
def test_a_subclassed_leaf_is_refused_by_both_paths(built: fold_compiled.Compiled, item: Any) -> None:
    assert is_leaf(item) is False
    assert fold_compiled.all_leaves([item]) is False
    assert fold_compiled.fold(b"l" * 32, [item, (b"e" * 32, 6), (b"f" * 32, 7)]) is None
    with pytest.raises(MalformedError):
        _, heads = history([("offer", 1)] * 4)
        shared = [h.leaf() for h in heads[:-1]]
        epochs.verify(epochs.replica(OWNER.public_key, heads[-1], (shared[0], item, *shared[2:]), 0))


def test_prefix_folds_and_verify_answer_alike_without_the_extension(
    built: fold_compiled.Compiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, heads = history([("offer", 1)] * 70)
    shared = tuple(h.leaf() for h in heads[:-1])
    value = epochs.replica(OWNER.public_key, heads[-1], shared, 0)
    origin = genesis(heads[0].queue_id, heads[0].epoch)
    cases = [0, 1, 31, 32, 33, 64, 65, len(shared)]
    fold_index._folds.clear()
    compiled = [fold_index.prefix_fold(origin, shared, n) for n in cases]
    epochs.verify(value)
    monkeypatch.setattr(fold_compiled, "load", lambda: None)
    fold_index._folds.clear()
    assert [fold_index.prefix_fold(origin, shared, n) for n in cases] == compiled
    assert compiled == [python_fold(origin, list(shared[:n]))[0] for n in cases]
    epochs.verify(value)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_malformed_shared_leaf_is_refused_on_both_paths(
    built: fold_compiled.Compiled, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    _, heads = history([("offer", 1)] * 6)
    shared = [h.leaf() for h in heads[:-1]]
    if not compiled:
        monkeypatch.setattr(fold_compiled, "load", lambda: None)
    for odd in odd_items:
        value = epochs.replica(OWNER.public_key, heads[-1], (*shared[:2], odd, *shared[3:]), 0)
        with pytest.raises(MalformedError):
            epochs.verify(value)
    tail = epochs.Tip(heads[-1], ((shared[-1][0], True),))  # a tip's tail is checked too
    value = epochs.replica(OWNER.public_key, heads[-1], tuple(shared[:-1]), 0)
    with pytest.raises(MalformedError):
        epochs.verify(dataclasses.replace(value, tips=(tail,)))


def test_the_fold_keeps_no_reference_it_does_not_own(built: fold_compiled.Compiled) -> None:
    leaves = [(bytes([i]) * 32, i) for i in range(50)]
    log = b"l" * 32
    before = [sys.getrefcount(o) for o in (log, *leaves)]
    for _ in range(200):
        fold_compiled.fold(log, leaves, 7)
        fold_compiled.fold(log, [*leaves, None], 7)
        fold_compiled.all_leaves(leaves)
    assert [sys.getrefcount(o) for o in (log, *leaves)] == before


def test_the_compiled_passes_personalisations_are_head2s() -> None:
    data = b"a body or two logs"
    for person, python in (
        (fold_compiled.BODY_PERSON, head2._BODY_HASHER),
        (fold_compiled.LOG_PERSON, head2._LOG_HASHER),
    ):
        hasher = python.copy()
        hasher.update(data)
        assert (
            len(person) == 16
            and hashlib.blake2b(data, digest_size=32, person=person).digest() == hasher.digest()
        )
