"""Reads served from the live cache's last commit never come back shorter than the store would answer."""

from __future__ import annotations

from latticed.crdt import queue as core
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.storage.live import LiveCache
from latticed.storage.writer import Change

BIG = 1 << 30


def _change(first: int, count: int) -> Change:
    state = core.empty_state(Identity.generate().public_key, "q")
    records = tuple(Record(value=b"%d" % (first + i)) for i in range(count))
    return Change(1, state, first, records)


def test_a_read_past_the_last_commit_kept_goes_to_the_store() -> None:
    """The engine's state can already end at a newer commit than the one cached (the storage thread
    publishes it first): a read to that end must not be answered with the cached commit's records only."""
    live = LiveCache()
    live.committed(_change(0, 50))
    assert live.recent_columns(1, 0, 51, 51, BIG) is None
    assert live.recent_columns(1, 10, 51, 51, BIG) is None


def test_a_read_inside_the_last_commit_is_served_from_it() -> None:
    live = LiveCache()
    live.committed(_change(0, 50))
    whole = live.recent_columns(1, 0, 50, 50, BIG)
    assert whole is not None and whole.offsets == list(range(50))
    capped = live.recent_columns(1, 10, 51, 5, BIG)  # the count ends the read inside the commit
    assert capped is not None and capped.offsets == list(range(10, 15))
    assert live.recent_columns(1, 50, 51, 1, BIG) is None  # not held here at all
