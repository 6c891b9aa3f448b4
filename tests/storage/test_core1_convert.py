"""A core-1 queue converted to core 2 in the store: by its owner (same records and offsets, version 1 of
epoch 1, writable on core 2 after reopening), from the fork point of a forked one (``recover``, with and
without ``--keep-mine``), by a replica receiving the owner's converted queue (its records kept), jobs of
one group commit that meet a conversion, and a kill anywhere in the conversion's commit."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from latticed.crdt import queue as core
from latticed.crdt import queue2
from latticed.crdt.queue2.from_core1 import CONVERTED_EPOCH, fork_point
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import ForkedQueueError, NotOwnerError, OtherCoreError
from latticed.net.core2_engine_host import ConvertMerge2
from latticed.storage.core1_convert import ConversionBusyError, UpgradeQueue
from latticed.storage.core2_jobs import Commit2
from latticed.storage.jobs import Append, CreateQueue, Merge
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


def rec(tag: str, i: int) -> Record:
    return make_record(f"{tag}{i}".encode() * 10, timestamp=NOW + i)


def writer_at(path: Path, identity: Identity = ALICE) -> Writer:
    path.mkdir(exist_ok=True)
    w = Writer(db_path(path), identity, clock=lambda: NOW)
    w.open()
    return w


def run(w: Writer, *jobs: object) -> None:
    w.process(list(jobs))  # type: ignore[arg-type]
    for job in jobs:
        assert job.error is None, job.error  # type: ignore[attr-defined]


def owner_store(path: Path, count: int = 25) -> int:
    w = writer_at(path)
    try:
        create = CreateQueue("q", {"team": "x"})
        run(w, create)
        q: int = create.result
        run(w, Append(q, [rec("a", i) for i in range(count - 5)]))
        run(w, Append(q, [rec("b", i) for i in range(5)]))
        return q
    finally:
        w.stop()


def test_the_owner_converts_its_queue_with_its_records_and_offsets(tmp_path: Path) -> None:
    q = owner_store(tmp_path / "o")
    w = writer_at(tmp_path / "o")
    before = w.states[q]
    assert fork_point(before) is None  # not forked: converted whole
    records, chain = before.entries.records(), [before.chain_at(i) for i in range(26)]
    job = UpgradeQueue(q)
    run(w, job)
    assert job.result == (0, 25)
    assert q not in w.states and w.lookup(before.queue_id) is None
    state = w.core2.committed(q)
    assert state.chains.epoch == CONVERTED_EPOCH and state.chains.tips[0].head.version == 1
    assert not state.forked
    assert state.records() == records and [state.chain_at(i) for i in range(26)] == chain
    assert state.meta == before.meta
    w.stop()
    w = writer_at(tmp_path / "o")  # reopened: a core-2 queue, writable there, offsets going on
    try:
        assert q not in w.states and w.core2.committed_q(before.queue_id) == q
        commit = Commit2(q, [rec("c", 0)])
        run(w, commit)
        assert commit.result == 25 and w.core2.committed(q).held == (0, 26)
        assert w.core2.committed(q).records()[:25] == records
    finally:
        w.stop()


def test_a_conversion_and_core1_writes_in_one_group_commit(tmp_path: Path) -> None:
    q = owner_store(tmp_path / "o")
    w = writer_at(tmp_path / "o")
    try:
        first, upgrade = Append(q, [rec("x", 0)]), UpgradeQueue(q)
        w.process([first, upgrade])  # staged on core 1 first: the conversion waits for the next commit
        assert first.error is None and isinstance(upgrade.error, ConversionBusyError)
        upgrade, late = UpgradeQueue(q), Append(q, [rec("y", 0)])
        w.process([upgrade, late])  # converted first: a core-1 write after it fails alone
        assert upgrade.error is None and isinstance(late.error, OtherCoreError)
        assert w.core2.committed(q).held == (0, 26)
    finally:
        w.stop()


def test_only_the_owner_converts_and_a_forked_queue_needs_recover(tmp_path: Path) -> None:
    q = owner_store(tmp_path / "o")
    owner = writer_at(tmp_path / "o")
    replica = writer_at(tmp_path / "r", BOB)
    try:
        d = core.delta(owner.states[q], None)
        merge = Merge(core.verify_delta(core.empty_state(ALICE.public_key, "q"), d))
        run(replica, merge)
        job = UpgradeQueue(merge.result)
        replica.process([job])
        assert isinstance(job.error, NotOwnerError)
    finally:
        owner.stop()
        replica.stop()


def forked_owner(tmp_path: Path) -> tuple[Writer, int]:
    """The owner's store and a copy of it both write past 20 shared records; the copy's history reaches
    the owner, whose core-1 queue is then forked."""
    q = owner_store(tmp_path / "o", count=20)
    shutil.copytree(tmp_path / "o", tmp_path / "copy")
    copy = writer_at(tmp_path / "copy")
    run(copy, Append(q, [rec("copy", i) for i in range(3)]))
    theirs = core.delta(copy.states[q], None)
    copy.stop()
    owner = writer_at(tmp_path / "o")
    run(owner, Append(q, [rec("own", i) for i in range(5)]))
    run(owner, Merge(core.verify_delta(core.empty_state(ALICE.public_key, "q"), theirs)))
    assert owner.states[q].forked
    return owner, q


@pytest.mark.parametrize("keep_mine", [False, True])
def test_a_forked_core1_queue_is_recovered_on_core2_from_its_fork_point(
    tmp_path: Path, keep_mine: bool
) -> None:
    owner, q = forked_owner(tmp_path)
    try:
        held = owner.states[q]
        own = held.entries.records()
        refused = UpgradeQueue(q)
        owner.process([refused])
        assert isinstance(refused.error, ForkedQueueError)
        job = UpgradeQueue(q, recover=True, keep_mine=keep_mine)
        run(owner, job)
        state = owner.core2.committed(q)
        assert state.chains.epoch == 1 and not state.forked
        lo, hi = state.held
        first_head = state.chains.shared[0][1] if state.chains.shared else state.chains.tips[0].head.end
        # The new epoch vouches for records both histories share (20), from a head the owner kept.
        assert lo == 0 and 0 < first_head <= 20
        assert state.records()[:first_head] == own[:first_head]
        if keep_mine:  # what it held past the fork point, written again in the new epoch
            assert hi == held.held_end and state.records()[first_head:] == own[first_head:]
        else:
            assert hi == first_head
            evidence = queue2_evidence(owner, q)
            assert evidence == own[first_head:]
        commit = Commit2(q, [rec("new", 0)])
        run(owner, commit)  # writable again
        assert commit.result == hi
    finally:
        owner.stop()


def queue2_evidence(w: Writer, q: int) -> list[Record]:
    from latticed.storage.core2_store import evidence  # noqa: PLC0415

    return evidence(w.store.connection, q).records(0)


def test_a_replica_holding_the_core1_queue_converts_on_the_owners_core2_delta(tmp_path: Path) -> None:
    q = owner_store(tmp_path / "o")
    owner = writer_at(tmp_path / "o")
    replica = writer_at(tmp_path / "r", BOB)
    try:
        d = core.delta(owner.states[q], None)
        merge = Merge(core.verify_delta(core.empty_state(ALICE.public_key, "q"), d))
        run(replica, merge)
        rq = merge.result
        rows = "SELECT first, count, chains FROM segments WHERE q = ? AND first < 25 ORDER BY first"
        kept_rows = replica.store.connection.execute(rows, (rq,)).fetchall()
        run(owner, UpgradeQueue(q))
        run(owner, Commit2(q, [rec("n", i) for i in range(4)]))
        theirs = owner.core2.committed(q)
        # The owner's converted queue in two chunks, as its peer sends it to one that names none.
        first = queue2.delta(theirs, None, max_records=25)
        assert first.from_offset == 0 and len(first.records) == 25
        job = ConvertMerge2(first, None)
        run(replica, job)
        assert job.result.changed and rq not in replica.states
        state = replica.core2.committed(rq)
        assert state.held == (0, 25) and state.records() == theirs.records()[:25]
        assert replica.store.connection.execute(rows, (rq,)).fetchall() == kept_rows  # kept, not rewritten
        rest = queue2.delta(theirs, queue2.summary(state))
        run(replica, ConvertMerge2(rest, None))
        assert replica.core2.committed(rq).chains == theirs.chains
        assert replica.core2.committed(rq).records() == theirs.records()
        # A 0.2.0 peer's core-1 delta of it is acknowledged and not merged (the link goes on).
        late = Merge(core.verify_delta(core.empty_state(ALICE.public_key, "q"), d))
        run(replica, late)
        assert not late.changed and late.summary is not None and late.summary.held_end == 25
        assert replica.core2.committed(rq).records() == theirs.records()
    finally:
        owner.stop()
        replica.stop()


#: Run in a child process: kill the process at one point of the conversion's commit (as kill -9).
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
    "adopt": (core2_store, "adopt"),
    "records": (Store, "write_entries"),
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


def core_of(path: Path, q: int) -> tuple[int, list[Record]]:
    w = writer_at(path)
    try:
        if q in w.states:
            return 1, w.states[q].entries.records()
        return 2, w.core2.committed(q).records()
    finally:
        w.stop()


def test_a_kill_anywhere_in_a_conversion_leaves_the_core1_or_the_core2_queue(tmp_path: Path) -> None:
    owner, q = forked_owner(tmp_path)
    own = owner.states[q].entries.records()
    owner.stop()
    base = tmp_path / "o"
    jobs_file = tmp_path / "jobs.pickle"
    jobs_file.write_bytes(pickle.dumps([UpgradeQueue(q, recover=True)]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for point in ("adopt", "records", "bodies", "evidence", "before-commit", "after-commit"):
        killed = tmp_path / f"killed-{point}"
        shutil.copytree(base, killed)
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(killed), point, str(jobs_file)],
            check=False,
            env=env,
            capture_output=True,
        )
        assert child.returncode == 0, (point, child.returncode, child.stderr.decode()[-2000:])
        which, records = core_of(killed, q)
        if point == "after-commit":
            assert which == 2 and records == own[: len(records)] and len(records) < len(own)
        else:
            assert (which, records) == (1, own), point
