"""``dlq list``/``dlq show`` on a daemon that holds a replica of another daemon's group: reads, answered
from its copies of the group log and the DLQ (no owner needed), as ``group stats`` is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from latticed.api.server import group_handlers
from latticed.api.server.context import Context
from latticed.api.server.op_table import build_op_table
from latticed.crdt.head import KIND_GROUP, KIND_QUEUE
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import NotFoundError, NotOwnerError
from latticed.groups.service import GroupService
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer
from latticed.storage.wiring import ChangeFanout

OWNER = Identity.from_seed(b"o" * 32)
REPLICA = Identity.from_seed(b"r" * 32)


@asynccontextmanager
async def daemon(path: Path, identity: Identity) -> AsyncIterator[tuple[Engine, GroupService, Context]]:
    changes = ChangeFanout()
    path.mkdir()
    async with Engine.open(path, identity, changes=changes) as engine, trio.open_nursery() as nursery:
        groups: GroupService = await nursery.start(GroupService(engine, changes, Sealer(engine)).run)
        yield (
            engine,
            groups,
            Context(
                engine,
                path,
                path / "sock",
                1 << 20,
                sealer=groups.sealer,
                ops=build_op_table(),
                groups=groups,
            ),
        )
        nursery.cancel_scope.cancel()


async def replicate(source: Engine, target: Engine, name: str, kind: int = KIND_QUEUE) -> None:
    q = target.find(OWNER.public_key, name, kind)
    since = None if q is None else target.state(q).summary()
    await target.merge_delta(await source.delta_for(OWNER.public_key, name, since, kind=kind))


async def test_dlq_list_and_show_read_a_replica_of_another_daemons_group(tmp_path: Path) -> None:
    async with (
        daemon(tmp_path / "owner", OWNER) as (owner, groups, _),
        daemon(tmp_path / "replica", REPLICA) as (replica, _, ctx),
    ):
        jobs = await owner.create_queue("jobs")
        await owner.append(jobs, [Record(b"r%d" % i) for i in range(3)])
        rt = await groups.create("mailer", ["jobs"], max_attempts=1, backoff_base_s=0)
        for _ in range(3):  # every record fails once: three dead letters
            lease = await groups.dequeue(rt, "c1", None, None)
            assert lease is not None
            await groups.nack(rt, lease.token, None, "smtp down")
        assert len(groups.dead_letters(rt, None)) == 3
        await groups.redrive(rt, [groups.dead_letters(rt, None)[0].dlq_offset])  # no longer parked
        for name, kind in (("jobs", KIND_QUEUE), ("mailer", KIND_GROUP), ("mailer.dlq", KIND_QUEUE)):
            await replicate(owner, replica, name, kind)

        group = f"{OWNER.public_key.hex()}/mailer"
        reply = await group_handlers.dlq_list(ctx, {"group": group})
        assert reply["dlq"] == f"{group}.dlq" and "replica" in reply["stale"]
        letters = reply["dead_letters"]
        assert [(d["offset"], d["value"], d["reason"]) for d in letters] == [
            (1, b"r1", "nack"),
            (2, b"r2", "nack"),
        ]
        limited = await group_handlers.dlq_list(ctx, {"group": group, "limit": 1})
        assert [d["offset"] for d in limited["dead_letters"]] == [1]
        shown = await group_handlers.dlq_show(ctx, {"group": group, "offset": letters[1]["dlq_offset"]})
        assert shown["dead_letter"] == letters[1]
        with pytest.raises(NotFoundError, match="no parked dead letter"):  # the redriven one
            await group_handlers.dlq_show(ctx, {"group": group, "offset": 0})
        with pytest.raises(NotFoundError, match="no parked dead letter"):
            await group_handlers.dlq_show(ctx, {"group": group, "offset": 99})
        # writes stay the owner's
        with pytest.raises(NotOwnerError):
            await group_handlers.dlq_purge(ctx, {"group": group})


async def test_dlq_list_on_a_replica_without_the_dlq_says_what_is_missing(tmp_path: Path) -> None:
    async with (
        daemon(tmp_path / "owner", OWNER) as (owner, groups, _),
        daemon(tmp_path / "replica", REPLICA) as (replica, _, ctx),
    ):
        await owner.create_queue("jobs")
        await groups.create("mailer", ["jobs"])
        await replicate(owner, replica, "mailer", KIND_GROUP)
        group = f"{OWNER.public_key.hex()}/mailer"
        with pytest.raises(NotFoundError, match=r"no replica of .*mailer\.dlq"):
            await group_handlers.dlq_list(ctx, {"group": group})
        with pytest.raises(NotFoundError, match="no group"):  # a group it holds nothing of
            await group_handlers.dlq_list(ctx, {"group": f"{OWNER.public_key.hex()}/other"})
