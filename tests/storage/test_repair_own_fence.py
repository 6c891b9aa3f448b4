"""``queue repair --drop`` of our own queue must not let this daemon sign a second history of it: until a
peer's copy as long as the one dropped has merged back (or the operator says no peer holds it, with
``--release``), creating it again or writing to it is refused, across a restart too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.corrupt_daemon import ALICE, BOB, NOW, own_queue_with_a_peer_copy, repair_context

from latticed.api.server import repair_handlers
from latticed.crdt.records import make_record
from latticed.errors import BehindPeersError
from latticed.storage.dropped_own import DroppedOwn
from latticed.storage.engine import Engine


async def _repair(engine: Engine, path: Path, queue: str, **args: Any) -> dict[str, Any]:
    return await repair_handlers.queue_repair(repair_context(engine, path), {"queue": queue, **args})


async def test_our_dropped_queue_takes_no_write_until_a_peer_copy_is_back_across_a_restart(
    tmp_path: Path,
) -> None:
    mine, peer = await own_queue_with_a_peer_copy(tmp_path)
    async with Engine.open(mine, BOB) as bob:
        assert (await _repair(bob, mine, "own", drop=True))["repaired"] is True
        with pytest.raises(BehindPeersError, match="queue repair own --release"):
            await bob.create_queue("own", core=2)
        with pytest.raises(BehindPeersError, match="dropped"):
            await bob.create_queue("own")  # core 1: the same address
    async with Engine.open(mine, BOB) as bob, Engine.open(peer, ALICE) as alice:
        with pytest.raises(BehindPeersError, match="dropped"):
            await bob.create_queue("own", core=2)
        held = alice.core2.lookup(BOB.public_key, "own")
        assert held is not None
        back = (await bob.core2.merge(await alice.core2.delta_for(held, None))).q
        assert await bob.append(back, [make_record(b"o2", timestamp=NOW + 2)]) == 2
    async with Engine.open(mine, BOB) as bob:
        q = bob.core2.lookup(BOB.public_key, "own")
        assert q is not None
        assert await bob.append(q, [make_record(b"o3", timestamp=NOW + 3)]) == 3


async def test_release_says_no_peer_holds_it_and_lets_the_owner_write_again(tmp_path: Path) -> None:
    mine, _peer = await own_queue_with_a_peer_copy(tmp_path)
    async with Engine.open(mine, BOB) as bob:
        assert (await _repair(bob, mine, "own", release=True))["repaired"] is False  # nothing dropped yet
        await _repair(bob, mine, "own", drop=True)
    async with Engine.open(mine, BOB) as bob:
        done = await _repair(bob, mine, "own", release=True)
        assert done["repaired"] is True and "2 record" in done["message"]
        q = await bob.create_queue("own", core=2)
        assert await bob.append(q, [make_record(b"n", timestamp=NOW)]) == 0


def test_a_shorter_copy_back_keeps_the_queue_refused(tmp_path: Path) -> None:
    dropped = DroppedOwn.load(tmp_path)
    dropped.remember("own", 0, 2)
    assert dropped.reason("own", 0, None) is not None
    assert dropped.reason("own", 0, 1) is not None
    assert dropped.reason("own", 0, 2) is None
    assert dropped.reason("other", 0, None) is None
    assert DroppedOwn.load(tmp_path).reason("own", 0, 1) is not None  # durable
    assert DroppedOwn.load(tmp_path).forget("own", 0) == 2
    assert DroppedOwn.load(tmp_path).reason("own", 0, None) is None
