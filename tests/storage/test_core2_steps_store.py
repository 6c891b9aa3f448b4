"""Schemas 7 and 8: a replica stores the core-2 head bodies a catch-up's steps rebuilt as those steps
(latticed/storage/core2_bodies.py), a few bytes a version, and since schema 8 the shared leaves of those
bodies too (latticed/storage/core2_leaves.py); it rebuilds them on load to the very value it held; a
truncation, a fork or another epoch rewrites such runs whole while their records are still there; a
changed run is refused on load; schema-6 and schema-7 stores open, migrate and serve the same values."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support.old_stores import queue_rows

from latticed.crdt import queue2, steps_memo, wire
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import LatticedError
from latticed.net.core2_engine_host import MergeSteps2
from latticed.protocol import core2_wire
from latticed.protocol.core2_steps import outgoing
from latticed.storage import core2_bodies, core2_leaves, core2_runs
from latticed.storage.codec import pack, unpack
from latticed.storage.core2_engine import reading_through
from latticed.storage.core2_jobs import Commit2
from latticed.storage.core2_queues import Core2Queues
from latticed.storage.engine import Engine
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

OWNER = Identity.from_seed(b"o" * 32)
REPLICA = Identity.from_seed(b"r" * 32)
NOW = 1_700_000_000_000


def single_offers(count: int) -> QueueState2:
    state = queue2.commit(queue2.empty_state(OWNER.public_key, "q"), OWNER, now_ms=NOW)
    for i in range(count):
        state = queue2.commit(state, OWNER, now_ms=NOW + i, records=[make_record(b"v%d" % i, timestamp=i)])
        if i == 40:
            state = queue2.commit(state, OWNER, now_ms=NOW + i, meta_updates={"m": "1"})
    return state


def on_the_wire(state: QueueState2, since: queue2.Summary | None, chunk: int) -> MergeSteps2:
    out = outgoing(state, since, chunk, 1 << 20)
    raw = wire.pack(core2_wire.delta_to_wire(out.delta, out.steps))
    return MergeSteps2(*core2_wire.delta_from_wire(wire.unpack(raw)))


def value(state: QueueState2) -> tuple[object, ...]:
    return state.chains, state.meta, state.bodies, state.held


def loaded(root: Path) -> QueueState2:
    """The replica's queue as a fresh open of its store reads it."""
    store = Store(db_path(root))
    try:
        queues = Core2Queues()
        queues.open(store)
        (q,) = queues.queues()
        return queues.committed(q)
    finally:
        store.close()


def stored_runs(root: Path, query: str) -> list[tuple[int | None, bytes]]:
    """``(steps_from, run)`` of each row ``query`` selects from the store at ``root``."""
    conn = sqlite3.connect(db_path(root))
    try:
        return [(steps_from, bytes(raw)) for steps_from, raw in conn.execute(query)]
    finally:
        conn.close()


def leaf_runs(root: Path) -> list[tuple[int | None, bytes]]:
    """The stored runs of shared leaves."""
    return stored_runs(root, "SELECT steps_from, leaves FROM leaves2 ORDER BY idx")


def runs(root: Path) -> list[tuple[int | None, bytes]]:
    """The stored runs of bodies."""
    return stored_runs(root, "SELECT steps_from, bodies FROM bodies2 ORDER BY end_off")


async def catch_up(root: Path, *sources: tuple[QueueState2, int]) -> QueueState2:
    """A replica at ``root`` joins each source's value in chunks of that size, as a link sends them."""
    async with Engine.open(root, REPLICA) as engine:
        for owner, chunk in sources:
            while True:
                q = engine.core2.lookup(OWNER.public_key, "q")
                mine = None if q is None else await engine.core2.value(q)
                if mine is not None and mine.chains == owner.chains and mine.held == owner.held:
                    break
                await engine.bridge.run(
                    on_the_wire(owner, None if mine is None else queue2.summary(mine), chunk)
                )
        assert q is not None
        state = await engine.core2.value(q)
        held = await engine.bridge.read(lambda reader: reading_through(state, reader.rows).records())
        assert held == owner.records()
        return state


async def test_a_catch_up_of_single_offers_stores_steps_and_loads_the_same_value(tmp_path: Path) -> None:
    owner = single_offers(700)
    held = await catch_up(tmp_path, (owner, 300))
    assert len(held.bodies) > 600 and value(held)[:2] == value(owner)[:2]
    stored = runs(tmp_path)
    stepped = [raw for steps_from, raw in stored if steps_from is not None]
    assert len(stepped) >= 2  # a run of steps per chunk
    assert sum(map(len, stepped)) < 20 * len(held.bodies)  # not 232 bytes a body
    leaves = leaf_runs(tmp_path)
    assert any(steps_from is not None for steps_from, _ in leaves)
    # the first chunk's 300 bodies' leaves as steps; the log's other ~400 leaves came whole
    assert sum(len(raw) for _, raw in leaves) < 40 * (len(held.chains.shared) - 250)
    assert value(loaded(tmp_path)) == value(held)


@pytest.mark.parametrize("cut", [150, 299, 650])
async def test_a_truncation_rewrites_the_runs_it_cuts_and_loads_the_same_value(
    tmp_path: Path, cut: int
) -> None:
    owner = single_offers(700)
    truncated = queue2.truncate(owner, OWNER, cut, now_ms=NOW + 10_000)
    more = truncated
    for i in range(50):
        more = queue2.commit(
            more, OWNER, now_ms=NOW + 20_000 + i, records=[make_record(b"w%d" % i, timestamp=1000 + i)]
        )
    held = await catch_up(tmp_path, (owner, 300), (truncated, 300), (more, 300))
    assert value(held)[:2] == value(more)[:2] and held.held[0] == cut
    lo = held.held[0]
    assert all(steps_from >= lo for steps_from, _ in runs(tmp_path) if steps_from is not None)
    assert all(steps_from >= lo for steps_from, _ in leaf_runs(tmp_path) if steps_from is not None)
    assert value(loaded(tmp_path)) == value(held)


async def test_a_changed_run_of_steps_is_refused_on_load(tmp_path: Path) -> None:
    await catch_up(tmp_path, (single_offers(100), 4096))
    conn = sqlite3.connect(db_path(tmp_path))
    rowid, raw = conn.execute("SELECT rowid, bodies FROM bodies2 WHERE steps_from IS NOT NULL").fetchone()
    items = unpack(bytes(raw))
    anchor, steps, count, digest = items[-1]
    changed = steps[:-1] + bytes([steps[-1] ^ 1])  # the last version's timestamp step
    conn.execute(
        "UPDATE bodies2 SET bodies = ? WHERE rowid = ?",
        (pack([*items[:-1], [anchor, changed, count, digest]]), rowid),
    )
    conn.commit()
    conn.close()
    with pytest.raises(LatticedError, match="do not rebuild"):
        loaded(tmp_path)


def test_steps_are_kept_only_for_the_bodies_they_rebuilt() -> None:
    owner = single_offers(20)
    prev, bodies = owner.bodies[0], owner.bodies[1:5]
    steps_memo.remember(prev, b"\x00", 0, bodies)
    copies = tuple(core2_bodies.decode_body(b.to_bytes()) for b in bodies)  # equal, not the same objects
    assert copies == bodies and steps_memo.take(copies) == []
    found = steps_memo.take((owner.bodies[0], *bodies))
    assert [(at, entry.bodies) for at, entry in found] == [(1, bodies)] and steps_memo.take(bodies) == []


def schema_6_store(path: Path, state: QueueState2, q: int) -> None:
    """A store of schema 6 holding ``state`` as a core-2 queue, its rows as schema 6 lays them."""
    store = Store(path, migrations=MIGRATIONS[:6])
    conn = store.connection
    queue_rows(store, q, state, NOW)
    conn.executemany(
        "INSERT INTO leaves2 (q, idx, leaves) VALUES (?, ?, ?)",
        [(q, *row) for row in core2_runs.leaf_runs(0, state.chains.shared)],
    )
    conn.executemany(
        "INSERT INTO bodies2 (q, end_off, version, last_end, last_version, bodies) VALUES (?, ?, ?, ?, ?, ?)",
        [(q, *row) for row in core2_runs.body_runs([b.to_bytes() for b in state.bodies])],
    )
    store.commit()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
    store.close()


def test_a_schema_6_store_migrates_and_serves_the_same_values(tmp_path: Path) -> None:
    owner = queue2.truncate(single_offers(core2_runs.RUN_MAX + 50), OWNER, 7, now_ms=NOW + 10**5)
    path = db_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema_6_store(path, owner, 1)
    store = Store(path)
    assert store.migrated_from == 6
    assert store.connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    queues = Core2Queues()
    queues.open(store)
    assert value(queues.committed(1)) == value(owner)
    store.close()
    writer = Writer(path, OWNER, clock=lambda: NOW + 10**6)
    writer.open()
    try:
        job = Commit2(1, [make_record(b"more", timestamp=NOW)])
        writer.process([job])
        assert job.error is None, job.error
        expected = value(writer.core2.committed(1))
    finally:
        writer.stop()
    assert value(loaded(tmp_path)) == expected


def test_a_run_item_that_is_neither_a_body_nor_steps_is_refused() -> None:
    body = single_offers(2).bodies[-1]
    for items in ([[None, b"\x00", 1, b"d" * 32]], [body.to_bytes(), [1, 2]], [body.to_bytes(), "x"], {}):
        with pytest.raises(LatticedError):
            core2_bodies.read_run(pack(items), lambda: (0, b"", []))


def test_steps_that_read_below_what_the_queue_holds_are_stored_whole() -> None:
    owner = single_offers(20)
    prev, bodies = owner.bodies[1], owner.bodies[2:12]
    for held_from, stepped in ((0, True), (bodies[0].end + 1, False)):
        steps_memo.remember(prev, b"\x00", 0, bodies)

        def chain_at(offset: int, lo: int = held_from) -> bytes | None:
            return owner.chain_at(offset) if offset >= lo else None

        rows = core2_bodies.runs(bodies, chain_at)
        assert [row[4] is not None for row in rows] == [stepped]


async def _send(src: Engine, dst: Engine) -> None:
    q = src.core2.lookup(OWNER.public_key, "q")
    assert q is not None
    state = await src.core2.value(q)
    mine = dst.core2.lookup(OWNER.public_key, "q")
    since = None if mine is None else queue2.summary(await dst.core2.value(mine))
    out = await src.bridge.read(lambda r: outgoing(reading_through(state, r.rows), since, 4096, 1 << 20))
    raw = wire.pack(core2_wire.delta_to_wire(out.delta, out.steps))
    await dst.bridge.run(MergeSteps2(*core2_wire.delta_from_wire(wire.unpack(raw))))


async def test_a_replica_holding_runs_of_steps_learns_of_a_fork_and_an_epoch_and_loads_the_same_value(
    tmp_path: Path,
) -> None:
    """The owner's store copied; both write; the relay took the owner's records as steps, then meets
    the copy's: its runs of steps past the fork point are rewritten whole before their records go; the
    owner's next epoch replaces every leaf."""
    owner, relay, copy = tmp_path / "owner", tmp_path / "relay", tmp_path / "copy"
    owner.mkdir()
    relay.mkdir()
    async with Engine.open(owner, OWNER) as a:
        q = await a.create_queue("q", core=2)
        await a.append(q, [make_record(b"shared-%d" % i, timestamp=i) for i in range(10)])
        async with Engine.open(relay, REPLICA) as r:
            await _send(a, r)
    shutil.copytree(owner, copy)
    async with (
        Engine.open(owner, OWNER) as a,
        Engine.open(copy, OWNER) as c,
        Engine.open(relay, REPLICA) as r,
    ):
        for i in range(20):  # enough versions for their leaves to be stored as steps too
            await a.append(q, [make_record(b"owner-%d" % i, timestamp=i)])
        await c.append(q, [make_record(b"copy-%d" % i, timestamp=i) for i in range(3)])
        await _send(a, r)
        assert any(steps_from is not None for steps_from, _ in runs(relay))
        assert any(steps_from is not None for steps_from, _ in leaf_runs(relay))
        await _send(c, r)
        rq = r.core2.lookup(OWNER.public_key, "q")
        assert rq is not None
        held = await r.core2.value(rq)
        assert held.forked and held.held == (0, 10)
    assert value(loaded(relay)) == value(held)
    async with Engine.open(owner, OWNER) as a, Engine.open(relay, REPLICA) as r:
        await _send(r, a)  # the owner learns of the fork, and starts the next epoch (every leaf replaced)
        assert await a.core2.recover(q, keep_mine=True) == 1
        await _send(a, r)  # a new epoch's first delta carries its bodies whole; the next, steps
        for i in range(30):
            await a.append(q, [make_record(b"epoch-%d" % i, timestamp=i)])
        await _send(a, r)
        held = await r.core2.value(rq)
        assert held.chains.epoch == 1 and held.chains == (await a.core2.value(q)).chains
        assert any(steps_from is not None for steps_from, _ in leaf_runs(relay))
    assert value(loaded(relay)) == value(held)


async def test_a_changed_run_of_leaves_as_steps_is_refused_on_load(tmp_path: Path) -> None:
    await catch_up(tmp_path, (single_offers(100), 4096))
    conn = sqlite3.connect(db_path(tmp_path))
    idx, raw = conn.execute("SELECT idx, leaves FROM leaves2 WHERE steps_from IS NOT NULL").fetchone()
    items = unpack(bytes(raw))
    (at, item), *_ = [(i, item) for i, item in enumerate(items) if isinstance(item, list)]
    for changed in (
        [*item[:1], item[1][:-1] + bytes([item[1][-1] ^ 1]), *item[2:]],  # the last version's timestamp step
        [*item[:4], item[4] + 1, item[5]],  # one leaf more than was stored
        [*item[:4], item[4] + 2, item[5]],  # more leaves than the steps rebuild bodies
    ):
        conn.execute(
            "UPDATE leaves2 SET leaves = ? WHERE idx = ?",
            (pack([*items[:at], changed, *items[at + 1 :]]), idx),
        )
        conn.commit()
        with pytest.raises(LatticedError):
            loaded(tmp_path)
    conn.close()


def test_a_schema_7_store_migrates_and_serves_the_same_values(tmp_path: Path) -> None:
    owner = queue2.truncate(single_offers(core2_runs.RUN_MAX + 50), OWNER, 7, now_ms=NOW + 10**5)
    path = db_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema_6_store(path, owner, 1)  # schema 7 lays these rows as schema 6 did
    conn = sqlite3.connect(path)
    MIGRATIONS[6](conn)
    conn.execute("PRAGMA user_version = 7")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.migrated_from == 7
    queues = Core2Queues()
    queues.open(store)
    assert value(queues.committed(1)) == value(owner)
    store.close()


async def test_a_load_decodes_the_steps_of_leaves_and_bodies_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await catch_up(tmp_path, (single_offers(100), 4096))
    assert any(lo is not None for lo, _ in leaf_runs(tmp_path)) and any(
        lo is not None for lo, _ in runs(tmp_path)
    )
    calls: list[bytes] = []
    decode = core2_bodies.decode_versions

    def counted(*args: Any) -> Any:
        calls.append(args[1])
        return decode(*args)

    monkeypatch.setattr(core2_bodies, "decode_versions", counted)
    assert value(loaded(tmp_path)) == value(held)
    assert len(calls) == 1


async def test_leaves_as_steps_and_whole_share_rows_of_at_most_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core2_runs, "RUN_MAX", 64)
    held = await catch_up(tmp_path, (single_offers(300), 50))
    conn = sqlite3.connect(db_path(tmp_path))
    found = conn.execute("SELECT idx, steps_from FROM leaves2 ORDER BY idx").fetchall()
    conn.close()
    starts = [idx for idx, _ in found]
    assert any(lo is not None for _, lo in found) and len(found) >= len(held.chains.shared) // 64
    assert all(b - a <= 64 for a, b in zip(starts, [*starts[1:], len(held.chains.shared)], strict=True))
    assert value(loaded(tmp_path)) == value(held)
    # Without runs of steps to take them from, every leaf is stored whole, in rows of at most a run.
    whole = core2_leaves.rows(0, held.chains.shared)
    assert all(lo is None and hi is None for _, lo, hi, _ in whole)
    assert [idx for idx, *_ in whole] == list(range(0, len(held.chains.shared), 64))


def test_a_relays_live_pushes_store_their_steps_without_reading_the_records_back(tmp_path: Path) -> None:
    """One-record pushes merged four to a commit (a relay's linger): their steps are checked against
    the chain the commit writes, from memory, not read back from the segment rows just written (the
    steps are still stored, and load to the same value)."""
    owner = single_offers(60)
    w = Writer(db_path(tmp_path), REPLICA)
    w.open()
    try:
        first = on_the_wire(owner, None, 4096)
        w.process([first])
        assert first.error is None, first.error
        q = first.result.q
        statements: list[str] = []
        w.store.connection.set_trace_callback(statements.append)
        try:
            for _ in range(5):
                jobs = []
                for _ in range(4):
                    before = queue2.summary(owner)
                    owner = queue2.commit(
                        owner, OWNER, now_ms=NOW + 100, records=[make_record(b"live", timestamp=100)]
                    )
                    jobs.append(on_the_wire(owner, before, 4096))
                w.process(jobs)
                assert all(job.error is None for job in jobs), [job.error for job in jobs]
        finally:
            w.store.connection.set_trace_callback(None)
        held = w.core2.committed(q)
    finally:
        w.stop()
    assert value(held)[:2] == value(owner)[:2]
    assert not [sql for sql in statements if "FROM segments" in sql], statements
    assert sum(steps_from is not None for steps_from, _ in runs(tmp_path)) == 1 + 5  # a run a commit
    assert value(loaded(tmp_path)) == value(held)
