"""Catch up before signing: after a start, the daemon signs nothing until it has heard from the peers it
knew at start (their first digest: what they hold, of our own queues too) or found them unreachable, for
at most ``timeout`` seconds. A store restored from a copy thus learns of the records its peers hold of its
own queues before it could sign a second history at those offsets; once a peer has said what it holds,
the owner fence's per-queue check (a peer holding more of our queue than we do) takes over.

Sans-IO: the service reports dials that ended and asks with its clock and how many connected peers have
not sent their first digest yet. Once open it stays open (one comparison per write).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Final

__all__ = ["GATE_GRACE_S", "START_CATCH_UP_S", "StartGate", "WRITE_HOLD_S"]

#: At most this long after a start writes wait for peers (a dial times out after 10 s).
START_CATCH_UP_S: Final = 12.0
#: A write the gate refused waits this much past the gate's deadline (the opening must reach it).
GATE_GRACE_S: Final = 1.0
#: The longest the daemon holds a write after a start before it answers: a client's timeout (the
#: integration tests') must exceed it, or it fails a write the daemon would still answer.
WRITE_HOLD_S: Final = START_CATCH_UP_S + GATE_GRACE_S


class StartGate:
    """Closed from the start until every peer of the first dial round was heard from or failed, or
    ``timeout``. Until :meth:`expect` names that round, it waits for it."""

    def __init__(
        self, started: float, targets: Iterable[Hashable] | None = None, timeout: float = START_CATCH_UP_S
    ) -> None:
        self.started = started
        self.timeout = timeout
        self._pending: set[Hashable] | None = None if targets is None else set(targets)
        #: How many peers the first dial round had.
        self.expected = 0 if targets is None else len(self._pending or ())
        self.opened_at: float | None = None
        self.timed_out = False

    @property
    def deadline(self) -> float:
        return self.started + self.timeout

    @property
    def waits_for(self) -> int:
        """Peers of the first dial round neither reached nor found unreachable yet."""
        return len(self._pending or ())

    def expect(self, targets: Iterable[Hashable]) -> None:
        """The first dial round: the peers to hear from (or to find unreachable)."""
        if self._pending is None:
            self._pending = set(targets)
            self.expected = len(self._pending)

    def dial_ended(self, target: Hashable) -> None:
        """The first dial of ``target`` connected (its digest is then awaited on the link) or failed."""
        if self._pending is not None:
            self._pending.discard(target)

    def reason(self, now: float, unheard_links: int) -> str | None:
        """Why this daemon must not sign yet (None: go ahead); opens the gate for good once nothing is
        awaited or the time is up."""
        if self.opened_at is not None:
            return None
        if self._pending is not None and not self._pending and unheard_links == 0:
            self.opened_at = now
            return None
        if now >= self.deadline:
            self.opened_at, self.timed_out = now, True
            return None
        waiting = []
        if self._pending is None:
            waiting.append("the first dials")
        elif self._pending:
            waiting.append(f"{len(self._pending)} to reach")
        if unheard_links:
            waiting.append(f"{unheard_links} to hear from")
        return (
            f"this daemon started {now - self.started:.1f} s ago and learns what its peers hold "
            f"({', '.join(waiting)}) before it signs anything, for at most {self.timeout:g} s (a store "
            "restored from a copy catches up first); retry in a moment"
        )
