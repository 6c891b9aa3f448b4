"""WAL checkpoints run on their own thread, not inside a commit: the WAL is copied back after a commit
past the threshold, a failing checkpoint never stops commits and the WAL stays bounded, the store closes
cleanly with the thread running, and a process killed mid-checkpoint loses no acknowledged write."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.clocks import TickingClock

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.process.logs import EVENT_ATTR, record_fields
from latticed.storage.checkpointer import BUSY_FACTOR, FALLBACK_FACTOR, QUIET_S, Checkpointer, wal_frames
from latticed.storage.jobs import Append, CreateQueue
from latticed.storage.sqlite import WAL_AUTOCHECKPOINT_PAGES
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int, size: int = 200) -> Record:
    return make_record(os.urandom(size), key=f"k{i}".encode(), timestamp=NOW + i)


def new_writer(path: Path, pages: int, quiet_s: float = QUIET_S) -> tuple[Writer, int]:
    writer = Writer(db_path(path), ALICE, clock=TickingClock(NOW))
    writer.open()
    writer.start_checkpointer(pages, quiet_s)
    job = CreateQueue("q")
    writer.process([job])
    return writer, job.result


def append(writer: Writer, q: int, i: int, size: int = 200) -> None:
    job = Append(q, [rec(i, size)])
    writer.process([job])
    assert job.error is None, job.error


def frames(writer: Writer) -> tuple[int, int]:
    read = wal_frames(writer.path)
    assert read is not None
    return read


def test_commits_past_the_working_size_leave_the_checkpoint_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real = Checkpointer._pass

    def held(self: Checkpointer) -> None:
        gate.wait()
        real(self)

    monkeypatch.setattr(Checkpointer, "_pass", held)
    writer, q = new_writer(tmp_path, WAL_AUTOCHECKPOINT_PAGES)
    try:
        assert writer.store.connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        i = 0
        while frames(writer)[0] <= WAL_AUTOCHECKPOINT_PAGES + 64:
            append(writer, q, i, 32_000)
            i += 1
        # SQLite's automatic checkpoint would have copied the WAL inside the commit that passed 4096 pages.
        assert frames(writer)[1] == 0
        checkpointer = writer.checkpointer
        assert checkpointer is not None
        gate.set()
        assert checkpointer.wait_idle(30)
        total, copied = frames(writer)
        assert copied == total and checkpointer.passes >= 1
        append(writer, q, i)
        assert frames(writer)[0] < 64, "the next commit starts the WAL over"
    finally:
        gate.set()
        writer.stop()


def test_the_thread_checkpoints_after_a_commit_past_the_threshold(tmp_path: Path) -> None:
    writer, q = new_writer(tmp_path, 32)
    checkpointer = writer.checkpointer
    assert checkpointer is not None
    try:
        for i in range(400):
            append(writer, q, i)
            assert frames(writer)[0] < FALLBACK_FACTOR * 32 + 16
        assert checkpointer.wait_idle(30)
        assert checkpointer.passes >= 1 and checkpointer.failures == 0
        total, copied = frames(writer)
        assert copied == total or total < 32, "all copied, or started over below the threshold"
    finally:
        writer.stop()


def recording_passes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int]]:
    """Each pass's start: (``time.monotonic()``, frames in the WAL then)."""
    starts: list[tuple[float, int]] = []
    real = Checkpointer._pass

    def recorded(self: Checkpointer) -> None:
        read = wal_frames(self.db)
        starts.append((time.monotonic(), -1 if read is None else read[0]))
        real(self)

    monkeypatch.setattr(Checkpointer, "_pass", recorded)
    return starts


def test_a_burst_is_copied_once_its_commits_pause_not_during_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the working size but short of the busy size, no pass copies beside the commits (on the same
    disk, the other core): one runs once no commit came for ``quiet_s``, and copies the whole burst."""
    starts = recording_passes(monkeypatch)
    writer, q = new_writer(tmp_path, 16, quiet_s=1.0)
    checkpointer = writer.checkpointer
    assert checkpointer is not None
    try:
        i = 0
        while frames(writer)[0] < 3 * 16:
            append(writer, q, i)
            i += 1
        last_commit = time.monotonic()
        assert frames(writer)[0] < BUSY_FACTOR * 16
        assert checkpointer.wait_idle(30)
        assert len(starts) == 1, "one pass for the burst"
        assert starts[0][0] >= last_commit + 0.9, "not before the commits paused"
        total, copied = frames(writer)
        assert copied == total >= 3 * 16
    finally:
        writer.stop()


def test_a_steady_stream_is_copied_at_the_busy_size_without_a_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits that never pause: a pass runs once the WAL reaches the busy size (64 MiB at 4 KiB pages,
    the journal size limit), and the WAL stays short of where the storage thread would copy it itself."""
    starts = recording_passes(monkeypatch)
    writer, q = new_writer(tmp_path, 16, quiet_s=3600.0)
    checkpointer = writer.checkpointer
    assert checkpointer is not None
    try:
        for i in range(2_000):
            append(writer, q, i)
            assert frames(writer)[0] < FALLBACK_FACTOR * 16 + 16
            if checkpointer.passes >= 2:
                break
        assert checkpointer.passes >= 2 and checkpointer.fallbacks == 0
        assert all(at >= BUSY_FACTOR * 16 for _, at in starts), starts
    finally:
        writer.stop()


def test_a_failing_checkpoint_does_not_stop_commits_and_the_wal_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="latticed")

    def broken(self: Checkpointer) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Checkpointer, "_pass", broken)
    writer, q = new_writer(tmp_path, 16)
    checkpointer = writer.checkpointer
    assert checkpointer is not None
    try:
        for i in range(300):
            append(writer, q, i)
            assert frames(writer)[0] < FALLBACK_FACTOR * 16 + 16, "the storage thread falls back"
        assert checkpointer.wait_idle(30)
        assert checkpointer.failures >= 1 and checkpointer.fallbacks >= 1
        failed = [
            record_fields(r)
            for r in caplog.records
            if getattr(r, EVENT_ATTR, None) == "storage.checkpoint_failed"
        ]
        assert failed and failed[0]["error"] == "disk I/O error"
        assert any(getattr(r, EVENT_ATTR, None) == "storage.checkpoint_fallback" for r in caplog.records)
        (state,) = writer.states.values()
        assert state.held_end - state.start == 300
    finally:
        writer.stop()


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "latticed-checkpoint"]


def test_the_store_closes_cleanly_with_the_checkpointer_running(tmp_path: Path) -> None:
    writer = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW))
    writer.start()
    checkpointer = writer.checkpointer
    assert checkpointer is not None and len(_checkpoint_threads()) == 1
    checkpointer.pages = 8  # so passes run while the jobs below commit
    create = CreateQueue("q")
    writer.submit(create)
    writer.stop()  # finishes the queued job, closes the checkpointer, then the store
    assert writer.checkpointer is None and not _checkpoint_threads()
    writer = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW))
    writer.open()
    try:
        (q,) = writer.states
        assert q == create.result
    finally:
        writer.stop()


#: Commits records one by one with the checkpoint thread copying them back every 16 pages; prints each
#: record's number once its commit returned (acknowledged) and "pass" as each checkpoint starts.
CHILD = """
import os, sys
from pathlib import Path
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.storage.checkpointer import Checkpointer
from latticed.storage.jobs import Append, CreateQueue
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

real = Checkpointer._pass
def announced(self):
    os.write(1, b"pass\\n")  # one write each: the two threads' lines never mix
    real(self)
Checkpointer._pass = announced
writer = Writer(db_path(Path(sys.argv[1])), Identity.from_seed(b"a" * 32))
writer.open()
writer.start_checkpointer(16)
create = CreateQueue("q")
writer.process([create])
for i in range(1_000_000):
    record = make_record(os.urandom(3000), key=str(i).encode(), timestamp=1_700_000_000_000 + i)
    job = Append(create.result, [record])
    writer.process([job])
    assert job.error is None, job.error
    os.write(1, b"%d\\n" % i)
"""


def test_a_kill_mid_checkpoint_loses_no_acknowledged_write(tmp_path: Path) -> None:
    src = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(src)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    acked = -1
    passes = 0
    for line in child.stdout:
        word = line.strip()
        if word == "pass":
            passes += 1
            if passes == 5:
                child.send_signal(signal.SIGKILL)  # while that checkpoint copies
                break
        else:
            acked = int(word)
    child.wait()
    assert passes == 5 and acked > 0
    writer = Writer(db_path(tmp_path), ALICE)
    writer.open()
    try:
        (state,) = writer.states.values()
        assert state.held_end - state.start >= acked + 1
        assert writer.store.connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        writer.stop()


def test_the_thread_stays_paused_while_the_disk_full_reserve_is_used(tmp_path: Path) -> None:
    writer, _ = new_writer(tmp_path, 8)
    checkpointer = writer.checkpointer
    assert checkpointer is not None
    other = sqlite3.connect(writer.path, isolation_level=None)
    try:
        assert writer.space.release(writer.store) > 0  # as after a commit failed on a full disk
        for i in range(40):  # a WAL past the threshold (and past the fallback's)
            other.execute(
                "INSERT OR REPLACE INTO settings (name, value) VALUES (?, ?)", (f"s{i}", "x" * 3000)
            )
        assert frames(writer)[0] > FALLBACK_FACTOR * 8
        checkpointer.after_commit(writer.store.connection)
        assert checkpointer.wait_idle(30)
        assert checkpointer.passes == 0 and checkpointer.fallbacks == 0, "space.py owns checkpoints"
        assert frames(writer)[1] == 0
        assert writer.space.restore(writer.store)
        checkpointer.after_commit(writer.store.connection)
        assert checkpointer.wait_idle(30)
        assert checkpointer.passes + checkpointer.fallbacks == 1
    finally:
        other.close()
        writer.stop()


def test_a_steady_stream_wakes_the_thread_once_per_pass_not_per_commit(tmp_path: Path) -> None:
    """Past the working size, short of the busy size, with no pause: the first commit asks for a pass
    and wakes the thread; the commits after it do not wake it again (it re-reads the WAL itself)."""
    writer, q = new_writer(tmp_path, 64, quiet_s=3600.0)
    checkpointer = writer.checkpointer
    assert checkpointer is not None
    try:
        i = 0
        while frames(writer)[0] < 64:
            append(writer, q, i)
            i += 1
        assert checkpointer.wakeups <= 1
        past = 0
        while frames(writer)[0] < (BUSY_FACTOR - 1) * 64:
            append(writer, q, i)
            i += 1
            past += 1
        assert past >= 10, "enough commits between the working and the busy size to tell"
        assert checkpointer.wakeups == 1, checkpointer.wakeups
        assert checkpointer.passes == 0, "still waiting for a pause or the busy size"
    finally:
        writer.stop()


def test_commits_read_the_wal_index_without_opening_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``-shm`` is held open from the start: a commit reads its header with one pread (no open and
    close, which would also drop the process's POSIX locks on it)."""
    writer, q = new_writer(tmp_path, 16, quiet_s=3600.0)
    opened: list[str] = []
    real_open = os.open

    def counting(path: str, *args: int, **kwargs: int) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    try:
        monkeypatch.setattr(os, "open", counting)
        for i in range(40):
            append(writer, q, i)
        monkeypatch.setattr(os, "open", real_open)
        assert not [path for path in opened if path.endswith("-shm")], opened
        checkpointer = writer.checkpointer
        assert checkpointer is not None and checkpointer.wakeups >= 1, "the index was read and acted on"
    finally:
        monkeypatch.setattr(os, "open", real_open)
        writer.stop()
