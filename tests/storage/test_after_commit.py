"""A failure AFTER a batch's COMMIT returned (ack22): its jobs are durable, so they must be answered with
their results, never with an error (a client told a durable write failed retries it and duplicates the
record, or gives up on data that is stored). The failure is logged, and memory that may now disagree with
the store (states published halfway) is read back from the store before anything is written again."""

from __future__ import annotations

import functools
import gc
import logging
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from support.clocks import TickingClock

from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import StorageError
from latticed.process.logs import EVENT_ATTR
from latticed.storage.engine import Engine
from latticed.storage.jobs import SUBMITTER, Append, CreateQueue, Job, Submitter, submitting
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(f"v{i}".encode(), timestamp=NOW + i)


def _events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, EVENT_ATTR, "")) for r in caplog.records]


def _raises_once(real: Callable[..., Any], error: Exception) -> Callable[..., Any]:
    left = [1]

    def call(*args: Any) -> Any:
        if left[0]:
            left[0] -= 1
            raise error
        return real(*args)

    return call


def _facts(state: QueueState) -> tuple[int, int, object]:
    return state.start, state.held_end, state.head


def _stored(path: Path) -> dict[int, tuple[int, int, object]]:
    """Each queue's (start, held end, head) as the store holds it, read on a connection of its own."""
    store = Store(path)
    try:
        return {loaded.q: _facts(loaded.state) for loaded in store.load()}
    finally:
        store.close()


class _RaisingMetrics:
    """Reports commits by raising (a bug in the metrics hook, after the COMMIT returned)."""

    def observe_commit(self, commit_s: float, fsync_s: float) -> None:
        raise RuntimeError("metrics bug")

    def committed(self, jobs: Any, changes: Any) -> None:
        pass

    def verification_failed(self, error: Any) -> None:
        pass


@pytest.fixture
def q(writer: Writer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> int:
    """Queue ``q`` on the shared ``writer`` (tests/storage/conftest.py), whose next publish of committed
    values raises once (a bug after the COMMIT returned), with the daemon's log captured."""
    caplog.set_level(logging.INFO, logger="latticed")
    create = CreateQueue("q", None)
    writer.process([create])
    monkeypatch.setattr(
        writer.core2, "publish", _raises_once(writer.core2.publish, RuntimeError("publish bug"))
    )
    assert isinstance(create.result, int)
    return create.result


def test_a_hook_that_raises_after_the_commit_leaves_the_jobs_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit metric raises after the COMMIT: the new queue and the append are reported done with
    their results, the failure is logged, and the queue number is not handed out again (the old code
    rolled ``_next_q`` back, so the next create collided with the committed queue)."""
    caplog.set_level(logging.INFO, logger="latticed")
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW), metrics=_RaisingMetrics())
    w.open()
    try:
        create = CreateQueue("q", None)
        w.process([create])
        assert create.error is None and isinstance(create.result, int)
        q = create.result
        append = Append(q, [rec(0), rec(1)])
        w.process([append])
        assert (append.error, append.result) == (None, 0)
        assert "storage.after_commit_failed" in _events(caplog)
        other = CreateQueue("r", None)
        w.process([other])
        assert other.error is None and other.result != q
        assert w.states[q].held_end == 2
    finally:
        w.stop()
    assert _stored(db_path(tmp_path))[q][1] == 2


def test_publishing_that_fails_after_the_commit_is_repaired_from_the_store(
    writer: Writer, q: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Publishing the committed values fails halfway (core-2's publish raises, so no core-1 state was
    published): the append is still done with its offset, memory is read back from the store (logged),
    and the next append continues after it. The old code failed the append and kept the old state, so
    the next append signed offset 0 again: a fork of our own queue."""
    first = Append(q, [rec(0)])
    writer.process([first])
    assert (first.error, first.result) == (None, 0)
    assert {"storage.after_commit_failed", "storage.reloaded"} <= set(_events(caplog))
    assert _facts(writer.states[q]) == _stored(writer.path)[q] == (0, 1, writer.states[q].head)
    second = Append(q, [rec(1)])
    writer.process([second])
    assert (second.error, second.result) == (None, 1)
    assert _stored(writer.path)[q][1] == 2


def test_a_failed_read_back_holds_writes_until_it_succeeds(
    writer: Writer, q: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If reading the store back fails too, memory may be stale: the next batch fails with a
    StorageError (nothing is signed from a stale state) and tries the read again first; once it works,
    writes go on from the committed values."""
    monkeypatch.setattr(writer.store, "load", _raises_once(writer.store.load, OSError("read failed")))
    first = Append(q, [rec(0)])
    writer.process([first])
    assert (first.error, first.result) == (None, 0)
    assert "storage.reload_failed" in _events(caplog)
    monkeypatch.setattr(writer.store, "load", _raises_once(writer.store.load, OSError("read failed again")))
    held = Append(q, [rec(1)])
    writer.process([held])
    assert isinstance(held.error, StorageError)
    retried = Append(q, [rec(1)])
    writer.process([retried])
    assert (retried.error, retried.result) == (None, 1)
    assert _stored(writer.path)[q][1] == 2


async def test_a_listener_that_raises_on_the_event_loop_does_not_fail_or_hang_the_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A change listener (replication, groups) that raises on the event loop after the commit: the
    offer still gets its offset (the old code left its waiter unwoken and crashed the run), the other
    jobs' callbacks run, and the next write works."""
    caplog.set_level(logging.INFO, logger="latticed")
    calls = [0]

    def listener(state: QueueState) -> None:
        calls[0] += 1
        if calls[0] == 2:  # the create is the first change, the first append the second
            raise RuntimeError("listener bug")

    async with Engine.open(tmp_path, ALICE, changes=listener) as e:
        q = await e.create_queue("q")
        notified: list[int] = []
        job = e.start_append(q, [rec(0)])
        job.notify = lambda: notified.append(0)
        assert await e.outcome(job) == 0
        assert notified == [0]
        assert "storage.listener_failed" in _events(caplog)
        assert await e.append(q, [rec(1)]) == 1
        assert calls[0] == 3


async def test_a_notify_that_raises_does_not_keep_the_others_from_theirs(tmp_path: Path) -> None:
    """Each job's ``notify`` runs even when an earlier one of the same batch raises."""
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.create_queue("q")
        heard: list[int] = []

        def bad() -> None:
            raise RuntimeError("notify bug")

        hold = e.bridge.hold()
        jobs: list[Job] = [e.start_append(q, [rec(i)]) for i in range(2)]
        jobs[0].notify = bad
        jobs[1].notify = lambda: heard.append(1)
        await trio.to_thread.run_sync(hold.wait_entered)
        hold.release()
        assert [await e.outcome(job) for job in jobs] == [0, 1]
        assert heard == [1]


async def test_a_submitters_fields_are_on_the_job_before_the_storage_thread_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs started inside ``submitting`` carry its notify, prepare and origin when they reach
    ``Writer.submit`` (assigned after the start, the storage thread could read ``prepare`` or ``origin``
    first); jobs started outside it carry none, and the variable is restored on leaving."""
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.create_queue("q")
        seen: list[tuple[object, object, object]] = []
        submit = e._writer.submit

        def watching(job: Job) -> None:
            seen.append((job.notify, job.prepare, job.origin))
            submit(job)

        monkeypatch.setattr(e._writer, "submit", watching)
        heard: list[str] = []

        def notify() -> None:
            heard.append("notify")

        def prepare() -> None:
            heard.append("prepare")

        origin = object()
        with submitting(Submitter(notify, prepare, origin)):
            inside = e.start_append(q, [rec(0)])
        assert SUBMITTER.get() is None
        outside = e.start_append(q, [rec(1)])
        assert seen == [(notify, prepare, origin), (None, None, None)]
        assert [await e.outcome(inside), await e.outcome(outside)] == [0, 1]
        assert "notify" in heard


async def test_a_notify_that_holds_its_job_leaves_no_cycle_behind(tmp_path: Path) -> None:
    """Replication's callback holds the pending merge that holds the job (gossip's partial over it): the
    job drops the callback once called, so reference counting frees them, not the cyclic collector
    (issue 28, gc23: a relay's ~25 cyclic objects a push were the collector's whole work)."""

    class Pending:
        job: Job

    heard: list[int] = []

    def settled(pending: Pending) -> None:
        heard.append(pending.job.result)

    gc.disable()
    try:
        async with Engine.open(tmp_path, ALICE) as e:
            q = await e.create_queue("q")
            pending = Pending()
            pending.job = e.start_append(q, [rec(0)])
            pending.job.notify = functools.partial(settled, pending)
            assert await e.outcome(pending.job) == 0
            gone = weakref.ref(pending)
            del pending
            assert heard == [0] and gone() is None
    finally:
        gc.enable()
