"""``queue list`` while a core-1 queue converts to core 2: the core-1 numbers it took before the
conversion name a queue whose core-1 state is gone (``ReplicaView.state`` raises OtherCoreError). The
listing leaves it out of the core-1 part and lists it once, from the core-2 part; before, the whole
listing failed (``other_core``) for a conversion that landed at one of its checkpoints."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from latticed.api.messages import pack
from latticed.api.server import handlers
from latticed.api.server.queue_listing import QueueListing
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import OtherCoreError
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


async def test_a_queue_converted_during_a_listing_is_listed_once_from_core2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        moved = await engine.create_queue("moved", core=1)
        kept = await engine.create_queue("kept", core=1)
        await engine.append(moved, [make_record(b"v", timestamp=NOW)])
        taken = list(engine.queues())  # as the listing took them, before the conversion landed
        assert moved in taken and kept in taken
        await engine.core2.upgrade_core1(moved, engine.state(moved))
        with pytest.raises(OtherCoreError):
            engine.state(moved)
        monkeypatch.setattr(engine, "queues", lambda: taken)
        ctx: Any = SimpleNamespace(
            engine=engine, listing=QueueListing(), sealer=SimpleNamespace(describe=lambda q: None)
        )
        reply = await handlers.queue_list(ctx, {})
    listed = msgpack.unpackb(pack(reply))["queues"]
    assert sorted((e["name"], e["core"]) for e in listed) == [("kept", 1), ("moved", 2)]
