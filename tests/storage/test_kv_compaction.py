"""Compaction of our KV namespace's op log: the log shrinks to the ops that still decide a key, every view
(ours, a replica's, a fresh replica's built from the compacted log alone) stays exactly as it was, and the
result is still a valid owner-signed log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clocks import TickingClock
from support.kvviews import view

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.crdt.kvplan import KvRequest, visible
from latticed.crdt.signing import Identity
from latticed.storage import kvcompact
from latticed.storage.jobs import Job, KvWrite, Merge
from latticed.storage.kvcompact import CompactKv, worth_compacting
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"c" * 32)
BOB = Identity.from_seed(b"d" * 32)
NOW = 1_700_000_000_000


def open_writer(path: Path, identity: Identity) -> Writer:
    path.mkdir(parents=True, exist_ok=True)
    w = Writer(db_path(path), identity, clock=TickingClock(NOW))
    w.open()
    return w


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[Writer]:
    w = open_writer(tmp_path / "alice", ALICE)
    yield w
    w.stop()


@pytest.fixture
def bob(tmp_path: Path) -> Iterator[Writer]:
    w = open_writer(tmp_path / "bob", BOB)
    yield w
    w.stop()


def run(w: Writer, *jobs: Job) -> None:
    w.process(list(jobs))
    for job in jobs:
        assert job.error is None, job.error


def write(w: Writer, op: str, key: str, **fields: object) -> None:
    run(w, KvWrite(KvRequest(op, key, **fields)))  # type: ignore[arg-type]


def namespace(w: Writer, owner: Identity) -> int:
    ns = w.lookup(core.empty_state(owner.public_key, "kv", KIND_KV).queue_id)
    assert ns is not None
    return ns


def visible_view(w: Writer, ns: int) -> dict[str, object]:
    """What a reader sees (absent keys left out)."""
    seen = {key: visible(entry, NOW + 10**9) for key, entry in view(w, ns).items()}
    return {key: value for key, value in seen.items() if value[0] is not None}


def log_ops(w: Writer, ns: int) -> list[kv.Op]:
    state = w.states[ns]
    return [kv.decode_op(r.value) for r in w.store.rows.records(ns, state.start, state.held_end)]


def churn(w: Writer) -> None:
    """Many superseded writes over a few keys, of every kind, deletions and expiries included."""
    for i in range(300):
        write(w, "incr", "hits")
        write(w, "put", f"k{i % 5}", value=b"v%d" % i)
        write(w, "hset", "user", member=b"f%d" % (i % 3), value=b"x%d" % i)
        write(w, "sadd", "tags", member=b"t%d" % (i % 4))
        write(w, "srem", "tags", member=b"t%d" % ((i + 1) % 4))
    write(w, "put", "gone", value=b"soon")
    write(w, "del", "gone")
    write(w, "hdel", "user", member=b"f0")
    write(w, "put", "short", value=b"lived", ttl_ms=5)


def compact_fully(w: Writer, ns: int) -> int:
    """Compaction steps over the whole log as it was; returns the ops dropped."""
    end, dropped = w.states[ns].held_end, 0
    while w.states[ns].start < end:
        job = CompactKv(ns, step=256)
        run(w, job)
        dropped += job.result
    return dropped


def test_compaction_keeps_only_deciding_ops_and_every_view(alice: Writer) -> None:
    churn(alice)
    ns = namespace(alice, ALICE)
    before_view, before_visible = view(alice, ns), visible_view(alice, ns)
    ops_before = len(log_ops(alice, ns))
    dropped = compact_fully(alice, ns)
    ops = log_ops(alice, ns)
    assert dropped > ops_before // 2
    assert len(ops) < ops_before // 5
    assert view(alice, ns) == before_view and visible_view(alice, ns) == before_visible
    # The ops left fold, from nothing, into exactly the view but for the value whose TTL has passed: it
    # decides nothing any more, so its op is dropped (retention purges it from the view too).
    assert kv.apply_ops({}, ops) == {key: e for key, e in before_view.items() if key != "short"}
    assert not any(op.key == "short" for op in ops)
    assert any(op.op == "del" and op.key == "gone" for op in ops)  # tombstones are kept
    assert any(op.op == "hdel" and op.member == b"f0" for op in ops)
    assert alice.store.verify_queue(ns, alice.states[ns]) >= len(ops)  # still a valid signed log


def test_replicas_old_and_new_converge_on_the_same_view(alice: Writer, bob: Writer, tmp_path: Path) -> None:
    churn(alice)
    ns = namespace(alice, ALICE)
    empty = core.empty_state(ALICE.public_key, "kv", KIND_KV)
    run(bob, Merge(core.verify_delta(empty, core.delta(alice.states[ns], core.Summary()))))
    replica = namespace(bob, ALICE)
    compact_fully(alice, ns)
    write(alice, "put", "after", value=b"compaction")
    # The old replica follows the owner's truncation and new ops; its view is still the owner's (the
    # value whose TTL passed is gone from its view: the log jumped past its end, so it folded it again).
    since = bob.states[replica].summary()
    run(bob, Merge(core.verify_delta(empty, core.delta(alice.states[ns], since))))
    assert visible_view(bob, replica) == visible_view(alice, ns)
    assert view(bob, replica) == {key: e for key, e in view(alice, ns).items() if key != "short"}
    assert bob.states[replica].start == alice.states[ns].start
    # A new replica that only ever sees the compacted log learns every key.
    carol = open_writer(tmp_path / "carol", Identity.from_seed(b"e" * 32))
    try:
        run(carol, Merge(core.verify_delta(empty, core.delta(alice.states[ns], core.Summary()))))
        assert visible_view(carol, namespace(carol, ALICE)) == visible_view(alice, ns)
    finally:
        carol.stop()


def test_maintenance_compacts_a_churned_log_by_itself(alice: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("latticed.storage.writer.MIN_OPS", 200)
    monkeypatch.setattr(kvcompact, "MIN_OPS", 200)
    for i in range(600):
        write(alice, "incr", f"c{i % 3}")
        alice.maintain()
    ns = namespace(alice, ALICE)
    assert len(log_ops(alice, ns)) < 200 + 3 * kvcompact.RATIO
    while alice.maintain():
        pass
    assert visible_view(alice, ns) == {f"c{j}": ("counter", 200) for j in range(3)}


def test_worth_compacting_needs_both_size_and_waste() -> None:
    assert not worth_compacting(kvcompact.MIN_OPS - 1, 1)
    assert worth_compacting(kvcompact.MIN_OPS, 10)
    assert not worth_compacting(kvcompact.MIN_OPS * 3, kvcompact.MIN_OPS * 2)
