"""A commit's or a live push's bodies and leaves extend the stored value's own lists
(:mod:`latticed.crdt.shared_prefix`): the store's diff of them reads what was appended, not the queue,
and answers what the full comparison answers for every shape."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, SupportsIndex

from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue2
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import make_record
from latticed.crdt.shared_prefix import Grown, grown
from latticed.crdt.signing import Identity
from latticed.storage import core2_leaves, core2_store

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def owned(n: int) -> QueueState2:
    state = queue2.empty_state(ALICE.public_key, "q")
    for i in range(n):
        state = queue2.commit(
            state, ALICE, now_ms=NOW + i, records=[make_record(b"r%d" % i, timestamp=NOW + i)]
        )
    return state


QUEUE = owned(60)
BODIES: tuple[HeadV2, ...] = tuple(QUEUE.bodies)
LEAVES = tuple(QUEUE.chains.shared)


class Counting(list[Any]):
    """A list that counts the items read through indexing (a slice counts each item it returns)."""

    reads = 0

    def __getitem__(self, index: SupportsIndex | slice) -> Any:  # type: ignore[override]
        got = super().__getitem__(index)
        Counting.reads += len(got) if isinstance(index, slice) else 1
        return got


def test_a_commit_diffs_its_bodies_by_what_it_appended() -> None:
    base: Grown[HeadV2] = Grown(Counting(BODIES[:-1]), len(BODIES) - 1)
    new = grown(base, BODIES[-1:])
    Counting.reads = 0
    assert core2_store._changed_bodies(base, new) == ([], BODIES[-1:])
    assert Counting.reads <= 1  # the appended body, not the 59 both hold


def test_common_leaves_of_one_list_read_none() -> None:
    base: Grown[tuple[bytes, int]] = Grown(Counting(LEAVES[:-2]), len(LEAVES) - 2)
    new = grown(base, LEAVES[-2:])
    a, b = replace(QUEUE.chains, shared=base), replace(QUEUE.chains, shared=new)
    Counting.reads = 0
    assert core2_leaves.common(a, b) == core2_leaves.common(b, a) == len(LEAVES) - 2
    assert Counting.reads == 0


def _shape(data: st.DataObject, items: tuple[Any, ...]) -> tuple[Any, Any]:
    """Two sequences as the store meets them: tuples, views of one list (either the longer), views of
    two lists, a view against a tuple; any subsets, or a prefix and its extension."""
    kind = data.draw(st.sampled_from(["tuples", "one list", "two lists", "view and tuple"]))
    if kind == "one list":
        n, m = sorted(data.draw(st.lists(st.integers(0, len(items)), min_size=2, max_size=2)))
        older = grown(items[:n])
        newer = grown(older, items[n:m])
        return (older, newer) if data.draw(st.booleans()) else (newer, older)
    old = tuple(x for x in items if data.draw(st.booleans()))
    new = tuple(x for x in items if data.draw(st.booleans()))
    if kind == "tuples":
        return old, new
    if kind == "two lists":
        return grown(old), grown(new)
    return (grown(old), new) if data.draw(st.booleans()) else (old, grown(new))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_fast_diff_answers_what_the_full_one_does(data: st.DataObject) -> None:
    old, new = _shape(data, BODIES)
    gone, added = core2_store._changed_bodies(old, new)
    full_gone, full_added = core2_store._changed_bodies(tuple(old), tuple(new))
    assert (list(gone), tuple(added)) == (list(full_gone), tuple(full_added))
    assert sorted({*old} - {*gone} | {*added}, key=core2_store._key) == list(new)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_common_leaves_answer_what_the_full_search_does(data: st.DataObject) -> None:
    """Verified logs of one epoch: each a prefix of the other (a cut log is a prefix too)."""
    n, m = sorted(data.draw(st.lists(st.integers(0, len(LEAVES)), min_size=2, max_size=2)))
    shapes: dict[str, tuple[Any, Any]] = {
        "tuples": (LEAVES[:n], LEAVES[:m]),
        "two lists": (grown(LEAVES[:n]), grown(LEAVES[:m])),
        "view and tuple": (grown(LEAVES[:n]), LEAVES[:m]),
    }
    older = grown(LEAVES[:n])
    shapes["one list"] = (older, grown(older, LEAVES[n:m]))
    old, new = shapes[data.draw(st.sampled_from(sorted(shapes)))]
    if data.draw(st.booleans()):
        old, new = new, old
    a, b = replace(QUEUE.chains, shared=old), replace(QUEUE.chains, shared=new)
    full = replace(QUEUE.chains, shared=tuple(old)), replace(QUEUE.chains, shared=tuple(new))
    assert core2_leaves.common(a, b) == core2_leaves.common(*full) == n
