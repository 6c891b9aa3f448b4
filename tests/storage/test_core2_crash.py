"""A process killed at any point of a core-2 group commit (``os._exit``: no rollback, no close, as
``kill -9`` leaves it) reopens to the value before it or after it, never a mix: killed anywhere inside
the transaction, the old value; killed after ``COMMIT`` returned, the new one."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from latticed.crdt import queue2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage.core2_jobs import Commit2, CreateQueue2, Merge2, Truncate2
from latticed.storage.jobs import Job
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000
Q = 1

#: Run in a child process: open the store, patch one point of the write path to kill the process
#: there, run the pickled jobs. Exit 0: killed at the point; 3: the point was never reached.
CHILD = """
import os, pickle, sys
from pathlib import Path
from latticed.crdt.signing import Identity
from latticed.storage import core2_store
from latticed.storage.store import Store, db_path
from latticed.storage.writer import Writer

data_dir, point, jobs_file = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def kill_after(fn):
    def wrapped(*args, **kwargs):
        fn(*args, **kwargs)
        os._exit(0)
    return wrapped

def kill_before(fn):
    def wrapped(*args, **kwargs):
        os._exit(0)
    return wrapped

where, name = {
    "records": (Store, "write_entries"),
    "leaves": (core2_store, "_persist_leaves"),
    "bodies": (core2_store, "_persist_bodies"),
    "evidence": (core2_store, "add_evidence"),
    "before-commit": (Store, "commit"),
    "after-commit": (Store, "commit"),
}[point]
patch = kill_before if point == "before-commit" else kill_after
setattr(where, name, patch(getattr(where, name)))
writer = Writer(db_path(data_dir), Identity.from_seed(b"a" * 32), clock=lambda: NOW_MS)
writer.open()
writer.process(pickle.loads(Path(jobs_file).read_bytes()))
os._exit(3)
""".replace("NOW_MS", str(NOW))


def rec(tag: str, i: int) -> Record:
    return make_record(f"{tag}{i}".encode() * 20, key=b"k", timestamp=NOW + i)


def writer_at(path: Path) -> Writer:
    w = Writer(db_path(path), ALICE, clock=lambda: NOW)
    w.open()
    return w


def value_at(path: Path) -> tuple[object, ...]:
    w = writer_at(path)
    try:
        state = w.core2.committed(Q)
        return (state.chains, state.meta, state.records(), state.bodies)
    finally:
        w.stop()


def base_store(path: Path) -> None:
    """The owner's queue: three heads of records, metadata."""
    path.mkdir()
    w = writer_at(path)
    try:
        for job in (
            CreateQueue2("q"),
            Commit2(Q, [rec("a", i) for i in range(30)]),
            Commit2(Q, [], {"m": "1"}),
        ):
            w.process([job])
            assert job.error is None, job.error
        for i in range(3):
            w.process([Commit2(Q, [rec("b", i)])])
    finally:
        w.stop()


def forking_delta(base: Path, tmp_path: Path) -> Merge2:
    """A copy of the owner's store writes other records: its delta, merged by the owner, forks it."""
    copy = tmp_path / "fork-copy"
    shutil.copytree(base, copy)
    w = writer_at(copy)
    try:
        w.process([Commit2(Q, [rec("c", i) for i in range(4)])])
        return Merge2(queue2.delta(w.core2.committed(Q), None))
    finally:
        w.stop()


SCENARIOS: dict[str, tuple[tuple[str, ...], Callable[[Path, Path], list[Job]]]] = {
    "commit": (
        ("records", "leaves", "bodies", "before-commit", "after-commit"),
        lambda base, tmp: [
            Commit2(Q, [rec("n", i) for i in range(40)]),
            Commit2(Q, [rec("m", 0)], {"m": "2"}),
        ],
    ),
    "truncate": (
        ("records", "leaves", "bodies", "before-commit", "after-commit"),
        lambda base, tmp: [Truncate2(Q, 31), Commit2(Q, [rec("t", 0)])],
    ),
    "fork": (
        ("records", "leaves", "bodies", "evidence", "before-commit", "after-commit"),
        lambda base, tmp: [Commit2(Q, [rec("o", i) for i in range(2)]), forking_delta(base, tmp)],
    ),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_kill_anywhere_in_a_core2_commit_leaves_the_old_or_the_new_value(
    tmp_path: Path, scenario: str
) -> None:
    base = tmp_path / "base"
    base_store(base)
    points, make_jobs = SCENARIOS[scenario]
    jobs_file = tmp_path / "jobs.pickle"
    jobs_file.write_bytes(pickle.dumps(make_jobs(base, tmp_path)))
    old = value_at(base)
    whole = tmp_path / "whole"
    shutil.copytree(base, whole)
    w = writer_at(whole)
    jobs = pickle.loads(jobs_file.read_bytes())
    w.process(jobs)
    assert all(job.error is None for job in jobs), [job.error for job in jobs]
    w.stop()
    new = value_at(whole)
    assert new != old
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for point in points:
        killed = tmp_path / f"killed-{point}"
        shutil.copytree(base, killed)
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(killed), point, str(jobs_file)],
            check=False,
            env=env,
            capture_output=True,
        )
        assert child.returncode == 0, (point, child.returncode, child.stderr.decode()[-2000:])
        assert value_at(killed) == (new if point == "after-commit" else old), point
