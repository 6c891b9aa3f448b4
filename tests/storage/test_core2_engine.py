"""Core-2 queues through the daemon's engine: the owner's writes answered once on disk, a replica caught
up in chunks by summary / delta_for / verify / merge, concurrent commits sharing group commits, and
evidence read on a reader connection."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio

from latticed.crdt import queue2
from latticed.crdt.records import MAX_VALUE_BYTES, Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import MalformedError
from latticed.storage.core2_engine import Core2Engine
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def rec(tag: str, i: int) -> Record:
    return make_record(f"{tag}{i}".encode(), timestamp=NOW + i)


async def catch_up(replica: Core2Engine, owner: Core2Engine, q: int, chunk: int) -> int:
    """Chunks of at most ``chunk`` records from ``owner`` until ``replica`` holds what it holds; returns
    how many deltas it took."""
    state = await owner.state(q)
    rounds = 0
    while True:
        rq = await replica.find(state.owner, state.name, state.kind)
        since = None if rq is None else await replica.summary(rq)
        d = await owner.delta_for(q, since, max_records=chunk)
        verified, against = await replica.verify(d)
        merged = await replica.merge(d, verified, against)
        rounds += 1
        if not merged.changed:
            return rounds


async def test_an_owner_and_a_replica_through_their_engines(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    async with Engine.open(tmp_path / "a", ALICE) as a, Engine.open(tmp_path / "b", BOB) as b:
        owner, replica = Core2Engine(a), Core2Engine(b)
        q = await owner.create("q", {"team": "x"})
        before = a.transactions
        firsts: list[int] = []

        async def offer(i: int) -> None:
            firsts.append(await owner.commit(q, [rec("v", j) for j in range(i * 10, i * 10 + 10)]))

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(offer, i)
        assert sorted(firsts) == list(range(0, 80, 10))
        assert a.transactions - before <= 8  # concurrent commits share transactions where they meet
        assert await owner.truncate(q, 5) == 5
        for i in range(8, 12):  # one head each: chunks end at heads
            await offer(i)

        rounds = await catch_up(replica, owner, q, chunk=20)
        assert rounds > 2  # in chunks
        rq = await replica.find(ALICE.public_key, "q")
        assert rq is not None
        theirs, ours = await owner.state(q), await replica.state(rq)
        assert ours.chains == theirs.chains and ours.meta == theirs.meta
        assert await replica.summary(rq) == await owner.summary(q)
        assert (await replica.evidence(rq)).pieces == ()


async def test_a_fork_met_through_engines_is_evidence_and_recovery_goes_on(tmp_path: Path) -> None:
    for name in ("owner", "relay"):
        (tmp_path / name).mkdir()
    async with Engine.open(tmp_path / "owner", ALICE) as e:
        owner = Core2Engine(e)
        q = await owner.create("q")
        await owner.commit(q, [rec("s", i) for i in range(10)])
    shutil.copytree(tmp_path / "owner", tmp_path / "copy")
    async with (
        Engine.open(tmp_path / "owner", ALICE) as e1,
        Engine.open(tmp_path / "copy", ALICE) as e2,
        Engine.open(tmp_path / "relay", BOB) as e3,
    ):
        owner, copy, relay = Core2Engine(e1), Core2Engine(e2), Core2Engine(e3)
        await owner.commit(q, [rec("o", i) for i in range(5)])
        await copy.commit(q, [rec("c", i) for i in range(3)])
        await catch_up(relay, owner, q, chunk=100)
        await catch_up(relay, copy, q, chunk=100)
        rq = await relay.find(ALICE.public_key, "q")
        assert rq is not None
        frozen = await relay.state(rq)
        assert frozen.forked and frozen.held == (0, 10)
        assert (await relay.evidence(rq)).records(0) == [rec("o", i) for i in range(5)]
        await catch_up(owner, relay, rq, chunk=100)  # the owner learns of the fork from the relay
        assert (await owner.state(q)).forked
        assert await owner.recover(q, keep_mine=True) == 1
        await catch_up(relay, owner, q, chunk=100)
        state = await relay.state(rq)
        assert state.chains.epoch == 1 and state.held == (0, 15) and not state.forked
        assert queue2.summary(state) == await owner.summary(q)


async def test_append_many_writes_parts_on_both_cores_together_or_not_at_all(tmp_path: Path) -> None:
    """The bulk append a work-queue group commit uses: parts of core-1 and core-2 queues in one
    transaction; a part refused fails every part."""
    async with Engine.open(tmp_path, ALICE) as e:
        one, two = await e.create_queue("one", core=1), await e.create_queue("two", core=2)
        assert await e.append_many([(two, [rec("t", i) for i in range(3)]), (one, [rec("o", 0)])]) == [0, 0]
        assert await e.append_many([(one, [rec("o", 1)]), (two, [rec("t", 3)])]) == [1, 3]
        assert (await e.bounds(one), await e.bounds(two)) == ((0, 2), (0, 4))
        assert (await e.read(two, 0, 4, 10, 1 << 20)).values == [b"t0", b"t1", b"t2", b"t3"]
        too_big = Record(b"x" * (MAX_VALUE_BYTES + 1), None, NOW)  # made past make_record's check
        with pytest.raises(MalformedError):
            await e.append_many([(two, [rec("t", 4)]), (one, [too_big])])
        assert (await e.bounds(one), await e.bounds(two)) == ((0, 2), (0, 4))
        assert (await Core2Engine(e).state(two)).chains.tips[0].head.end == 4  # nothing signed either
