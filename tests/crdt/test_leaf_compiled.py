"""The compiled loop of the steps' bodies (``versions`` in latticed/crdt/_columns.c) rebuilds exactly
what :func:`latticed.crdt.leaf_bodies.decode_versions`'s Python loop rebuilds — the same bodies, leaves
and log — and leaves everything else to that loop: any steps the Python loop refuses (malformed, over
records not held), the compiled one answers None for. A record changed under the steps still breaks
the fold into the signed head, on either path.

Where the extension is missing the tests that need it skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by
.ci/run) makes them fail instead.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accel import required
from support.v2_histories import OWNER, history, step

from latticed.crdt import epochs, leaf_bodies, leaf_codec, leaf_compiled
from latticed.crdt.core_errors import EquivocationError, GapError, MalformedError
from latticed.crdt.head2 import HeadV2, Leaf, body_digest, next_log
from latticed.crdt.signing import blake2b

Window = tuple[int, bytes, list[bytes]]


@pytest.fixture(scope="module")
def built() -> leaf_compiled.Compiled:
    """The compiled loop; skip where it was not built, unless it is required there."""
    return required(leaf_compiled.load(), "the compiled loop latticed.crdt._columns.versions")


def window_of(chain_at: Callable[[int], bytes | None], first: int, last: int) -> Window:
    base = chain_at(first)
    assert base is not None
    return first, base, [value for value in map(chain_at, range(first + 1, last + 1)) if value is not None]


def lookup(window: Window) -> Callable[[int], bytes | None]:
    first, base, chain = window
    return lambda offset: (
        base
        if offset == first
        else chain[offset - first - 1]
        if first < offset <= first + len(chain)
        else None
    )


def python(prev: HeadV2, raw: bytes, chain_at: Callable[[int], bytes | None]) -> list[HeadV2 | Leaf] | type:
    try:
        return leaf_bodies._decode(prev, next_log(prev), raw, chain_at)
    except (MalformedError, GapError) as exc:
        return type(exc)


def assert_same(c: leaf_compiled.Compiled, prev: HeadV2, raw: bytes, window: Window) -> bool:
    """The compiled loop gives the Python loop's versions, or None; None wherever Python refuses.
    Returns whether the compiled loop answered."""
    expected = python(prev, raw, lookup(window))
    found = leaf_compiled.decode(c, prev, next_log(prev), raw, window)
    if isinstance(expected, type):
        assert found is None, expected
        return False
    if found is None:
        return False
    assert found == expected
    for got, want in zip(found, expected, strict=True):
        assert type(got) is type(want)
        if isinstance(got, HeadV2):
            assert isinstance(want, HeadV2)
            assert got.signature == b"" and got.leaf() == (body_digest(got.body()), got.end) == want.leaf()
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=2, max_size=14), st.data())
def test_steps_rebuild_the_bodies_the_python_loop_rebuilds(
    built: leaf_compiled.Compiled, steps: list[tuple[str, int]], data: st.DataObject
) -> None:
    state, heads = history(steps)
    at = data.draw(st.integers(0, len(heads) - 2))
    versions = [h if state.chain_at(h.start) and state.chain_at(h.end) else h.leaf() for h in heads[at + 1 :]]
    raw = leaf_codec.encode(heads[at], versions)
    lo = data.draw(st.integers(state.start, state.known_end))
    hi = data.draw(st.integers(lo, state.known_end))
    assert_same(built, heads[at], raw, window_of(state.chain_at, lo, hi))


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=3, max_size=10), st.data())
def test_bytes_the_python_loop_refuses_the_compiled_one_leaves_to_it(
    built: leaf_compiled.Compiled, steps: list[tuple[str, int]], data: st.DataObject
) -> None:
    state, heads = history(steps)
    raw = bytearray(leaf_codec.encode(heads[0], heads[1:]))
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["flip", "cut", "append", "set"]))
        if how == "cut":
            del raw[data.draw(st.integers(0, len(raw))) :]
        elif how == "append":
            raw += data.draw(st.binary(min_size=1, max_size=12))
        elif raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = (
                raw[i] ^ (1 << data.draw(st.integers(0, 7)))
                if how == "flip"
                else data.draw(st.integers(0, 255))
            )
    assert_same(built, heads[0], bytes(raw), window_of(state.chain_at, state.start, state.known_end))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_any_bytes_are_rebuilt_alike_or_left_to_python(built: leaf_compiled.Compiled, raw: bytes) -> None:
    state, heads = history([("offer", 2), ("offer", 3)])
    assert_same(built, heads[0], raw, window_of(state.chain_at, state.start, state.known_end))


def test_counters_at_their_bounds_are_left_to_python(built: leaf_compiled.Compiled) -> None:
    state, heads = history([("offer", 1)] * 3)
    window = window_of(state.chain_at, 0, 3)
    huge = leaf_codec._varint(2**63)  # an end or timestamp step past what a head holds
    for raw in (
        bytes([0]) + huge + b"\x00",
        bytes([0, 1]) + leaf_codec._varint(2**64),
        bytes([4]) + huge + bytes(32),
        bytes([0]) + b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x00" + b"\x00",  # a 10-byte varint of 1
    ):
        assert_same(built, heads[0], raw, window)
    last = dataclasses.replace(heads[0], version=2**64 - 1)
    assert (
        built.versions is not None
        and leaf_compiled.decode(built, last, next_log(last), b"\x00\x01\x00", window) is None
    )
    late = dataclasses.replace(heads[0], timestamp=2**64 - 1)
    assert leaf_compiled.decode(built, late, next_log(late), b"\x00\x01\x02", window) is None


def test_single_offers_take_the_compiled_loop_and_a_changed_record_breaks_the_fold(
    built: leaf_compiled.Compiled,
) -> None:
    state, heads = history([("offer", 1)] * 20)
    raw = leaf_codec.encode(heads[0], heads[1:-1])
    window = window_of(state.chain_at, 0, 20)
    assert assert_same(built, heads[0], raw, window)
    honest = leaf_bodies.decode_versions(heads[0], raw, lookup(window), window)
    leaves = [b.leaf() if isinstance(b, HeadV2) else b for b in honest]
    epochs.verify(epochs.replica(OWNER.public_key, heads[-1], (heads[0].leaf(), *leaves), 0))
    first, base, chain = window
    tampered = (first, base, [*chain[:6], blake2b(b"another record", b"test.record"), *chain[7:]])
    forged = leaf_compiled.decode(built, heads[0], next_log(heads[0]), raw, tampered)
    assert forged is not None
    leaves = [b.leaf() if isinstance(b, HeadV2) else b for b in forged]
    with pytest.raises(EquivocationError):
        epochs.verify(epochs.replica(OWNER.public_key, heads[-1], (heads[0].leaf(), *leaves), 0))


def test_the_loop_keeps_no_reference_it_does_not_own(built: leaf_compiled.Compiled) -> None:
    """Run many times, the objects it shares with the trusted body keep their reference counts."""
    state, heads = history([("offer", 1), ("meta", 1), ("offer", 2), ("truncate", 1), ("offer", 1)])
    raw = leaf_codec.encode(heads[0], heads[1:])
    window = window_of(state.chain_at, state.start, state.known_end)
    prev = heads[0]
    shared = (prev.queue_id, prev.meta_hash, prev.base_hash, window[1], *window[2])
    assert leaf_compiled.decode(built, prev, next_log(prev), raw, window) is not None  # the meta path too
    before = [sys.getrefcount(o) for o in shared]
    for _ in range(200):
        leaf_compiled.decode(built, prev, next_log(prev), raw, window)
        leaf_compiled.decode(built, prev, next_log(prev), raw[:-1], window)
    assert [sys.getrefcount(o) for o in shared] == before


def test_the_bodies_and_leaves_it_makes_are_left_out_of_the_cycle_collector(
    built: leaf_compiled.Compiled,
) -> None:
    """They hold only bytes, ints and a leaf: untracked, a collection does not walk them (a catch-up
    makes two a version), and they are freed by their reference counts, as any untracked object."""
    state, heads = history([("offer", 1)] * 6 + [("meta", 0), ("offer", 1)])
    window = window_of(state.chain_at, 0, state.known_end)
    mixed = [heads[2].leaf(), *heads[3:]]  # a leaf the steps carry whole, then bodies
    raw = leaf_codec.encode(heads[1], mixed)
    found = leaf_compiled.decode(built, heads[1], next_log(heads[1]), raw, window)
    assert found is not None and found[0] == mixed[0]
    bodies = [v for v in found if isinstance(v, HeadV2)]
    assert len(bodies) == len(heads) - 3
    assert not any(gc.is_tracked(b) or gc.is_tracked(b.leaf()) for b in bodies)
    assert not any(gc.is_tracked(v) for v in found if not isinstance(v, HeadV2))
    assert [b.leaf() for b in bodies] == [h.leaf() for h in heads[3:]]


def test_without_the_extension_the_python_loop_reads_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    state, heads = history([("offer", 1)] * 10 + [("meta", 0), ("offer", 2)])
    raw = leaf_codec.encode(heads[0], heads[1:])
    window = window_of(state.chain_at, 0, state.known_end)
    either = leaf_bodies.decode_versions(heads[0], raw, state.chain_at, window)
    monkeypatch.setattr(leaf_compiled, "load", lambda: None)
    assert leaf_bodies.decode_versions(heads[0], raw, state.chain_at, window) == either
    assert [b.leaf() for b in either if isinstance(b, HeadV2)] == [h.leaf() for h in heads[1:]]


def test_the_leaves_and_logs_it_fills_are_the_pythons_and_the_folds_of_the_log(
    built: leaf_compiled.Compiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lists the same pass fills (so the replica need not walk the bodies again) are each version's
    leaf and the log before it, then the last: on both paths, leaves carried whole among them too, and
    emptied where the compiled loop refuses the steps."""
    state, heads = history([("offer", 1)] * 6 + [("meta", 0), ("offer", 1)])
    window = window_of(state.chain_at, 0, state.known_end)
    mixed = [heads[2].leaf(), *heads[3:]]
    raw = leaf_codec.encode(heads[1], mixed)
    want_leaves = [h.leaf() for h in heads[2:]]
    want_logs = [h.log for h in heads[2:]] + [next_log(heads[-1])]
    filled: list[tuple[list[Leaf], list[bytes]]] = []
    for load in (leaf_compiled.load, lambda: None):
        monkeypatch.setattr(leaf_compiled, "load", load)
        out: tuple[list[Leaf], list[bytes]] = ([], [])
        found = leaf_bodies.decode_versions(heads[1], raw, state.chain_at, window, out)
        assert [v if isinstance(v, tuple) else v.leaf() for v in found] == want_leaves
        filled.append(out)
    assert filled == [(want_leaves, want_logs)] * 2
    out = ([], [])
    assert leaf_compiled.decode(built, heads[1], next_log(heads[1]), raw[:-1], window, out=out) is None
    assert out == ([], [])
    with pytest.raises(ValueError, match="empty"):
        leaf_bodies.decode_versions(heads[1], raw, state.chain_at, window, ([heads[0].leaf()], []))
