"""Review of the batched fresh-queue merge (:mod:`latticed.storage.core2_fresh`): the same deltas merged
with ``fresh_batched`` on and off leave the same values, rows and writer memory (the store's runs of
small segments: what it compacts next), for deltas that change the staged first value in the same group
commit (a truncation, a fork), for chunked deltas off the wire, and after a failed write; forged deltas
are refused and leave nothing."""

from __future__ import annotations

import dataclasses
import sqlite3
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from support.fresh_paths import (
    OWNER,
    REPLICA,
    as_wire,
    assert_same,
    catch_ups,
    copy,
    dump,
    merge_both,
    open_pair,
    rec,
    single_offers,
    small,
    tails,
    value,
)
from support.writer_jobs import ok

from latticed.crdt import queue2
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue2 import Delta, QueueState2
from latticed.crdt.records import Record, make_record
from latticed.errors import LatticedError, NotFoundError
from latticed.storage import core2_fresh, core2_store
from latticed.storage.batch import Batch
from latticed.storage.core2_jobs import DropQueue2, Merge2, Merged2
from latticed.storage.core2_queues import core2_of
from latticed.storage.jobs import Job, WriterView
from latticed.storage.store import Store
from latticed.storage.writer import Writer


def held_after(state: QueueState2, *deltas: Delta) -> QueueState2:
    """What a replica holding nothing holds after joining ``deltas`` (as the event loop would)."""
    held = queue2.empty_state(state.owner, state.name)
    for d in deltas:
        held = queue2.join_verified(held, queue2.verify_delta(held, d)).state
    return held


def grow(pair: tuple[Writer, Writer], state: QueueState2, commits: int) -> QueueState2:
    """The owner's next ``commits`` single offers, merged one a group commit on both stores."""
    for i in range(commits):
        grown = queue2.commit(state, OWNER, now_ms=500 + i, records=[rec(300 + i)])
        merge_both(pair, [[Merge2(queue2.delta(grown, queue2.summary(state)))]])
        state = grown
    return state


# ---------------------------------------------------------------------- a staged value changed in the batch
def test_a_first_chunk_then_the_owners_truncation_in_one_group_commit(
    pair: tuple[Writer, Writer], tmp_path: Path
) -> None:
    """The first chunk is placed from 0, the next delta (the owner truncated meanwhile) cuts it to 3 in
    the same group commit: the generic path appended the run to the queue's stored one (a run of small
    segments from 3 begins), so the store must compact the later single offers from the same offsets."""
    owner = single_offers("t", 8)
    first = queue2.delta(owner, None, max_records=5)
    cut = queue2.truncate(owner, OWNER, 3, now_ms=50)
    then = queue2.delta(cut, queue2.summary(held_after(owner, first)))
    assert then.records and then.log is not None
    merge_both(pair, [[Merge2(first), Merge2(then)]])
    q = pair[1].core2.find(owner.queue_id)
    assert q is not None and pair[1].core2.committed(q).held == (3, 8)
    grow(pair, cut, 33)  # past a compaction of 32 small segments
    assert_same(pair, tmp_path)


def test_a_truncated_queue_placed_then_forked_in_one_group_commit(
    pair: tuple[Writer, Writer], tmp_path: Path
) -> None:
    """Placed from the owner's start past 0, then forked by another history in the same group commit (not
    writable as a fresh queue: persisted the generic way, from the placed run): the same rows, evidence
    and memory of small segments as the generic path, which held the placed records in memory."""
    base = queue2.truncate(single_offers("f", 6), OWNER, 2, now_ms=40)
    one = queue2.commit(base, OWNER, now_ms=60, records=[rec(i, b"o") for i in range(3)])
    two = queue2.commit(base, OWNER, now_ms=61, records=[rec(i, b"c") for i in range(2)])
    fork = queue2.delta(two, queue2.summary(held_after(one, queue2.delta(one, None))))
    merge_both(pair, [[Merge2(queue2.delta(one, None)), Merge2(fork)]])
    q = pair[1].core2.find(one.queue_id)
    assert q is not None and pair[1].core2.committed(q).forked
    assert dump(pair[1])["evidence2"]  # the records past the fork point were set aside
    # (a frozen queue is appended to no more: which run of small segments the store notes is moot)
    assert_same(pair, tmp_path, memory=False)


# ---------------------------------------------------------------------- chunks as a replica decodes them
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(catch_ups(off_the_wire=True))
def test_any_chunked_wire_catch_up_leaves_the_same_store_on_both_paths(jobs: list[list[Job]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_pair(Path(tmp)) as pair:
        root = Path(tmp)
        with mock.patch.object(core2_fresh, "write_new", wraps=core2_fresh.write_new) as placed:
            merge_both(pair, jobs)
        assert placed.called
        changes = [
            {c.q: value(c.state) for c in w.changes2 if c.state is not None} for w in pair
        ]  # what the last batch told its listeners
        assert changes[0] == changes[1]
        assert_same(pair, root)


# ---------------------------------------------------------------------- a write that fails after the batch's
def test_a_write_failing_after_the_new_queues_went_in_leaves_nothing_and_the_next_goes_in_alike(
    pair: tuple[Writer, Writer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group commit of new queues and an update of a held one, its write failing at the update (after
    the new queues' rows were written, on either path): nothing of it stays, on disk or in memory (the
    staging, ``find``, the store's runs of small segments), and the same jobs then go in alike."""
    held = single_offers("held", 3)
    merge_both(pair, [[Merge2(queue2.delta(held, None))]])
    more = queue2.commit(held, OWNER, now_ms=99, records=[rec(50)])
    fresh = [single_offers(f"n{i}", 4) for i in range(3)]
    jobs: list[Job] = [Merge2(queue2.delta(s, None)) for s in fresh]
    jobs.append(Merge2(queue2.delta(more, queue2.summary(held))))  # staged last: persisted last
    real = core2_store.persist

    def failing(store: Store, q: int, old: QueueState2, new: QueueState2) -> tuple[QueueState2, bool]:
        if new.name == "held":
            raise sqlite3.OperationalError("disk I/O error")
        return real(store, q, old, new)

    for w in pair:
        before, memory = dump(w), small(w)
        with monkeypatch.context() as m:
            m.setattr(core2_store, "persist", failing)
            attempt = [copy(job) for job in jobs]
            w.process(attempt)
        assert all(isinstance(job.error, LatticedError) for job in attempt)
        assert dump(w) == before
        assert all(w.core2.find(s.queue_id) is None for s in fresh)
        assert not w.core2.pending and set(small(w)) <= set(memory)
        assert [w.core2.committed(q).held for q in w.core2.queues()] == [(0, 3)]
    merge_both(pair, [jobs])
    assert_same(pair, tmp_path)
    merge_both(
        pair,
        [
            [
                Merge2(queue2.delta(queue2.commit(s, OWNER, now_ms=98, records=[rec(9)]), queue2.summary(s)))
                for s in fresh
            ]
        ],
    )
    for w in pair:  # and after the writer reads its index again
        w.core2.reload(w.store)
        assert all(w.core2.find(s.queue_id) is not None for s in fresh)
    assert_same(pair, tmp_path)


# ---------------------------------------------------------------------- forged first deltas
def _resigned_tip(d: Delta) -> Delta:
    """``d`` with its newest head's signature altered."""
    assert d.log is not None
    value = d.log.value
    tip = value.tips[0]
    raw = bytearray(tip.head.to_bytes())
    raw[-1] ^= 1
    bad = dataclasses.replace(tip, head=HeadV2.from_bytes(bytes(raw)))
    return dataclasses.replace(
        d, log=dataclasses.replace(d.log, value=dataclasses.replace(value, tips=(bad,)))
    )


def _forgeries(good: QueueState2) -> dict[str, Delta]:
    d = queue2.delta(good, None)
    other = queue2.delta(single_offers("other", 5), None)
    records = list(d.records)
    records[-1] = dataclasses.replace(records[-1], timestamp=records[-1].timestamp + 1)
    return {
        "metadata": dataclasses.replace(d, meta=(("team", "evil"),)),
        "no metadata": dataclasses.replace(d, meta=None),
        "signature": _resigned_tip(d),
        "timestamp": dataclasses.replace(d, records=tuple(records)),
        "a record short of a body": dataclasses.replace(d, records=tuple(d.records[:-1])),
        "shifted": dataclasses.replace(d, from_offset=1),
        "bodies of another queue": dataclasses.replace(d, bodies=other.bodies),
        "no bodies": dataclasses.replace(d, bodies=()),
        "another queue's leaves": dataclasses.replace(d, log=other.log),
        "another owner": dataclasses.replace(d, owner=REPLICA.public_key),
    }


@pytest.mark.parametrize("kind", sorted(_forgeries(single_offers("good", 5))))
def test_a_forged_first_delta_is_refused_and_leaves_nothing(pair: tuple[Writer, Writer], kind: str) -> None:
    good = queue2.commit(
        queue2.empty_state(OWNER.public_key, "good"), OWNER, now_ms=1, meta_updates={"team": "shop"}
    )
    good = queue2.commit(good, OWNER, now_ms=10, records=[rec(0), rec(1)])
    good = queue2.commit(good, OWNER, now_ms=11, records=[rec(2), rec(3), rec(4)])  # no body ends at 4
    bad = _forgeries(good)[kind]
    for w in pair:
        before = dump(w)
        job = Merge2(bad)
        w.process([job, Merge2(queue2.delta(single_offers("beside", 2), None))])
        assert isinstance(job.error, LatticedError), kind
        assert w.core2.find(good.queue_id) is None
        assert w.core2.find(queue2.empty_state(bad.owner, bad.name).queue_id) is None
        assert {w.core2.committed(q).name for q in w.core2.queues()} == {"beside"}
        assert dump(w)["segments"] != before["segments"]  # the good one beside it went in
    assert dump(pair[0]) == dump(pair[1])


# ---------------------------------------------------------------------- records of every shape
def mixed(i: int) -> Record:
    """Keys or none, headers or none (some shared), clocks stepping back."""
    key = None if i % 3 == 0 else b"k%d" % i
    headers = [] if i % 2 else [("producer", b"p1")] if i % 4 else [("trace", b"t%d" % i), ("n", "x")]
    return make_record(b"m%d" % i, key=key, headers=headers, timestamp=5000 - 13 * (i % 5) + i)


def mixed_queue(name: str, cut: int) -> QueueState2:
    state = queue2.commit(queue2.empty_state(OWNER.public_key, name), OWNER, now_ms=1)
    for n in (1, 4, 2, 5):
        at = state.held[1]
        state = queue2.commit(state, OWNER, now_ms=at + 5, records=[mixed(at + i) for i in range(n)])
    return queue2.truncate(state, OWNER, cut, now_ms=90) if cut else state


def test_records_of_every_shape_off_the_wire_are_stored_alike(
    pair: tuple[Writer, Writer], tmp_path: Path
) -> None:
    """Records mixing keys, headers and clocks, in runs off the wire: from 0 and past 0 (truncated), whole
    and in chunks of 3 (the second in the same group commit, the rest in the next ones)."""
    whole = [as_wire(mixed_queue(name, cut)) for name, cut in (("w0", 0), ("w3", 3))]
    batches: list[list[Job]] = [whole, []]
    for s in (mixed_queue("c0", 0), mixed_queue("c3", 3)):
        held = queue2.empty_state(OWNER.public_key, s.name)
        for i in range(3):
            since = queue2.summary(held) if i else None
            batches[max(0, i - 1)].append(as_wire(s, since, 3))
            held = queue2.join_verified(held, queue2.verify_delta(held, queue2.delta(s, since, 3))).state
    merge_both(pair, batches)
    assert_same(pair, tmp_path)


def test_the_same_first_delta_again_in_one_group_commit_changes_nothing_more(
    pair: tuple[Writer, Writer], tmp_path: Path
) -> None:
    """Two peers send a fresh replica the same queue (whole, and a prefix of it) in one group commit: the
    first is placed, the others join onto the staged value and change nothing; then the owner's next."""
    owner = single_offers("twice", 6)
    d = queue2.delta(owner, None)
    for w in pair:
        jobs = [Merge2(d), Merge2(d), Merge2(queue2.delta(owner, None, max_records=2))]
        ok(w, *jobs)
        results = [job.result for job in jobs]
        assert isinstance(results[0], Merged2) and results[0].changed
        assert all(isinstance(r, Merged2) and r.q == results[0].q and not r.changed for r in results[1:])
        assert [len(job.added) for job in jobs] == [6, 0, 0]
    grow(pair, owner, 2)
    assert_same(pair, tmp_path)


class DropFound(DropQueue2):
    """Drop the queue ``find`` names for ``qid`` when the job runs (one staged in this very batch)."""

    __slots__ = ("qid",)

    def __init__(self, qid: bytes) -> None:
        super().__init__(-1)
        self.qid = qid

    def apply(self, batch: Batch, writer: WriterView) -> None:
        found = core2_of(writer).find(self.qid)
        assert found is not None
        self.q = found
        super().apply(batch, writer)


def test_a_queue_placed_and_dropped_in_one_group_commit(pair: tuple[Writer, Writer], tmp_path: Path) -> None:
    """A drop of a queue the same group commit placed is refused (it is not committed yet), on both paths
    alike; the queue goes in, and a drop in the next group commit takes every row of it."""
    owner = single_offers("gone", 4)
    for w in pair:
        placed, drop = Merge2(queue2.delta(owner, None)), DropFound(owner.queue_id)
        w.process([placed, drop])
        assert placed.error is None and isinstance(drop.error, NotFoundError)
        assert w.core2.find(owner.queue_id) is not None
    assert_same(pair, tmp_path)
    for w in pair:
        ok(w, DropFound(owner.queue_id))
        assert w.core2.find(owner.queue_id) is None and w.core2.queues() == []
        assert not any(dump(w).values())
    assert small(pair[0]) == small(pair[1]) and tails(pair[0]) == tails(pair[1])
