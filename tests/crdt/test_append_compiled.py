"""A live push's head check in C (``appended_head`` in latticed/crdt/_columns.c, through
:mod:`latticed.crdt.append_compiled`) only ever confirms what the Python path of
:func:`epoch_delta.merge` accepts: over valid pieces and pieces with any field of the head, the leaves,
the base fold, our owner, queue or epoch altered (forged signatures, other types, sizes and ranges),
merge answers the same value or raises the same error with the pass and without it, and the head's leaf
the pass sets is the one Python computes.

Where the extension is missing the tests that need it skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by
.ci/run) makes them fail instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.accel import required

from latticed.crdt import append_compiled, epoch_delta, queue2
from latticed.crdt.epochs import Chains, Tip
from latticed.crdt.head2 import HeadV2, body_digest, fold, next_log
from latticed.crdt.records import MAX_OFFSET, Record
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(b"a" * 32)
OTHER = Identity.from_seed(b"b" * 32)


def _line(n: int) -> list[Chains]:
    """The owner's log after each of ``n + 1`` commits of one record."""
    state = queue2.empty_state(OWNER.public_key, "q")
    out = []
    for i in range(n + 1):
        state = queue2.commit(state, OWNER, now_ms=1_000 + i, records=[Record(b"%d" % i)])
        out.append(state.chains)
    return out


LINE = _line(6)

HEAD_FIELDS = [f.name for f in dataclasses.fields(HeadV2) if f.init]
#: Values a field off the wire may hold: other types, sizes, ranges (the valid ones among them too).
odd_values: list[Any] = [
    0,
    1,
    2,
    -1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    True,
    False,
    1.0,
    None,
    "x",
    b"",
    b"\x00" * 31,
    b"\x00" * 32,
    b"\x01" * 32,
    b"\x00" * 33,
    b"\x00" * 64,
    bytearray(32),
    (b"\x00" * 32, 1),
]


class Bytes(bytes):
    """A bytes subclass (the C pass takes exact bytes only; Python's checks take subclasses)."""


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", call()
    except Exception as exc:  # the type and text are what is compared
        return type(exc).__name__, str(exc)


def _both(value: Chains, piece: epoch_delta.LogDelta) -> tuple[Any, Any]:
    """merge's outcome with the compiled pass, then with it off (the reference), on copies."""
    compiled = _outcome(lambda: epoch_delta.merge(value, _fresh(piece)))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(append_compiled, "checked", lambda *_, **__: False)
        reference = _outcome(lambda: epoch_delta.merge(value, _fresh(piece)))
    return compiled, reference


def _fresh(piece: epoch_delta.LogDelta) -> epoch_delta.LogDelta:
    """The piece with a new head object (no leaf cached from an earlier call), one tip and start head."""
    head = dataclasses.replace(piece.value.tips[0].head)
    value = dataclasses.replace(piece.value, tips=(Tip(head),), start_head=head)
    return dataclasses.replace(piece, value=value)


def _piece(behind: int, ahead: int) -> tuple[Chains, epoch_delta.LogDelta]:
    value = LINE[behind]
    piece = epoch_delta.delta(LINE[ahead], epoch_delta.summary(value))
    assert piece is not None
    return value, _fresh(piece)


@pytest.fixture(scope="module")
def built() -> append_compiled.Compiled:
    return required(append_compiled.load(), "the compiled check latticed.crdt._columns.appended_head")


def _args(value: Chains, piece: epoch_delta.LogDelta) -> dict[str, Any]:
    """What ``_append`` passes the compiled check, the head under ``head``."""
    return {
        "head": piece.value.tips[0].head,
        "owner": value.owner,
        "queue_id": value.queue_id,
        "epoch": value.epoch,
        "base": piece.base,
        "base_fold": piece.base_fold,
        "leaves": piece.value.shared,
        "ours_end": value.tips[0].head.end,
    }


@pytest.mark.parametrize(("behind", "ahead"), [(0, 1), (2, 3), (1, 4), (0, 6)])
def test_a_valid_push_is_confirmed_with_the_leaf_python_computes(
    built: append_compiled.Compiled, behind: int, ahead: int
) -> None:
    value, piece = _piece(behind, ahead)
    assert len(piece.value.shared) == ahead - behind - 1
    assert append_compiled.checked(**_args(value, piece))
    head = piece.value.tips[0].head
    assert head._leaf == (body_digest(head.body()), head.end)
    assert head._leaf[1] is head.end
    compiled, reference = _both(value, piece)
    assert compiled == reference
    assert compiled[0] == "value"
    assert compiled[1].tips[0].head == LINE[ahead].tips[0].head
    assert next_log(compiled[1].tips[0].head) == next_log(LINE[ahead].tips[0].head)


@settings(max_examples=300, deadline=None)
@given(
    span=st.sampled_from([(0, 1), (2, 3), (1, 4)]),
    field=st.sampled_from(HEAD_FIELDS),
    replacement=st.one_of(st.sampled_from(odd_values), st.integers(-(2**65), 2**65), st.binary(max_size=70)),
    as_subclass=st.booleans(),
)
def test_any_head_field_altered_answers_as_python_does(
    built: append_compiled.Compiled,
    span: tuple[int, int],
    field: str,
    replacement: Any,
    as_subclass: bool,
) -> None:
    value, piece = _piece(*span)
    if as_subclass and type(replacement) is bytes:
        replacement = Bytes(replacement)
    head = dataclasses.replace(piece.value.tips[0].head, **{field: replacement})
    altered = dataclasses.replace(
        piece, value=dataclasses.replace(piece.value, tips=(Tip(head),), start_head=head)
    )
    compiled, reference = _both(value, altered)
    assert compiled == reference
    if append_compiled.checked(**_args(value, _fresh(altered))):
        assert reference[0] == "value"  # confirmed only where Python accepts


@settings(max_examples=200, deadline=None)
@given(
    what=st.sampled_from(["leaf", "leaves", "base_fold", "base", "owner", "queue", "epoch", "resigned"]),
    index=st.integers(0, 3),
    replacement=st.one_of(
        st.sampled_from(odd_values),
        st.tuples(st.binary(min_size=30, max_size=34), st.integers(-2, MAX_OFFSET + 2)),
        st.binary(max_size=40),
        st.integers(-2, 2**64 + 2),
    ),
)
def test_a_piece_or_our_value_altered_answers_as_python_does(
    built: append_compiled.Compiled, what: str, index: int, replacement: Any
) -> None:
    value, piece = _piece(1, 4)  # two leaves in the piece
    new = piece.value
    if what == "leaf":
        shared = list(new.shared)
        shared[index % len(shared)] = replacement
        piece = dataclasses.replace(piece, value=dataclasses.replace(new, shared=tuple(shared)))
    elif what == "leaves":
        piece = dataclasses.replace(piece, value=dataclasses.replace(new, shared=new.shared[: index % 3]))
    elif what == "base_fold":
        piece = dataclasses.replace(piece, base_fold=replacement)
    elif what == "base":
        piece = dataclasses.replace(piece, base=replacement)
    elif what == "owner":
        value = dataclasses.replace(value, owner=OTHER.public_key if index % 2 else replacement)
    elif what == "queue":
        value = dataclasses.replace(value, queue_id=replacement)
    elif what == "epoch":
        value = dataclasses.replace(value, epoch=replacement)
    else:  # a head signed by another key, or by the owner over leaves it does not fold
        head = new.tips[0].head
        signer = OTHER if index % 2 else OWNER
        log = head.log if index % 2 else bytes(32)
        forged = dataclasses.replace(head, log=log).signed(signer)
        piece = dataclasses.replace(
            piece, value=dataclasses.replace(new, tips=(Tip(forged),), start_head=forged)
        )
    compiled, reference = _both(value, piece)
    assert compiled == reference
    if append_compiled.checked(**_args(value, _fresh(piece))):
        assert reference[0] == "value"


#: Ends and counters the owner might sign: small ones near our chain's (one record a commit), the bounds.
_u64s = st.one_of(
    st.integers(0, 12),
    st.sampled_from([MAX_OFFSET - 1, MAX_OFFSET, MAX_OFFSET + 1, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
)


_FAULTS = ["ends", "count", "digests", "version", "start", "end", "epoch", "queue", "log", "signer"]


@settings(max_examples=400, deadline=None)
@given(
    span=st.sampled_from([(0, 1), (2, 3), (1, 4), (0, 6)]),
    faults=st.sets(st.sampled_from(_FAULTS), max_size=2),
    data=st.data(),
)
def test_a_head_the_owner_signs_over_altered_leaves_answers_as_python_does(
    built: append_compiled.Compiled, span: tuple[int, int], faults: set[str], data: st.DataObject
) -> None:
    # Re-signed, so the signature no longer refuses what the layout, epoch, queue, fold, version and
    # ends' checks must: each is then the only check standing (an owner's key signs what it is given).
    value, piece = _piece(*span)
    head = piece.value.tips[0].head
    leaves = piece.value.shared
    if "count" in faults:
        size = data.draw(st.integers(0, 6), "count")
        pool = leaves or ((head.leaf()[0], head.end),)
        leaves = tuple(pool[i % len(pool)] for i in range(size))
    if "ends" in faults:
        ends = data.draw(st.lists(st.one_of(_u64s, st.just(-1)), min_size=len(leaves), max_size=len(leaves)))
        leaves = tuple((digest, e) for (digest, _), e in zip(leaves, ends, strict=True))
    if "digests" in faults:
        leaves = tuple((bytes(32), e) for _, e in leaves)
    try:
        folded = fold(piece.base_fold, leaves)
    except Exception:  # a leaf that does not fold (a negative end): any log
        folded = bytes(32)
    changes: dict[str, Any] = {"log": folded}
    if "log" in faults:
        changes["log"] = data.draw(st.sampled_from([head.log, bytes(32)]), "log")
    if "version" in faults:
        step = data.draw(st.sampled_from([-2, -1, 1, 2]) | _u64s, "version")
        changes["version"] = head.version + step if step in (-2, -1, 1, 2) else step
    for field in ("start", "end", "epoch"):
        if field in faults:
            changes[field] = data.draw(_u64s, field)
    if "queue" in faults:
        changes["queue_id"] = bytes(32)
    body = dataclasses.replace(head, **changes)
    signer = OTHER if "signer" in faults else OWNER
    try:
        signed = dataclasses.replace(body, signature=signer.sign(body.body()))
    except Exception:  # not packable (a version below 0 or past 2^64): the layout's check refuses it
        signed = body
    altered = dataclasses.replace(
        piece,
        value=dataclasses.replace(piece.value, shared=leaves, tips=(Tip(signed),), start_head=signed),
    )
    compiled, reference = _both(value, altered)
    event(f"{reference[0]}: {reference[1]}" if reference[0] != "value" else "value")
    assert compiled == reference
    if append_compiled.checked(**_args(value, _fresh(altered))):
        assert reference[0] == "value"


def test_a_forged_signature_is_refused_on_both_paths(built: append_compiled.Compiled) -> None:
    value, piece = _piece(2, 3)
    head = piece.value.tips[0].head
    flipped = bytes([head.signature[0] ^ 1]) + head.signature[1:]
    forged = dataclasses.replace(head, signature=flipped)
    bad = dataclasses.replace(
        piece, value=dataclasses.replace(piece.value, tips=(Tip(forged),), start_head=forged)
    )
    assert not append_compiled.checked(**_args(value, bad))
    assert forged._leaf is None  # nothing set on what it does not confirm
    compiled, reference = _both(value, bad)
    assert compiled == reference == ("BadSignatureError", "signature does not verify under the owner's key")


def test_without_the_extension_the_python_path_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    value, piece = _piece(2, 3)
    monkeypatch.setattr(append_compiled, "load", lambda: None)
    assert not append_compiled.checked(**_args(value, piece))
    assert epoch_delta.merge(value, piece).tips[0].head == LINE[3].tips[0].head


@pytest.mark.parametrize("slot", HEAD_FIELDS)
def test_a_head_with_an_empty_slot_is_left_to_python(built: append_compiled.Compiled, slot: str) -> None:
    value, piece = _piece(2, 3)
    head = piece.value.tips[0].head
    object.__delattr__(head, slot)
    assert not append_compiled.checked(**_args(value, piece))  # no exception from the pass
    compiled = _outcome(lambda: epoch_delta.merge(value, piece))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(append_compiled, "checked", lambda *_, **__: False)
        reference = _outcome(lambda: epoch_delta.merge(value, piece))
    assert compiled == reference
    assert compiled[0] == "AttributeError"


class _LyingLeaf(tuple):  # type: ignore[type-arg]
    """A leaf whose items, iterated, are not the ones it stores (only code in this process makes one)."""

    def __iter__(self) -> Any:
        return iter((bytes(32), self[1]))


class _LyingDigest(bytes):
    """A digest that, added to a log, is another one."""

    def __radd__(self, other: bytes) -> bytes:
        return other + bytes(32)


@pytest.mark.parametrize("kind", ["tuple", "bytes"])
def test_a_leaf_of_a_subclass_is_left_to_python(built: append_compiled.Compiled, kind: str) -> None:
    # The C reads a tuple's and a bytes' storage; Python's fold and ends iterate and add them, which a
    # subclass may answer otherwise: the C confirms exact leaves only, and ``is_leaf`` takes exact
    # types only (sec22), so merge refuses such a leaf as malformed on both paths.
    value, piece = _piece(1, 4)  # two leaves: Python folds them one by one, as fold_one
    digest, end = piece.value.shared[0]
    odd = _LyingLeaf((digest, end)) if kind == "tuple" else (_LyingDigest(digest), end)
    shared = (odd, *piece.value.shared[1:])
    piece = dataclasses.replace(piece, value=dataclasses.replace(piece.value, shared=shared))
    assert not append_compiled.checked(**_args(value, _fresh(piece)))
    compiled, reference = _both(value, piece)
    assert compiled == reference
    assert reference[0] == "MalformedError"
