"""The v2 fork core on real queue histories: a forked owner's two histories, their v2 heads signed beside
the v1 ones. What the frozen value holds is the same in both histories, and every record fork is found."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import epoch_delta, epochs
from latticed.crdt import queue as core
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue import QueueState
from latticed.crdt.queue.v2heads import chains_of, recover, sign_v2
from latticed.crdt.records import Record, chain_fold, record_digest
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(bytes(range(32)))
step = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 4)),
    st.tuples(st.just("truncate"), st.integers(0, 3)),
    st.tuples(st.just("meta"), st.integers(0, 1)),
)
Line = tuple[QueueState, tuple[HeadV2, ...]]


def run(line: Line, steps: list[tuple[str, int]], tag: bytes) -> Line:
    """The owner at ``line`` signs ``steps`` (records named by ``tag``), each head also as v2."""
    state, heads = line
    for index, (kind, arg) in enumerate(steps):
        now = len(heads) * 10 + index
        if kind == "offer":
            records = [Record(value=tag + b"%d.%d" % (len(heads), i), timestamp=now) for i in range(arg)]
            state = core.commit(state, OWNER, now_ms=now, records=records)
        elif kind == "truncate":
            state = core.commit(state, OWNER, now_ms=now, new_start=min(state.known_end, state.start + arg))
        else:
            state = core.commit(state, OWNER, now_ms=now, meta_updates={"k": tag.decode() + str(arg)})
        heads = (*heads, sign_v2(state, OWNER, heads[-1] if heads else None))
    return state, heads


@settings(max_examples=300, deadline=None)
@given(
    st.lists(step, min_size=1, max_size=5),
    st.lists(step, max_size=5),
    st.lists(step, max_size=5),
    st.sampled_from([b"a", b"b"]),
)
def test_a_frozen_queue_holds_only_records_both_histories_share(
    shared: list[tuple[str, int]], mine: list[tuple[str, int]], theirs: list[tuple[str, int]], tag: bytes
) -> None:
    base = run((core.empty_state(OWNER.public_key, "q"), ()), shared, b"s")
    (x, xh), (y, yh) = run(base, mine, b"a"), run(base, theirs, tag)
    joined = epochs.join(chains_of(x, xh), chains_of(y, yh))
    epochs.verify(joined)
    if joined.forked:
        lo, hi = joined.held
        for offset in range(lo, hi):
            assert x.record_at(offset) == y.record_at(offset) is not None
    both = range(max(x.start, y.start), min(x.held_end, y.held_end))
    if any(x.record_at(o) != y.record_at(o) for o in both) or (x.meta != y.meta and x.version == y.version):
        assert joined.forked
    if xh == yh[: len(xh)] or yh == xh[: len(yh)]:
        assert not joined.forked and joined.held == (max(x.start, y.start), max(x.held_end, y.held_end))


def test_the_owner_recovers_a_frozen_queue_in_a_new_epoch() -> None:
    """Recovery goes on from the frozen records under epoch 1, which supersedes every epoch-0 head, the
    twin's later ones included; two recoveries that differ fork epoch 1 and freeze it at its start."""
    base = run((core.empty_state(OWNER.public_key, "q"), ()), [("offer", 3), ("truncate", 1)], b"s")
    (x, xh), (y, yh) = run(base, [("offer", 2)], b"a"), run(base, [("offer", 1), ("meta", 0)], b"b")
    frozen = epochs.join(chains_of(x, xh), chains_of(y, yh))
    assert frozen.forked and frozen.held == (1, 3)
    mine = recover(x, frozen, OWNER, now_ms=99)
    after = epochs.replica(OWNER.public_key, mine, (), frozen.held[1])
    epochs.verify(after)
    assert (after.epoch, after.forked, after.held) == (1, False, (1, 3)) and mine.head_hash == x.chain_at(3)
    (_, later) = run((y, yh), [("offer", 4)], b"b")
    assert epochs.join(after, chains_of(y, later)) == after == epochs.join(frozen, after)
    theirs = recover(y, frozen, OWNER, now_ms=98)
    twice = epochs.join(after, epochs.replica(OWNER.public_key, theirs, (), 3))
    assert twice.epoch == 1 and twice.forked and twice.fork_point == 0 and twice.held == (1, 1)
    with pytest.raises(MalformedError):
        recover(x, chains_of(x, xh), OWNER, now_ms=99)


def test_a_chunk_up_to_the_fork_point_is_vouched_by_the_last_shared_body() -> None:
    """No signed checkpoint is needed: the unsigned body of the last shared head is on the verified log,
    and the records up to the fork point fold to its head hash; a body changed in any field is not."""
    base = run((core.empty_state(OWNER.public_key, "q"), ()), [("offer", 2), ("offer", 3)], b"s")
    (x, xh), (y, yh) = run(base, [("offer", 2)], b"a"), run(base, [("offer", 1), ("meta", 0)], b"b")
    frozen = epochs.join(chains_of(x, xh), chains_of(y, yh))
    last_shared = dataclasses.replace(base[1][-1], signature=b"")
    assert frozen.fork_point == last_shared.end == 5
    assert epoch_delta.vouches(frozen, last_shared)
    digests = [record_digest(r, offset) for offset, r in enumerate(x.entries.records(), start=x.start)][:5]
    assert chain_fold(x.chain_at(0) or b"", digests) == last_shared.head_hash
    for forged in (
        dataclasses.replace(last_shared, head_hash=bytes(32)),
        dataclasses.replace(last_shared, version=1),
    ):
        assert not epoch_delta.vouches(frozen, forged)
    assert all(epoch_delta.vouches(frozen, h) for h in (*xh, *yh))  # the tips keep their leaves
    (_, third) = run(base, [("offer", 1)], b"c")
    assert not epoch_delta.vouches(frozen, third[-1])  # a history this value has not seen
