"""A batch that creates many core-2 queues (a fresh replica's catch-up creates thousands a commit): their
rows go in with one statement a table, and the batch's changes are built once, one a queue, not again
when the values are published."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.writer_jobs import ok

from latticed.crdt.signing import Identity
from latticed.storage import core2_queues
from latticed.storage.core2_jobs import CreateQueue2
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return db_path(tmp_path)


@pytest.fixture
def alice(path: Path) -> Iterator[Writer]:
    w = Writer(path, ALICE, clock=lambda: NOW)
    w.open()
    yield w
    w.stop()


def creates(w: Writer, count: int) -> list[int]:
    """Create ``count`` core-2 queues in one commit; their numbers."""
    qs = ok(w, *(CreateQueue2(f"q{i}") for i in range(count)))
    assert all(isinstance(q, int) for q in qs)
    return [q for q in qs if isinstance(q, int)]


def test_a_batch_of_creates_builds_one_change_a_queue(alice: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []

    class Counted(core2_queues.Change2):
        __slots__ = ()

        def __init__(self, q: int, state: object) -> None:
            built.append(q)
            super().__init__(q, state)  # type: ignore[arg-type]

    monkeypatch.setattr(core2_queues, "Change2", Counted)
    qs = creates(alice, 50)
    assert sorted(built) == sorted(qs)  # once each: not again by publish
    assert sorted(c.q for c in alice.changes2) == sorted(qs)
    assert all(c.state is alice.core2.committed(c.q) for c in alice.changes2)


def test_a_batch_of_creates_is_stored_and_read_back(alice: Writer, path: Path) -> None:
    qs = creates(alice, 50)
    before = {q: alice.core2.committed(q) for q in qs}
    alice.stop()
    again = Writer(path, ALICE, clock=lambda: NOW)
    again.open()
    try:
        for q, state in before.items():
            read = again.core2.committed(q)
            assert (read.name, read.queue_id, read.chains, read.held) == (
                state.name,
                state.queue_id,
                state.chains,
                state.held,
            )
            assert again.core2.find(state.queue_id) == q
        assert sorted(again.core2.committed(q).name for q in before) == sorted(f"q{i}" for i in range(50))
    finally:
        again.stop()
