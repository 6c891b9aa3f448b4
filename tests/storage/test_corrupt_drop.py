"""review23: a queue found corrupt can be dropped (the engine's DropQueue2; `latticectl queue repair`):
its rows go, doctor no longer names it, and its owner's delta then replicates it again whole. Before,
the drop job refused it (it loaded the value first): restoring the whole data directory was the only
way out."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support.corrupt_daemon import ALICE, BOB, alice_x, copied, tamper

from latticed.storage.corruption import CorruptQueueError
from latticed.storage.engine import Engine
from latticed.storage.store import db_path


async def test_a_corrupt_queue_is_dropped_and_replicated_again(tmp_path: Path) -> None:
    _, whole = await alice_x(tmp_path / "alice")
    replica_dir = await copied(tmp_path / "bob", BOB, whole)
    tamper(replica_dir, "x")
    async with Engine.open(replica_dir, BOB) as bob:
        q = bob.core2.lookup(ALICE.public_key, "x")
        assert q is not None
        with pytest.raises(CorruptQueueError):
            await bob.core2.value(q)
        assert len(bob.core2.corrupt_entries()) == 1
        await bob.core2.drop(q)
        assert bob.core2.lookup(ALICE.public_key, "x") is None and bob.core2.corrupt_entries() == []
        conn = sqlite3.connect(db_path(replica_dir))
        try:
            for table in ("segments", "queue2", "queues"):
                assert conn.execute(f"SELECT count(*) FROM {table} WHERE q = ?", (q,)).fetchone()[0] == 0
        finally:
            conn.close()
        again = (await bob.core2.merge(whole)).q
        assert (await bob.core2.value(again)).held == (0, 3)
        assert (await bob.row(again, 2)) is not None
    async with Engine.open(replica_dir, BOB) as bob:
        await bob.core2.load_all()
        assert bob.core2.corrupt_entries() == []
        again2 = bob.core2.lookup(ALICE.public_key, "x")
        assert again2 is not None and dict((await bob.core2.value(again2)).meta) == {"team": "x"}
