"""review23: a queue found corrupt can be dropped (the engine's DropQueue2; `latticectl queue repair`):
its rows go, doctor no longer names it, and its owner's delta then replicates it again whole. Before,
the drop job refused it (it loaded the value first): restoring the whole data directory was the only
way out."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from test_corrupt_queue import ALICE, BOB, NOW, _tamper

from latticed.crdt.records import make_record
from latticed.storage.corruption import CorruptQueueError
from latticed.storage.engine import Engine
from latticed.storage.store import db_path


async def test_a_corrupt_queue_is_dropped_and_replicated_again(tmp_path: Path) -> None:
    owner_dir, replica_dir = tmp_path / "alice", tmp_path / "bob"
    owner_dir.mkdir()
    replica_dir.mkdir()
    async with Engine.open(owner_dir, ALICE) as alice:
        x = await alice.create_queue("x", {"team": "x"}, core=2)
        await alice.append(x, [make_record(b"v%d" % i, timestamp=NOW + i) for i in range(3)])
        whole = await alice.core2.delta_for(x, None)
    async with Engine.open(replica_dir, BOB) as bob:
        await bob.core2.merge(whole)
    _tamper(replica_dir, "x", {"team": "evil"})
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
