"""A forked KV namespace: when a replica's join keeps the other history's records in place of some of its
own, the view must follow the records. Replicas that hold the same records must hold the same view, or
they diverge for good (records converge, views would not)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, cast

import pytest
from support.clocks import TickingClock
from support.kvviews import view

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.facades.kv_namespace import KvNamespace
from latticed.facades.lattice_queue import LatticeQueue
from latticed.privacy import crypto
from latticed.privacy import meta as sealed_meta
from latticed.storage.entries import SqlRows
from latticed.storage.jobs import Merge
from latticed.storage.sealer import SealableStore, Sealer
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


class _Writes(Protocol):
    def put(self, key: str, value: bytes) -> None: ...


def _diverge(a: _Writes, b: _Writes, a_ops: int, b_ops: int) -> None:
    """After the junction: A writes a key B never writes, then both overwrite the shared key."""
    a.put("only-a", b"a")
    for i in range(a_ops - 1):
        a.put("shared", b"a%d" % i)
    for i in range(b_ops):
        b.put("shared", b"b%d" % i)


def histories(a_ops: int, b_ops: int) -> tuple[KvNamespace, KvNamespace, core.QueueState]:
    """Bob's namespace with one op, then two histories from there: A (an old copy of his store) writes a
    key B never writes, and both overwrite the shared key."""
    base = KvNamespace.create(BOB, clock=TickingClock(NOW))
    base.put("shared", b"base")
    junction = base.state
    a = base
    b_clock = TickingClock(NOW + 10)
    b = KvNamespace(LatticeQueue(junction, BOB, b_clock), b_clock)
    _diverge(a, b, a_ops, b_ops)
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


# ------------------------------------------------------------------ a sealed namespace through a fork


class _Node:
    """What a :class:`Sealer` reads of its engine on the storage thread: the identity and a queue's state."""

    def __init__(self, writer: Writer) -> None:
        self.identity = writer.identity
        self._writer = writer

    def state(self, q: int) -> core.QueueState:
        return self._writer.states[q]

    def address(self, q: int) -> str:
        return f"{BOB.public_key.hex()}/kv#{q}"


def install_sealer(w: Writer) -> None:
    """As the daemon does at start (``Sealer.install``): one sealer per writer, so what it remembers of
    the epochs a view was folded with carries from one join to the next."""
    w.kv_sealing = Sealer(cast(SealableStore, _Node(w)))


class SealedHistory:
    """A history of Bob's sealed namespace, written with the library (ops sealed under epoch 0), with
    its plaintext ops kept to compute the view a reader must fold."""

    def __init__(self, log: LatticeQueue, content_key: bytes, ops: list[kv.Op]) -> None:
        self.log, self.content_key, self.ops = log, content_key, ops

    def put(self, key: str, value: bytes) -> None:
        op = kv.Op("put", self.ops[-1].hlc + 1 if self.ops else 1, key, value)
        records = [Record(op.encode(), op.key.encode(), 1)]
        nonce = secrets.token_bytes(crypto.NONCE_SIZE)
        self.log.offer_many(crypto.seal_run(self.content_key, self.log.state.queue_id, 0, records, nonce))
        self.log.commit()
        self.ops.append(op)

    @property
    def view(self) -> dict[str, kv.Entry]:
        return kv.apply_ops({}, self.ops)


def sealed_histories(
    readers: list[bytes], a_ops: int, b_ops: int
) -> tuple[SealedHistory, SealedHistory, core.QueueState]:
    """``histories`` for a namespace sealed to ``readers`` when it was created: A writes a key B never
    writes, and both overwrite the shared key."""
    content_key = secrets.token_bytes(32)
    base = LatticeQueue(EMPTY, BOB, TickingClock(NOW))
    for key, value in sealed_meta.seal_new(BOB.public_key, readers, content_key, secrets.token_bytes).items():
        base.set_meta(key, value)
    a = SealedHistory(base, content_key, [])
    a.put("shared", b"base")
    a.put("junction", b"j")  # nobody writes it again: only a fold of the whole log holds it
    junction = base.state
    b = SealedHistory(LatticeQueue(junction, BOB, TickingClock(NOW + 10)), content_key, list(a.ops))
    _diverge(a, b, a_ops, b_ops)
    return a, b, junction


def test_a_reader_of_a_sealed_namespace_folds_a_spliced_join_from_the_whole_log(
    replicas: tuple[Writer, Writer],
) -> None:
    """X and Y are readers. X takes B's chunk from the junction on: the ops it keeps below the chunk
    (the junction's) are not among the join's appended records, so the view, cleared, is folded again
    from the whole kept log, each op opened with the reader key."""
    x, y = replicas
    install_sealer(x)
    install_sealer(y)
    a, b, junction = sealed_histories([x.identity.public_key, y.identity.public_key], a_ops=2, b_ops=4)
    ns_x = merge(x, a.log.delta())
    assert view(x, ns_x) == a.view and "only-a" in a.view
    chunk = b.log.delta(junction.summary())
    assert chunk.from_offset == junction.held_end
    merge(x, chunk)
    ns_y = merge(y, b.log.delta())
    assert x.states[ns_x].forked
    records = b.log.state.entries.records()
    assert x.states[ns_x].entries.records() == y.states[ns_y].entries.records() == records
    assert view(x, ns_x) == view(y, ns_y) == b.view
    assert "junction" in b.view and "only-a" not in b.view  # not vacuous: below the chunk, and A's alone


def test_a_relay_of_a_sealed_namespace_folds_nothing_through_a_fork(replicas: tuple[Writer, Writer]) -> None:
    """Neither X nor Y holds the key: X's join, which folds the view again from the whole log, opens
    nothing and folds nothing, and both hold B's records."""
    x, y = replicas
    install_sealer(x)
    install_sealer(y)
    a, b, junction = sealed_histories([], a_ops=2, b_ops=4)
    ns_x = merge(x, a.log.delta())
    assert view(x, ns_x) == {}
    merge(x, b.log.delta(junction.summary()))
    ns_y = merge(y, b.log.delta())
    assert x.states[ns_x].forked
    records = b.log.state.entries.records()
    assert x.states[ns_x].entries.records() == y.states[ns_y].entries.records() == records
    assert view(x, ns_x) == view(y, ns_y) == {}
    assert b.view  # not vacuous: a reader would fold these
