"""Clocks for tests that pass time in as an argument (as every lattice and the writer take it)."""

from __future__ import annotations


class TickingClock:
    """Milliseconds that advance by one on every reading, from ``start``: distinct, ordered timestamps
    without sleeping."""

    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now
