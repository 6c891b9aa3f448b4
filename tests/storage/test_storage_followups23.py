"""fix23: follow-ups of session 22's storage reviews. A number on neither fork core is not found (not a
bare KeyError), through the engine and the local API; a repeating upkeep error is logged at most once an
interval, with a count of the ones held back; a failure while a commit is handed to the live cache, or a
read-back that only succeeds later, still wakes the changed queues' waiters, and nothing stale is served
from the cache."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.inprocess import daemon_at

from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import NotFoundError
from latticed.process.logs import EVENT_ATTR, FIELDS_ATTR, EveryInterval
from latticed.storage import writer as writer_module
from latticed.storage.engine import Engine
from latticed.storage.writer import Change

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(f"v{i}".encode(), timestamp=NOW + i)


# ---------------------------------------------------------------------- (1) a number on neither core
async def test_an_append_to_a_dropped_queues_number_is_not_found(tmp_path: Path) -> None:
    """``start_append`` checks the owner through ``state``: a dropped core-2 queue's number (a request
    resolved before the drop) used to raise a bare KeyError there."""
    async with Engine.open(tmp_path, ALICE) as e:
        x = await e.create_queue("x", core=2)
        await e.core2.drop(x)
        with pytest.raises(NotFoundError, match=f"#{x}"):
            e.start_append(x, [rec(0)])
        with pytest.raises(NotFoundError):
            e.require_owner(x, "offer")
        with pytest.raises(NotFoundError):
            e.state(x + 100)  # never a queue
        y = await e.create_queue("y")  # the engine goes on
        assert await e.append(y, [rec(0)]) == 0


def test_the_local_api_answers_a_dropped_number_with_not_found(tmp_path: Path) -> None:
    """An offer whose address resolved to a queue dropped since gets ``not_found`` (it was an internal
    error, logged as a handler failure), and the daemon goes on serving."""
    with daemon_at(tmp_path) as d, d.client() as client:
        client.queue_create("x", core=2)
        client.queue_create("y")
        engine = d.handle.engine
        x = engine.resolve("x")
        d.call(engine.core2.drop, x)
        engine._addresses[("x", KIND_QUEUE)] = x  # resolved before the drop, as a request in flight
        with pytest.raises(NotFoundError):
            client.offer("x", b"v")
        assert client.offer("y", b"v") == 0
        assert [q["name"] for q in client.queue_list()] == ["y"]


# ---------------------------------------------------------------------- (2) upkeep errors, rate-limited
def test_every_interval_lets_the_first_through_then_one_an_interval_with_a_count() -> None:
    now = [100.0]
    gate = EveryInterval(60.0, clock=lambda: now[0])
    assert gate.allow() == 0  # the first at once, none held back
    assert [gate.allow() for _ in range(3)] == [None, None, None]
    now[0] = 159.9
    assert gate.allow() is None
    now[0] = 160.0
    assert gate.allow() == 4  # the four held back since
    assert gate.allow() is None
    now[0] = 500.0
    assert gate.allow() == 1


async def test_a_repeating_upkeep_error_is_logged_once_an_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upkeep runs after every batch: a bug there repeating at each one must not flood the log. The
    clock is the upkeep's own call count (calls 1-5 at t=0, later ones past the interval)."""
    caplog.set_level(logging.INFO, logger="latticed")
    calls = [0]

    def clock() -> float:
        return 0.0 if calls[0] <= 5 else 61.0 + calls[0]

    async with Engine.open(tmp_path, ALICE) as e:

        def maintain(idle: bool = True) -> bool:
            calls[0] += 1
            raise RuntimeError("upkeep bug")

        e._writer.maintain_log = EveryInterval(60.0, clock=clock)
        e._writer.maintain = maintain  # type: ignore[method-assign]
        q = await e.create_queue("q")
        for i in range(6):
            assert await e.append(q, [rec(i)]) == i
    assert calls[0] >= 7  # one a batch (the thread has ended: every call is counted)
    events = [r for r in caplog.records if getattr(r, EVENT_ATTR, "") == "storage.maintain_failed"]
    assert [getattr(r, FIELDS_ATTR)["suppressed"] for r in events] == [0, 4]
    assert all(r.exc_info is not None for r in events)


# ---------------------------------------------------------------------- (3) the live cache after a failure
@asynccontextmanager
async def woken_past(e: Engine, q: int, end: int, *, seconds: float) -> AsyncIterator[trio.Event]:
    """A task blocked in ``e.wait_past(q, end)`` before the body runs; the event is set once it returns.
    Leaving waits for it (within ``seconds``): the tests here check that a commit that went wrong still
    wakes the queue's waiters, and a waiter never woken would otherwise hang."""
    woken = trio.Event()

    async def waiter() -> None:
        await e.wait_past(q, end)
        woken.set()

    with trio.fail_after(seconds):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            yield woken
            await woken.wait()


async def test_a_raising_live_cache_update_still_forgets_and_wakes_the_queue(tmp_path: Path) -> None:
    """The live cache's ``committed`` raises for a commit: the queue's waiter is still woken (it sees
    the new end) and the cache no longer serves the commit before it (reads go to the store)."""
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.create_queue("q")
        assert await e.append(q, [rec(0)]) == 0
        assert e.live.recent_row(q, 0) is not None  # the last commit's records, kept
        real = e.live.committed

        def committed(change: Change) -> None:
            if change.q == q:
                raise RuntimeError("live cache bug")
            real(change)

        e.live.committed = committed  # type: ignore[method-assign]
        async with woken_past(e, q, 1, seconds=10):
            assert await e.append(q, [rec(1)]) == 1
        assert e.live.recent_row(q, 0) is None
        assert await e.row(q, 0) is not None and await e.row(q, 1) is not None


async def test_a_read_back_that_works_only_later_wakes_the_changed_queues_waiters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishing a commit fails and so does reading the store back: the waiter woken by the commit
    reads the stale value and waits again. Once a later read-back works (the idle thread's), it must be
    woken again: nothing else will wake it until the queue's next commit."""
    monkeypatch.setattr(writer_module, "_REPAIR_RETRY_S", 0.0)
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.create_queue("q")
        writer = e._writer
        allowed = threading.Event()
        real_load, real_publish, published = writer.store.load, writer.core2.publish, [0]

        def load() -> Any:
            if not allowed.is_set():
                raise OSError("read failed")
            return real_load()

        def publish() -> Any:
            published[0] += 1
            if published[0] == 1:
                raise RuntimeError("publish bug")
            return real_publish()

        monkeypatch.setattr(writer.store, "load", load)
        monkeypatch.setattr(writer.core2, "publish", publish)
        async with woken_past(e, q, 0, seconds=5) as woken:
            assert await e.append(q, [rec(0)]) == 0  # acked: the COMMIT returned
            await trio.testing.wait_all_tasks_blocked()
            assert e.state(q).held_end == 0 and not woken.is_set()  # stale: it waits again
            allowed.set()
        assert e.state(q).held_end == 1
        assert await e.append(q, [rec(1)]) == 1


async def test_live_cache_reset_keeps_nothing_and_wakes_every_waiter(tmp_path: Path) -> None:
    """review23 (a mutant of fix23's reset that kept the recent records survived the tests above):
    after a stale spell nothing cached is served, and every queue's waiter looks again."""
    async with Engine.open(tmp_path, ALICE) as e:
        q, r = await e.create_queue("q"), await e.create_queue("r")
        assert await e.append(q, [rec(0)]) == 0
        assert e.live.recent_row(q, 0) is not None  # served from the cache until the reset
        waiting = [e.live.changed(q), e.live.changed(r)]
        e.live.reset()
        assert e.live.recent_row(q, 0) is None and all(event.is_set() for event in waiting)
        assert await e.row(q, 0) is not None  # the store still answers
