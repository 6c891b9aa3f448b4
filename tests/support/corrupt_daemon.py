"""Stores holding core-2 queues found corrupt at load, for the ``queue repair`` and ``doctor`` tests.

:func:`make_corrupt`: a daemon's data directory where Alice's ``x`` (3 records, held as a replica) and
the daemon's own ``own`` (2 records) have metadata changed behind its back, its own ``good`` (1 record)
not. :func:`replica_store`: the same in a store Bob's engine opens (no daemon).
:func:`own_queue_with_a_peer_copy`: Bob's own ``own`` tampered, Alice holding a good copy.
:func:`repair_context`: the API context ``queue_repair`` runs in, replication stood in for.
:func:`written`, :func:`fill`, :func:`copied`: what they are made of (a queue written in a new store, a
queue filled in an open one, a queue's delta copied into a new store), for stores of the same kind."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from latticed.api.server.api_ports import MembershipView
from latticed.api.server.context import Context
from latticed.crdt.queue2 import Delta
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.storage.codec import pack
from latticed.storage.engine import Engine
from latticed.storage.store import db_path
from support.inprocess import daemon_at, engine_context

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000
#: The values of Alice's ``x`` and of Bob's own ``own``.
X_VALUES, OWN_VALUES = [b"v0", b"v1", b"v2"], [b"o0", b"o1"]


def tamper(data_dir: Path, name: str) -> None:
    """Write other metadata into core-2 queue ``name``'s row (of any owner), as a disk or a hand would."""
    conn = sqlite3.connect(db_path(data_dir))
    try:
        conn.execute(
            "UPDATE queue2 SET meta = ? WHERE q = (SELECT q FROM queues WHERE name = ?)",
            (pack([["team", "evil"]]), name),
        )
        conn.commit()
    finally:
        conn.close()


async def written(
    directory: Path,
    identity: Identity,
    name: str,
    values: Sequence[bytes],
    meta: Mapping[str, str] | None = None,
) -> Delta:
    """``identity``'s core-2 queue ``name`` holding ``values``, written in a new store at ``directory``:
    the delta of the whole queue, to merge into another store."""
    directory.mkdir()
    async with Engine.open(directory, identity) as engine:
        return await engine.core2.delta_for(await fill(engine, name, values, meta), None)


async def fill(
    engine: Engine, name: str, values: Sequence[bytes], meta: Mapping[str, str] | None = None
) -> int:
    """A new core-2 queue ``name`` of ``engine``'s owner holding ``values``, stamped from ``NOW`` on."""
    q = await engine.create_queue(name, meta, core=2)
    await engine.append(q, [make_record(value, timestamp=NOW + i) for i, value in enumerate(values)])
    return q


async def alice_x(directory: Path) -> tuple[bytes, Delta]:
    """Alice's queue ``x`` with 3 records, written in her own store at ``directory``: her key and the
    delta of the whole queue."""
    return ALICE.public_key, await written(directory, ALICE, "x", X_VALUES, {"team": "x"})


def make_corrupt(root: Path) -> str:
    """Fill ``root`` (a :func:`daemon_at` root) as the module docstring says; returns ``x``'s address."""
    import trio  # noqa: PLC0415 - only to build Alice's store

    owner, whole = trio.run(alice_x, root / "alice")
    with daemon_at(root) as d, d.client() as client:
        engine = d.handle.engine

        async def merge() -> None:
            await engine.core2.merge(whole)

        d.call(merge)
        for name, values in (("own", OWN_VALUES), ("good", [b"g0"])):
            client.queue_create(name, {"team": name}, core=2)
            for value in values:
                client.offer(name, value)
    tamper(root / "data", "x")
    tamper(root / "data", "own")
    return f"{owner.hex()}/x"


async def replica_store(tmp_path: Path) -> Path:
    """Bob's store: Alice's ``x`` (3 records) and his own ``own`` (2) tampered, his ``good`` not."""
    _, whole = await alice_x(tmp_path / "alice")
    replica_dir = tmp_path / "bob"
    replica_dir.mkdir()
    async with Engine.open(replica_dir, BOB) as bob:
        await bob.core2.merge(whole)
        await fill(bob, "own", OWN_VALUES, {"team": "b"})
        await fill(bob, "good", [b"g"])
    tamper(replica_dir, "x")
    tamper(replica_dir, "own")
    return replica_dir


async def own_queue_with_a_peer_copy(tmp_path: Path) -> tuple[Path, Path]:
    """Bob's store with his own ``own`` (2 records) tampered, and Alice's holding a good copy of it."""
    mine = tmp_path / "bob"
    whole = await written(mine, BOB, "own", OWN_VALUES, {"team": "b"})
    peer = await copied(tmp_path / "alice", ALICE, whole)
    tamper(mine, "own")
    return mine, peer


async def copied(directory: Path, identity: Identity, whole: Delta) -> Path:
    """A new store of ``identity``'s at ``directory`` holding a copy of ``whole`` (a queue's delta)."""
    directory.mkdir()
    async with Engine.open(directory, identity) as engine:
        await engine.core2.merge(whole)
    return directory


class _Membership:
    def __init__(self, service: Any) -> None:
        self.service = service


def repair_context(engine: Engine, path: Path, replication: Any = None) -> Context:
    """An API context over ``engine``; ``replication`` (None: a daemon without it) stands in for the
    service ``queue_repair`` restarts links through."""
    return engine_context(engine, path, cast(MembershipView, _Membership(replication)))
