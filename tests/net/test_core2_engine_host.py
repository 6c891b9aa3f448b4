"""The daemon's store as replication's core-2 host: deltas as a link sends them (their bodies as steps)
merged into another store, a delta that no longer fits storing nothing, a forged one raising, and a
core-2 delta of a queue held here on core 1 refused without closing anything, and a delta whose rows a
fork freeze moved aside during its read raising GapError, read again by the link driver from the frozen
value."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from latticed.crdt import queue2
from latticed.crdt.records import Record, RecordRun, make_record
from latticed.crdt.signing import Identity
from latticed.errors import GapError, IntegrityError
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.gossip import Gossip, PeerLink
from latticed.net.replication_service import EngineHost
from latticed.protocol.core2_wire import Delta2, Summary2, encode2, link_summary
from latticed.storage.engine import Engine
from latticed.storage.entries import SqlRows

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def rec(tag: str, i: int) -> Record:
    return make_record(f"{tag}{i}".encode(), timestamp=NOW + i)


async def test_deltas_with_steps_join_another_store_and_a_stale_one_stores_nothing(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    async with (
        Engine.open(tmp_path / "a", ALICE) as a,
        Engine.open(tmp_path / "b", BOB) as b,
        Engine.open(tmp_path / "c", BOB) as c,
    ):
        owner, replica, empty = EngineCore2Host(a), EngineCore2Host(b), EngineCore2Host(c)
        q = await a.core2.create("q")
        await a.core2.commit(q, [rec("v", i) for i in range(5)])
        key = (ALICE.public_key, "q", 0)
        first = await owner.delta2_for(key, None, 100, 1 << 20)
        assert first is not None
        summary, changed = await replica.submit_merge2(first.delta, first.steps, b"p" * 32).result()
        assert changed and summary == owner.summaries2()[key]

        for i in range(5, 8):  # one head per commit: the next delta's bodies go as steps
            await a.core2.commit(q, [rec("v", i)])
        assert summary is not None
        second = await owner.delta2_for(key, summary.core, 100, 1 << 20)
        assert second is not None and second.steps is not None
        # To a store holding nothing of it, the steps cannot be rebuilt: nothing stored, nothing held.
        assert await empty.submit_merge2(second.delta, second.steps, b"p" * 32).result() == (None, False)
        assert empty.summaries2() == {}
        summary, changed = await replica.submit_merge2(second.delta, second.steps, b"p" * 32).result()
        assert changed and summary == owner.summaries2()[key] == link_summary(await b.core2.value(q))
        # The same delta again: it no longer fits (or changes nothing); what is held is the answer.
        assert await replica.submit_merge2(second.delta, second.steps, b"p" * 32).result() == (summary, False)


async def test_a_forged_delta_raises_and_a_core1_queue_refuses_core2_deltas(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    async with Engine.open(tmp_path / "a", ALICE) as a, Engine.open(tmp_path / "b", BOB) as b:
        owner, replica = EngineCore2Host(a), EngineCore2Host(b)
        q = await a.core2.create("q")
        await a.core2.commit(q, [rec("v", i) for i in range(3)])
        out = await owner.delta2_for((ALICE.public_key, "q", 0), None, 100, 1 << 20)
        assert out is not None
        forged = dataclasses.replace(out.delta, records=(rec("x", 0), *out.delta.records[1:]))
        with pytest.raises(IntegrityError):
            await replica.submit_merge2(forged, out.steps, b"p" * 32).result()
        assert replica.summaries2() == {}

        # A core-1 queue of the same address on the replica: the core-2 delta is refused, nothing stored.
        other = queue2.empty_state(ALICE.public_key, "one")
        d = queue2.delta(queue2.commit(other, ALICE, now_ms=NOW, records=[rec("o", 0)]), None)
        state = await _core1_replica_of(a, b, "one")
        assert await replica.submit_merge2(d, None, b"p" * 32).result() == (None, False)
        assert b.state(state).held_end == 1 and replica.summaries2() == {}


async def _core1_replica_of(owner: Engine, replica: Engine, name: str) -> int:
    """Queue ``name`` created on core 1 by ``owner``, with one record, held by ``replica``; its number."""
    q = await owner.create_queue(name, None)
    await owner.append(q, [rec("o", 0)])
    d = await owner.delta_for(ALICE.public_key, name, None)
    state = await replica.merge_delta(d)
    found = replica.find(state.owner, state.name, state.kind)
    assert found is not None
    return found


async def test_a_catch_up_chunk_is_read_from_the_store_once_as_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk sized by bytes reads its rows once, a column at a time (no Record per row: that was most
    of a catch-up sender's time), and goes on the wire as the records would; the replica joins it."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    reads: list[str] = []
    for method in ("records", "run"):
        original = getattr(SqlRows, method, None)

        def counted(self: SqlRows, q: int, lo: int, hi: int, _f: Any = original, _m: str = method) -> Any:
            reads.append(_m)
            return _f(self, q, lo, hi)

        monkeypatch.setattr(SqlRows, method, counted, raising=False)
    async with Engine.open(tmp_path / "a", ALICE) as a, Engine.open(tmp_path / "b", BOB) as b:
        owner, replica = EngineCore2Host(a), EngineCore2Host(b)
        q = await a.core2.create("q")
        written = [
            make_record(
                f"v{i}",
                key=f"k{i}" if i % 2 else None,
                headers={"h": "x"} if i % 3 else None,
                timestamp=NOW + i,
            )
            for i in range(20)
        ]
        for i in range(0, 20, 5):
            await a.core2.commit(q, written[i : i + 5])
        key = (ALICE.public_key, "q", 0)
        reads.clear()
        out = await owner.delta2_for(key, None, 12, 1 << 20)  # ends at the body of the 10th record
        assert out is not None and reads == ["run"]
        assert type(out.delta.records) is RecordRun and list(out.delta.records) == written[:10]
        assert pickle.loads(pickle.dumps(out.delta)) == out.delta  # a store job may cross processes
        ours = owner.summaries2()[key]
        as_records = dataclasses.replace(out.delta, records=tuple(written[:10]))
        assert encode2(Delta2(1, ours, out.delta, out.steps)) == encode2(
            Delta2(1, ours, as_records, out.steps)
        )
        summary, changed = await replica.submit_merge2(out.delta, out.steps, b"p" * 32).result()
        assert changed and summary is not None and summary.core.held_end == 10


async def test_a_relay_builds_the_next_links_delta_from_the_merged_records_without_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay answers the next link for a push it just merged from the records the merge appended (no
    reader thread's read transaction per relayed record), and the delta is the one a read gives; records
    whose chain is not the held value's are never served: the read decides then."""
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
    async with (
        Engine.open(tmp_path / "a", ALICE) as a,
        Engine.open(tmp_path / "b", BOB) as b,
        Engine.open(tmp_path / "c", BOB) as c,
    ):
        owner, relay, leaf = EngineCore2Host(a), EngineCore2Host(b), EngineCore2Host(c)
        q = await a.core2.create("q")
        await a.core2.commit(q, [rec("v", i) for i in range(3)])
        key = (ALICE.public_key, "q", 0)
        held: dict[EngineCore2Host, Summary2 | None] = {}
        reads: list[object] = []
        read = b.bridge.read

        async def counted(fn: Any) -> Any:
            reads.append(fn)
            return await read(fn)

        monkeypatch.setattr(b.bridge, "read", counted)
        first = await owner.delta2_for(key, None, 100, 1 << 20)
        assert first is not None
        for host in (relay, leaf):
            held[host], _ = await host.submit_merge2(first.delta, first.steps, b"p" * 32).result()
        for i in range(3, 6):  # live pushes, one record each, relayed on as they come
            await a.core2.commit(q, [rec("v", i)])
            since = held[relay]
            assert since is not None
            push = await owner.delta2_for(key, since.core, 100, 1 << 20)
            assert push is not None
            held[relay], changed = await relay.submit_merge2(push.delta, push.steps, b"p" * 32).result()
            assert changed

            reads.clear()
            to_leaf = held[leaf]
            assert to_leaf is not None
            out = await relay.delta2_for(key, to_leaf.core, 100, 1 << 20)
            assert out is not None and reads == []
            fresh = await EngineCore2Host(b).delta2_for(key, to_leaf.core, 100, 1 << 20)  # read from disk
            assert fresh is not None and len(reads) == 1
            assert list(out.delta.records) == list(fresh.delta.records) == [rec("v", i)]
            assert dataclasses.replace(out.delta, records=()) == dataclasses.replace(fresh.delta, records=())
            assert (out.steps, out.implied) == (fresh.steps, fresh.implied)
            held[leaf], changed = await leaf.submit_merge2(out.delta, out.steps, b"p" * 32).result()
            assert changed and held[leaf] == held[relay] == owner.summaries2()[key]

        # Records that are not the held value's (another branch's, a rolled-back commit's): the chain at
        # the held end tells, and the read answers.
        await a.core2.commit(q, [rec("v", 6)])
        since = held[relay]
        assert since is not None
        push = await owner.delta2_for(key, since.core, 100, 1 << 20)
        assert push is not None
        await relay.submit_merge2(push.delta, push.steps, b"p" * 32).result()
        rq = b.core2.lookup(*key)
        assert rq is not None
        state = await b.core2.value(rq)
        run = relay.recent._runs[rq]
        relay.recent._runs[rq] = type(run)(
            run.lo, (*run.records[:-1], rec("x", 6)), (*run.chains[:-1], b"x" * 32)
        )
        to_leaf = held[leaf]
        assert to_leaf is not None and state.held[1] == 7
        reads.clear()
        # The push itself, committed and the newest, goes on as it came (its records, no read)...
        out = await relay.delta2_for(key, to_leaf.core, 100, 1 << 20)
        assert out is not None and out.delta is push.delta and reads == []
        assert relay.ahead.value(rq) is None  # ...until the value ahead is let go (the next push does)
        out = await relay.delta2_for(key, to_leaf.core, 100, 1 << 20)
        assert out is not None and list(out.delta.records) == [rec("v", 6)] and len(reads) == 1


async def test_a_fork_frozen_while_a_delta_is_read_is_read_again_from_the_frozen_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay reads the delta the copy of an identity lacks while the copy's own records arrive and
    freeze the queue at its fork point, moving the rows past it aside: the read finds them gone. That is
    no fault of the peer, and raising closed the link (the copied-identity test saw the copy's row
    missing until it redialled). The host raises GapError, as every host may; the link driver's read
    again (the one mechanism, ``Gossip._read_again``) builds the delta from the frozen value."""
    for name in ("owner", "relay"):
        (tmp_path / name).mkdir()
    async with Engine.open(tmp_path / "owner", ALICE) as e:
        q = await e.core2.create("q")
        await e.core2.commit(q, [rec("s", i) for i in range(10)])
    shutil.copytree(tmp_path / "owner", tmp_path / "copy")
    async with (
        Engine.open(tmp_path / "owner", ALICE) as a,
        Engine.open(tmp_path / "copy", ALICE) as c,
        Engine.open(tmp_path / "relay", BOB) as b,
    ):
        owner, copy, relay = EngineCore2Host(a), EngineCore2Host(c), EngineCore2Host(b)
        await a.core2.commit(q, [rec("o", i) for i in range(5)])
        await c.core2.commit(q, [rec("c", i) for i in range(3)])
        key = (ALICE.public_key, "q", 0)
        whole = await owner.delta2_for(key, None, 100, 1 << 20)
        assert whole is not None
        await relay.submit_merge2(whole.delta, whole.steps, b"o" * 32).result()
        theirs = await copy.delta2_for(key, None, 100, 1 << 20)
        assert theirs is not None
        since = copy.summaries2()[key].core
        read = b.bridge.read
        raced: list[bool] = []

        async def after_the_copys_merge(fn: Any) -> Any:
            if not raced:  # the copy's records commit between the value's load and the read
                raced.append(True)
                summary, changed = await relay.submit_merge2(theirs.delta, theirs.steps, b"c" * 32).result()
                assert changed and summary is not None and summary.core.held_end == 10
            return await read(fn)

        monkeypatch.setattr(b.bridge, "read", after_the_copys_merge)
        host = EngineCore2Host(b)
        delta2_for = functools.partial(host.delta2_for, key, since, 100, 1 << 20)  # no recent rows: a read
        with pytest.raises(GapError) as raised:
            await delta2_for()  # the host leaves the race to its caller: the link driver reads again
        assert raced == [True]
        gossip = Gossip(EngineHost(b), BOB.public_key, host2=host)
        peer = PeerLink(b"c" * 32, "10.0.0.2:7000", "incoming", None)  # type: ignore[arg-type]  # for logs
        out = await gossip._read_again(peer, key, delta2_for, raised.value)
        assert gossip.counters["delta_reads_raced"] == 1
        frozen = await b.core2.value(q)
        assert frozen.forked and frozen.held == (0, 10)
        # Answered from the frozen value: both signed histories (the fork proof), no record past the
        # fork point (the read found them gone), and what a read now gives.
        assert out is not None and out.delta.records == ()
        assert out.delta.log is not None and len(out.delta.log.value.tips) == 2
        assert await EngineCore2Host(b).delta2_for(key, since, 100, 1 << 20) == out
