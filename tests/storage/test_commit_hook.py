"""Adversarial checks of ``Job.prepare`` (singles22): a batch's jobs are shown to the event loop right
before its ``COMMIT``, with results that look final. What a waiter may send is decided only by ``done``
and ``error``: a COMMIT that fails, a batch retried on a full disk, a job that raises, each ends in what
the commit did, and ``prepare`` never runs once a job is done."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import LatticedError, StorageError
from latticed.storage.batch import Batch
from latticed.storage.bridge import StorageBridge
from latticed.storage.engine import Engine
from latticed.storage.jobs import Append, Call, CreateQueue, Job, Truncate, WriterView
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(f"v{i}".encode(), timestamp=NOW + i)


class FailingCommits:
    """Wraps a store's ``commit``: the next ``count`` COMMITs raise ``error`` (the transaction is then
    rolled back by the writer, as after a real failure) instead of committing. With ``token``, a failing
    COMMIT first lets that event loop run what was queued before it (as a real fsync's time does)."""

    def __init__(
        self, commit: Any, error: Exception, count: int = 1, token: trio.lowlevel.TrioToken | None = None
    ) -> None:
        self._commit, self._error, self.left, self._token = commit, error, count, token
        self.failed = 0

    def __call__(self) -> None:
        if self.left > 0:
            self.left -= 1
            self.failed += 1
            if self._token is not None:
                trio.from_thread.run_sync(lambda: None, trio_token=self._token)
            raise self._error
        self._commit()


@pytest.fixture
def q(writer: Writer) -> int:
    """Queue ``q``, created on the shared ``writer`` (tests/storage/conftest.py)."""
    create = CreateQueue("q", None)
    writer.process([create])
    assert isinstance(create.result, int)
    return create.result


def _full() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database or disk is full")
    exc.sqlite_errorcode = 13  # type: ignore[attr-defined]  # SQLITE_FULL
    return exc


async def test_a_failed_commit_is_answered_by_its_error_though_prepare_saw_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real bridge and storage thread: ``prepare`` runs on the event loop before the jobs are
    done, seeing offsets and no error; the COMMIT then fails and every job ends with a StorageError (no
    offset is durable: the next append gets offset 0 again, and its ``prepare`` also precedes ``done``)."""
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.create_queue("q")
        store = e._writer.store
        failing = FailingCommits(
            store.commit, sqlite3.OperationalError("disk I/O error"), token=trio.lowlevel.current_trio_token()
        )
        monkeypatch.setattr(store, "commit", failing)
        seen: list[tuple[int, bool, object, object]] = []

        def watch(job: Job, n: int) -> None:
            def prepare() -> None:
                seen.append((n, job.done.is_set(), job.error, job.result))

            job.prepare = prepare

        hold = e.bridge.hold()  # the jobs below wait together: one batch
        jobs = [e.start_append(q, [rec(i)]) for i in range(3)]
        for n, job in enumerate(jobs):
            watch(job, n)
        await trio.to_thread.run_sync(hold.wait_entered)
        hold.release()
        for job in jobs:
            with pytest.raises(StorageError, match="disk I/O error"):
                await e.outcome(job)
        assert failing.failed == 1
        # Each job was prepared once, before it was done, from a result that was never committed.
        assert seen == [(0, False, None, 0), (1, False, None, 1), (2, False, None, 2)]
        seen.clear()
        again = e.start_append(q, [rec(9)])
        watch(again, 9)
        assert await e.outcome(again) == 0  # nothing of the failed batch was written
        assert seen == [(9, False, None, 0)]


def test_a_batch_retried_on_a_full_disk_shows_each_try_and_the_dropped_job_keeps_its_error(
    writer: Writer, q: int
) -> None:
    """A COMMIT failing on a full disk is tried again with the jobs that free space alone: the hook hears
    both tries, the first with a result for the append that then fails. The append ends with the error
    and (still) that stale result: a waiter that trusted a result prepared before the COMMIT would ack a
    record that is not on disk, which is why the reply is chosen only once ``done``, by ``error`` first."""
    seed = Append(q, [rec(0), rec(1)])
    writer.process([seed])
    assert seed.error is None
    heard: list[list[tuple[str, object, object]]] = []
    writer.on_committing = lambda jobs: heard.append(
        [(type(job).__name__, job.result, job.error) for job in jobs]
    )
    failing = FailingCommits(writer.store.commit, _full())
    writer.store.commit = failing  # type: ignore[method-assign]
    append, truncate = Append(q, [rec(2)]), Truncate(q, 1)
    writer.process([append, truncate])
    # The first try (then its COMMIT failed), and the second, alone: the truncation frees space.
    assert heard[0] == [("Append", 2, None), ("Truncate", None, None)]
    assert heard[1:] == [[("Truncate", None, None)]]
    assert isinstance(append.error, StorageError) and append.result == 2  # stale, with its error
    assert truncate.error is None and writer.states[q].start == 1 and writer.states[q].held_end == 2


def test_a_job_that_raises_is_shown_with_its_error_and_the_others_commit(writer: Writer, q: int) -> None:
    """A job that raises without changing the batch fails alone: the hook sees it with its error (a
    waiter must not build a success for it) and the others with their results, which then commit."""

    def broken(batch: Batch, view: WriterView) -> None:
        raise RuntimeError("a bug in a job")

    heard: list[list[tuple[object, bool]]] = []
    writer.on_committing = lambda jobs: heard.append([(job.result, job.error is not None) for job in jobs])
    first, bad, last = Append(q, [rec(0)]), Call(broken), Append(q, [rec(1)])
    writer.process([first, bad, last])
    assert heard == [[(0, False), (None, True), (1, False)]]
    assert isinstance(bad.error, LatticedError) and "a bug in a job" in str(bad.error)
    assert (first.error, last.error, writer.states[q].held_end) == (None, None, 2)


def test_each_distinct_prepare_runs_once_per_batch() -> None:
    """A connection's ``prepare`` builds all its jobs' replies in one pass: the bridge calls it once per
    batch however many of its jobs the batch holds (once per job walked its pending jobs n times)."""
    calls: list[object] = []

    class Waiter:
        def prepare(self) -> None:
            calls.append(self)

    one, two = Waiter(), Waiter()
    jobs = [Job() for _ in range(5)]
    for job, waiter in zip(jobs, [one, one, two, None, one], strict=True):
        job.prepare = None if waiter is None else waiter.prepare
    StorageBridge._prepare(jobs)
    assert calls == [one, two]
