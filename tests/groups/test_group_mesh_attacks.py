"""A peer holding the network key attacks a group it may consume, speaking the real lease-forwarding
protocol over a link to a real owner (engine, group service, lease server): it cannot settle other
consumers' work (ack, nack, extend, claim, ``ack_up_to``), purge dead letters, make retention with
``keep_unsettled`` cut what nobody processed, or lock local consumers out with waiting calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.meshlinks import connect, start

from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import CapacityError, LeaseError, NotAllowedError
from latticed.groups.lease_server import RemoteLeaseServer
from latticed.groups.service import GroupService
from latticed.groups.waiting import MAX_WAITING_PER_PEER
from latticed.host.retention_policy import meta_updates
from latticed.net.leasing import LeaseLinks
from latticed.services.retention_service import RetentionService
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer
from latticed.storage.wiring import ChangeFanout

OWNER = Identity.from_seed(b"o" * 32)
HONEST, HOSTILE = b"\x05" * 32, b"\x66" * 32


@dataclass
class Mesh:
    engine: Engine
    groups: GroupService
    q: int
    honest: LeaseLinks
    hostile: LeaseLinks

    async def call(self, links: LeaseLinks, op: str, **body: Any) -> dict[str, Any]:
        return await links.call(OWNER.public_key, op, {"group": "g", **body}, timeout=30, connect_within=0)

    async def take(self, links: LeaseLinks, n: int, consumer: str = "pid1.c1") -> list[dict[str, Any]]:
        answer = await self.call(links, "take", consumer=consumer, n=n)
        leases: list[dict[str, Any]] = answer["leases"]
        return leases

    @property
    def jobs(self) -> str:
        return f"{OWNER.public_key.hex()}/jobs"


@asynccontextmanager
async def mesh(
    tmp_path: Path, records: int, meta: dict[str, str] | None = None, per_group: int | None = None
) -> AsyncIterator[Mesh]:
    changes = ChangeFanout()
    async with Engine.open(tmp_path, OWNER, changes=changes) as engine, trio.open_nursery() as nursery:
        groups: GroupService = await nursery.start(GroupService(engine, changes, Sealer(engine)).run)
        q = await engine.create_queue("jobs", meta or {})
        if records:
            await engine.append(q, [Record(b"r%d" % i) for i in range(records)])
        server = RemoteLeaseServer(groups)
        if per_group is not None:
            server.waiting.per_group = per_group
        owner = await start(nursery, server)
        honest, hostile = await start(nursery), await start(nursery)
        connect(nursery, owner, OWNER.public_key, honest, HONEST)
        connect(nursery, owner, OWNER.public_key, hostile, HOSTILE)
        yield Mesh(engine, groups, q, honest, hostile)
        nursery.cancel_scope.cancel()


async def test_a_key_holder_settles_nothing_it_was_not_granted(tmp_path: Path) -> None:
    async with mesh(tmp_path, records=8) as m:
        rt = await m.groups.create("g", ["jobs"], max_attempts=1)
        theirs = await m.take(m.honest, 2)
        local = await m.groups.dequeue(rt, "pid9.c1", None, None)
        assert local is not None
        dead = await m.groups.dequeue(rt, "pid9.c2", None, None)
        assert dead is not None
        await m.groups.nack(rt, dead.token, None, "bad")  # max_attempts 1: a dead letter
        assert len(m.groups.dead_letters(rt, None)) == 1
        tokens = [t["lease"] for t in theirs] + [local.token]

        refused = await m.call(m.hostile, "ack", leases=tokens)
        assert [r["error"]["code"] for r in refused["results"]] == ["lease"] * 3
        for op, body in (("nack", {}), ("extend", {"visibility": 600})):
            for token in tokens:
                with pytest.raises(LeaseError, match="not granted"):
                    await m.call(m.hostile, op, lease=token, **body)
        with pytest.raises(NotAllowedError, match="not leased to a worker of the calling daemon"):
            await m.call(m.hostile, "ack_up_to", queue=m.jobs, offset=8)
        with pytest.raises(NotAllowedError, match="purges its dead letters"):
            await m.call(m.hostile, "ack_up_to", queue=f"{OWNER.public_key.hex()}/g.dlq", offset=1)
        claimed = await m.call(m.hostile, "claim", consumer="pid1.c1", min_idle=0, count=10)
        assert claimed["leases"] == []

        stats = rt.dispatcher.stats(m.groups.now())
        assert (stats.done, stats.leased, stats.dead) == (0, 3, 1)
        assert len(m.groups.dead_letters(rt, None)) == 1
        assert all(rt.dispatcher.holder(t) is not None for t in tokens)  # nobody's lease went stale
        assert m.groups.unsettled_floor(m.jobs) == 0
        acked = await m.call(m.honest, "ack", leases=[t["lease"] for t in theirs])
        assert all(r["ok"] for r in acked["results"])
        await m.groups.ack(rt, local.token)


async def test_a_peer_acks_up_to_over_its_own_leases_only(tmp_path: Path) -> None:
    async with mesh(tmp_path, records=6) as m:
        rt = await m.groups.create("g", ["jobs"])
        mine = await m.take(m.hostile, 3)
        assert [t["offset"] for t in mine] == [0, 1, 2]
        with pytest.raises(NotAllowedError):
            await m.call(m.hostile, "ack_up_to", queue=m.jobs, offset=4)  # 3 is not its own
        answer = await m.call(m.hostile, "ack_up_to", queue=m.jobs, offset=3)
        assert answer == {"acked": 3}
        assert rt.dispatcher.stats(m.groups.now()).done == 3


async def test_keep_unsettled_retention_keeps_what_a_peer_tried_to_settle(tmp_path: Path) -> None:
    meta = {k: v for k, v in meta_updates(max_records=10, keep_unsettled=True).items() if v is not None}
    async with mesh(tmp_path, records=550, meta=meta) as m:
        await m.groups.create("g", ["jobs"])
        await m.groups.dequeue(m.groups.runtime("g"), "pid1.c1", None, None)  # the group has taken all in
        with pytest.raises(NotAllowedError):
            await m.call(m.hostile, "ack_up_to", queue=m.jobs, offset=550)
        retention = RetentionService(m.engine, unsettled_floor=m.groups.unsettled_floor)
        await retention.enforce(m.q)
        state = m.engine.state(m.q)
        assert (state.start, state.held_end) == (0, 550)  # nothing unprocessed was cut


async def test_waiting_calls_of_a_peer_take_no_consumer_slot_and_are_bounded(tmp_path: Path) -> None:
    async with mesh(tmp_path, records=0) as m, trio.open_nursery() as nursery:
        rt = await m.groups.create("g", ["jobs"], max_consumers=2)
        refusals: list[BaseException] = []

        async def wait_for_work(links: LeaseLinks, consumer: str) -> None:
            try:
                await m.call(links, "dequeue", consumer=consumer, wait=3600)
            except CapacityError as exc:
                refusals.append(exc)

        for i in range(MAX_WAITING_PER_PEER):
            nursery.start_soon(wait_for_work, m.hostile, f"pid{i}.c1")
        await trio.testing.wait_all_tasks_blocked()
        assert refusals == [] and rt.dispatcher.consumers() == []  # waiting, holding no slot
        # local consumers are not locked out (exit 11) by the peer's waiting calls
        assert await m.groups.dequeue(rt, "pid100.c1", None, None) is None
        assert await m.groups.dequeue(rt, "pid100.c2", None, None) is None
        m.groups.detach(rt, "pid100.c1")
        m.groups.detach(rt, "pid100.c2")
        # one call more than the bound is refused at once; another peer may still wait
        await wait_for_work(m.hostile, "one.more")
        assert len(refusals) == 1 and "calls waiting" in str(refusals[0])
        nursery.start_soon(wait_for_work, m.honest, "pid1.c1")
        await trio.testing.wait_all_tasks_blocked()
        assert len(refusals) == 1
        nursery.cancel_scope.cancel()


async def test_all_peers_together_are_bounded_per_group(tmp_path: Path) -> None:
    async with mesh(tmp_path, records=0, per_group=3) as m, trio.open_nursery() as nursery:
        await m.groups.create("g", ["jobs"])

        async def wait_for_work(links: LeaseLinks, consumer: str) -> None:
            await m.call(links, "dequeue", consumer=consumer, wait=3600)

        for links, consumer in ((m.hostile, "a"), (m.hostile, "b"), (m.honest, "c")):
            nursery.start_soon(wait_for_work, links, consumer)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(CapacityError, match="remote calls waiting"):
            await m.call(m.honest, "dequeue", consumer="d", wait=3600)
        nursery.cancel_scope.cancel()
