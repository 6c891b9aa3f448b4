"""A replica that holds nothing of a core-2 queue joins a peer's first chunk as the run the wire decoded
(columns), as it joins every later chunk: no Record is built per row on the way to the store (that cost
more than verifying the row), and what it stores is the owner's queue."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from support.no_rows import NoRows

from latticed.crdt import queue2, wire
from latticed.crdt.queue.state import EntryView
from latticed.crdt.records import Record, RecordRun, make_record
from latticed.crdt.signing import Identity
from latticed.net.core2_engine_host import MergeSteps2
from latticed.protocol import core2_wire
from latticed.protocol.core2_steps import outgoing, unpack_steps
from latticed.storage.core2_engine import reading_through
from latticed.storage.engine import Engine
from latticed.storage.entries import StoredEntries

OWNER = Identity.from_seed(b"o" * 32)
REPLICA = Identity.from_seed(b"r" * 32)


def single_offers(count: int) -> queue2.QueueState2:
    state = queue2.commit(queue2.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1)
    for i in range(count):
        state = queue2.commit(state, OWNER, now_ms=10 + i, records=[make_record(b"v%d" % i, timestamp=i)])
    return state


def on_the_wire(state: queue2.QueueState2, since: queue2.Summary | None, chunk: int) -> MergeSteps2:
    out = outgoing(state, since, chunk, 1 << 20)
    raw = wire.pack(core2_wire.delta_to_wire(out.delta, out.steps))
    return MergeSteps2(*core2_wire.delta_from_wire(wire.unpack(raw)))


def test_a_run_joined_to_an_empty_stored_run_stays_a_run() -> None:
    owner = single_offers(30)
    empty = queue2.empty_state(OWNER.public_key, "q")
    stored = dataclasses.replace(empty, entries=cast(EntryView, StoredEntries(NoRows(), 7, 0, 0)))
    job = on_the_wire(owner, None, 4096)
    d = unpack_steps(stored, job.delta, job.steps)
    merged = queue2.join_verified(stored, queue2.verify_delta(stored, d)).state
    entries = merged.entries
    assert isinstance(entries, StoredEntries) and entries.q == 7 and entries.lo == 0
    records, chains = entries.overlay
    assert type(records) is RecordRun and len(records) == 30
    assert chains == tuple(owner.entries.chain(i) for i in range(30))
    assert merged.chains == owner.chains


async def test_a_fresh_replica_stores_its_first_chunk_without_a_record_per_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = single_offers(300)
    built: list[int] = []
    iterate = RecordRun.__iter__

    def counting(run: RecordRun) -> Iterator[Record]:
        built.append(len(run))
        return iterate(run)

    async with Engine.open(tmp_path, REPLICA) as engine:
        monkeypatch.setattr(RecordRun, "__iter__", counting)
        await engine.bridge.run(on_the_wire(owner, None, 200))
        assert [n for n in built if n > 1] == []
        monkeypatch.setattr(RecordRun, "__iter__", iterate)
        q = engine.core2.lookup(OWNER.public_key, "q")
        assert q is not None
        state = await engine.core2.value(q)
        await engine.bridge.run(on_the_wire(owner, queue2.summary(state), 200))
        state = await engine.core2.value(q)
        assert state.chains == owner.chains and state.held == owner.held
        held = await engine.bridge.read(lambda reader: reading_through(state, reader.rows).records())
        assert held == owner.records()
