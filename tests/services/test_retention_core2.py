"""Retention on fork core 2: the owner's policies (max records, max age) cut its core-2 queues by signed
truncation at a timer round, counted as core 1's are; a replica's core-2 queue is never cut locally (no
replica floor on core 2), nor is a frozen one."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from latticed.crdt import queue2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.host.retention_policy import MAX_AGE_KEY, MAX_RECORDS_KEY, ReplicaCaps
from latticed.process.logs import EVENT_ATTR
from latticed.services import retention_service
from latticed.services.retention_core2 import Cut2, enforce_core2
from latticed.services.retention_service import RetentionService
from latticed.storage.codec import pack
from latticed.storage.engine import Engine
from latticed.storage.store import db_path
from latticed.storage.wiring import ChangeFanout

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
OLD = 1_700_000_000_000  # 2023: older than an hour by any clock this runs on


def rec(i: int, timestamp: int = OLD) -> Record:
    return make_record(b"x%d" % i, timestamp=timestamp)


async def test_the_owners_core2_policies_truncate_at_a_timer_round(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        core2 = engine.core2
        counted = await core2.create("counted", {MAX_RECORDS_KEY: "50"})
        aged = await core2.create("aged", {MAX_AGE_KEY: "3600000"})
        free = await core2.create("free")
        for q in (counted, aged, free):
            await core2.commit(q, [rec(i) for i in range(200)])
        service = RetentionService(engine, interval_s=3600.0)
        await service.upkeep()
        assert (await core2.value(counted)).held == (200 - 47, 200)  # 95 % of the limit is kept
        assert (await core2.value(aged)).held == (200, 200)
        assert (await core2.value(free)).held == (0, 200)
        counters = service.counters
        assert (counters.truncations, counters.records_truncated) == (2, 153 + 200)
        assert counters.bytes_truncated > 0 and counters.failures == 0
        await service.upkeep()  # within its limits now: nothing more
        assert service.counters.truncations == 2
    async with Engine.open(tmp_path, ALICE) as engine:  # the truncations were signed and stored
        assert (await engine.core2.value(counted)).held == (153, 200)


async def test_a_replicas_core2_queue_is_not_cut_here_nor_a_frozen_one(tmp_path: Path) -> None:
    theirs = queue2.commit(
        queue2.empty_state(BOB.public_key, "theirs"),
        BOB,
        now_ms=1,
        meta_updates={MAX_RECORDS_KEY: "5"},
        records=[rec(i) for i in range(100)],
    )
    base = queue2.commit(
        queue2.empty_state(ALICE.public_key, "frozen"),
        ALICE,
        now_ms=1,
        meta_updates={MAX_RECORDS_KEY: "5"},
        records=[rec(i) for i in range(100)],
    )
    mine = queue2.commit(base, ALICE, now_ms=2, records=[rec(i) for i in range(3)])
    copy = queue2.commit(base, ALICE, now_ms=3, records=[rec(i + 10) for i in range(4)])
    async with Engine.open(tmp_path, ALICE) as engine:
        core2 = engine.core2
        for state in (theirs, queue2.join(mine, copy)):
            d = queue2.delta(state, None)
            verified, against = await core2.verify(d)
            await core2.merge(d, verified, against)
        # A replica cap of 1 byte, and both queues far over their owner's max_records.
        service = RetentionService(engine, caps=ReplicaCaps(default=1), interval_s=3600.0)
        await service.upkeep()
        held = {core2.address(q): (await core2.value(q)).held for q in core2.queues()}
        assert held == {
            f"{BOB.public_key.hex()}/theirs": (0, 100),
            f"{ALICE.public_key.hex()}/frozen": (0, 100),
        }
        assert service.counters.truncations == service.counters.local_drops == 0
        assert service.counters.failures == 0


async def test_a_queue_moved_to_core2_after_a_check_was_due_is_cut_on_core2(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        q = await engine.create_queue("moved", {MAX_RECORDS_KEY: "50"})
        await engine.append(q, [rec(i) for i in range(200)])
        service = RetentionService(engine, interval_s=3600.0)
        await engine.core2.upgrade_core1(q, engine.state(q))  # a core-1 check of it may still be due
        assert await service.enforce(q) == 0  # not a crash of the retention worker: core 2 cuts it
        await service.upkeep()
        assert (await engine.core2.value(q)).held == (200 - 47, 200)


async def test_a_running_service_checks_only_the_limited_core2_queues_after_its_first_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A daemon of tens of thousands of core-2 queues, few of them limited, was scanned whole at every
    # round of the timer (a loop turn per round over every queue, on the writer and every replica).
    checked: list[int] = []

    async def counted(store: Any, core2: Any, q: int, floor: Any = None) -> Cut2 | None:
        checked.append(q)
        return await enforce_core2(store, core2, q, floor)

    monkeypatch.setattr(retention_service, "enforce_core2", counted)
    changes = ChangeFanout()
    async with Engine.open(tmp_path, ALICE, changes=changes) as engine, trio.open_nursery() as nursery:
        core2 = engine.core2
        free = [await core2.create(f"free{i}") for i in range(30)]
        service = await nursery.start(RetentionService(engine, interval_s=3600.0).run, changes)
        await service.upkeep()  # the first round (the timer's ran already): every queue
        checked.clear()
        await service.upkeep()
        assert checked == []  # none of them limited
        counted_q = await core2.create("counted", {MAX_RECORDS_KEY: "50"})
        await core2.commit(counted_q, [rec(i) for i in range(200)])
        await core2.commit(free[3], [rec(0)])
        await service.upkeep()
        assert checked.count(counted_q) >= 1 and set(checked) == {counted_q}
        assert (await core2.value(counted_q)).held == (200 - 47, 200)
        await core2.commit(free[4], [rec(1), rec(2)], {MAX_RECORDS_KEY: "1"})
        checked.clear()
        await service.upkeep()
        assert set(checked) == {counted_q, free[4]}  # limited by a later commit: checked from then on
        await core2.drop(counted_q)
        await core2.commit(free[4], [], {MAX_RECORDS_KEY: None})  # its limit lifted
        checked.clear()
        await service.upkeep()
        assert checked == []
        nursery.cancel_scope.cancel()


async def test_a_corrupt_core2_queue_is_skipped_without_a_failure_at_each_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A queue found corrupt (logged once as store.queue_corrupt, named by doctor) was logged again as
    # retention.failed, and counted a failure, at every round of the timer.
    caplog.set_level(logging.DEBUG, logger="latticed")
    async with Engine.open(tmp_path, ALICE) as engine:
        bad = await engine.core2.create("bad", {MAX_RECORDS_KEY: "50"})
        good = await engine.core2.create("good", {MAX_RECORDS_KEY: "50"})
        for q in (bad, good):
            await engine.core2.commit(q, [rec(i) for i in range(200)])
    conn = sqlite3.connect(db_path(tmp_path))
    try:  # other metadata than the owner signed, written behind latticed's back
        conn.execute(
            "UPDATE queue2 SET meta = ? WHERE q = ?", (pack([[MAX_RECORDS_KEY, "50"], ["team", "evil"]]), bad)
        )
        conn.commit()
    finally:
        conn.close()
    async with Engine.open(tmp_path, ALICE) as engine:
        service = RetentionService(engine, interval_s=3600.0)
        for _ in range(3):
            await service.upkeep()
        assert (await engine.core2.value(good)).held == (200 - 47, 200)
        assert service.counters.failures == 0 and service.counters.truncations == 1
        assert [e["queue"] for e in engine.core2.corrupt_entries()] == [f"{ALICE.public_key.hex()}/bad"]
    events = [getattr(r, EVENT_ATTR, "") for r in caplog.records]
    assert events.count("store.queue_corrupt") == 1 and "retention.failed" not in events
