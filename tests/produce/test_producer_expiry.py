"""Idle producers' rows expire on the owner (latticed/produce/expiry.py): the owner's real engine and offer
server under a clock the test moves; the retention service's timer round runs the step and counts it.
Rows of producers idle for the whole window go (a retry after that is written again, as documented); an
active producer's rows stay and its retry within the window is still answered from them; each step looks
at a bounded number of rows; rows a release without last-use rows wrote are adopted, not dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from latticed.crdt.signing import Identity
from latticed.errors import MalformedError
from latticed.host.config import DaemonConfig
from latticed.produce.dedup import ROW_PREFIX, USED_PREFIX
from latticed.produce.expiry import DEFAULT_IDLE_S, IdleProducers
from latticed.produce.owner import OfferServer
from latticed.produce.policy import producers_meta
from latticed.services.metrics_collector import StateCollector
from latticed.services.retention_service import RetentionService
from latticed.storage.batch import Batch
from latticed.storage.engine import Engine
from latticed.storage.jobs import WriterView
from latticed.storage.sealer import Sealer

OWNER = Identity.from_seed(b"a" * 32)
B = Identity.from_seed(b"b" * 32)
DAY_MS = 86_400_000
IDLE_S = 86_400.0


class Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


class Owner:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self.engine, self.clock = engine, clock
        self.offers = OfferServer(engine, Sealer(engine))
        self.q = 0

    async def offer(self, producer: str, seq: int, value: bytes = b"v") -> tuple[int, int, bool]:
        job = self.offers.start(B.public_key, self.q, producer, seq, [[value, None, None]])
        result: tuple[int, int, bool] = await self.engine.outcome(job)
        return result

    async def rows(self, prefix: str = ROW_PREFIX) -> int:
        def count(reader: Any) -> int:
            sql = "SELECT count(*) FROM settings WHERE substr(name, 1, ?) = ?"
            return int(reader.conn.execute(sql, (len(prefix), prefix)).fetchone()[0])

        return await self.engine.inspect(count)


@asynccontextmanager
async def owner(tmp_path: Path) -> AsyncIterator[Owner]:
    clock = Clock()
    async with Engine.open(tmp_path, OWNER, clock=clock) as engine:
        a = Owner(engine, clock)
        await engine.create_queue("feed", producers_meta([B.public_hex]))
        a.q = a.offers.own_queue("feed")
        yield a


async def test_idle_producers_rows_go_and_active_ones_stay(tmp_path: Path) -> None:
    async with owner(tmp_path) as a:
        idle = IdleProducers(a.engine, IDLE_S)
        assert await a.offer("idle", 0) == (0, 1, False)
        assert await a.offer("active", 0) == (1, 1, False)
        a.clock.ms += DAY_MS // 2
        assert await a.offer("active", 1) == (2, 1, False)  # the active producer writes again
        assert await idle.step() == 0  # nobody idle for a day yet
        assert (await a.rows(), await a.rows(USED_PREFIX)) == (2, 2)

        a.clock.ms += DAY_MS // 2  # "idle" has written nothing for a day, "active" for half a day
        assert await idle.step() == 1
        assert (await a.rows(), await a.rows(USED_PREFIX)) == (1, 1)
        # the active producer's retry within the window is still answered from its row, nothing written
        assert await a.offer("active", 1) == (2, 1, True)
        assert await a.offer("active", 0) == (1, 1, True)
        # the idle one's retry after expiry is not recognised any more: written again (documented)
        assert await a.offer("idle", 0) == (3, 1, False)
        assert a.engine.state(a.q).held_end == 4


async def test_a_step_looks_at_a_bounded_number_of_rows(tmp_path: Path) -> None:
    async with owner(tmp_path) as a:
        for i in range(5):
            await a.offer(f"p{i}", 0)
        a.clock.ms += 2 * DAY_MS
        idle = IdleProducers(a.engine, IDLE_S, limit=2)
        assert [await idle.step() for _ in range(4)] == [2, 2, 1, 0]
        assert await a.rows() == 0


async def test_rows_without_a_last_use_are_adopted_not_dropped(tmp_path: Path) -> None:
    """Rows a release that kept no last-use row wrote expire one idle time after they are first seen."""
    async with owner(tmp_path) as a:
        await a.offer("old", 0)

        def forget_use(batch: Batch, writer: WriterView) -> None:
            conn = writer.store.connection
            conn.execute("DELETE FROM settings WHERE substr(name, 1, ?) = ?", (len(USED_PREFIX), USED_PREFIX))
            conn.commit()

        await a.engine.call_in_writer(forget_use)
        a.clock.ms += 30 * DAY_MS
        idle = IdleProducers(a.engine, IDLE_S)
        assert await idle.step() == 0
        assert (await a.rows(), await a.rows(USED_PREFIX)) == (1, 1)
        assert await a.offer("old", 0) == (0, 1, True)  # still remembered
        a.clock.ms += DAY_MS
        assert await idle.step() == 1
        assert await a.rows() == 0


async def test_the_retention_timer_round_expires_and_counts(tmp_path: Path) -> None:
    async with owner(tmp_path) as a:
        await a.offer("p", 0)
        service = RetentionService(a.engine, interval_s=3600.0, expire_producers=IdleProducers(a.engine).step)
        await service.upkeep()
        assert service.counters.producers_expired == 0
        a.clock.ms += int(DEFAULT_IDLE_S * 1000)
        await service.upkeep()
        assert service.counters_dict()["producers_expired"] == 1
        assert await a.rows() == 0
        collector = StateCollector(a.engine, tmp_path, version="test", retention=lambda: service)
        metrics = {m.name: m.samples[0].value for m in collector.collect() if m.samples}
        assert metrics["latticed_retention_producers_expired"] == 1


def test_the_idle_time_is_configurable_within_range(tmp_path: Path) -> None:
    config = DaemonConfig(data_dir=tmp_path, socket_path=tmp_path / "s", producer_expiry_s=3600)
    assert config.producer_expiry_s == 3600
    assert DaemonConfig(data_dir=tmp_path, socket_path=tmp_path / "s").producer_expiry_s == DEFAULT_IDLE_S
    with pytest.raises(MalformedError, match="producer_expiry_s"):
        DaemonConfig(data_dir=tmp_path, socket_path=tmp_path / "s", producer_expiry_s=0)
