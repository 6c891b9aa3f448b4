"""The compiled passes over a catch-up's head bodies (``packed_bodies`` and ``unvouched`` in
latticed/crdt/_columns.c) and the ordered merge of rebuilt bodies: each gives what the Python path gives
or leaves the item to it. ``unvouched`` only ever confirms a body the Python check
(:func:`epoch_delta.vouches` and the chain value at its end) confirms, so ``queue2.verify_delta`` refuses
a changed body or record with and without it.

Where the extension is missing the tests that need it skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by
.ci/run) makes them fail instead.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required
from support.single_offers import chunk, single_offers
from support.v2_histories import OWNER, history

from latticed.crdt import epoch_delta, epochs, leaf_bodies, leaf_compiled, queue2
from latticed.crdt.core_errors import TamperedError
from latticed.crdt.head2 import HeadV2
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity


@pytest.fixture(scope="module")
def built() -> Any:
    return required(leaf_compiled._packs(), "the compiled body passes in latticed.crdt._columns")


def signed_log(count: int) -> tuple[epochs.Chains, list[HeadV2], list[bytes]]:
    """A value whose log holds ``count`` single offers, its heads (unsigned, leaves computed) and the
    chain values after offset 0."""
    state, heads = history([("offer", 1)] * count)
    value = epochs.replica(OWNER.public_key, heads[-1], tuple(h.leaf() for h in heads[:-1]), 0)
    bodies = [dataclasses.replace(h, signature=b"") for h in heads]
    for body in bodies:
        body.leaf()
    chain = [state.chain_at(offset) or b"" for offset in range(1, state.known_end + 1)]
    return value, bodies, chain


def python_confirms(value: epochs.Chains, body: Any, chain: list[bytes], first: int) -> bool:
    index = body.end - first - 1
    return epoch_delta.vouches(value, body) and 0 <= index < len(chain) and body.head_hash == chain[index]


def test_bodies_on_the_log_are_confirmed_and_the_tip_is_left_to_python(built: Any) -> None:
    value, bodies, chain = signed_log(30)
    left = leaf_compiled.unvouched(bodies, value.shared, value.queue_id, value.epoch, chain=chain, first=0)
    assert left == [len(bodies) - 1]  # the newest head's version is on the tip, not in the shared leaves
    assert all(python_confirms(value, b, chain, 0) for b in bodies)


changes: list[tuple[str, Callable[[HeadV2], Any]]] = [
    ("head_hash", lambda b: dataclasses.replace(b, head_hash=bytes(32))),
    ("queue_id", lambda b: dataclasses.replace(b, queue_id=bytes(32))),
    ("epoch", lambda b: dataclasses.replace(b, epoch=b.epoch + 1)),
    ("version", lambda b: dataclasses.replace(b, version=b.version + 1)),
    ("end", lambda b: dataclasses.replace(b, end=b.end + 1)),
    ("timestamp", lambda b: dataclasses.replace(b, timestamp=b.timestamp + 1)),
    ("leaf not computed", dataclasses.replace),
    ("not a head", lambda b: (b.queue_id, b.epoch)),
]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(changes), st.integers(0, 18), st.integers(0, 3))
def test_a_changed_body_is_never_confirmed(
    built: Any, change: tuple[str, Callable[[HeadV2], Any]], at: int, first: int
) -> None:
    value, bodies, chain = signed_log(20)
    changed = change[1](bodies[at])
    if isinstance(changed, HeadV2) and change[0] != "leaf not computed":
        changed.leaf()  # as the steps' loop leaves it: a leaf over the changed body
    items: list[Any] = [*bodies[:at], changed, *bodies[at + 1 :]]
    left = leaf_compiled.unvouched(
        items, value.shared, value.queue_id, value.epoch, chain=chain[first:], first=first
    )
    assert left is not None
    for index, item in enumerate(items):
        if index not in left:
            assert python_confirms(value, item, chain[first:], first)
    if change[0] != "leaf not computed":
        assert at in left


def test_arguments_of_another_shape_are_left_to_python(built: Any) -> None:
    value, bodies, chain = signed_log(5)
    args = (bodies, value.shared, value.queue_id, value.epoch)
    assert leaf_compiled.unvouched(*args, chain=chain, first=0) is not None
    for i, odd in ((1, list(value.shared)), (2, bytearray(value.queue_id)), (3, True)):
        changed = (*args[:i], odd, *args[i + 1 :])
        assert leaf_compiled.unvouched(*changed, chain=chain, first=0) is None  # type: ignore[arg-type]
    assert leaf_compiled.unvouched(*args, chain=tuple(chain), first=0) is None
    assert leaf_compiled.unvouched(*args, chain=chain, first=-1) is None


def catch_up_chunk(count: int) -> tuple[queue2.QueueState2, queue2.Delta]:
    """A fresh replica and the first chunk of ``count`` single offers, rebuilt from its steps."""
    owner = Identity.from_seed(b"o" * 32)
    empty = queue2.empty_state(owner.public_key, "q")
    return empty, chunk(single_offers(owner, range(10, 10 + count)), empty, 4096)


@pytest.mark.parametrize("compiled", [True, False])
def test_verify_delta_refuses_a_changed_body_or_record_on_both_paths(
    built: Any, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    empty, d = catch_up_chunk(40)
    if not compiled:
        monkeypatch.setattr(leaf_compiled, "_packs", lambda: None)
    verified = queue2.verify_delta(empty, d)
    assert len(verified.records) == 40 and len(verified.bodies) == len(d.bodies)
    for at in (0, 7, len(d.bodies) - 2):
        bodies = list(d.bodies)
        bodies[at] = dataclasses.replace(bodies[at], head_hash=bytes(32))
        bodies[at].leaf()
        with pytest.raises(TamperedError):
            queue2.verify_delta(empty, dataclasses.replace(d, bodies=tuple(bodies)))
    records = list(d.records)
    records[5] = make_record(b"another", timestamp=5)
    with pytest.raises(TamperedError):
        queue2.verify_delta(empty, dataclasses.replace(d, records=tuple(records)))


def test_verify_delta_refuses_a_chunk_without_a_body_that_ends_inside_it(built: Any) -> None:
    # The usual chunk's path (every body ends inside the records) reads the bodies' ends once, as a set,
    # and tests the log's ends against it: a body left out anywhere, the last included, is refused.
    empty, d = catch_up_chunk(30)
    assert len(queue2.verify_delta(empty, d).bodies) == len(d.bodies)
    for at in (0, 11, len(d.bodies) - 1):
        without = dataclasses.replace(d, bodies=d.bodies[:at] + d.bodies[at + 1 :])
        with pytest.raises(TamperedError):
            queue2.verify_delta(empty, without)


heads_of = st.builds(
    lambda end, version, ts: HeadV2(
        b"q" * 32, 0, version, b"l" * 32, 0, end, b"b" * 32, b"h" * 32, 0, b"m" * 32, ts
    ),
    st.integers(0, 6),
    st.integers(1, 6),
    st.integers(0, 3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(heads_of, max_size=6), st.lists(heads_of, max_size=8))
def test_in_order_is_the_stable_sort(carried: list[HeadV2], rebuilt: list[HeadV2]) -> None:
    def key(b: HeadV2) -> tuple[int, int]:
        return b.end, b.version

    rebuilt.sort(key=key)  # as decode_versions gives them
    got = leaf_bodies.in_order(tuple(carried), rebuilt)
    want = tuple(sorted((*carried, *rebuilt), key=key))
    assert [id(b) for b in got] == [id(b) for b in want]


def test_packed_bodies_are_to_bytes(built: Any) -> None:
    _, heads = history([("offer", 1), ("meta", 1), ("offer", 2)])
    unsigned = [dataclasses.replace(h, signature=b"") for h in heads]
    for items in (heads, unsigned, tuple(heads), []):
        assert leaf_compiled.packed(items) == [h.to_bytes() for h in items]


class Head(HeadV2):
    __slots__ = ()


@pytest.mark.parametrize(
    "odd",
    [
        lambda h: dataclasses.replace(h, epoch=True),
        lambda h: dataclasses.replace(h, log=b"short"),
        lambda h: dataclasses.replace(h, signature=bytearray(64)),
        lambda h: Head(*(getattr(h, f.name) for f in dataclasses.fields(HeadV2) if f.init)),
    ],
)
def test_a_head_of_another_shape_is_packed_by_python(built: Any, odd: Callable[[HeadV2], HeadV2]) -> None:
    _, heads = history([("offer", 1), ("offer", 1)])
    items = [heads[0], odd(heads[1])]
    assert built(HeadV2, heads[0].body()[:24], items) is None
    assert leaf_compiled.packed(items) == [
        heads[0].to_bytes(),
        bytes(items[1].body()) + bytes(items[1].signature),
    ]


def test_the_passes_keep_no_reference_they_do_not_own(built: Any) -> None:
    value, bodies, chain = signed_log(12)
    shared = (value.queue_id, *value.shared, *chain, *bodies)
    before = [sys.getrefcount(o) for o in shared]
    for _ in range(200):
        leaf_compiled.unvouched(bodies, value.shared, value.queue_id, value.epoch, chain=chain, first=0)
        leaf_compiled.packed(bodies)
    assert [sys.getrefcount(o) for o in shared] == before


def test_a_head_with_an_empty_slot_raises_as_getattr_does(built: Any) -> None:
    # unvouched reads a head's slots in place; an empty one (a head never initialised) goes through
    # getattr, which raises, as the pass did before it read slots in place.
    value, bodies, chain = signed_log(4)
    empty = object.__new__(HeadV2)
    with pytest.raises(AttributeError):
        leaf_compiled.unvouched(
            [*bodies[:2], empty], value.shared, value.queue_id, value.epoch, chain=chain, first=0
        )
    assert leaf_compiled.unvouched(
        bodies, value.shared, value.queue_id, value.epoch, chain=chain, first=0
    ) == [3]
