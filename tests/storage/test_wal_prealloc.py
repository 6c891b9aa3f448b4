"""The WAL is written out to its working size when the store opens, so commits overwrite it in place; only
an empty WAL is ever touched, a crash at any point loses nothing, and a full disk only costs the speed-up."""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

import pytest
from support.clocks import TickingClock

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage import sqlite as sqlite_module
from latticed.storage.jobs import Append, CreateQueue
from latticed.storage.sqlite import (
    WAL_AUTOCHECKPOINT_PAGES,
    connect,
    preallocate_wal,
    wal_path,
)
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000
PAGE = 4096
WORKING_SIZE = 32 + WAL_AUTOCHECKPOINT_PAGES * (24 + PAGE)


def rec(i: int) -> Record:
    return make_record(f"value {i}".encode(), key=f"k{i}".encode(), timestamp=NOW + i)


def write_records(path: Path, count: int, *, close: bool = True) -> tuple[Writer, int]:
    """A writer on the store at ``path`` that committed ``count`` more records to its one queue (made on
    first use), one per commit."""
    writer = Writer(path, ALICE, clock=TickingClock(NOW))
    writer.open()
    if writer.states:
        (q,) = writer.states
    else:
        job = CreateQueue("q")
        writer.process([job])
        q = job.result
    for i in range(count):
        append = Append(q, [rec(i)])
        writer.process([append])
        assert append.error is None
    if close:
        writer.store.close()
    return writer, q


def stored_values(path: Path) -> list[bytes]:
    writer = Writer(path, ALICE, clock=TickingClock(NOW))
    writer.open()
    try:
        (q,) = writer.states
        state = writer.states[q]
        rows = [writer.store.rows.record(q, offset) for offset in range(state.start, state.held_end)]
        return [row.value for row in rows if row is not None]
    finally:
        writer.store.close()


def test_a_store_opens_with_its_wal_written_out_to_the_working_size(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    store = Store(path)
    try:
        wal = wal_path(path).stat()
        assert wal.st_size == WORKING_SIZE
        assert wal.st_blocks * 512 >= WORKING_SIZE, "the WAL must be written, not sparse"
    finally:
        store.close()


def test_commits_after_preallocation_reopen_intact(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    write_records(path, 50)
    assert stored_values(path) == [f"value {i}".encode() for i in range(50)]
    # A second start writes the (deleted at close) WAL out again and keeps every record.
    write_records(path, 0)
    assert len(stored_values(path)) == 50


def test_a_crash_after_preallocation_loses_nothing(tmp_path: Path) -> None:
    """The files as a crash would leave them (copied while the writer is open, after each of: the
    preallocation alone, and commits into the preallocated WAL) open with every committed record."""
    path = db_path(tmp_path / "live")
    path.parent.mkdir()
    write_records(path, 20)
    writer, q = write_records(path, 0, close=False)  # reopened: WAL zero-filled, no frame yet
    try:
        assert wal_path(path).stat().st_size == WORKING_SIZE
        crashed_early = tmp_path / "early"
        crashed_early.mkdir()
        for source in (path, wal_path(path)):
            shutil.copy(source, crashed_early / source.name)
        for i in range(20, 30):
            append = Append(q, [rec(i)])
            writer.process([append])
            assert append.error is None
        crashed_late = tmp_path / "late"
        crashed_late.mkdir()
        for source in (path, wal_path(path)):
            shutil.copy(source, crashed_late / source.name)
    finally:
        writer.store.close()
    assert len(stored_values(db_path(crashed_early))) == 20
    assert stored_values(db_path(crashed_late)) == [f"value {i}".encode() for i in range(30)]


def test_a_wal_still_in_use_is_left_alone(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    conn = connect(path, writer=True)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    reader = sqlite3.connect(str(path), isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 1  # holds a WAL snapshot
        conn.execute("INSERT INTO t VALUES (2)")  # frames the checkpoint may not cut away
        before = wal_path(path).read_bytes()
        assert preallocate_wal(conn, path) == 0
        assert wal_path(path).read_bytes() == before
        reader.execute("COMMIT")
        assert preallocate_wal(conn, path) == WORKING_SIZE
        assert reader.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    finally:
        reader.close()
        conn.close()


def test_a_full_disk_leaves_the_wal_empty_and_the_store_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    real_pwrite = sqlite_module.os.pwrite

    def pwrite_until_full(fd: int, data: bytes, offset: int) -> int:
        nonlocal calls
        calls += 1
        if calls > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    path = db_path(tmp_path)
    Store(path).close()
    monkeypatch.setattr(sqlite_module.os, "pwrite", pwrite_until_full)
    conn = connect(path, writer=True)
    try:
        with pytest.raises(OSError, match="No space"):
            preallocate_wal(conn, path)
        assert wal_path(path).stat().st_size == 0, "the space written before the failure is given back"
    finally:
        conn.close()
    # The store itself opens and commits regardless; only the speed-up is lost.
    calls = 0
    write_records(path, 5)
    monkeypatch.undo()
    assert len(stored_values(path)) == 5
