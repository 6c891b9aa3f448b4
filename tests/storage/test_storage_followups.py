"""fix22: the small follow-ups of ack22's and review22d's storage reviews. A dropped queue's address
leaves the engine's cache (a stale number is never handed out) and its number is not found (not an
AssertionError); one raising live-cache update does not skip the rest of a commit's changes; a bug in
the storage thread's upkeep is logged and the thread goes on taking writes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import NotFoundError
from latticed.process.logs import EVENT_ATTR
from latticed.storage.engine import Engine
from latticed.storage.writer import Change

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(f"v{i}".encode(), timestamp=NOW + i)


async def test_a_dropped_queues_address_no_longer_resolves(tmp_path: Path) -> None:
    """The address was resolved (and cached) before the drop: after it, the name finds nothing."""
    async with Engine.open(tmp_path, ALICE) as e:
        x = await e.create_queue("x", core=2)
        assert e.resolve("x") == x
        assert e.resolve(f"{ALICE.public_key.hex()}/x") == x
        await e.core2.drop(x)
        with pytest.raises(NotFoundError):
            e.resolve("x")
        with pytest.raises(NotFoundError):
            e.resolve(f"{ALICE.public_key.hex()}/x")
        y = await e.create_queue("x", core=2)  # the name again: a new queue, found by it
        assert e.resolve("x") == y != x


async def test_a_commit_to_a_dropped_queues_number_is_not_found(tmp_path: Path) -> None:
    """A number taken before the drop (a request in flight) gets the API's not-found error."""
    async with Engine.open(tmp_path, ALICE) as e:
        x = await e.create_queue("x", core=2)
        await e.core2.drop(x)
        with pytest.raises(NotFoundError, match=f"#{x}"):
            e.core2.start_commit(x, [rec(0)])
        with pytest.raises(NotFoundError):
            e.core2.address(x)


async def test_a_raising_live_cache_update_does_not_skip_the_other_changes(tmp_path: Path) -> None:
    """One batch changes two queues; the live cache raises on the first. The second still reaches the
    live cache, and the change listener hears both."""
    heard: list[str] = []

    def listener(state: QueueState) -> None:
        heard.append(state.name)

    async with Engine.open(tmp_path, ALICE, changes=listener) as e:
        a = await e.create_queue("a")
        b = await e.create_queue("b")
        real = e.live.committed
        reached: list[int] = []

        def committed(change: Change) -> None:
            if change.q == a:
                raise RuntimeError("live cache bug")
            reached.append(change.q)
            real(change)

        e.live.committed = committed  # type: ignore[method-assign]
        heard.clear()
        assert await e.append_many([(a, [rec(0)]), (b, [rec(1)])]) == [0, 0]
        assert reached == [b]
        assert sorted(heard) == ["a", "b"]
        assert await e.append(b, [rec(2)]) == 1


async def test_a_raising_upkeep_step_is_logged_and_the_thread_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upkeep runs after every batch on the storage thread: an exception there used to end the thread,
    and every later write waited for ever."""
    caplog.set_level(logging.INFO, logger="latticed")
    async with Engine.open(tmp_path, ALICE) as e:
        calls = [0]

        def maintain(idle: bool = True) -> bool:
            calls[0] += 1
            raise RuntimeError("upkeep bug")

        e._writer.maintain = maintain  # type: ignore[method-assign]
        with trio.fail_after(10):  # a dead storage thread never answers
            q = await e.create_queue("q")
            assert await e.append(q, [rec(0)]) == 0
            # Upkeep follows a batch's answers, so only the next batch's answer proves it ran (and failed)
            assert calls[0] >= 1
    events = [r for r in caplog.records if getattr(r, EVENT_ATTR, "") == "storage.maintain_failed"]
    assert events and events[0].exc_info is not None
