"""The engine's core-2 view on the event loop: a name resolves to a core-2 queue, the engine's writes and
reads reach it, each commit publishes a Change2 (waking waiters, heard by ``on_change``), the owner fence
holds its writes back as it holds core 1's, and the core-1-only calls refuse it by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from latticed.crdt.queue import QueueState
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import BehindPeersError, NotFoundError, OtherCoreError
from latticed.storage.engine import Engine
from latticed.storage.wiring import OwnerFence

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


async def test_a_core2_queue_through_the_engines_core_aware_calls(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        heard: list[tuple[int, QueueState2 | None]] = []
        engine.core2.on_change = lambda q, state: heard.append((q, state))
        q = await engine.create_queue("q", {"a": "b"}, core=2)
        assert engine.resolve("q") == q and engine.core2.holds(q)
        assert engine.address(q) == f"{ALICE.public_key.hex()}/q" and engine.owned(q)
        assert engine.created_ms(q) > 0
        with pytest.raises(OtherCoreError, match="fork core 2"):
            engine.state(q)
        woken = engine.core2.changed(q)
        job = engine.start_append(q, [make_record(b"v%d" % i, timestamp=NOW) for i in range(3)])
        assert await engine.outcome(job) == 0
        assert woken.is_set()
        assert heard[-1][0] == q and heard[-1][1] is not None and heard[-1][1].held == (0, 3)
        await engine.set_meta(q, {"a": None})
        assert (await engine.core2.value(q)).meta == ()
        assert (await engine.read(q, 0, 10, 10, 1 << 20)).values == [b"v0", b"v1", b"v2"]
        assert await engine.row(q, 5) is None
        await engine.truncate(q, 1)
        assert await engine.bounds(q) == (1, 3)
        assert await engine.verify(q) == 2
        assert engine.queues() == [] and engine.core2.queues() == [q]
        with pytest.raises(NotFoundError):
            engine.resolve("nothing")


async def test_the_owner_fence_holds_core2_writes_back(tmp_path: Path) -> None:
    fence = OwnerFence()
    asked: list[tuple[str, int]] = []

    def behind(state: QueueState) -> str | None:
        asked.append((state.name, state.held_end))
        return "a peer holds more of it"

    async with Engine.open(tmp_path, ALICE, fence=fence) as engine:
        q = await engine.create_queue("q", core=2)
        await engine.outcome(engine.start_append(q, [make_record(b"x", timestamp=NOW)]))
        with fence.held_by(behind):
            with pytest.raises(BehindPeersError, match="a peer holds more of it"):
                engine.start_append(q, [make_record(b"y", timestamp=NOW)])
            with pytest.raises(BehindPeersError):
                await engine.create_queue("other", core=2)
            with pytest.raises(BehindPeersError):
                await engine.core2.recover_queue(q)
        assert asked == [("q", 1), ("other", 0), ("q", 1)]
        assert await engine.outcome(engine.start_append(q, [make_record(b"y", timestamp=NOW)])) == 1
