"""A live tail on a replica streams a peer's verified records while their commit is still under way
(storage/ahead.py), and nothing else sees them early: every other read, and the store, waits for the
commit. The storage thread is held inside a batch (``engine.bridge.hold()``) so "not yet committed" is
certain."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from support.inprocess import InProcessDaemon, start_in_process

from latticed.crdt import queue as core
from latticed.crdt.records import RecordRun
from latticed.crdt.signing import Identity
from latticed.errors import StorageError
from latticed.host.config import DaemonConfig
from latticed.storage.ahead import summary_after
from latticed.storage.bridge import StorageHold
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)


def records(n: int, tag: str, size: int = 8) -> RecordRun:
    return RecordRun(
        [f"{tag}{i}".encode().ljust(size, b".") for i in range(n)],
        [b"k%d" % i if i % 2 else None for i in range(n)],
        [1000 + i for i in range(n)],
        [(("h", b"%d" % i),) if i % 3 == 0 else () for i in range(n)],
    )


def alice_chunks(*sizes: int, size: int = 8) -> list[core.QueueDelta]:
    """Alice's queue written in commits of these sizes, as the deltas a peer pushes one by one."""
    state = core.empty_state(ALICE.public_key, "q")
    deltas = []
    for i, n in enumerate(sizes):
        before = state.summary() if i else None
        state = core.commit(state, ALICE, now_ms=i + 1, records=records(n, f"c{i}-", size))
        deltas.append(core.delta(state, before, None))
    return deltas


async def replica_with_first_chunk(engine: Engine, deltas: list[core.QueueDelta]) -> int:
    await engine.merged(engine.submit_merge(await engine.verify_delta(deltas[0])))
    q = engine.find(ALICE.public_key, "q")
    assert q is not None
    return q


async def test_a_tail_sees_verified_records_before_their_commit(tmp_path: Path) -> None:
    deltas = alice_chunks(10, 5, 7)
    async with Engine.open(tmp_path, BOB) as engine:
        q = await replica_with_first_chunk(engine, deltas)
        verified = [await engine.verify_delta(d) for d in deltas[1:]]
        with engine.bridge.hold():
            jobs = [engine.submit_merge(v) for v in verified]
            assert engine.state(q).held_end == 10  # nothing committed
            assert engine.visible_end(q) == 22
            shown = await engine.read_visible(q, 10, 100, 1000, 1 << 20)
            assert shown.offsets == list(range(10, 22))
            assert shown.values == [r.value for r in deltas[1].records + deltas[2].records]
            assert shown.keys == [r.key for r in deltas[1].records + deltas[2].records]
            assert shown.headers[0] == [["h", b"0"]] and shown.headers[1] is None
            # Bounded like any read, in records and in bytes (always at least one).
            assert (await engine.read_visible(q, 12, 100, 3, 1 << 20)).offsets == [12, 13, 14]
            assert (await engine.read_visible(q, 12, 100, 1000, 1)).offsets == [12]
            # Everyone else sees only what is durable.
            assert len(await engine.read(q, 0, 100, 1000, 1 << 20)) == 10
            assert engine.state(q).summary().held_end == 10
            with trio.move_on_after(0) as waiting:
                await engine.wait_past(q, 20, ahead=True)
            assert not waiting.cancelled_caught
        for job in jobs:
            await engine.merged(job)
        # Committed: nothing left ahead.
        assert engine.state(q).held_end == 22 and engine.live.ahead(q) is None
        stored = await engine.read(q, 10, 100, 1000, 1 << 20)
        assert stored == shown


async def test_a_tail_waiting_at_the_end_wakes_for_records_ahead(tmp_path: Path) -> None:
    deltas = alice_chunks(4, 3)
    async with Engine.open(tmp_path, BOB) as engine:
        q = await replica_with_first_chunk(engine, deltas)
        woke: list[int] = []

        async def tail_waits() -> None:
            await engine.wait_past(q, 4, ahead=True)
            woke.append(engine.visible_end(q))

        async def committed_waits() -> None:
            await engine.wait_past(q, 4)
            woke.append(-engine.state(q).held_end)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail_waits)
            nursery.start_soon(committed_waits)
            await trio.testing.wait_all_tasks_blocked()
            verified = await engine.verify_delta(deltas[1])
            with engine.bridge.hold():
                job = engine.submit_merge(verified)
                await trio.testing.wait_all_tasks_blocked()
                assert woke == [7]  # the tail woke; a committed-only waiter did not
            await engine.merged(job)
        assert woke == [7, -7]


async def test_only_a_delta_that_extends_what_we_hold_is_shown(tmp_path: Path) -> None:
    deltas = alice_chunks(4, 3, 2)
    async with Engine.open(tmp_path, BOB) as engine:
        q = await replica_with_first_chunk(engine, deltas)
        gap = await engine.verify_delta(deltas[2])  # starts at 7: we hold 4
        whole = await engine.verify_delta(core.delta(_alice_state(deltas), None, None))  # from 0
        with engine.bridge.hold():
            gap_job = engine.submit_merge(gap)
            whole_job = engine.submit_merge(whole)
            assert engine.visible_end(q) == 4 and engine.live.ahead(q) is None
        await engine.merged(gap_job)  # joins what connects (the head), not the records past the gap
        await engine.merged(whole_job)
        assert engine.state(q).held_end == 9 and engine.visible_end(q) == 9


def _alice_state(deltas: list[core.QueueDelta]) -> core.QueueState:
    state = core.empty_state(ALICE.public_key, "q")
    for d in deltas:
        state = core.merge(state, d)
    return state


async def test_a_failed_merge_takes_back_what_it_showed(tmp_path: Path) -> None:
    deltas = alice_chunks(2, 64, size=32 * 1024)  # the second is 2 MiB
    async with Engine.open(tmp_path, BOB) as engine:
        q = await replica_with_first_chunk(engine, deltas)
        await engine.call_in_writer(lambda batch, writer: writer.store.set_max_page_count(1))  # disk "full"
        verified = await engine.verify_delta(deltas[1])
        with engine.bridge.hold():
            job = engine.submit_merge(verified)
            assert engine.visible_end(q) == 66
        with pytest.raises(StorageError):
            await engine.merged(job)
        assert engine.visible_end(q) == 2 and engine.live.ahead(q) is None
        assert (await engine.read_visible(q, 2, 100, 1000, 1 << 20)).offsets == []


@contextmanager
def replica_daemon(tmp_path: Path, deltas: list[core.QueueDelta]) -> Iterator[tuple[InProcessDaemon, Engine]]:
    """A daemon in this process holding Alice's first chunk as a replica; stopped at the end."""
    daemon = start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))
    try:
        engine: Engine = daemon.handle.engine

        async def merge_first() -> None:
            await replica_with_first_chunk(engine, deltas)

        daemon.call(merge_first)
        yield daemon, engine
    finally:
        daemon.stop()


def test_a_tail_on_a_replica_streams_records_ahead_of_the_commit(tmp_path: Path) -> None:
    """End to end through the API: the tail's client gets the records while the storage thread is
    still held, then the same offsets are durable."""
    deltas = alice_chunks(3, 4)
    with replica_daemon(tmp_path, deltas) as (daemon, engine):
        address = f"{ALICE.public_key.hex()}/q"
        with daemon.client() as c:
            tail = c.tail(address, from_offset=3)
            got: list[tuple[int, bytes]] = []

            async def submit_held() -> StorageHold:
                verified = await engine.verify_delta(deltas[1])
                hold = engine.bridge.hold()
                daemon.box["job"] = engine.submit_merge(verified)
                return hold

            hold = daemon.call(submit_held)
            try:
                for entry in tail:
                    got.append((entry.offset, entry.value))
                    if entry.offset == 6:
                        break
                assert c.queue_info(address)["end_offset"] == 3  # still not committed
            finally:
                hold.release()
                tail.close()

            async def committed() -> None:
                await engine.merged(daemon.box.pop("job"))

            daemon.call(committed)
            assert got == [(3 + i, v) for i, v in enumerate(r.value for r in deltas[1].records)]
            assert c.queue_info(address)["end_offset"] == 7


async def test_only_live_pushes_wait_ahead_and_only_so_many(tmp_path: Path) -> None:
    """A catch-up chunk is not latency-bound: it is not copied ahead. Nor is anything past the cap."""
    from latticed.storage.ahead import AHEAD_DELTA_RECORDS, AHEAD_MAX_RECORDS  # noqa: PLC0415

    per = AHEAD_DELTA_RECORDS
    pushes = AHEAD_MAX_RECORDS // per
    deltas = alice_chunks(1, per + 1, *([per] * (pushes + 1)))
    async with Engine.open(tmp_path, BOB) as engine:
        q = await replica_with_first_chunk(engine, deltas)
        big = await engine.verify_delta(deltas[1])
        with engine.bridge.hold():
            job = engine.submit_merge(big)
            assert engine.visible_end(q) == 1 and engine.live.ahead(q) is None
        await engine.merged(job)
        held = engine.state(q).held_end
        verified = [await engine.verify_delta(d) for d in deltas[2:]]
        with engine.bridge.hold():
            jobs = [engine.submit_merge(v) for v in verified]
            assert engine.visible_end(q) == held + pushes * per == held + AHEAD_MAX_RECORDS
        for job in jobs:
            await engine.merged(job)
        assert engine.state(q).held_end == held + (pushes + 1) * per and engine.live.ahead(q) is None


def test_a_replica_tail_gets_every_record_once_in_order_however_commits_interleave(tmp_path: Path) -> None:
    """Pushes arrive while the storage thread is sometimes held (records shown ahead), sometimes free
    (committed first), and a late duplicate arrives too: the tail sees each offset once, in order."""
    import random  # noqa: PLC0415

    rng = random.Random(7)
    sizes = [rng.randint(1, 9) for _ in range(40)]
    deltas = alice_chunks(*sizes)
    total = sum(sizes)
    with replica_daemon(tmp_path, deltas) as (daemon, engine):
        got: list[tuple[int, bytes]] = []
        done = threading.Event()

        def follow() -> None:
            with daemon.client() as c:
                for entry in c.tail(f"{ALICE.public_key.hex()}/q", from_offset=0):
                    got.append((entry.offset, entry.value))
                    if entry.offset == total - 1:
                        done.set()
                        return

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()

        async def push_all() -> None:
            jobs = []
            for i, d in enumerate(deltas[1:], start=1):
                verified = await engine.verify_delta(d)
                if rng.random() < 0.5:
                    hold = engine.bridge.hold()
                    jobs.append(engine.submit_merge(verified))
                    if i % 7 == 0:  # a redundant link delivers an earlier push again
                        jobs.append(engine.submit_merge(await engine.verify_delta(deltas[i - 1])))
                    await trio.sleep(0)
                    hold.release()
                else:
                    jobs.append(engine.submit_merge(verified))
                if rng.random() < 0.3:
                    await engine.merged(jobs[-1])
            for job in jobs:
                await engine.merged(job)

        daemon.call(push_all)
        assert done.wait(30)
        reader.join(10)
        expected = [(o, r.value) for o, r in enumerate(r for d in deltas for r in d.records)]
        assert got == expected


# ------------------------------------------------------------------ relaying ahead of the commit


async def test_a_relay_serves_a_verified_push_as_it_came_before_its_commit(tmp_path: Path) -> None:
    deltas = alice_chunks(4, 3, 2)
    async with Engine.open(tmp_path, BOB) as engine:
        q = await replica_with_first_chunk(engine, deltas)
        at_base = engine.state(q).summary()
        key = (ALICE.public_key, "q", 0)
        assert engine.ahead_for(*key, at_base) is None  # nothing ahead
        verified = [await engine.verify_delta(d) for d in deltas[1:]]
        with engine.bridge.hold():
            jobs = [engine.submit_merge(v) for v in verified]
            ahead = engine.ahead_for(*key, at_base)
            assert ahead is not None
            assert ahead.delta_from(at_base) is deltas[1]  # relayed as it came
            assert jobs[0].ahead is not None
            assert ahead.delta_from(jobs[0].ahead) is deltas[2]  # then the next, from where that ends
            assert ahead.delta_from(jobs[1].ahead) is None  # a peer that has it all: nothing to send
            forked_since = dataclasses.replace(at_base, held_hash=b"\x00" * 32)
            assert ahead.delta_from(forked_since) is None  # not our chain: wait for the commit
            assert engine.ahead_for(*key, None) is None and engine.ahead_for(*key, core.Summary()) is None
        for job in jobs:
            await engine.merged(job)
        # What each job said we would hold is what we hold once it is stored.
        assert [job.ahead for job in jobs] == [job.summary for job in jobs]
        assert jobs[-1].ahead == engine.state(q).summary()
        assert engine.ahead_for(*key, at_base) is None


def test_summary_after_refuses_what_could_change_more_than_the_end() -> None:
    deltas = alice_chunks(4, 3)
    base = core.merge(core.empty_state(ALICE.public_key, "q"), deltas[0]).summary()
    d = deltas[1]
    assert d.head is not None
    end_hash = b"\x01" * 32
    after = summary_after(base, d, end_hash)
    assert after is not None and (after.held_end, after.held_hash) == (7, end_hash)
    truncating = dataclasses.replace(d, head=dataclasses.replace(d.head, start=5))
    assert summary_after(base, truncating, end_hash) is None
    new_meta = dataclasses.replace(d, meta=None, head=dataclasses.replace(d.head, meta_version=9))
    assert summary_after(base, new_meta, end_hash) is None
    assert summary_after(base, dataclasses.replace(d, head=None), end_hash) is None
