"""The store tests' shared writer: Alice's store in a fresh directory, on a clock that ticks from a fixed
time, so the tests of each store module do not each define it again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clocks import TickingClock
from support.fresh_paths import open_pair

from latticed.crdt.signing import Identity
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

#: The same seed and time as the store tests' own ``ALICE`` and ``NOW``.
ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Writer]:
    w = Writer(db_path(tmp_path), ALICE, clock=TickingClock(NOW))
    w.open()
    yield w
    w.stop()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Writer, Writer]]:
    """A replica store merging with the batched fresh path and one with the generic path
    (:func:`support.fresh_paths.open_pair`), for the tests of :mod:`latticed.storage.core2_fresh`."""
    with open_pair(tmp_path) as both:
        yield both
