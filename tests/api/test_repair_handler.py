"""``queue_repair``'s handler on a real engine with a recording replication service: links restart only
when a queue was dropped (never on a refusal), and without replication the reply says the queue comes
back when a peer that holds it connects."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from support.corrupt_daemon import ALICE, BOB, repair_context, replica_store

from latticed.api.server import repair_handlers
from latticed.api.server.context import Context
from latticed.storage.engine import Engine


class _Replication:
    def __init__(self) -> None:
        self.restarts: list[str] = []

    def restart_core2_links(self, reason: str) -> int:
        self.restarts.append(reason)
        return 2


#: Alice's ``x`` as ``queue_repair`` is asked for it: a replica's address.
X = f"{ALICE.public_key.hex()}/x"


async def _repair(ctx: Context, queue: str, **args: Any) -> dict[str, Any]:
    return await repair_handlers.queue_repair(ctx, {"queue": queue, **args})


@contextlib.asynccontextmanager
async def _bobs(tmp_path: Path, replication: _Replication | None) -> AsyncIterator[tuple[Engine, Context]]:
    """Bob's engine over a :func:`replica_store` and the API context ``queue_repair`` runs in there."""
    path = await replica_store(tmp_path)
    async with Engine.open(path, BOB) as engine:
        yield engine, repair_context(engine, path, replication)


async def test_links_restart_only_after_a_drop(tmp_path: Path) -> None:
    replication = _Replication()
    async with _bobs(tmp_path, replication) as (engine, ctx):
        assert ctx.ops.handlers["queue_repair"] is repair_handlers.queue_repair
        assert (await _repair(ctx, "own"))["repaired"] is False
        assert (await _repair(ctx, "good"))["repaired"] is False
        assert replication.restarts == []
        done = await _repair(ctx, X)
        assert done["repaired"] is True and done["links_restarted"] == 2
        assert "its 2 peer link(s) that carry core-2 queues restarted" in done["message"]
        assert replication.restarts == [f"queue repair {X}"]
        assert engine.core2.lookup(ALICE.public_key, "x") is None


async def test_without_replication_the_queue_comes_back_when_a_peer_connects(tmp_path: Path) -> None:
    async with _bobs(tmp_path, None) as (_engine, ctx):
        done = await _repair(ctx, "own", drop=True)
    assert done["repaired"] is True and done["owned"] is True and done["links_restarted"] == 0
    assert done["message"].endswith("it is fetched again when a peer that holds it connects")


async def test_two_repairs_at_once_drop_once_and_restart_links_once(tmp_path: Path) -> None:
    replication = _Replication()
    async with _bobs(tmp_path, replication) as (_engine, ctx):
        replies: list[dict[str, Any]] = []

        async def repair() -> None:
            replies.append(await _repair(ctx, X))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(repair)
            nursery.start_soon(repair)
    assert sorted(r["repaired"] for r in replies) == [False, True]
    (refused,) = [r for r in replies if not r["repaired"]]
    assert "not corrupt" in refused["message"] and refused["owned"] is False
    assert replication.restarts == [f"queue repair {X}"]
