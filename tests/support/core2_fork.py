"""Fork an in-process daemon's own core-2 queue, as a copied store would: the copy goes on writing its
own records from what the daemon held, the daemon writes others, and the copy's history is merged back
through the daemon's Core2Engine (which freezes the queue at the fork point)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from latticed.crdt.queue2 import Delta
from latticed.crdt.records import make_record
from latticed.storage.core2_engine import Core2Engine
from latticed.storage.engine import Engine
from support.inprocess import InProcessDaemon

NOW = 1_700_000_000_000


def own_delta(daemon: InProcessDaemon, name: str) -> Delta:
    """The whole history the daemon holds of its own core-2 queue ``name``."""
    engine = daemon.handle.engine

    async def take() -> Delta:
        q = engine.core2.lookup(engine.public_key, name)
        assert q is not None
        return await engine.core2.delta_for(q, None)

    result: Delta = daemon.call(take)
    return result


def merge(daemon: InProcessDaemon, d: Delta) -> None:
    """``d`` verified and merged by the daemon, as a peer's delta would be."""
    engine = daemon.handle.engine

    async def run() -> None:
        verified, against = await engine.core2.verify(d)
        await engine.core2.merge(d, verified, against)

    daemon.call(run)


def copy_writes(path: Path, daemon: InProcessDaemon, name: str, count: int) -> Delta:
    """A copy of the daemon's store (its queue ``name`` as held now) that writes ``count`` records of its
    own; returns the copy's whole history of the queue."""
    d = own_delta(daemon, name)
    path.mkdir()

    async def run() -> Delta:
        async with Engine.open(path, daemon.handle.identity) as engine:
            copy = Core2Engine(engine)
            merged = await copy.merge(d)
            records = [make_record(f"copy{i}".encode(), timestamp=NOW + i) for i in range(count)]
            await copy.commit(merged.q, records)
            return await copy.delta_for(merged.q, None)

    result: Delta = trio.run(run)
    return result


def fork(daemon: InProcessDaemon, path: Path, name: str, *, copy: int, own: Callable[[], object]) -> None:
    """Fork ``name`` at its current end: the copy writes ``copy`` records, ``own()`` writes the daemon's
    (through its API), then the copy's history reaches the daemon."""
    copied = copy_writes(path, daemon, name, copy)
    own()
    merge(daemon, copied)


__all__ = ["NOW", "copy_writes", "fork", "merge", "own_delta"]
