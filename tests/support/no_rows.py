"""A row source that fails the test at any read: for a stored run that must answer from memory alone (an
empty run a delta's records are joined to, a new queue's run before it is written)."""

from __future__ import annotations

from latticed.crdt.records import Record, RecordRun


class NoRows:
    """:class:`~latticed.storage.entries.RowSource` that reads no row."""

    def __init__(self, what: str = "an empty run reads no row") -> None:
        self.what = what

    def record(self, q: int, off: int) -> Record | None:
        raise AssertionError(self.what)

    def chain(self, q: int, off: int) -> bytes | None:
        raise AssertionError(self.what)

    def records(self, q: int, lo: int, hi: int) -> list[Record]:
        raise AssertionError(self.what)

    def run(self, q: int, lo: int, hi: int) -> RecordRun:
        raise AssertionError(self.what)
