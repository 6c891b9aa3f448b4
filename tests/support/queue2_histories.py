"""Histories of a forked owner for the v2 queue state's tests: real records, real signatures, truncations,
metadata and timestamp-only heads, two or three copies of one store, and sometimes a recovery."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(bytes(range(32)))
Step = tuple[str, int]
step = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 3)),
    st.tuples(st.just("truncate"), st.integers(0, 3)),
    st.tuples(st.just("meta"), st.integers(0, 1)),
    st.tuples(st.just("touch"), st.just(0)),
)
#: One copy's states, one per head it signed (its owner state after each).
Line = list[QueueState2]


def empty() -> QueueState2:
    return queue2.empty_state(OWNER.public_key, "q")


def extend(state: QueueState2, steps: Sequence[Step], tag: bytes) -> Line:
    """``state`` (an owner's) continued by ``steps``, its records named by ``tag``."""
    line = []
    for kind, arg in steps:
        version = state.chains.tips[0].head.version if state.chains.tips else 0
        now = version * 10 + len(tag)
        if kind == "offer":
            records = [Record(value=tag + b"%d.%d" % (version, i), timestamp=now) for i in range(arg)]
            state = queue2.commit(state, OWNER, now_ms=now, records=records)
        elif kind == "truncate":
            state = queue2.truncate(state, OWNER, state.held[0] + arg, now_ms=now)
        elif kind == "meta":
            state = queue2.commit(state, OWNER, now_ms=now, meta_updates={"k": tag.hex() + str(arg)})
        else:
            state = queue2.commit(state, OWNER, now_ms=now)
        line.append(state)
    return line


def catch_up(replica: QueueState2, source: QueueState2, chunks: int, size: int) -> QueueState2:
    """``replica`` after ``chunks`` deltas of at most ``size`` records from ``source``."""
    for _ in range(chunks):
        d = queue2.delta(source, queue2.summary(replica), max_records=size)
        replica = queue2.join_verified(replica, queue2.verify_delta(replica, d)).state
    return replica


@st.composite
def forked_owner(draw: st.DrawFn) -> list[Line]:
    """Two or three copies of one store past a shared prefix (tags may coincide: then they may be one
    history), and sometimes the owner's recovery of the frozen queue in epoch 1."""
    shared = extend(empty(), draw(st.lists(step, min_size=1, max_size=4)), b"s")
    lines = [
        extend(
            shared[-1],
            draw(st.lists(step, min_size=1, max_size=4)),
            draw(st.sampled_from([b"a", b"b", b"c"])),
        )
        for _ in range(draw(st.integers(2, 3)))
    ]
    frozen = queue2.join(lines[0][-1], lines[1][-1])
    if frozen.forked and draw(st.integers(0, 2)) == 0:
        mine = lines[0][-1].records()[frozen.held[1] - lines[0][-1].held[0] :] if draw(st.booleans()) else []
        recovered = queue2.recover(frozen, OWNER, now_ms=1000, keep_mine=mine)
        lines.append([recovered, *extend(recovered, draw(st.lists(step, max_size=3)), b"r")])
    return lines


def snapshot(draw: st.DrawFn, lines: list[Line]) -> QueueState2:
    """A replica of one copy at some version, holding some of its records (caught up in chunks), or
    the copy itself, or nothing yet."""
    line = draw(st.sampled_from(lines))
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return empty()
    source = line[draw(st.integers(0, len(line) - 1))]
    if kind < 4:
        return source
    return catch_up(empty(), source, draw(st.integers(0, 2)), draw(st.integers(1, 3)))


@st.composite
def states(draw: st.DrawFn, count: int) -> list[QueueState2]:
    lines = draw(forked_owner())
    picked = []
    for _ in range(count):
        value = snapshot(draw, lines)
        for _ in range(draw(st.integers(0, 2))):
            value = queue2.join(value, snapshot(draw, lines))
        picked.append(value)
    return picked
