"""Connection accounting for the peer listener: what a stranger (or a key holder) may hold before and
after the handshake, and the descriptors kept for the local API and the store.

Every accepted connection takes a :class:`Ticket` first:

* **Per source** (:func:`source_of`: an IPv4 address, an IPv6 /64) at most ``per_source`` handshakes run at
  once; another connection from that source is closed at once. Each handshake has its own time limit
  (``DEFAULT_HANDSHAKE_TIMEOUT``), so one source holds at most ``per_source`` of them, that long each.
* **In all** at most ``max_pending`` handshakes run at once. When that is reached the newcomer is not
  refused: the oldest handshake of the source running the most is cut instead, so sources holding
  half-open connections cannot keep an honest peer from getting its (milliseconds-long) turn.
* **Descriptors.** A connection is closed at once while the process's open descriptors are within
  ``fd_reserve`` of its ``RLIMIT_NOFILE``: the reserve is for the local API, the store and the metrics
  endpoint, which peers must never starve. Authenticated links count too (a key holder can make
  identities at will).

The counts are kept on the event loop (no locks); the descriptor count is read from ``/proc/self/fd`` at
most every :data:`FD_RECOUNT_S`, plus what this accounting opened since.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import resource
import time
from collections.abc import Callable
from typing import Final

import trio

__all__ = [
    "DEFAULT_FD_RESERVE",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_PER_SOURCE",
    "FAILURE_LOG_INTERVAL_S",
    "Admission",
    "FailureLog",
    "Ticket",
    "source_of",
]

#: Handshakes running at once, in all (a slow LAN handshake takes milliseconds).
DEFAULT_MAX_PENDING: Final = 256
#: Handshakes running at once from one source.
DEFAULT_PER_SOURCE: Final = 8
#: Descriptors kept free for the local API, the store and metrics.
DEFAULT_FD_RESERVE: Final = 128
#: How often the open descriptors are recounted (seconds).
FD_RECOUNT_S: Final = 0.25
#: One ``peer.handshake_failed`` line per source per this many seconds (with the count it stands for).
FAILURE_LOG_INTERVAL_S: Final = 60.0


def source_of(host: str) -> str:
    """The source a connection counts against: the IPv4 address (also when mapped into IPv6), or the
    IPv6 /64 (one host usually has a whole /64 to pick addresses from)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _fd_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


class Ticket:
    """One accepted connection's place in the accounting; :meth:`close` it when the connection ends."""

    __slots__ = ("_admission", "_closed", "authenticated", "scope", "source")

    def __init__(self, admission: Admission, source: str) -> None:
        self._admission = admission
        self._closed = False
        self.source = source
        self.authenticated = False
        #: Run the handshake inside this: it is cancelled when the ticket is cut to make room.
        self.scope = trio.CancelScope()

    def authenticate(self) -> None:
        """The handshake succeeded: the connection no longer counts as pending."""
        if not self.authenticated and not self._closed:
            self.authenticated = True
            self._admission._pending_done(self)

    def close(self) -> None:
        """The connection ended. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self.authenticated:
            self._admission._pending_done(self)
        self._admission._open -= 1


class Admission:
    """The accounting of one listener (see the module doc)."""

    def __init__(
        self,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        per_source: int = DEFAULT_PER_SOURCE,
        fd_reserve: int = DEFAULT_FD_RESERVE,
        fd_limit: Callable[[], int] = _fd_limit,
        open_fds: Callable[[], int | None] = _open_fds,
    ) -> None:
        self.max_pending = max_pending
        self.per_source = per_source
        self.fd_reserve = fd_reserve
        self._fd_limit = fd_limit
        self._open_fds = open_fds
        self._pending: dict[str, collections.deque[Ticket]] = {}
        self._pending_total = 0
        self._open = 0  # tickets not closed (pending or authenticated)
        self._fds_counted: int | None = None
        self._opened_since_count = 0
        self._counted_at = float("-inf")
        #: Connections closed at once, by reason ("source", "descriptors"), and handshakes cut for room.
        self.refused: collections.Counter[str] = collections.Counter()

    @property
    def pending(self) -> int:
        """Handshakes running now."""
        return self._pending_total

    def pending_from(self, source: str) -> int:
        return len(self._pending.get(source, ()))

    def admit(self, source: str) -> Ticket | str:
        """A ticket for a new connection from ``source``, or why it must be closed at once."""
        if not self._descriptors_left():
            self.refused["descriptors"] += 1
            return (
                f"too few file descriptors left (keeping {self.fd_reserve} of {self._fd_limit()} for the "
                "local API and the store)"
            )
        queue = self._pending.get(source)
        if queue is not None and len(queue) >= self.per_source:
            self.refused["source"] += 1
            return f"{len(queue)} handshakes from {source} already running (at most {self.per_source})"
        if self._pending_total >= self.max_pending:
            self._cut_largest()
        ticket = Ticket(self, source)
        self._pending.setdefault(source, collections.deque()).append(ticket)
        self._pending_total += 1
        self._open += 1
        self._opened_since_count += 1
        return ticket

    def _cut_largest(self) -> None:
        queue = max(self._pending.values(), key=len)
        oldest = queue[0]
        self.refused["cut"] += 1
        oldest.scope.cancel()
        oldest.close()  # its slot is free now; the handler sees the cancellation and closes the socket

    def _pending_done(self, ticket: Ticket) -> None:
        queue = self._pending.get(ticket.source)
        if queue is None:
            return
        try:
            queue.remove(ticket)
        except ValueError:
            return
        self._pending_total -= 1
        if not queue:
            del self._pending[ticket.source]

    def _descriptors_left(self) -> bool:
        now = time.monotonic()
        if now - self._counted_at >= FD_RECOUNT_S:
            self._fds_counted = self._open_fds()
            self._opened_since_count = 0
            self._counted_at = now
        in_use = self._open if self._fds_counted is None else self._fds_counted + self._opened_since_count
        return in_use < self._fd_limit() - self.fd_reserve


class FailureLog:
    """Rate limit for a per-connection log line: the first failure from a source is logged, the next ones
    within ``interval`` seconds are only counted, and the first one after it is logged with the count of
    failures it stands for. At most ``max_sources`` are tracked (the oldest forgotten first)."""

    def __init__(self, *, interval: float = FAILURE_LOG_INTERVAL_S, max_sources: int = 4096) -> None:
        self.interval = interval
        self.max_sources = max_sources
        self._last: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()

    def note(self, source: str, now: float) -> int | None:
        """A failure from ``source`` at ``now`` (monotonic seconds): how many failures to report on a
        line written now, or None to write nothing."""
        last = self._last.get(source)
        if last is not None and now - last[0] < self.interval:
            self._last[source] = (last[0], last[1] + 1)
            return None
        count = 1 + (last[1] if last is not None else 0)
        self._last[source] = (now, 0)
        self._last.move_to_end(source)
        while len(self._last) > self.max_sources:
            self._last.popitem(last=False)
        return count
