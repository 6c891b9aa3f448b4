"""The fold index: a fold of a log's first leaves is exactly head2's fold whatever histories share an
origin, and a delta to a peer does not refold the leaves it knows (its cost does not grow with the log)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.queue2_histories import OWNER, empty

from latticed.crdt import epoch_delta, epochs, fold_index, head2, queue2
from latticed.crdt.fold_index import STRIDE, prefix_fold
from latticed.crdt.head2 import Leaf, fold
from latticed.crdt.records import Record

leaf = st.tuples(st.sampled_from([bytes([i]) * 32 for i in range(3)]), st.integers(0, 2**40))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(leaf, max_size=3 * STRIDE + 5), st.integers(0, 4 * STRIDE)), max_size=6))
def test_a_prefix_fold_is_the_fold_of_that_prefix(calls: list[tuple[list[Leaf], int]]) -> None:
    """Calls under one origin with logs that agree, grow, shrink or part keep giving fold's answer."""
    origin = head2.genesis(b"\x07" * 32, 3)
    for leaves, n in calls:
        log = tuple(leaves)
        assert prefix_fold(origin, log, n) == fold(origin, log[:n])


def _count_folds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = head2.fold_one

    def counting(log: bytes, digest: bytes, end: int) -> bytes:
        calls[0] += 1
        return real(log, digest, end)

    monkeypatch.setattr(head2, "fold_one", counting)
    monkeypatch.setattr(fold_index, "fold_one", counting)
    return calls


def test_a_delta_folds_only_past_what_it_folded_before(monkeypatch: pytest.MonkeyPatch) -> None:
    state = empty()
    summaries = []
    for i in range(300):
        state = queue2.commit(state, OWNER, now_ms=i, records=[Record(value=b"%d" % i)])
        summaries.append(queue2.summary(state))
    behind = summaries[200]  # a peer that knows 201 leaves of our 299 shared ones
    want = epoch_delta.delta(state.chains, behind.log)
    calls = _count_folds(monkeypatch)
    for since in (behind, summaries[150], summaries[-2], summaries[-1]):
        got = epoch_delta.delta(state.chains, since.log)
        assert got is not None and got.base == since.log.known - (since is summaries[-1])
    assert epoch_delta.delta(state.chains, behind.log) == want
    assert calls[0] <= 4 * STRIDE  # folding from the origin each time: over 700


def test_the_remembered_folds_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_index, "MAX_LEAVES", 4 * STRIDE)
    monkeypatch.setattr(fold_index, "_folds", {})
    leaves = tuple((bytes([i % 256]) * 32, i) for i in range(3 * STRIDE))
    for q in range(5):
        origin = head2.genesis(bytes([q]) * 32, 0)
        assert prefix_fold(origin, leaves, len(leaves)) == fold(origin, leaves)
    assert sum(len(known) for known, _ in fold_index._folds.values()) <= 4 * STRIDE
    assert origin in fold_index._folds  # the newest stays


def test_merging_a_log_we_hold_or_extend_folds_only_the_new_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed catch-up's later chunks carry a log the replica holds already (or one head past it):
    merging them does not refold the replica's leaves, nor verify the heads it holds again."""
    state = empty()
    for i in range(200):
        state = queue2.commit(state, OWNER, now_ms=i, records=[Record(value=b"%d" % i)])
    whole = epoch_delta.merge(empty().chains, epoch_delta.delta(state.chains, None))  # the first chunk
    again = epoch_delta.delta(state.chains, epoch_delta.summary(whole))  # the next chunk's log
    assert again is not None
    behind = epoch_delta.merge(empty().chains, epoch_delta.delta(log_at(state, 150), None))
    onward = epoch_delta.delta(state.chains, epoch_delta.summary(behind))
    assert onward is not None
    calls = _count_folds(monkeypatch)
    assert epoch_delta.merge(whole, again) is whole
    assert calls[0] == 0
    assert epoch_delta.merge(behind, onward).shared == state.chains.shared
    assert calls[0] <= 2 * STRIDE  # the leaves past the peer's log, not all 200


def log_at(state: queue2.QueueState2, version: int) -> epochs.Chains:
    """``state``'s log as it stood at ``version``: its first leaves and the head it rebuilds."""
    line = empty()
    for i in range(version):
        line = queue2.commit(line, OWNER, now_ms=i, records=[Record(value=b"%d" % i)])
    assert line.chains.shared == state.chains.shared[: len(line.chains.shared)]
    return line.chains


@settings(max_examples=100, deadline=None)
@given(
    st.lists(leaf, min_size=STRIDE, max_size=3 * STRIDE + 5),
    st.lists(leaf, max_size=2 * STRIDE),
    st.integers(0, 4 * STRIDE),
    st.integers(0, 6 * STRIDE),
    st.booleans(),
)
def test_a_run_folded_elsewhere_gives_the_same_folds(
    run: list[Leaf], before: list[Leaf], skew: int, n: int, other_start: bool
) -> None:
    """A decode's folds of a run of leaves are used where a fold meets that run from the log it starts
    at (in whole strides), and give fold's answer; a run from another log or of other leaves is not."""
    origin = head2.genesis(bytes([len(before), skew % 251]) + b"\x08" * 30, 5)
    leaves = (*before[: len(before) - len(before) % STRIDE], *run, *before)
    start = fold(origin, leaves[: len(before) - len(before) % STRIDE])
    logs, log = [], head2.genesis(b"\x01" * 32, 1) if other_start else start
    for digest, end in run:
        log = head2.fold_one(log, digest, end)
        logs.append(log)
    fold_index.folded_run(start if not other_start else head2.genesis(b"\x01" * 32, 1), run, logs)
    assert prefix_fold(origin, leaves, n) == fold(origin, leaves[:n])


def test_a_run_folded_elsewhere_is_not_folded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    origin = head2.genesis(b"\x09" * 32, 0)
    run = [(bytes([i % 256]) * 32, i) for i in range(4 * STRIDE)]
    logs, log = [], origin
    for digest, end in run:
        log = head2.fold_one(log, digest, end)
        logs.append(log)
    fold_index.folded_run(origin, run, logs)
    monkeypatch.setattr(fold_index.fold_compiled, "fold", lambda *args: None)  # Python folds: counted
    calls = _count_folds(monkeypatch)
    assert prefix_fold(origin, tuple(run), len(run) - 3) == logs[len(run) - 4]
    assert calls[0] == STRIDE - 3  # the last part-stride only


@settings(max_examples=100, deadline=None)
@given(
    st.lists(leaf, min_size=STRIDE, max_size=3 * STRIDE + 5),
    st.lists(leaf, min_size=1, max_size=STRIDE + 2),
    st.integers(0, 6 * STRIDE),
    st.sampled_from(["same", "other leaf", "other start"]),
)
def test_a_run_that_starts_leaves_in_gives_the_same_folds(
    run: list[Leaf], lead: list[Leaf], n: int, how: str
) -> None:
    """A run that starts after a few of the log's leaves (a catch-up's steps follow version 2's body) is
    met by folding those few; one whose start is not the fold of the leaves before it is not used."""
    origin = head2.genesis(bytes([len(lead), n % 251]) + b"\x0a" * 30, 6)
    leaves = (*lead, *run)
    before = [(b"\x05" * 32, 7), *lead[1:]] if how == "other leaf" else lead
    start = fold(origin, before) if how != "other start" else head2.genesis(b"\x02" * 32, 2)
    logs, log = [], start
    for digest, end in run:
        log = head2.fold_one(log, digest, end)
        logs.append(log)
    fold_index.folded_run(start, run, logs)
    assert prefix_fold(origin, leaves, n) == fold(origin, leaves[:n])


def test_a_run_one_leaf_in_is_not_folded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    origin = head2.genesis(b"\x0b" * 32, 0)
    leaves = [(bytes([i % 256]) * 32, i) for i in range(4 * STRIDE + 1)]
    start = head2.fold_one(origin, *leaves[0])
    logs, log = [], start
    for digest, end in leaves[1:]:
        log = head2.fold_one(log, digest, end)
        logs.append(log)
    fold_index.folded_run(start, leaves[1:], logs)
    monkeypatch.setattr(fold_index.fold_compiled, "fold", lambda *args: None)  # Python folds: counted
    calls = _count_folds(monkeypatch)
    assert prefix_fold(origin, tuple(leaves), len(leaves) - 3) == logs[len(leaves) - 5]
    assert calls[0] == 1 + STRIDE - 2  # the leaf before the run, then the last part-stride only
