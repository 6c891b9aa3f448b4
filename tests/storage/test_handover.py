"""The storage thread's hand-over to the event loop (latticed/storage/handover.py): every posted call runs
once, in order, whatever the timing of its wake-up byte; nothing is lost when the socket is full, when
the hand-over closes, or when the run ends with calls pending; a waiter cancelled mid-hand-over leaves
the batch's other answers and the next batch's intact."""

from __future__ import annotations

import logging
import random
import socket
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage.engine import Engine
from latticed.storage.handover import HandoverClosed, LoopHandover, write_byte

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(f"v{i}".encode(), timestamp=NOW + i)


async def test_calls_posted_from_a_thread_run_once_each_in_order() -> None:
    """Bursts and gaps from another thread (a byte per call, the loop reading bytes while more come):
    each call runs exactly once, in the order posted."""
    handover = LoopHandover()
    ran: list[int] = []
    done = trio.Event()
    count = 3000

    def call(i: int) -> None:
        ran.append(i)
        if i == count - 1:
            done.set()

    def poster() -> None:
        rng = random.Random(24)
        for i in range(count):
            handover.post(call, i)
            if rng.random() < 0.02:
                time.sleep(rng.random() / 1000)  # a gap: the loop drains and waits again

    with trio.fail_after(30):
        await trio.to_thread.run_sync(poster)
        await done.wait()
    assert ran == list(range(count))
    assert handover.wakeups == count  # one byte a call, none skipped
    await trio.testing.wait_all_tasks_blocked()
    assert ran == list(range(count))  # and nothing ran twice after the last one


async def test_a_full_wake_up_socket_loses_no_call() -> None:
    """With the socket's buffer full a write takes nothing (EAGAIN), and the call still runs: bytes
    unread were ahead of it."""
    handover = LoopHandover()
    fd = handover._write.fileno()
    filled = 0
    while write_byte(fd) == 1:
        filled += 1
    assert filled > 0 and write_byte(fd) == 0  # full: nothing written, no error
    ran: list[int] = []
    await trio.to_thread.run_sync(lambda: [handover.post(ran.append, i) for i in range(5)])
    with trio.fail_after(10):
        while len(ran) < 5:
            await trio.sleep(0.001)
    assert ran == [0, 1, 2, 3, 4]


def test_write_byte_writes_one_byte_and_raises_on_a_closed_descriptor() -> None:
    """One byte a call; a descriptor that is not open is an OSError, not a silent success."""
    a, b = socket.socketpair()
    a.setblocking(False)
    with a, b:
        assert write_byte(a.fileno()) == 1
        assert b.recv(16) == b"\0"
    with pytest.raises(OSError):
        write_byte(a.fileno())  # -1 once closed: EBADF


async def test_close_runs_what_was_posted_then_refuses_more_and_ends_the_pump() -> None:
    handover = LoopHandover()
    ran: list[str] = []
    handover.post(ran.append, "a")
    handover.post(ran.append, "b")
    handover.close()
    assert ran == ["a", "b"] and handover.closed
    with pytest.raises(HandoverClosed):
        handover.post(ran.append, "c")
    handover.close()  # twice: nothing more happens
    await trio.testing.wait_all_tasks_blocked()
    assert ran == ["a", "b"]
    assert handover._read.fileno() == -1 and handover._write.fileno() == -1  # the sockets are released


def test_the_run_ending_with_calls_pending_runs_them() -> None:
    """Cancelled at the run's end (as trio's own entry queue is), the pump runs what was posted, and
    a call posted after it is refused (the storage thread logs it), not queued for nobody."""
    ran: list[int] = []
    box: list[LoopHandover] = []

    async def main() -> None:
        handover = LoopHandover()
        box.append(handover)
        handover.post(ran.append, 1)  # not run yet: the run ends before the pump's turn
        handover.post(ran.append, 2)

    trio.run(main)
    assert ran == [1, 2]
    with pytest.raises(HandoverClosed):
        box[0].post(ran.append, 3)


async def test_a_call_that_raises_is_logged_and_the_next_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    handover = LoopHandover()
    ran: list[int] = []
    done = trio.Event()

    def broken() -> None:
        raise RuntimeError("a bug in a call")

    def poster() -> None:
        handover.post(broken)
        handover.post(ran.append, 1)
        handover.post(done.set)

    with caplog.at_level(logging.ERROR), trio.fail_after(10):
        await trio.to_thread.run_sync(poster)
        await done.wait()
    assert ran == [1]
    assert any("storage.handover_failed" in r.getMessage() for r in caplog.records)


async def test_a_waiter_cancelled_during_the_hand_over_leaves_the_others_answered(tmp_path: Path) -> None:
    """A batch's waiter cancelled between its commit and its wake-up (in the batch's ``prepare``, run on
    the loop while the COMMIT runs): the others of the batch get their offsets, the cancelled one's record
    is committed all the same, and the next batch is answered."""
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.create_queue("q")
        hold = e.bridge.hold()  # the three appends below wait together: one batch
        jobs = [e.start_append(q, [rec(i)]) for i in range(3)]
        results: dict[int, object] = {}
        scopes = [trio.CancelScope() for _ in jobs]

        def prepare() -> None:
            scopes[1].cancel()

        jobs[0].prepare = prepare

        async def wait(n: int) -> None:
            with scopes[n]:
                results[n] = await e.outcome(jobs[n])

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(3):
                    nursery.start_soon(wait, n)
                await trio.to_thread.run_sync(hold.wait_entered)
                hold.release()
        assert results == {0: 0, 2: 2}  # the cancelled waiter returned nothing
        assert jobs[1].error is None and jobs[1].result == 1 and jobs[1].done.is_set()
        with trio.fail_after(30):
            assert await e.append(q, [rec(3)]) == 3
        assert await e.bounds(q) == (0, 4)
        handover = e.bridge.handover
    assert handover.closed  # the bridge's stop closed it after the storage thread's last batch
    with pytest.raises(HandoverClosed):
        handover.post(print)


async def test_many_concurrent_appends_each_answered_through_the_real_storage_thread(tmp_path: Path) -> None:
    """Sixteen writers, each waiting for its ack before the next (the bench's shape), over many batches:
    no wake-up lost (a lost one hangs a writer: the deadline fails), each offset once."""
    async with Engine.open(tmp_path, ALICE, group_commit_ms=1.0) as e:
        qs = [await e.create_queue(f"q{i}") for i in range(16)]
        offsets: dict[int, list[int]] = {q: [] for q in qs}

        async def writer(q: int) -> None:
            for i in range(40):
                offsets[q].append(await e.append(q, [rec(i)]))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for q in qs:
                    nursery.start_soon(writer, q)
        assert all(got == list(range(40)) for got in offsets.values())
        assert e.bridge.handover.turns <= e.bridge.handover.wakeups


class _PostsAfterItsTurn(LoopHandover):
    """Posts one more call right after its first turn's calls ran, before the pump waits again: the
    moment a storage thread's post races the loop's (a reader that read the bytes after taking the
    calls would swallow this call's byte and never run it)."""

    def __init__(self, late: list[str]) -> None:
        self._late: list[str] | None = late
        super().__init__()

    def _run(self) -> None:
        super()._run()
        if self._late is not None and not self.closed:
            late, self._late = self._late, None
            self.post(late.append, "late")


async def test_a_call_posted_as_a_turn_ends_still_wakes_the_loop() -> None:
    ran: list[str] = []
    handover = _PostsAfterItsTurn(ran)
    handover.post(ran.append, "first")
    with trio.fail_after(5):
        while ran != ["first", "late"]:
            await trio.sleep(0.001)
    assert handover.turns == 2
