"""The compiled passes over lists (``packed_bodies``, ``unvouched``, ``fold`` and ``versions`` in
latticed/crdt/_columns.c) when a garbage collection inside them runs a finalizer that empties the list
they read (review23b found this in ``compact_rows`` and ``offered``; tests/protocol/
test_compact_rows_compiled.py has those). Each pass reads the list's size after the allocation that may
collect, or again after it, and holds an item it still uses: it answers what Python answers of the
list as the finalizer left it, or None (the Python path then reads it). Before, each read past an
emptied list or a freed item (a crash, or bytes of another object).

The finalizer also refills the freed memory with other bytes, so a pass that kept a freed item's
address reads those instead of failing only under .ci/sanitize. Sans-IO.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
from collections.abc import Callable
from typing import Any

from support.accel import required
from support.v2_histories import OWNER, history

from latticed.crdt import epoch_delta, epochs, fold_compiled, leaf_codec, leaf_compiled
from latticed.crdt.head2 import HEAD2_NAMESPACE, HeadV2, fold_one, next_log

#: One try per position of the collection among the pass's first allocations of tracked objects.
DUES = range(1, 9)


def _copy(value: bytes) -> bytes:
    """An equal bytes object of its own, held by nothing else (freed when the list that holds it is)."""
    return bytes(bytearray(value))


def collected_inside(
    read: Callable[..., Any], make: Callable[[], tuple[tuple[Any, ...], list[Any]]]
) -> list[tuple[Any, list[Any]]]:
    """``read(*args)`` for each of ``DUES``, ``make()`` giving fresh ``(args, victim)`` each time, with a
    garbage collection due at that tracked allocation whose finalizer empties ``victim`` (then
    allocates bytes into the memory it freed). Returns ``(answer, victim after)`` of the calls in which
    the finalizer ran inside the pass."""
    here, found = sys._getframe().f_code, []
    keep: list[list[bytes]] = []
    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    try:
        for due in DUES:
            args, victim = make()
            inside: list[int] = []

            class Finalized:
                def __del__(self) -> None:
                    caller = sys._getframe(1)
                    if caller.f_code is here and caller.f_lineno == line:
                        inside.append(len(victim))
                    victim.clear()
                    keep.append([os.urandom(32) for _ in range(512)])

            bomb = Finalized()
            bomb.cycle = bomb  # type: ignore[attr-defined]
            del bomb
            gc.set_threshold(gc.get_count()[0] + due)
            gc.enable()
            line = sys._getframe().f_lineno + 1
            answer = read(*args)  # an exact tuple: passed on as it is, nothing allocated before the pass
            gc.disable()
            gc.set_threshold(*threshold)
            gc.collect()  # the bomb, if it was not collected inside
            if inside:
                found.append((answer, victim))
    finally:
        gc.set_threshold(*threshold)
        gc.enable()
    return found


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
    for answer, heads in runs:
        assert heads == [] and answer in (None, [])


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
        for answer, victim in runs:
            assert victim == []
            now = (victim, chain) if emptied == "bodies" else (bodies, victim)
            assert answer is None or answer == python(*now), emptied


def test_fold_of_leaves_emptied_during_the_pass() -> None:
    c = required(fold_compiled.load(), "the compiled fold latticed.crdt._columns.fold")
    log = bytes(range(32))

    def make() -> tuple[tuple[Any, ...], list[Any]]:
        leaves = [(os.urandom(32), end) for end in range(64)]
        return (c.blake2b, fold_compiled.LOG_PERSON, log, leaves, 8), leaves

    runs = collected_inside(c.columns.fold, make)
    assert runs
    for answer, leaves in runs:
        folded = log
        for digest, end in leaves:
            folded = fold_one(folded, digest, end)
        assert leaves == [] and answer in (None, (folded, []))


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
    for answer, chain in runs:
        assert chain == []
        assert answer is None or [b.head_hash for b in answer] == expected
