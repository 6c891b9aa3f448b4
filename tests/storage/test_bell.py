"""The storage thread's bell to the event loop (latticed/storage/bell.py) and the bridge's use of it: the
replies of a batch told before its COMMIT are built before any of its jobs is done, whichever of the
bell's task and the completion runs first (wake26)."""

from __future__ import annotations

import ctypes
import sys
import threading
from collections import deque

import pytest
import trio
import trio.testing

from latticed.storage import bell as bell_module
from latticed.storage.bell import Bell
from latticed.storage.bridge import StorageBridge
from latticed.storage.jobs import Job


async def test_a_ring_from_another_thread_wakes_the_loop_once_per_wait() -> None:
    bell = Bell()
    try:
        thread = threading.Thread(target=bell.ring)
        thread.start()
        with trio.fail_after(5):
            await bell.wait()
        thread.join()
        bell.ring()
        bell.ring()  # two rings before a wait: one wake-up, the counter drained
        with trio.fail_after(5):
            await bell.wait()
        with trio.move_on_after(0.05) as nothing:
            await bell.wait()
        assert nothing.cancelled_caught
    finally:
        bell.close()


async def test_close_ends_a_waiting_wait_and_a_later_ring_writes_nothing() -> None:
    bell = Bell()
    raised: list[type[BaseException]] = []

    async def waiter() -> None:
        try:
            await bell.wait()
        except trio.ClosedResourceError as exc:
            raised.append(type(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        bell.close()
    assert raised == [trio.ClosedResourceError]
    bell.ring()  # the fd may belong to another file by now: nothing is written
    bell.close()  # twice: nothing


def test_the_daemons_platform_writes_with_the_gil_held() -> None:
    """On Linux the write is libc's through ctypes.PyDLL (which keeps the GIL); elsewhere, where it is
    missing, os.write, which still wakes the loop."""
    if sys.platform == "linux":
        assert isinstance(bell_module._WRITE, ctypes._CFuncPtr)  # type: ignore[attr-defined]
    bell = Bell()
    try:
        bell_module._released_write(bell._write, bell._byte, len(bell._byte))
        assert bell_module._released_write(-1, b"\x00", 1) is None  # a bad fd: nothing raised
    finally:
        bell.close()


async def test_the_completion_builds_the_told_replies_first_if_the_bells_task_has_not() -> None:
    """``_complete`` takes every batch told and not yet prepared before it sets anything done: a reply is
    never built from a job already done, and none is skipped when the bell's task runs late."""
    order: list[str] = []
    bridge = StorageBridge.__new__(StorageBridge)
    bridge._on_commit = lambda jobs, changes, changes2: order.append("on_commit")
    bridge._preparing = deque()
    jobs = [Job(), Job()]
    later = Job()  # the next batch, told before this one's completion ran: prepared too, not done

    class Waiter:
        def __init__(self, job: Job) -> None:
            self.job = job

        def prepare(self) -> None:
            order.append(f"prepare done={self.job.done.is_set()}")

    for job in [*jobs, later]:
        job.done = trio.Event()
        job.prepare = Waiter(job).prepare
    bridge._preparing.extend([jobs, [later]])
    bridge._complete(jobs, [], [])
    assert order == ["prepare done=False"] * 3 + ["on_commit"]
    assert not bridge._preparing and all(job.done.is_set() for job in jobs) and not later.done.is_set()


@pytest.mark.parametrize("told", [0, 1])
async def test_the_bells_task_builds_told_replies_in_order(told: int) -> None:
    """Through a real bridge's task: a told batch's replies are built once the bell rings (none when
    nothing was told)."""
    built: list[int] = []

    class Stub:
        on_done = on_committing = on_reloaded = None
        size = 1  # the read pool's

    bridge = StorageBridge(Stub(), Stub(), lambda jobs, changes, changes2: None)  # type: ignore[arg-type]
    try:
        jobs = [Job() for _ in range(told)]
        for n, job in enumerate(jobs):
            job.prepare = lambda n=n: built.append(n)  # type: ignore[misc]
        bridge._on_committing(jobs)
        await trio.testing.wait_all_tasks_blocked()
        assert built == list(range(told)) and not bridge._preparing
    finally:
        bridge._bell.close()
