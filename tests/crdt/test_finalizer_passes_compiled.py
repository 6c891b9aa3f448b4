"""The compiled passes over lists (``packed_bodies``, ``unvouched``, ``fold`` and ``versions`` in
latticed/crdt/_columns.c) when a garbage collection inside them runs a finalizer that empties the list
they read (review23b found this in ``compact_rows`` and ``offered``; tests/protocol/
test_compact_rows_compiled.py has those). Each pass reads the list's size after the allocation that may
collect, or again after it, and holds an item it still uses: it answers what Python answers of the
list as the finalizer left it, or None (the Python path then reads it). Before, each read past an
emptied list or a freed item (a crash, or bytes of another object).

The finalizer (tests/support/gc_inside.py) also refills the freed memory with other bytes, so a pass
that kept a freed item's address reads those instead of failing only under .ci/sanitize. Sans-IO.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from support.accel import required
from support.gc_inside import collected_inside
from support.v2_histories import OWNER, history

from latticed.crdt import epoch_delta, epochs, fold_compiled, leaf_codec, leaf_compiled
from latticed.crdt.head2 import HEAD2_NAMESPACE, HeadV2, fold_one, next_log


def _copy(value: bytes) -> bytes:
    """An equal bytes object of its own, held by nothing else (freed when the list that holds it is)."""
    return bytes(bytearray(value))


def _log(count: int) -> tuple[epochs.Chains, list[HeadV2], list[bytes]]:
    """A value whose log holds ``count`` single offers, its heads (leaves computed) and the chain values
    after offset 0 (each its own object)."""
    state, heads = history([("offer", 1)] * count)
    value = epochs.replica(OWNER.public_key, heads[-1], tuple(h.leaf() for h in heads[:-1]), 0)
    bodies = [dataclasses.replace(h) for h in heads]
    for body in bodies:
        body.leaf()
    chain = [_copy(state.chain_at(offset) or b"") for offset in range(1, state.known_end + 1)]
    return value, bodies, chain


def test_packed_bodies_of_heads_emptied_during_the_pass() -> None:
    packs = required(leaf_compiled._packs(), "the compiled body passes in latticed.crdt._columns")
    _, bodies, _ = _log(40)

    def make() -> tuple[tuple[Any, ...], list[Any]]:
        heads = list(bodies)
        return (HeadV2, HEAD2_NAMESPACE, heads), heads

    runs = collected_inside(packs, make)
    assert runs
    for run in runs:
        assert run.victim == [] and run.answer in (None, [])


def test_unvouched_of_bodies_or_a_chain_emptied_during_the_pass() -> None:
    required(leaf_compiled._packs(), "the compiled body passes in latticed.crdt._columns")
    columns = required(fold_compiled.load(), "latticed.crdt._columns").columns
    value, bodies, chain = _log(40)

    def python(now: list[HeadV2], chain_now: list[bytes]) -> list[int]:
        def confirms(body: HeadV2) -> bool:
            index = body.end - 1
            return (
                epoch_delta.vouches(value, body)
                and index < len(chain_now)
                and body.head_hash == chain_now[index]
            )

        return [i for i, body in enumerate(now) if not confirms(body)]

    for emptied in ("bodies", "chain"):

        def make() -> tuple[tuple[Any, ...], list[Any]]:
            listed, values = list(bodies), [_copy(c) for c in chain]
            args = (HeadV2, listed, value.shared, value.queue_id, value.epoch, values, 0)
            return args, listed if emptied == "bodies" else values

        runs = collected_inside(columns.unvouched, make)
        assert runs, emptied
        for run in runs:
            assert run.victim == []
            now = (run.victim, chain) if emptied == "bodies" else (bodies, run.victim)
            assert run.answer is None or run.answer == python(*now), emptied


def test_fold_of_leaves_emptied_during_the_pass() -> None:
    """A collection at the pass's first allocation (before it reads the leaves) must be seen: the fold of
    the emptied list, or None. One at its last (the answer's tuple, after every read) leaves the answer
    the fold of the whole list, which is what the pass read."""
    c = required(fold_compiled.load(), "the compiled fold latticed.crdt._columns.fold")
    log = bytes(range(32))
    whole: dict[int, tuple[bytes, list[bytes]]] = {}

    def folds(leaves: list[tuple[bytes, int]]) -> tuple[bytes, list[bytes]]:
        folded, steps = log, []
        for count, (digest, end) in enumerate(leaves, 1):
            folded = fold_one(folded, digest, end)
            if count % 8 == 0:
                steps.append(folded)
        return folded, steps

    def make() -> tuple[tuple[Any, ...], list[Any]]:
        leaves = [(os.urandom(32), end) for end in range(64)]
        whole[id(leaves)] = folds(leaves)  # no leaf kept: the finalizer frees them
        return (c.blake2b, fold_compiled.LOG_PERSON, log, leaves, 8), leaves

    runs = collected_inside(c.columns.fold, make)
    assert runs
    for run in runs:
        assert run.victim == [] and run.answer in (None, folds(run.victim), whole[id(run.victim)])
    assert any(run.answer != whole[id(run.victim)] for run in runs)  # a collection before the reads


def test_versions_over_a_chain_emptied_during_the_pass() -> None:
    """The bodies it builds hold the chain values they were built from, however late in the pass the
    chain is emptied (a body's allocation is where a collection runs)."""
    c = required(leaf_compiled.load(), "the compiled loop latticed.crdt._columns.versions")
    state, heads = history([("offer", 1)] * 6)
    raw = leaf_codec.encode(heads[0], heads[1:])
    expected = [h.head_hash for h in heads[1:]]
    base = state.chain_at(0)

    def make() -> tuple[tuple[Any, ...], list[Any]]:
        chain = [_copy(state.chain_at(offset) or b"") for offset in range(1, state.known_end + 1)]
        fields = leaf_compiled._fields(heads[0])
        args = (HeadV2, c.blake2b, leaf_compiled._PERSONS, HEAD2_NAMESPACE, fields, next_log(heads[0]), raw)
        return (*args, base, 0, chain), chain

    runs = collected_inside(c.versions, make)
    assert len(runs) >= 2  # emptied before the first body, and at bodies' allocations
    for run in runs:
        assert run.victim == []
        assert run.answer is None or [b.head_hash for b in run.answer] == expected
