"""A full disk, for real: the store on a small tmpfs. Dropping records (a truncation, a retention change)
still commits, using the reserve; the freed pages go back to the file system; ``store compact`` gives
back what is left and converts a store made without incremental auto-vacuum."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clocks import TickingClock

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import StorageError
from latticed.host.retention_policy import MAX_RECORDS_KEY
from latticed.storage.jobs import Append, CreateQueue, Job, SetMeta, Truncate
from latticed.storage.reserve import RESERVE_BYTES, reserve_path
from latticed.storage.space import CompactStore, store_bytes
from latticed.storage.sqlite import wal_path
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000
RECORD_BYTES = 200_000


def rec(i: int, size: int = RECORD_BYTES) -> Record:
    return make_record(os.urandom(size), key=f"k{i}".encode(), timestamp=NOW + i)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (root only: the suite runs as root), unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def run(w: Writer, *jobs: Job) -> list[Job]:
    w.process(list(jobs))
    return list(jobs)


def fill(w: Writer, q: int) -> None:
    """Offer records, large then small, until not even a small one fits."""
    for size in (RECORD_BYTES, 4000, 100):
        for i in range(10_000):
            (job,) = run(w, Append(q, [rec(i, size)]))
            if job.error is not None:
                assert isinstance(job.error, StorageError) and "full" in str(job.error), job.error
                break
        else:
            raise AssertionError("the disk never filled")


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.fixture(params=["sqlite-checkpoints", "checkpoint-thread"])
def full_writer(small_disk: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Writer, int]]:
    """A writer on a full disk; with the checkpoint thread too (paused while the reserve is used)."""
    w = Writer(db_path(small_disk), ALICE, clock=TickingClock(NOW))
    w.open()
    if request.param == "checkpoint-thread":
        w.start_checkpointer(64)
        assert w.checkpointer is not None
    try:
        (create,) = run(w, CreateQueue("fill"))
        q = create.result
        fill(w, q)
        yield w, q
    finally:
        w.stop()


def test_the_reserve_is_written_out_when_the_store_opens(tmp_path: Path) -> None:
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW))
    w.open()
    try:
        reserve = reserve_path(tmp_path).stat()
        assert reserve.st_size == RESERVE_BYTES
        assert reserve.st_blocks * 512 >= RESERVE_BYTES, "the reserve must hold real blocks"
    finally:
        w.stop()


def test_a_truncation_commits_on_a_full_disk_and_gives_the_space_back(
    full_writer: tuple[Writer, int], small_disk: Path
) -> None:
    w, q = full_writer
    state = w.states[q]
    before = store_bytes(db_path(small_disk))  # most of it still in the WAL: no room to checkpoint
    (truncate,) = run(w, Truncate(q, state.held_end - 1))
    assert truncate.error is None
    assert w.states[q].start == state.held_end - 1
    # The freed pages went back to the file system, the WAL was cut, and the reserve is back.
    assert store_bytes(db_path(small_disk)) < before // 4
    assert wal_path(db_path(small_disk)).stat().st_size < RESERVE_BYTES
    assert reserve_path(small_disk).stat().st_size == RESERVE_BYTES
    (append,) = run(w, Append(q, [rec(0)]))
    assert append.error is None, "writes go on once there is room"


def test_a_retention_change_commits_on_a_full_disk(full_writer: tuple[Writer, int]) -> None:
    w, q = full_writer
    for i in range(1000):  # until not even a metadata write of the same size fits
        (meta,) = run(w, SetMeta(q, {"team": f"{i:04}" + "x" * 2000}))
        if meta.error is not None:
            break
    (change,) = run(w, SetMeta(q, {MAX_RECORDS_KEY: "1" + "0" * 2000}))
    assert change.error is None
    assert w.states[q].meta_dict[MAX_RECORDS_KEY].startswith("1")
    # Other metadata is an ordinary write: it may not take the room kept for freeing space.
    (other,) = run(w, SetMeta(q, {"team": "x" * 2000}))
    assert isinstance(other.error, StorageError) and "full" in str(other.error)
    # ... and neither may offers while the reserve is used up: the truncation retention makes next fits.
    (append,) = run(w, Append(q, [rec(1)]))
    assert isinstance(append.error, StorageError) and "full" in str(append.error)
    (truncate,) = run(w, Truncate(q, w.states[q].held_end - 1))
    assert truncate.error is None


def test_a_truncation_in_a_batch_with_offers_commits_alone(full_writer: tuple[Writer, int]) -> None:
    w, q = full_writer
    end = w.states[q].held_end
    append, truncate = run(w, Append(q, [rec(2)]), Truncate(q, end - 2))
    assert isinstance(append.error, StorageError)
    assert truncate.error is None and w.states[q].start == end - 2 and w.states[q].held_end == end


def test_space_freed_by_a_large_truncation_reaches_the_file_system(tmp_path: Path) -> None:
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW))
    w.open()
    try:
        (create,) = run(w, CreateQueue("q"))
        q = create.result
        for i in range(60):
            run(w, Append(q, [rec(i)]))
        big = db_path(tmp_path).stat().st_size
        run(w, Truncate(q, 59))
        while w.maintain(idle=True):
            pass
        assert db_path(tmp_path).stat().st_size < big // 4, "the database file shrank"
    finally:
        w.stop()


def _files(path: Path) -> int:
    return store_bytes(path)


def test_store_compact_converts_a_store_without_incremental_auto_vacuum(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    Store(path).close()
    conn = sqlite3.connect(path)  # as a store made before incremental auto-vacuum was
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    conn.close()
    w = Writer(path, ALICE, clock=TickingClock(NOW))
    w.open()
    try:
        (create,) = run(w, CreateQueue("q"))
        q = create.result
        for i in range(40):
            run(w, Append(q, [rec(i)]))
        run(w, Truncate(q, 39))
        while w.maintain(idle=True):
            pass
        assert w.store.connection.execute("PRAGMA freelist_count").fetchone()[0] > 1000, "kept free pages"
        (compact,) = run(w, CompactStore(w.space))
        assert compact.error is None, compact.error
        result = compact.result
        assert result["vacuumed"] is True and result["freed_bytes"] > 30 * RECORD_BYTES
        assert result["after_bytes"] == _files(path)
        assert w.store.connection.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        assert w.store.connection.execute("PRAGMA freelist_count").fetchone()[0] == 0
        (again,) = run(w, CompactStore(w.space))
        assert again.error is None and again.result["vacuumed"] is False
    finally:
        w.stop()
