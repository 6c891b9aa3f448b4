"""A fresh replica's new core-2 queues placed straight from their verified first delta and written together
(:mod:`latticed.storage.core2_fresh`): the same deltas merged with ``fresh_batched`` on and off into two
stores leave the same values and the same rows, read back alike (after reopening too); what fails
verification is refused on both paths and changes nothing; deltas that are not placeable go the generic
way; a failed batch leaves nothing."""

from __future__ import annotations

import dataclasses
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from support.fresh_paths import (
    OWNER,
    as_wire,
    assert_same,
    catch_ups,
    dump,
    merge_both,
    open_pair,
    rec,
    single_offers,
)
from support.no_rows import NoRows
from support.writer_jobs import ok

from latticed.crdt import queue2
from latticed.crdt.queue2 import Delta, QueueState2
from latticed.crdt.signing import Identity
from latticed.errors import LatticedError
from latticed.storage import core2_fresh, core2_runs
from latticed.storage.core2_jobs import Merge2, Merged2
from latticed.storage.core2_queues import Core2Queues
from latticed.storage.jobs import Job
from latticed.storage.store import Store
from latticed.storage.writer import Writer


def one_batch(name: str, count: int) -> QueueState2:
    state = queue2.commit(queue2.empty_state(OWNER.public_key, name), OWNER, now_ms=1)
    return queue2.commit(state, OWNER, now_ms=2, records=[rec(i) for i in range(count)])


def truncated(name: str) -> QueueState2:
    """Records from offset 3 on: its delta starts at the owner's start, not at 0."""
    state = single_offers(name, 8)
    return queue2.truncate(state, OWNER, 3, now_ms=50)


def owners() -> list[QueueState2]:
    return [
        *(single_offers(f"s{i}", 5) for i in range(6)),
        single_offers("meta", 5, {"team": "shop", "tz": "utc"}),
        one_batch("batch", 5),
        one_batch("big", 600),  # more than a small segment
        truncated("cut"),
    ]


def test_placeable_takes_a_first_delta_from_the_owners_start_only() -> None:
    for owner in owners():
        empty = queue2.empty_state(owner.owner, owner.name)
        v = queue2.verify_delta(empty, queue2.delta(owner, None))
        assert core2_fresh.placeable(empty, v)
        placed = core2_fresh.as_queue(NoRows("a new queue's run reads no row"), 7, empty, v)
        joined = queue2.join_verified(empty, v).state
        assert (placed.chains, placed.meta, placed.held, placed.records()) == (
            joined.chains,
            joined.meta,
            joined.held,
            joined.records(),
        )
        assert list(placed.bodies) == list(joined.bodies)
    # nothing but leaves (no records) is no queue's value to place
    leaves = queue2.delta(single_offers("x", 3), None, max_records=0)
    empty = queue2.empty_state(OWNER.public_key, "x")
    v = queue2.verify_delta(empty, dataclasses.replace(leaves, records=(), bodies=()))
    assert not core2_fresh.placeable(empty, v)


def test_the_same_deltas_leave_the_same_store_on_both_paths(
    pair: tuple[Writer, Writer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = owners()
    written: list[int] = []
    real = core2_fresh.write_new

    def spy(store: Store, new: Sequence[tuple[int, QueueState2, int]], *rest: Any) -> list[QueueState2]:
        written.append(len(new))
        return real(store, new, *rest)

    monkeypatch.setattr(core2_fresh, "write_new", spy)
    merge_both(pair, [[Merge2(queue2.delta(s, None)) for s in states]])
    assert written == [len(states)]  # the batched store wrote them all together, the other none
    assert all(pair[0].core2.committed(q).held[1] > 0 for q in pair[0].core2.queues())
    assert_same(pair, tmp_path)


def test_the_same_wire_deltas_leave_the_same_store_on_both_paths(
    pair: tuple[Writer, Writer], tmp_path: Path
) -> None:
    """As a replica decodes them: records as a run, bodies as steps (stored as steps alike)."""
    merge_both(pair, [[as_wire(s) for s in owners()]])
    assert any(row[5] is not None for row in dump(pair[0])["bodies2"])  # some stored as steps
    assert_same(pair, tmp_path)


def test_a_fresh_queue_goes_on_alike_after_its_first_chunk(
    pair: tuple[Writer, Writer], tmp_path: Path
) -> None:
    """A chunked catch-up: the later chunks in the same group commit (onto the staged first value) and in
    the next, then the owner's next records."""
    a, b = single_offers("a", 9), single_offers("b", 9)

    def chunk(state: QueueState2, held: int) -> Merge2:
        if held == 0:
            return Merge2(queue2.delta(state, None, max_records=3))
        part = queue2.delta(state, None, max_records=held)
        since = queue2.summary(
            queue2.join_verified(
                queue2.empty_state(OWNER.public_key, state.name),
                queue2.verify_delta(queue2.empty_state(OWNER.public_key, state.name), part),
            ).state
        )
        return Merge2(queue2.delta(state, since, max_records=3))

    merge_both(pair, [[chunk(a, 0), chunk(a, 3), chunk(b, 0)], [chunk(a, 6), chunk(b, 3)]])
    more = queue2.commit(a, OWNER, now_ms=99, records=[rec(100 + i) for i in range(3)])
    held = [w.core2.committed(w.core2.find(a.queue_id) or -1) for w in pair]
    assert held[0].held == held[1].held == (0, 9)
    merge_both(pair, [[Merge2(queue2.delta(more, queue2.summary(held[1])))]])
    assert_same(pair, tmp_path)
    assert pair[0].core2.committed(pair[0].core2.find(a.queue_id) or -1).held == (0, 12)


def forked_owner(name: str) -> QueueState2:
    """An owner that signed two histories past 4 shared records: their join, forked."""
    base = single_offers(name, 4)
    one = queue2.commit(base, OWNER, now_ms=60, records=[rec(i, b"o") for i in range(3)])
    two = queue2.commit(base, OWNER, now_ms=61, records=[rec(i, b"c") for i in range(2)])
    return queue2.join(one, two)


def test_deltas_that_are_not_placeable_go_the_generic_way(
    pair: tuple[Writer, Writer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked = forked_owner("forked")
    assert forked.forked
    recovered = queue2.recover(forked_owner("recovered"), OWNER, now_ms=70)
    leaves_only = queue2.commit(queue2.empty_state(OWNER.public_key, "bare"), OWNER, now_ms=1)
    deltas = [queue2.delta(s, None) for s in (forked, recovered, leaves_only)]
    for d in deltas:
        empty = queue2.empty_state(d.owner, d.name)
        assert not core2_fresh.placeable(empty, queue2.verify_delta(empty, d))
    placed: list[object] = []
    real = core2_fresh.as_queue
    monkeypatch.setattr(core2_fresh, "as_queue", lambda *a: placed.append(a) or real(*a))
    merge_both(pair, [[Merge2(d) for d in deltas]])
    assert placed == []
    new = pair[0]
    r = new.core2.find(recovered.queue_id)
    assert r is not None and new.core2.committed(r).chains.epoch == recovered.chains.epoch > 0
    q = new.core2.find(forked.queue_id)
    assert q is not None and new.core2.committed(q).forked and new.core2.committed(q).held == forked.held
    assert_same(pair, tmp_path)


def forged(d: Delta) -> Delta:
    records = list(d.records)
    records[2] = dataclasses.replace(records[2], value=b"forged")
    return dataclasses.replace(d, records=tuple(records))


def test_a_forged_delta_is_refused_on_both_paths_and_changes_nothing(pair: tuple[Writer, Writer]) -> None:
    good = single_offers("good", 5)
    stranger = Identity.from_seed(b"s" * 32)
    signed_by_another = dataclasses.replace(
        queue2.delta(single_offers("good2", 5), None), owner=stranger.public_key
    )
    for w in pair:
        before = dump(w)
        for bad in (forged(queue2.delta(good, None)), signed_by_another):
            job = Merge2(bad)
            w.process([job])
            assert isinstance(job.error, LatticedError)
        assert dump(w) == before and w.core2.find(good.queue_id) is None
    # beside a good one in the same group commit: the good one goes in, alone
    for w in pair:
        jobs = [Merge2(forged(queue2.delta(good, None))), Merge2(queue2.delta(single_offers("ok", 5), None))]
        w.process(jobs)
        assert isinstance(jobs[0].error, LatticedError) and jobs[1].error is None
        assert isinstance(jobs[1].result, Merged2) and jobs[1].result.changed
        assert w.core2.find(good.queue_id) is None
    assert dump(pair[0]) == dump(pair[1])


def test_a_failed_batch_leaves_nothing(pair: tuple[Writer, Writer], monkeypatch: pytest.MonkeyPatch) -> None:
    states = owners()[:4]
    for w in pair:
        before = dump(w)
        real = Store.commit

        def failing(store: Store) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(Store, "commit", failing)
        jobs = [Merge2(queue2.delta(s, None)) for s in states]
        w.process(jobs)
        assert all(job.error is not None for job in jobs)
        monkeypatch.setattr(Store, "commit", real)
        assert dump(w) == before
        assert all(w.core2.find(s.queue_id) is None for s in states)
        assert w.core2.queues() == []
        ok(w, *[Merge2(queue2.delta(s, None)) for s in states])  # the next batch goes in whole
        assert sorted(w.core2.committed(q).name for q in w.core2.queues()) == sorted(s.name for s in states)
    assert dump(pair[0]) == dump(pair[1])


def test_the_flag_is_the_class_default_and_switches_per_instance() -> None:
    assert Core2Queues.fresh_batched is True
    c = Core2Queues()
    c.fresh_batched = False
    assert Core2Queues.fresh_batched is True and Core2Queues().fresh_batched


def test_later_small_appends_are_compacted_alike(pair: tuple[Writer, Writer], tmp_path: Path) -> None:
    """The owner's single offers merged one a group commit after the first delta: the runs of small
    segments the store merges (every 32) start where they did on the old path, from 0 or past it."""
    states = [single_offers("zero", 3), truncated("cut")]
    merge_both(pair, [[Merge2(queue2.delta(s, None)) for s in states]])
    for i in range(40):
        grown = [queue2.commit(s, OWNER, now_ms=100 + i, records=[rec(200 + i)]) for s in states]
        merge_both(
            pair, [[Merge2(queue2.delta(g, queue2.summary(s))) for g, s in zip(grown, states, strict=True)]]
        )
        states = grown
    assert_same(pair, tmp_path)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(catch_ups(off_the_wire=False))
def test_any_catch_up_leaves_the_same_store_on_both_paths(jobs: list[list[Job]]) -> None:
    """Whatever the queues' shapes, the chunking and the group commits they fall into, the batched path
    leaves what the generic one does."""
    with tempfile.TemporaryDirectory() as tmp, open_pair(Path(tmp)) as pair:
        root = Path(tmp)
        with mock.patch.object(core2_fresh, "write_new", wraps=core2_fresh.write_new) as placed:
            merge_both(pair, jobs)
        assert placed.called  # the first chunks took the batched path
        assert_same(pair, root)


def test_queues_of_many_rows_a_table_are_written_alike(
    pair: tuple[Writer, Writer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaves and bodies go in rows of at most ``RUN_MAX`` (4,096: no test queue reaches it); made small,
    a queue's leaves and bodies take several rows each, and both paths write the same ones."""
    monkeypatch.setattr(core2_runs, "RUN_MAX", 3)
    merge_both(pair, [[Merge2(queue2.delta(s, None)) for s in owners()[:7]], [as_wire(owners()[7])]])
    rows = dump(pair[1])  # the generic path's
    for table in ("leaves2", "bodies2"):
        per_queue = [row[0] for row in rows[table]]
        assert max(per_queue.count(q) for q in set(per_queue)) > 1, table
    assert_same(pair, tmp_path)
