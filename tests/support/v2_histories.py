"""Core-1 queue histories of offers, truncations and metadata changes with the v2 head of each commit: what
the leaf-codec tests (pure and compiled) rebuild bodies and leaves from."""

from __future__ import annotations

from hypothesis import strategies as st

from latticed.crdt import queue as core
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue.v2heads import sign_v2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(bytes(range(32)))
step = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 3)),
    st.tuples(st.just("truncate"), st.integers(0, 3)),
    st.tuples(st.just("meta"), st.integers(0, 1)),
)


def history(steps: list[tuple[str, int]]) -> tuple[core.QueueState, list[HeadV2]]:
    """A core-1 queue after ``steps`` and the v2 heads of its commits (the owner's clock may step back)."""
    state, heads = core.empty_state(OWNER.public_key, "q"), []
    for index, (kind, arg) in enumerate(steps):
        now = 1000 + index * 3 - (index % 3) * 5
        if kind == "offer":
            state = core.commit(state, OWNER, now_ms=now, records=[Record(value=b"%d" % index)] * arg)
        elif kind == "truncate":
            state = core.commit(state, OWNER, now_ms=now, new_start=min(state.known_end, state.start + arg))
        else:
            state = core.commit(state, OWNER, now_ms=now, meta_updates={"k": str(arg)})
        heads.append(sign_v2(state, OWNER, heads[-1] if heads else None))
    return state, heads
