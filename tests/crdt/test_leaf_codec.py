"""The v2 log's steps: a replica holding the records rebuilds every leaf from a few bytes a version, a
changed record shows as a log that no longer folds into the signed head, and bad bytes are refused."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.v2_histories import OWNER, history, step

from latticed.crdt import epochs, leaf_codec
from latticed.crdt import queue as core
from latticed.crdt.core_errors import EquivocationError, MalformedError
from latticed.crdt.head2 import HeadV2, Leaf, genesis
from latticed.crdt.signing import blake2b


def steps_for(state: core.QueueState, heads: list[HeadV2]) -> list[HeadV2 | Leaf]:
    """Each head as a body when its records are held, else as its leaf (as the sender would)."""
    return [h if state.chain_at(h.start) and state.chain_at(h.end) else h.leaf() for h in heads]


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=2, max_size=14), st.data())
def test_a_replica_holding_the_records_rebuilds_every_leaf(
    steps: list[tuple[str, int]], data: st.DataObject
) -> None:
    state, heads = history(steps)
    at = data.draw(st.integers(0, len(heads) - 2))
    raw = leaf_codec.encode(heads[at], steps_for(state, heads[at + 1 : -1]))
    leaves = leaf_codec.decode(heads[at], raw, state.chain_at)
    assert leaves == [h.leaf() for h in heads[at + 1 : -1]]
    value = epochs.replica(OWNER.public_key, heads[-1], (*(h.leaf() for h in heads[: at + 1]), *leaves), 0)
    epochs.verify(value)
    rebuilt = sum(1 for h in steps_for(state, heads[at + 1 : -1]) if isinstance(h, HeadV2))
    assert len(raw) <= 40 * (len(leaves) - rebuilt) + 45 * rebuilt


def test_a_single_offer_costs_three_bytes_and_a_changed_record_breaks_the_fold() -> None:
    state, heads = history([("offer", 1)] * 20)
    raw = leaf_codec.encode(heads[0], heads[1:-1])
    assert len(raw) == 3 * 18
    honest = leaf_codec.decode(heads[0], raw, state.chain_at)
    epochs.verify(epochs.replica(OWNER.public_key, heads[-1], (heads[0].leaf(), *honest), 0))
    tampered = {offset: state.chain_at(offset) for offset in range(21)}
    tampered[7] = blake2b(b"another record", b"test.record")
    leaves = leaf_codec.decode(heads[0], raw, tampered.get)
    value = epochs.replica(OWNER.public_key, heads[-1], (heads[0].leaf(), *leaves), 0)
    with pytest.raises(EquivocationError):
        epochs.verify(value)


def test_steps_over_records_not_held_are_refused() -> None:
    _, heads = history([("offer", 2), ("offer", 2), ("offer", 2)])
    raw = leaf_codec.encode(heads[0], heads[1:2])
    with pytest.raises(MalformedError):
        leaf_codec.decode(heads[0], raw, lambda offset: None)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_bad_bytes_are_refused_with_a_typed_error(raw: bytes) -> None:
    _, heads = history([("offer", 2)])
    try:
        leaves = leaf_codec.decode(heads[0], raw, lambda offset: bytes(32))
    except MalformedError:
        return
    assert all(len(digest) == 32 for digest, _ in leaves)


def test_a_leaf_sent_as_is_keeps_the_fields_after_it() -> None:
    body = HeadV2(bytes(32), 0, 1, genesis(bytes(32), 0), 0, 0, bytes(32), bytes(32), 0, bytes(32), 5)
    later = dataclasses.replace(body, version=3, end=4, timestamp=9)
    raw = leaf_codec.encode(body, [(b"\x01" * 32, 2), later])
    leaves = leaf_codec.decode(body, raw, lambda offset: bytes(32))
    assert leaves[0] == (b"\x01" * 32, 2) and leaves[1][1] == 4
