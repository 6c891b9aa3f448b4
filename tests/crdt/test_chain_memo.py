"""Chain values handed from rebuilding a delta's steps to its verification: the records are hashed once,
a hit is exactly chain_extend's answer, and anything else (other records, base or offset, a list, a
second take) misses."""

from __future__ import annotations

import pytest
from support.queue2_histories import OWNER, empty

from latticed.crdt import chain_memo, queue2
from latticed.crdt.queue2 import replica_deltas
from latticed.crdt.records import Record, RecordRun, chain_extend
from latticed.protocol import core2_steps
from latticed.protocol.core2_steps import outgoing, unpack_steps

BASE = b"\x01" * 32


def _run(n: int, tag: bytes = b"v") -> RecordRun:
    return RecordRun.of([Record(value=tag + b"%d" % i, timestamp=i) for i in range(n)])


def test_a_remembered_chain_is_taken_once_and_only_for_the_same_records() -> None:
    run = _run(5)
    chain = chain_extend(BASE, 7, run)
    chain_memo.remember(BASE, 7, run, chain)
    assert chain_memo.take(BASE, 8, run) is None  # another offset
    assert chain_memo.take(b"\x02" * 32, 7, run) is None  # another base
    assert chain_memo.take(BASE, 7, _run(5)) is None  # equal records, other objects: not assumed
    assert chain_memo.take(BASE, 7, run[0:5]) == chain  # a whole slice shares the run's columns
    as_tuple = tuple(_run(1))
    chain_memo.remember(BASE, 7, as_tuple, chain_extend(BASE, 7, as_tuple))
    one = RecordRun((as_tuple[0].value,), (None,), (as_tuple[0].timestamp,))
    assert chain_memo.take(BASE, 7, one) is None  # a tuple's key (one item) and a run's (four): a miss
    assert chain_memo.take(BASE, 7, as_tuple) == chain_extend(BASE, 7, as_tuple)
    assert chain_memo.take(BASE, 7, run) is None  # taken already
    records = list(run)
    chain_memo.remember(BASE, 7, records, chain)  # a list may change: never remembered
    assert chain_memo.take(BASE, 7, records) is None
    as_tuple = tuple(records)
    chain_memo.remember(BASE, 7, as_tuple, chain)
    assert chain_memo.take(BASE, 7, as_tuple) == chain_extend(BASE, 7, as_tuple)


def test_a_delta_with_steps_is_hashed_once_from_rebuilding_to_verifying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = empty()
    for i in range(30):
        state = queue2.commit(state, OWNER, now_ms=i, records=[Record(value=b"%d" % i)] * 3)
    out = outgoing(state, None, 40)
    assert out.steps is not None
    calls: list[int] = []

    def counting(base: bytes, first: int, records: object) -> list[bytes]:
        calls.append(len(records))  # type: ignore[arg-type]
        return chain_extend(base, first, records)  # type: ignore[arg-type]

    monkeypatch.setattr(core2_steps, "chain_extend", counting)
    monkeypatch.setattr(replica_deltas, "chain_extend", counting)
    replica = empty()
    d = unpack_steps(replica, out.delta, out.steps)
    joined = queue2.join_verified(replica, queue2.verify_delta(replica, d)).state
    assert calls == [len(out.delta.records)]
    assert joined.held[1] == out.delta.from_offset + len(out.delta.records)
    assert joined.chain_at(joined.held[1]) == state.chain_at(joined.held[1])
