"""review23: fix23's load check (``storage/corruption.py``) never finds a healthy queue corrupt: every
owner path that changes what a core-2 queue's start head signs (metadata set and deleted, truncation, a
fork frozen and recovered into a new epoch, a core-1 queue converted) and a replica that merged each
step, reloaded from their stores."""

from __future__ import annotations

from pathlib import Path

from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.net.core2_engine_host import ConvertMerge2
from latticed.net.core2_recent import RecentRows
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def _records(tag: str, n: int) -> list:  # type: ignore[type-arg]
    return [make_record(f"{tag}{i}".encode(), timestamp=NOW + i) for i in range(n)]


async def _sync(src: Engine, dst: Engine, q: int) -> None:
    await dst.core2.merge(await src.core2.delta_for(q, None))


async def test_owner_and_replica_reload_every_changed_queue_as_healthy(tmp_path: Path) -> None:
    dirs = {n: tmp_path / n for n in ("alice", "bob", "copy")}
    for d in dirs.values():
        d.mkdir()
    async with Engine.open(dirs["alice"], ALICE) as a, Engine.open(dirs["bob"], BOB) as b:
        x = await a.create_queue("x", {"team": "a", "z": "1"}, core=2)
        await a.core2.commit(x, _records("r", 3))
        await _sync(a, b, x)
        await a.core2.commit(x, [], {"team": "b", "new": "2"})  # metadata only
        await _sync(a, b, x)
        await a.core2.commit(x, _records("s", 2), {"z": None})  # records and a deletion
        await a.core2.truncate(x, 2)
        await _sync(a, b, x)
        async with Engine.open(dirs["copy"], ALICE) as c:  # a copied store writes its own: a fork
            cx = (await c.core2.merge(await a.core2.delta_for(x, None))).q
            await c.core2.commit(cx, _records("copy", 2), {"copy": "yes"})
            forked = await c.core2.delta_for(cx, None)
        await a.core2.commit(x, _records("own", 2))
        await _sync(a, b, x)
        await a.core2.merge(forked)
        assert (await a.core2.value(x)).chains.forked
        await _sync(a, b, x)
        assert await a.core2.recover(x) == 1
        await a.core2.commit(x, _records("after", 1), {"epoch": "1"})
        await _sync(a, b, x)
        y = await a.create_queue("y", {"k": "v"})  # core 1, converted
        await a.append(y, _records("y", 2))
        await b.merge_delta(await a.delta_for(ALICE.public_key, "y", None))  # bob holds it on core 1
        await a.core2.upgrade_core1(y, a.state(y))
        await a.core2.commit(y, [], {"k": "w"})
        d = await a.core2.delta_for(y, None)
        await b.bridge.run(ConvertMerge2(d, None, RecentRows()))  # bob converts his copy, as a peer's push
        assert b.find(ALICE.public_key, "y") is None
        values = {q: await a.core2.value(q) for q in (x, y)}
        expected = {q: (v.meta, v.chains.epoch, v.held) for q, v in values.items()}
        assert expected[x][1] == 1  # recovered: a new epoch
    for path, who in ((dirs["alice"], ALICE), (dirs["bob"], BOB)):
        async with Engine.open(path, who) as e:
            await e.core2.load_all()
            assert e.core2.corrupt_entries() == []
            for name, q in (("x", x), ("y", y)):
                found = e.core2.lookup(ALICE.public_key, name)
                assert found is not None
                value = await e.core2.value(found)
                assert (value.meta, value.chains.epoch, value.held) == expected[q]
