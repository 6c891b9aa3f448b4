"""A forked KV namespace stops where each replica stands, as a queue does: a replica keeps the ops it
held, and its view is folded again from those up to its visible end only (every read of a forked queue
stops there), so two replicas never show a key that one history set and the other did not."""

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


def _shown_view(state: core.QueueState) -> dict[str, kv.Entry]:
    """The view of a namespace's ops up to its visible end."""
    records = state.entries.records(0, state.visible_end - state.start)
    return kv.apply_ops({}, [kv.decode_op(r.value) for r in records])


@pytest.mark.parametrize("chunked", [False, True])
def test_a_fork_stops_a_kv_namespace_where_each_replica_stands(
    replicas: tuple[Writer, Writer], chunked: bool
) -> None:
    """X holds history A and meets B (whole, or B's chunk from the junction on); Y holds B and meets A.
    Each flags the fork, keeps its own ops, and its view shows none of what one history wrote alone."""
    x, y = replicas
    a, b, junction = histories(a_ops=2, b_ops=4)
    ns_x = merge(x, a.delta())
    ns_y = merge(y, b.delta())
    assert "only-a" in view(x, ns_x)
    merge(x, b.delta(junction.summary()) if chunked else b.delta())
    merge(y, a.delta())
    sx, sy = x.states[ns_x], y.states[ns_y]
    assert sx.forked and sy.forked
    assert sx.entries.records() == a.state.entries.records()  # nothing dropped, nothing taken
    assert sy.entries.records() == b.state.entries.records()
    assert view(x, ns_x) == _shown_view(sx) and view(y, ns_y) == _shown_view(sy)
    assert "only-a" not in view(x, ns_x)
    assert sx.visible_end == sy.visible_end and view(x, ns_x) == view(y, ns_y)


def test_a_truncated_history_stops_a_kv_namespace_too(replicas: tuple[Writer, Writer]) -> None:
    """B truncates above the junction but below X's end: X's run does not pass through B's start with
    B's chain value there, which proves the fork; X keeps its ops and shows none past its visible end."""
    x, _ = replicas
    a, b, junction = histories(a_ops=3, b_ops=4)
    ns_x = merge(x, a.delta())
    cut = junction.held_end + 1
    truncated = core.commit(b.state, BOB, now_ms=NOW + 100, new_start=cut)
    merge(x, core.delta(truncated))
    state = x.states[ns_x]
    assert state.forked and state.entries.records() == a.state.entries.records()
    assert view(x, ns_x) == _shown_view(state)


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


def test_the_library_namespace_stops_at_a_fork_too() -> None:
    """``KvNamespace`` (the library) folds again like the daemon: a replica of A that meets B keeps A's
    ops and shows only those up to its visible end."""
    a, b, _ = histories(a_ops=2, b_ops=4)
    x = KvNamespace.replica(BOB.public_key)
    x.merge(a.delta())
    assert "only-a" in x.view
    x.merge(b.delta())
    assert x.state.forked and x.state.entries.records() == a.state.entries.records()
    assert x.view == _shown_view(x.state) and "only-a" not in x.view


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


def test_a_reader_of_a_sealed_namespace_folds_only_the_shown_ops_through_a_fork(
    replicas: tuple[Writer, Writer],
) -> None:
    """X and Y are readers. X holds A and meets B's chunk from the junction on: its view, cleared, is
    folded again from its own ops up to its visible end, each opened with the reader key."""
    x, y = replicas
    install_sealer(x)
    install_sealer(y)
    a, b, junction = sealed_histories([x.identity.public_key, y.identity.public_key], a_ops=2, b_ops=4)
    ns_x = merge(x, a.log.delta())
    assert view(x, ns_x) == a.view and "only-a" in a.view
    merge(x, b.log.delta(junction.summary()))
    state = x.states[ns_x]
    assert state.forked and state.entries.records() == a.log.state.entries.records()
    shown = kv.apply_ops({}, a.ops[: state.visible_end - state.start])
    assert view(x, ns_x) == shown and "only-a" not in view(x, ns_x)


def test_a_relay_of_a_sealed_namespace_folds_nothing_through_a_fork(replicas: tuple[Writer, Writer]) -> None:
    """Neither X nor Y holds the key: X's fold again after the fork opens nothing and folds nothing, and
    X keeps its own records."""
    x, _ = replicas
    install_sealer(x)
    a, b, junction = sealed_histories([], a_ops=2, b_ops=4)
    ns_x = merge(x, a.log.delta())
    assert view(x, ns_x) == {}
    merge(x, b.log.delta(junction.summary()))
    state = x.states[ns_x]
    assert state.forked and state.entries.records() == a.log.state.entries.records()
    assert view(x, ns_x) == {}
    assert b.view  # not vacuous: a reader would fold these
