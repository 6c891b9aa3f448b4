"""Two replica stores side by side, one merging with the batched fresh path and one with the generic
path (``Core2Queues.fresh_batched`` on and off), and what the tests of :mod:`latticed.storage.core2_fresh`
compare between them: every table's rows and each queue's value."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from hypothesis import strategies as st

from latticed.crdt import queue2, wire
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.net.core2_engine_host import MergeSteps2
from latticed.protocol import core2_wire
from latticed.protocol.core2_steps import outgoing
from latticed.storage import timeindex
from latticed.storage.core2_jobs import Merge2
from latticed.storage.jobs import Job
from latticed.storage.store import db_path
from latticed.storage.writer import Writer
from support.writer_jobs import ok

OWNER = Identity.from_seed(b"o" * 32)
REPLICA = Identity.from_seed(b"r" * 32)
NOW = 1_700_000_000_000
#: Every table a core-2 queue has rows in, read in key order (bodies2 is a rowid table: not the rowid).
TABLES = {
    "queues": "SELECT * FROM queues ORDER BY q",
    "queue2": "SELECT * FROM queue2 ORDER BY q",
    "segments": "SELECT * FROM segments ORDER BY q, first",
    "times": "SELECT * FROM times ORDER BY q, first",
    "leaves2": "SELECT * FROM leaves2 ORDER BY q, idx",
    "bodies2": "SELECT q, end_off, version, last_end, last_version, steps_from, bodies FROM bodies2 "
    "ORDER BY q, end_off, version, bodies",
    "evidence2": "SELECT * FROM evidence2 ORDER BY q, first",
}


def rec(i: int, tag: bytes = b"v") -> Record:
    return make_record(tag + b"%d" % i, key=b"k%d" % (i % 2), timestamp=1000 + 7 * i)


def single_offers(name: str, count: int, meta: dict[str, str | None] | None = None) -> QueueState2:
    """An owner's queue of ``count`` single offers (a head each), with ``meta`` signed first."""
    state = queue2.commit(queue2.empty_state(OWNER.public_key, name), OWNER, now_ms=1, meta_updates=meta)
    for i in range(count):
        state = queue2.commit(state, OWNER, now_ms=10 + i, records=[rec(i)])
    return state


def as_wire(state: QueueState2, since: queue2.Summary | None = None, chunk: int = 4096) -> MergeSteps2:
    """``state``'s delta as a replica decodes it (records a run, bodies as steps)."""
    out = outgoing(state, since, chunk, 1 << 20)
    raw = wire.pack(core2_wire.delta_to_wire(out.delta, out.steps))
    return MergeSteps2(*core2_wire.delta_from_wire(wire.unpack(raw)))


def open_writer(path: Path, *, batched: bool) -> Writer:
    path.mkdir(exist_ok=True)
    w = Writer(db_path(path), REPLICA, clock=lambda: NOW)
    w.open()
    w.core2.fresh_batched = batched
    return w


@contextlib.contextmanager
def open_pair(root: Path) -> Iterator[tuple[Writer, Writer]]:
    """The batched store (``root/new``) and the generic one (``root/old``), stopped on the way out."""
    new, old = open_writer(root / "new", batched=True), open_writer(root / "old", batched=False)
    try:
        yield new, old
    finally:
        new.stop()
        old.stop()


def dump(w: Writer) -> dict[str, list[tuple[object, ...]]]:
    conn = w.store.connection
    return {table: conn.execute(sql).fetchall() for table, sql in TABLES.items()}


def value(state: QueueState2) -> tuple[object, ...]:
    return (
        state.name,
        state.chains,
        state.meta,
        state.held,
        state.records(),
        [state.entries.chain(i) for i in range(len(state.entries))],
        tuple(b.to_bytes() for b in state.bodies),
    )


def values(w: Writer) -> dict[str, tuple[object, ...]]:
    return {w.core2.committed(q).name: value(w.core2.committed(q)) for q in w.core2.queues()}


def copy(job: Job) -> Job:
    """A merge job again, unrun (a job is run once)."""
    if isinstance(job, MergeSteps2):
        return MergeSteps2(job.delta, job.steps)
    assert isinstance(job, Merge2)
    return Merge2(job.delta)


def merge_both(pair: tuple[Writer, Writer], jobs: Sequence[Sequence[Job]]) -> None:
    """Each of ``jobs`` (a list of job lists, one a group commit) run on both stores, in the same order."""
    for w in pair:
        for batch in jobs:
            ok(w, *[copy(job) for job in batch])


def small(w: Writer) -> dict[int, tuple[int, int]]:
    """The store's runs of small segments per queue (what it compacts next)."""
    return dict(w.store._small)


def tails(w: Writer) -> dict[int, tuple[int, int] | None]:
    """The time index's last rows the store remembers (what its next appends read instead)."""
    return dict(w.store._tails._last)


def assert_same(pair: tuple[Writer, Writer], tmp_path: Path, *, memory: bool = True) -> None:
    """Both stores hold the same values and rows (and, with ``memory``, will compact alike)."""
    new, old = pair
    assert values(new) == values(old) and values(new)
    assert dump(new) == dump(old)
    if memory:
        assert small(new) == small(old)
    assert tails(new) == tails(old)
    for q in old.core2.queues():
        for ts in (0, 1000, 1014, 1021, 1035, 99_999):
            conns = (new.store.connection, old.store.connection)
            assert timeindex.segment_reaching(conns[0], q, ts) == timeindex.segment_reaching(conns[1], q, ts)
    expected = values(old)
    for name in ("new", "old"):
        again = Writer(db_path(tmp_path / name), REPLICA, clock=lambda: NOW)
        again.open()
        try:
            assert values(again) == expected
        finally:
            again.stop()


@st.composite
def catch_ups(draw: st.DrawFn, *, off_the_wire: bool) -> list[list[Job]]:
    """Owners' queues of drawn shapes (commits of drawn sizes, maybe metadata, maybe truncated), each sent
    in chunks of a drawn size as a catch-up sends them (``off_the_wire``: as a replica decodes them,
    records a run and bodies as steps), the chunks of all queues interleaved (each queue's in order) and
    cut into group commits at drawn points."""
    per_queue: list[list[Job]] = []
    for n in range(draw(st.integers(1, 3))):
        meta = draw(st.sampled_from([None, {"team": "shop"}]))
        state = queue2.commit(
            queue2.empty_state(OWNER.public_key, f"q{n}"), OWNER, now_ms=1, meta_updates=meta
        )
        count = 0
        for size in draw(st.lists(st.integers(1, 12), min_size=1, max_size=4)):
            state = queue2.commit(
                state, OWNER, now_ms=10 + count, records=[rec(count + i) for i in range(size)]
            )
            count += size
        if draw(st.booleans()) and count > 1:
            state = queue2.truncate(state, OWNER, draw(st.integers(1, count - 1)), now_ms=90)
        chunk = draw(st.integers(1, count))
        held = queue2.empty_state(OWNER.public_key, state.name)
        jobs: list[Job] = []
        while held.held[1] < state.held[1] or not jobs:
            since = queue2.summary(held) if jobs else None
            d = queue2.delta(state, since, max_records=chunk)
            held = queue2.join_verified(held, queue2.verify_delta(held, d)).state
            jobs.append(as_wire(state, since, chunk) if off_the_wire else Merge2(d))
        per_queue.append(jobs)
    order = draw(st.permutations([i for i, jobs in enumerate(per_queue) for _ in jobs]))
    taken = [iter(jobs) for jobs in per_queue]
    flat = [next(taken[i]) for i in order]
    cuts = sorted(draw(st.sets(st.integers(1, len(flat) - 1), max_size=3)) if len(flat) > 1 else [])
    return [flat[a:b] for a, b in zip([0, *cuts], [*cuts, len(flat)], strict=True)]
