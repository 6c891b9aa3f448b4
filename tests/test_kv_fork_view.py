"""A forked KV namespace: when a replica's join keeps the other history's records in place of some of its
own, the view must follow the records. Replicas that hold the same records must hold the same view, or
they diverge for good (records converge, views would not)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clocks import TickingClock

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.crdt.signing import Identity
from latticed.kv import KvNamespace
from latticed.queue import LatticeQueue
from latticed.storage.entries import SqlRows
from latticed.storage.jobs import Merge
from latticed.storage.reader import StoreReader
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

BOB = Identity.from_seed(b"f" * 32)
NOW = 1_700_000_000_000
EMPTY = core.empty_state(BOB.public_key, "kv", KIND_KV)


def open_writer(path: Path, seed: bytes) -> Writer:
    path.mkdir(parents=True, exist_ok=True)
    w = Writer(db_path(path), Identity.from_seed(seed), clock=TickingClock(NOW))
    w.open()
    return w


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Writer, Writer]]:
    """X (first holds history A, then joins B) and Y (only ever gets B)."""
    x, y = open_writer(tmp_path / "x", b"x" * 32), open_writer(tmp_path / "y", b"y" * 32)
    yield x, y
    x.stop()
    y.stop()


def merge(w: Writer, d: core.QueueDelta) -> int:
    job = Merge(core.verify_delta(EMPTY, d))
    w.process([job])
    assert job.error is None, job.error
    assert isinstance(job.result, int)
    return job.result


def view(w: Writer, ns: int) -> dict[str, kv.Entry]:
    reader = StoreReader(w.path)
    try:
        return dict(reader.kv_scan(ns, ""))
    finally:
        reader.close()


def histories(a_ops: int, b_ops: int) -> tuple[KvNamespace, KvNamespace, core.QueueState]:
    """Bob's namespace with one op, then two histories from there: A (an old copy of his store) writes a
    key B never writes, and both overwrite the shared key."""
    base = KvNamespace.create(BOB, clock=TickingClock(NOW))
    base.put("shared", b"base")
    junction = base.state
    a = base
    b_clock = TickingClock(NOW + 10)
    b = KvNamespace(LatticeQueue(junction, BOB, b_clock), b_clock)
    a.put("only-a", b"a")
    for i in range(a_ops - 1):
        a.put("shared", b"a%d" % i)
    for i in range(b_ops):
        b.put("shared", b"b%d" % i)
    return a, b, junction


def test_a_join_that_splices_a_kv_run_from_a_chunk_rebuilds_the_view(replicas: tuple[Writer, Writer]) -> None:
    """X takes B's chunk from the junction on (its own records up to there, then B's)."""
    x, y = replicas
    a, b, junction = histories(a_ops=2, b_ops=4)
    ns_x = merge(x, a.delta())
    assert "only-a" in view(x, ns_x)
    chunk = b.delta(junction.summary())
    assert chunk.from_offset == junction.held_end
    merge(x, chunk)
    ns_y = merge(y, b.delta())
    assert x.states[ns_x].forked
    assert x.states[ns_x].entries.records() == y.states[ns_y].entries.records() == b.state.entries.records()
    assert view(x, ns_x) == view(y, ns_y) == b.view


def test_a_join_that_replaces_a_kv_run_wholesale_rebuilds_the_view(replicas: tuple[Writer, Writer]) -> None:
    """X takes B's whole run (a delta from offset 0, longer than what it holds)."""
    x, y = replicas
    a, b, _ = histories(a_ops=2, b_ops=4)
    ns_x = merge(x, a.delta())
    merge(x, b.delta())
    ns_y = merge(y, b.delta())
    assert x.states[ns_x].entries.records() == b.state.entries.records()
    assert view(x, ns_x) == view(y, ns_y) == b.view


def test_a_same_length_history_with_the_higher_chain_value_rebuilds_the_view(
    replicas: tuple[Writer, Writer],
) -> None:
    """Both histories end at one offset: the join keeps the higher chain value there; X held the other."""
    x, y = replicas
    one, other, _ = histories(a_ops=3, b_ops=3)
    end = one.state.held_end
    assert other.state.held_end == end
    loser, winner = sorted((one, other), key=lambda n: n.state.chain_at(end) or b"")
    ns_x = merge(x, loser.delta())
    merge(x, winner.delta())
    ns_y = merge(y, winner.delta())
    assert x.states[ns_x].entries.records() == winner.state.entries.records()
    assert view(x, ns_x) == view(y, ns_y) == winner.view
    assert view(x, ns_x) != loser.view  # not vacuous: the loser's view differs


def test_a_truncation_into_the_replaced_run_rebuilds_the_view(replicas: tuple[Writer, Writer]) -> None:
    """B truncates above the junction but below X's end (only superseded ops go, as compaction does): X's
    run no longer holds B's start, so it takes B's run whole from there."""
    x, y = replicas
    a, b, junction = histories(a_ops=3, b_ops=4)
    ns_x = merge(x, a.delta())
    ns_y = merge(y, b.delta())
    cut = junction.held_end + 1  # drops base's "shared" op and B's first, both superseded by B's last
    assert cut < a.state.held_end
    truncated = core.commit(b.state, BOB, now_ms=NOW + 100, new_start=cut)
    merge(x, core.delta(truncated))
    merge(y, core.delta(truncated, y.states[ns_y].summary()))
    assert x.states[ns_x].start == y.states[ns_y].start == cut
    assert x.states[ns_x].entries.records() == y.states[ns_y].entries.records()
    assert view(x, ns_x) == view(y, ns_y) == b.view


def test_a_merge_that_extends_the_log_keeps_the_view_and_reads_no_chain(
    replicas: tuple[Writer, Writer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The normal path: the check costs no row read, and the view is folded on, never cleared."""
    x, _ = replicas
    bob = KvNamespace.create(BOB, clock=TickingClock(NOW))
    bob.put("a", b"1")
    ns = merge(x, bob.delta())
    cleared: list[int] = []
    chains: list[int] = []
    monkeypatch.setattr(x.store, "clear_kv", cleared.append)
    real_chain = SqlRows.chain
    monkeypatch.setattr(SqlRows, "chain", lambda self, q, off: chains.append(off) or real_chain(self, q, off))
    for i in range(3):
        bob.put(f"k{i}", b"v")
        merge(x, bob.delta(x.states[ns].summary()))
    assert cleared == [] and chains == []
    assert view(x, ns) == bob.view


def test_the_library_namespace_follows_a_replaced_run_too() -> None:
    """``KvNamespace`` (the library) folds again like the daemon: a replica of A that joins B sees B."""
    a, b, _ = histories(a_ops=2, b_ops=4)
    x = KvNamespace.replica(BOB.public_key)
    x.merge(a.delta())
    assert "only-a" in x.view
    x.merge(b.delta())
    y = KvNamespace.replica(BOB.public_key)
    y.merge(b.delta())
    assert x.state.entries.records() == y.state.entries.records()
    assert x.view == y.view == b.view
