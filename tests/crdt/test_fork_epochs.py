"""Lattice laws of the v2 fork core (``crdt/epochs.py``) over two and three histories of a forked owner,
with truncations, superseded heads, metadata- and timestamp-only forks and a recovered epoch, with real
signatures. ``LATTICE_LAW_EXAMPLES`` raises the number of examples (2,000 by default)."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import append_compiled, epoch_delta, epochs
from latticed.crdt import head2 as head2_module
from latticed.crdt.core_errors import BadSignatureError, EquivocationError, MalformedError
from latticed.crdt.epochs import Chains, join
from latticed.crdt.head import genesis_hash, meta_hash, queue_id
from latticed.crdt.head2 import HEAD2_SIZE, HeadV2, Leaf, genesis, next_log
from latticed.crdt.records import chain_next
from latticed.crdt.signing import Identity, blake2b

OWNER = Identity.from_seed(bytes(range(32)))
QID = queue_id(OWNER.public_key, "q")
EXAMPLES = int(os.environ.get("LATTICE_LAW_EXAMPLES", "2000"))
LAWS = settings(max_examples=EXAMPLES, deadline=None)

Step = tuple[str, int]
step = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 4)),
    st.tuples(st.just("truncate"), st.integers(0, 3)),
    st.tuples(st.just("meta"), st.integers(0, 1)),
    st.tuples(st.just("touch"), st.just(0)),  # a head that changes nothing but its timestamp
)


@dataclasses.dataclass(frozen=True)
class Line:
    """One history of the owner: its heads (version i at index i-1) and their leaves."""

    heads: tuple[HeadV2, ...]
    chain: tuple[bytes, ...]  # chain values at offsets 0 .. end

    def leaves(self) -> tuple[Leaf, ...]:
        return tuple(h.leaf() for h in self.heads)


def extend(line: Line, steps: Sequence[Step], tag: bytes, epoch: int | None = None) -> Line:
    """``line`` continued by ``steps``, its records named by ``tag`` (two tags: two histories); with
    ``epoch``, the first head recovers the queue there (version 1, a fresh log)."""
    heads, chain = list(line.heads), list(line.chain)
    for index, (kind, arg) in enumerate(steps):
        prev = heads[-1] if heads else None
        start, end = (prev.start, prev.end) if prev else (0, 0)
        meta_version, mhash = (prev.meta_version, prev.meta_hash) if prev else (0, meta_hash({}))
        if kind == "offer":
            for offset in range(end, end + arg):
                chain.append(chain_next(chain[-1], blake2b(tag + b"%d" % offset, b"test.record")))
            end += arg
        elif kind == "truncate":
            start = min(end, start + arg)
        elif kind == "meta":
            meta_version, mhash = (prev.version + 1 if prev else 1), meta_hash({"k": tag.hex() + str(arg)})
        fresh = epoch is not None and index == 0
        head_epoch = epoch if fresh else (prev.epoch if prev else 0)
        version = 1 if fresh or prev is None else prev.version + 1
        log = genesis(QID, head_epoch) if fresh or prev is None else next_log(prev)
        body = HeadV2(QID, head_epoch, version, log, start, end, chain[start], chain[end], meta_version,
                      mhash, len(heads) * 10 + len(tag))  # fmt: skip
        heads.append(body.signed(OWNER))
    return Line(tuple(heads), tuple(chain))


ROOT = Line((), (genesis_hash(QID),))


@st.composite
def forked_owner(draw: st.DrawFn) -> tuple[list[Line], int]:
    """Two or three histories sharing a prefix (tags may coincide: then they are one), and sometimes
    the owner's recovery in epoch 1 from the shared prefix."""
    shared = extend(ROOT, draw(st.lists(step, min_size=1, max_size=5)), b"s")
    lines = [
        extend(
            shared, draw(st.lists(step, min_size=1, max_size=5)), draw(st.sampled_from([b"a", b"b", b"c"]))
        )
        for _ in range(draw(st.integers(2, 3)))
    ]
    if draw(st.integers(0, 3)) == 0:
        recover = [("touch", 0), *draw(st.lists(step, max_size=3))]
        lines.append(extend(shared, recover, draw(st.sampled_from([b"r", b"t"])), epoch=1))
    return lines, len(shared.heads)


def snapshot(draw: st.DrawFn, lines: list[Line], split: int) -> Chains:
    """A replica of one history at some version (holding some of its records), or nothing yet; mostly
    past the split, where the histories differ."""
    line = draw(st.sampled_from(lines))
    if draw(st.integers(0, 9)) == 0:
        return epochs.empty(OWNER.public_key, QID)
    low = split + 1 if draw(st.integers(0, 3)) else 1
    index = draw(st.integers(min(low, len(line.heads)), len(line.heads)))
    return _at(line, index, draw(st.integers(0, line.heads[index - 1].end)))


@st.composite
def states(draw: st.DrawFn, count: int) -> list[Chains]:
    lines, split = draw(forked_owner())
    picked = []
    for _ in range(count):
        value = snapshot(draw, lines, split)
        for _ in range(draw(st.integers(0, 2))):
            value = join(value, snapshot(draw, lines, split))
        picked.append(value)
    return picked


@LAWS
@given(states(3))
def test_join_is_a_lattice_over_forked_histories(values: list[Chains]) -> None:
    a, b, c = values
    for value in (a, b, c, join(a, b)):
        epochs.verify(value)
    ab = join(a, b)
    assert ab == join(b, a)
    assert join(ab, c) == join(a, join(b, c)) == join(join(a, c), b)
    assert join(a, a) == a
    assert join(ab, a) == ab == join(b, ab)
    if a.epoch == ab.epoch:
        assert ab.forked >= a.forked and ab.start >= a.start
        if a.forked:
            assert ab.fork_point is not None and a.fork_point is not None and ab.fork_point <= a.fork_point


@LAWS
@given(states(5), st.randoms(use_true_random=False))
def test_any_order_and_grouping_of_joins_reaches_one_value(values: list[Chains], rnd: object) -> None:
    """Whether a queue is frozen, where, and what it holds is a function of what was seen together."""
    assert isinstance(rnd, random.Random)
    left = values[0]
    for value in values[1:]:
        left = join(left, value)
    pool = list(values)
    while len(pool) > 1:
        rnd.shuffle(pool)
        pool.append(join(pool.pop(), pool.pop()))
    assert pool[0] == left


def _lines(shared: list[Step], mine: list[Step], theirs: list[Step]) -> tuple[Line, Line, Line]:
    base = extend(ROOT, shared, b"s")
    return base, extend(base, mine, b"a"), extend(base, theirs, b"b")


def _at(line: Line, index: int, held: int | None = None) -> Chains:
    """A replica of ``line``'s ``index``-th head, with its epoch's log and (by default) all its records."""
    head = line.heads[index - 1]
    log = tuple(h.leaf() for h in line.heads[: index - 1] if h.epoch == head.epoch)
    return epochs.replica(OWNER.public_key, head, log, head.end if held is None else held)


def test_a_superseded_head_still_contradicts_its_twin() -> None:
    """The first attempt's non-associative case: a newer head of one history no longer contradicted the
    twin's head of an older version. Its log still names the older head."""
    _, mine, theirs = _lines([("offer", 2)], [("offer", 1), ("offer", 1)], [("offer", 3)])
    old, new, twin = _at(mine, 2), _at(mine, 3), _at(theirs, 2)
    assert not join(old, new).forked
    frozen = join(join(old, new), twin)
    assert frozen == join(old, join(new, twin)) and frozen.forked
    assert frozen.fork_point == 2 and frozen.held == (0, 2)


def test_a_truncation_past_the_fork_point_freezes_at_the_start() -> None:
    """Records a truncation dropped cannot be compared any more, and need not be: the logs part below
    the start, so the queue is frozen at the highest signed start and holds nothing."""
    _, mine, theirs = _lines([("offer", 3)], [("offer", 2), ("truncate", 4)], [("offer", 1)])
    frozen = join(_at(mine, 3), _at(theirs, 2))
    assert frozen.forked and frozen.fork_point == 3 and frozen.start == 4 and frozen.held == (4, 4)
    assert join(join(_at(mine, 2), _at(theirs, 2)), _at(mine, 3)) == frozen


def test_a_metadata_or_timestamp_only_fork_is_a_fork() -> None:
    _, mine, theirs = _lines([("offer", 2)], [("meta", 0)], [("touch", 0), ("touch", 0)])
    frozen = join(_at(mine, 2), _at(theirs, 3))
    assert frozen.forked and frozen.fork_point == 2
    epochs.verify(frozen)


def test_a_higher_epoch_supersedes_a_frozen_one() -> None:
    base, mine, theirs = _lines([("offer", 2)], [("offer", 1)], [("offer", 1)])
    frozen = join(_at(mine, 2), _at(theirs, 2))
    recovered = extend(base, [("touch", 0), ("offer", 1)], b"r", epoch=1)
    after = _at(recovered, 3)
    assert after.epoch == 1 and not after.forked and after.shared == (recovered.heads[1].leaf(),)
    assert join(frozen, after) == after == join(after, frozen)


def test_a_frozen_value_is_a_proof_anyone_can_check() -> None:
    _, mine, theirs = _lines([("offer", 2)], [("offer", 1), ("offer", 1)], [("offer", 1)])
    frozen = join(_at(mine, 3), _at(theirs, 2))
    epochs.verify(frozen)
    tip = frozen.tips[0] if frozen.tips[0].tail else frozen.tips[1]
    forged_leaf = (bytes(32), tip.tail[0][1])
    doctored = [
        dataclasses.replace(frozen, tips=(dataclasses.replace(tip, tail=(forged_leaf,)), *frozen.tips[1:])),
        dataclasses.replace(frozen, shared=frozen.shared[:-1]),
        dataclasses.replace(frozen, tips=frozen.tips[::-1]),
        dataclasses.replace(frozen, owner=Identity.from_seed(bytes(32)).public_key),
        dataclasses.replace(frozen, shared=(*frozen.shared[:-1], ("x", 2))),  # type: ignore[arg-type]
        dataclasses.replace(frozen, shared=(*frozen.shared[:-1], (frozen.shared[-1][0], -1))),
    ]
    for value in doctored:
        with pytest.raises((EquivocationError, BadSignatureError, MalformedError)):
            epochs.verify(value)


def test_a_head_v2_round_trips_and_refuses_other_layouts() -> None:
    head = extend(ROOT, [("offer", 2)], b"s").heads[0]
    raw = head.to_bytes()
    assert len(raw) == HEAD2_SIZE == 296 and HeadV2.from_bytes(raw) == head
    head.verify(OWNER.public_key, QID)
    for bad in (raw[:-1], b"x" + raw[1:], raw[:64] + bytes(8) + raw[72:]):
        with pytest.raises(MalformedError):
            HeadV2.from_bytes(bad)
    with pytest.raises(BadSignatureError):
        dataclasses.replace(head, timestamp=head.timestamp + 1).verify(OWNER.public_key, QID)


@settings(max_examples=max(EXAMPLES // 2, 100), deadline=None)
@given(states(2), st.booleans())
def test_a_delta_for_a_summary_joins_like_the_value(values: list[Chains], stale: bool) -> None:
    """Only the leaves the peer lacks travel; when the peer's log parts from ours below what it claims,
    the merge says so and the whole value (which proves the fork) goes instead."""
    a, b = values
    since = epoch_delta.summary(epochs.empty(OWNER.public_key, QID) if stale else b)
    expected = join(dataclasses.replace(a, held_end=0), b)
    piece = epoch_delta.delta(a, since)
    if piece is None:
        assert join(a, b) == b or not a.tips or since.epoch > a.epoch
        return
    try:
        got = epoch_delta.merge(b, piece)
    except ValueError:
        whole = epoch_delta.delta(a, None)
        assert whole is not None and whole.base == 0 and not stale
        got = epoch_delta.merge(b, whole)
    assert got == expected
    if piece.base:
        assert len(piece.value.shared) == len(a.shared) - piece.base


def test_a_forged_delta_changes_nothing() -> None:
    _, mine, theirs = _lines([("offer", 2)], [("offer", 1), ("offer", 1)], [("offer", 1)])
    a, b = _at(mine, 3), _at(theirs, 2)
    piece = epoch_delta.delta(a, epoch_delta.summary(b))
    assert piece is not None
    forged_tip = dataclasses.replace(a.tips[0], head=dataclasses.replace(a.tips[0].head, timestamp=7))
    forged = dataclasses.replace(piece, value=dataclasses.replace(piece.value, tips=(forged_tip,)))
    with pytest.raises(BadSignatureError):
        epoch_delta.merge(b, forged)
    with pytest.raises(ValueError):
        epoch_delta.merge(b, dataclasses.replace(piece, base_fold=bytes(32)))


def test_a_delta_that_goes_on_from_our_head_is_appended() -> None:
    """The catch-up case folds only the leaves sent (our fold is our head's next log) and gives the join;
    a forged leaf in it is refused as the whole check would refuse it."""
    line = extend(ROOT, [("offer", 2), ("touch", 0), ("offer", 1), ("truncate", 1), ("offer", 3)], b"s")
    behind, ahead = _at(line, 2), _at(line, 5)
    piece = epoch_delta.delta(ahead, epoch_delta.summary(behind))
    assert piece is not None and piece.base == 2
    appended = epoch_delta._append(behind, piece)
    expected = join(behind, dataclasses.replace(ahead, held_end=0))
    assert appended is not None and appended == epoch_delta.merge(behind, piece) == expected
    forged = dataclasses.replace(piece.value, shared=((bytes(32), 3), *piece.value.shared[1:]))
    with pytest.raises(EquivocationError):
        epoch_delta.merge(behind, dataclasses.replace(piece, value=forged))


def test_a_newest_head_that_is_also_the_start_head_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live push's one head is usually the start head too (the newest of the highest start): its
    signature is checked once, and refused when forged; a start head other than the newest is still
    checked. (The Python path: where the compiled pass is built it checks such a head first,
    tests/crdt/test_append_compiled.py.)"""
    monkeypatch.setattr(append_compiled, "checked", lambda *_, **__: False)
    line = extend(ROOT, [("offer", 2), ("offer", 1), ("truncate", 1), ("offer", 1)], b"s")
    checked: list[bytes] = []
    real = head2_module.verify

    def counted(owner: bytes, body: bytes, signature: bytes) -> None:
        checked.append(signature)
        real(owner, body, signature)

    monkeypatch.setattr(head2_module, "verify", counted)
    behind, ahead = _at(line, 3), _at(line, 4)  # version 4 leaves the start where 3 put it
    piece = epoch_delta.delta(ahead, epoch_delta.summary(behind))
    assert piece is not None and piece.value.start_head == piece.value.tips[0].head
    assert epoch_delta.merge(behind, piece) == join(behind, dataclasses.replace(ahead, held_end=0))
    assert checked == [piece.value.tips[0].head.signature]

    forged_start = dataclasses.replace(piece.value.start_head, timestamp=7)  # not the newest head
    forged = dataclasses.replace(piece, value=dataclasses.replace(piece.value, start_head=forged_start))
    with pytest.raises(BadSignatureError):
        epoch_delta.merge(behind, forged)
    tip = dataclasses.replace(piece.value.tips[0], head=forged_start)  # a forged head that is both
    both = dataclasses.replace(piece.value, tips=(tip,), start_head=forged_start)
    with pytest.raises(BadSignatureError):
        epoch_delta.merge(behind, dataclasses.replace(piece, value=both))
