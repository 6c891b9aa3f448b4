"""Stores holding core-2 queues found corrupt at load, for the ``queue repair`` and ``doctor`` tests.

:func:`make_corrupt`: a daemon's data directory where Alice's ``x`` (3 records, held as a replica) and
the daemon's own ``own`` (2 records) have metadata changed behind its back, its own ``good`` (1 record)
not. :func:`replica_store`: the same in a store Bob's engine opens (no daemon).
:func:`own_queue_with_a_peer_copy`: Bob's own ``own`` tampered, Alice holding a good copy.
:func:`repair_context`: the API context ``queue_repair`` runs in, replication stood in for."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, cast

from latticed.api.server.api_ports import MembershipView
from latticed.api.server.context import Context
from latticed.api.server.op_table import build_op_table
from latticed.crdt.queue2 import Delta
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.storage.codec import pack
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer
from latticed.storage.store import db_path
from support.inprocess import daemon_at

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


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


async def alice_x(directory: Path) -> tuple[bytes, Delta]:
    """Alice's queue ``x`` with 3 records, written in her own store at ``directory``: her key and the
    delta of the whole queue."""
    directory.mkdir()
    async with Engine.open(directory, ALICE) as alice:
        x = await alice.create_queue("x", {"team": "x"}, core=2)
        await alice.append(x, [make_record(b"v%d" % i, timestamp=NOW + i) for i in range(3)])
        return ALICE.public_key, await alice.core2.delta_for(x, None)


def make_corrupt(root: Path) -> str:
    """Fill ``root`` (a :func:`daemon_at` root) as the module docstring says; returns ``x``'s address."""
    import trio  # noqa: PLC0415 - only to build Alice's store

    owner, whole = trio.run(alice_x, root / "alice")
    with daemon_at(root) as d, d.client() as client:
        engine = d.handle.engine

        async def merge() -> None:
            await engine.core2.merge(whole)

        d.call(merge)
        for name, values in (("own", [b"o0", b"o1"]), ("good", [b"g0"])):
            client.queue_create(name, {"team": name}, core=2)
            for value in values:
                client.offer(name, value)
    tamper(root / "data", "x")
    tamper(root / "data", "own")
    return f"{owner.hex()}/x"


async def replica_store(tmp_path: Path) -> Path:
    """Bob's store: Alice's ``x`` (3 records) and his own ``own`` (2) tampered, his ``good`` not."""
    owner_dir, replica_dir = tmp_path / "alice", tmp_path / "bob"
    owner_dir.mkdir()
    replica_dir.mkdir()
    async with Engine.open(owner_dir, ALICE) as alice:
        x = await alice.create_queue("x", {"team": "x"}, core=2)
        await alice.append(x, [make_record(b"v%d" % i, timestamp=NOW + i) for i in range(3)])
        whole = await alice.core2.delta_for(x, None)
    async with Engine.open(replica_dir, BOB) as bob:
        await bob.core2.merge(whole)
        own = await bob.create_queue("own", {"team": "b"}, core=2)
        await bob.append(own, [make_record(b"o%d" % i, timestamp=NOW + i) for i in range(2)])
        good = await bob.create_queue("good", core=2)
        await bob.append(good, [make_record(b"g", timestamp=NOW)])
    tamper(replica_dir, "x")
    tamper(replica_dir, "own")
    return replica_dir


async def own_queue_with_a_peer_copy(tmp_path: Path) -> tuple[Path, Path]:
    """Bob's store with his own ``own`` (2 records) tampered, and Alice's holding a good copy of it."""
    mine, peer = tmp_path / "bob", tmp_path / "alice"
    mine.mkdir()
    peer.mkdir()
    async with Engine.open(mine, BOB) as bob:
        own = await bob.create_queue("own", {"team": "b"}, core=2)
        await bob.append(own, [make_record(b"o%d" % i, timestamp=NOW + i) for i in range(2)])
        whole = await bob.core2.delta_for(own, None)
    async with Engine.open(peer, ALICE) as alice:
        await alice.core2.merge(whole)
    tamper(mine, "own")
    return mine, peer


class _Membership:
    def __init__(self, service: Any) -> None:
        self.service = service


def repair_context(engine: Engine, path: Path, replication: Any = None) -> Context:
    """An API context over ``engine``; ``replication`` (None: a daemon without it) stands in for the
    service ``queue_repair`` restarts links through."""
    return Context(
        engine,
        path,
        path / "sock",
        1 << 20,
        sealer=Sealer(engine),
        ops=build_op_table(),
        membership=cast(MembershipView, _Membership(replication)),
    )
