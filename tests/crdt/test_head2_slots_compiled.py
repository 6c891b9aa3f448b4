"""``HeadV2``'s slots are exactly the C passes' name table (``HEAD_SLOTS`` of latticed/crdt/_columns.c).

``versions`` and ``compact_head`` build heads slot by slot and ``packed_bodies``, ``appended_head`` and
``unvouched`` read them so: a slot added to ``HeadV2`` (a field, or a value a method caches) without the
table learning of it would be left empty in every head built from a peer's push, and raise where it is
read. These tests make that a failing test instead.

Where the extension is missing the tests skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by .ci/run)
makes them fail instead.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from types import ModuleType

import pytest
from support.v2_histories import history

from latticed.crdt import columns_compiled, head2, leaf_codec, leaf_compiled
from latticed.crdt.head2 import HeadV2, next_log
from latticed.protocol import core2_head_compiled


@pytest.fixture(scope="module")
def built() -> ModuleType:
    found = columns_compiled.load()
    if found is not None:
        return found
    message = "the compiled passes latticed.crdt._columns are not built (no C compiler at install?)"
    if os.environ.get("LATTICED_REQUIRE_ACCEL") == "1":
        pytest.fail(message)
    pytest.skip(message)


def test_the_c_name_table_is_the_slots_in_the_fields_order(built: ModuleType) -> None:
    assert HeadV2.__slots__ == built.HEAD_SLOTS
    # compact_head's fallback calls the constructor with the first 12 positionally.
    assert tuple(f.name for f in dataclasses.fields(HeadV2)) == built.HEAD_SLOTS
    assert tuple(f.name for f in dataclasses.fields(HeadV2) if f.init) == built.HEAD_SLOTS[:12]


def test_the_c_types_of_the_signed_fields_are_the_bodys(built: ModuleType) -> None:
    hints = typing.get_type_hints(HeadV2)
    signed = built.HEAD_SLOTS[:11]  # packed in this order by body(), then the signature
    assert sorted((*built.HEAD_HASH_SLOTS, *built.HEAD_COUNTER_SLOTS)) == list(range(len(signed)))
    assert [signed[i] for i in built.HEAD_HASH_SLOTS] == [n for n in signed if hints[n] is bytes]
    assert [signed[i] for i in built.HEAD_COUNTER_SLOTS] == [n for n in signed if hints[n] is int]
    assert head2.HEAD2_BODY.format == ">" + "".join("32s" if hints[n] is bytes else "Q" for n in signed)


def test_the_ref_names_compact_head_reads_are_slots_of_the_right_kind(built: ModuleType) -> None:
    slots, ref = built.HEAD_SLOTS, built.REF_SLOTS
    counters = [slots[i] for i in built.HEAD_COUNTER_SLOTS if slots[i] != "epoch"]
    hashes = [slots[i] for i in built.HEAD_HASH_SLOTS if slots[i] not in ("queue_id", "log")]
    assert list(ref) == [*counters, *hashes, "_leaf"]


def test_a_head_keeps_nothing_but_its_slots(built: ModuleType) -> None:
    _, heads = history([("offer", 1)] * 2)
    head = heads[-1]
    head.leaf()  # the one value a method caches, in its slot
    assert not hasattr(head, "__dict__") and not hasattr(HeadV2, "__weakref__")
    assert {name for name in built.HEAD_SLOTS if hasattr(head, name)} == set(HeadV2.__slots__)


def test_every_slot_of_a_head_the_c_builds_is_set_as_pythons(built: ModuleType) -> None:
    c = leaf_compiled.load()
    assert c is not None
    state, heads = history([("offer", 1)] * 6)
    raw = leaf_codec.encode(heads[0], heads[1:-1])
    chain = [value for value in map(state.chain_at, range(1, 7)) if value is not None]
    base = state.chain_at(0)
    assert base is not None and len(chain) == 6
    found = leaf_compiled.decode(c, heads[0], next_log(heads[0]), raw, (0, base, chain))
    assert found is not None and len(found) == 4
    for got, want in zip(found, heads[1:-1], strict=True):
        assert isinstance(got, HeadV2)
        assert [getattr(got, name) for name in HeadV2.__slots__[:11]] == [
            getattr(want, name) for name in HeadV2.__slots__[:11]
        ]
        assert got.signature == b"" and got._leaf == want.leaf()


def _clear() -> None:
    leaf_compiled.load.cache_clear()
    leaf_compiled._packs.cache_clear()
    core2_head_compiled._slots_known.cache_clear()


def test_a_table_that_is_not_the_slots_turns_the_passes_that_build_heads_off(
    built: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if a slot were added to HeadV2 and not to the C: the passes that set slots are not used at all.
    monkeypatch.setattr(built, "HEAD_SLOTS", (*built.HEAD_SLOTS, "_body"))
    _clear()
    try:
        assert not columns_compiled.knows_slots(HeadV2.__slots__)
        assert leaf_compiled.load() is None and leaf_compiled._packs() is None
        assert (
            core2_head_compiled.compact_head(
                [0] * 10,
                None,
                queue_id=bytes(32),
                epoch=0,
                shared_fold=None,
                tail=(),
                chained=None,
                records_end=0,
                empty_meta=None,
            )
            is None
        )
    finally:
        monkeypatch.undo()
        _clear()
    assert columns_compiled.knows_slots(HeadV2.__slots__)
    assert leaf_compiled.load() is not None and core2_head_compiled._slots_known()
