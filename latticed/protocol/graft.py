"""Plumtree's graft timer, learned per link, and what a host is still taking in (sans-IO).

A lazy link's HAVE may announce news before the eager link delivers it. The WANT that grafts the lazy
link waits a timeout first; too short a timeout on a busy host (where an eager copy is late by up to a
second while sockets, verification and commits queue) grafts a second eager link, and every chunk of a
backlog then crosses both. A fixed timeout long enough for the busiest host would make every repair of
a dead link that slow everywhere, so the timeout is learned per link from how long news that a HAVE
announced actually took to arrive (:class:`GraftClock`: a smoothed estimate and its deviation, with a
floor and a cap, as TCP's retransmission timer), and a graft is held back while the host still has
deltas of the queue on their way into its store (:class:`Arrivals`): the eager link is delivering.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from latticed.protocol.replication_messages import QueueKey

__all__ = ["Arrivals", "GraftClock"]

#: Weights of a new sample in the smoothed lateness and in its deviation (TCP's 1/8 and 1/4).
_GAIN = 0.125
_DEVIATION_GAIN = 0.25
#: The timeout is the smoothed lateness plus this many deviations (TCP's RTO uses 4).
_DEVIATIONS = 4.0


@dataclass(slots=True)
class GraftClock:
    """How long a HAVE's news may take to arrive on this link's host before a graft, learned.

    ``floor`` is the timeout before any sample, and never less; ``cap`` bounds it (a dead eager link is
    repaired within ``cap``); ``cap`` None keeps the timeout fixed at ``floor``. A sample is a gap
    between arrivals of news a HAVE announced (from the HAVE to the first of it, or between two parts of
    a backlog streaming in). A graft whose first delta brought nothing (the eager copy came after all)
    doubles a back-off factor; one that brought news halves it again."""

    floor: float
    cap: float | None = None
    smoothed: float | None = None
    deviation: float = 0.0
    backoff: float = 1.0
    samples: int = 0

    def timeout(self) -> float:
        cap = self.cap
        if cap is None or cap <= self.floor:
            return self.floor
        learned = self.floor if self.smoothed is None else self.smoothed + _DEVIATIONS * self.deviation
        return min(cap, max(self.floor, learned) * self.backoff)

    def sample(self, gap: float) -> None:
        """News announced by a HAVE arrived ``gap`` after the HAVE, or after the previous part of it."""
        if self.cap is None or gap < 0:
            return
        self.samples += 1
        if self.smoothed is None:
            self.smoothed, self.deviation = gap, gap / 2
            return
        self.deviation += _DEVIATION_GAIN * (abs(gap - self.smoothed) - self.deviation)
        self.smoothed += _GAIN * (gap - self.smoothed)

    def premature(self) -> None:
        """A graft's first delta brought nothing: the eager copy was only late, wait longer next time."""
        if self.cap is not None:
            self.backoff = min(self.backoff * 2, max(1.0, self.cap / self.floor) if self.floor > 0 else 1.0)

    def needed(self) -> None:
        """A graft's first delta brought news: the eager copy was missing."""
        self.backoff = max(1.0, self.backoff / 2)


@dataclass(slots=True)
class Arrivals:
    """Deltas each queue has on their way into the host's store, received on any link and not yet
    applied: shared by a host's sessions, so a lazy link does not graft while another one delivers."""

    pending: Counter[QueueKey] = field(default_factory=Counter)

    def received(self, key: QueueKey) -> None:
        self.pending[key] += 1

    def settled(self, key: QueueKey, count: int = 1) -> None:
        left = self.pending[key] - count
        if left > 0:
            self.pending[key] = left
        else:
            del self.pending[key]

    def arriving(self, key: QueueKey) -> bool:
        return self.pending.get(key, 0) > 0
