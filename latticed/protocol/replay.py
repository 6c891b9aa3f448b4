"""The responder's replay cache: the handshake openings (msg1) it answered recently, by source address.

A recorded opening replayed to the daemon it was sent to must draw no answer (docs/protocol.md §4.2), so
the cache remembers every opening it admitted until the opening's time leaves the freshness window. Only
openings that passed the MAC enter it, so only holders of the network key can fill it, and a key holder
can make as many valid openings as it likes, dated anywhere in the window. The cache is built so that
such a flood costs honest peers nothing:

* **Per-source share.** Openings are counted by source (the caller's label for where the connection came
  from: an IPv4 address, an IPv6 /64). A source holding :attr:`ReplayCache.per_source` openings is
  refused until some of them expire; nothing is forgotten to make room for it, so it locks out only
  itself.
* **Future-dated openings** (more than :data:`FUTURE_SKEW_MS` ahead of our clock) stay longest, so a
  source may hold only :attr:`ReplayCache.future_per_source` of them.
* **Eviction that cannot be monopolised.** Only when the whole cache is full (many sources) does it
  forget an opening: the oldest of the source holding the most. That source's *floor* rises (its
  openings at or below the forgotten time are refused from then on); other sources' floors do not move.
* **Expiry.** An opening whose time fell out of the window leaves and raises the cache-wide floor, which
  the window refuses anyway; the floor keeps a responder whose clock jumps back from answering an opening
  it forgot.

What it cannot do with bounded memory is documented in docs/protocol.md §4.3: an opening forgotten by
eviction (only a flooding source's, under a flood from many sources) replayed *from another source*
within the window draws msg2.

Sans-IO and not thread-safe: one per daemon, used from its event loop.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Final, Protocol

from latticed.errors import MalformedError

__all__ = [
    "DEFAULT_REPLAY_CAPACITY",
    "FRESHNESS_WINDOW_MS",
    "FUTURE_SKEW_MS",
    "OpeningCache",
    "ReplayCache",
]

#: How far msg1's time may lie from the responder's clock, either way (ms): clock skew plus latency.
FRESHNESS_WINDOW_MS: Final = 120_000
#: Openings a :class:`ReplayCache` remembers by default (they are forgotten after the window anyway).
DEFAULT_REPLAY_CAPACITY: Final = 8192
#: An opening dated more than this ahead of our clock counts as future-dated (ms).
FUTURE_SKEW_MS: Final = 5_000


class OpeningCache(Protocol):
    """What a responder's handshake needs of a replay cache (a :class:`ReplayCache` seen from one source)."""

    @property
    def window_ms(self) -> int: ...

    def admit(self, key: bytes, time_ms: int, now_ms: int) -> bool: ...


@dataclass(slots=True)
class _Source:
    """One source's openings still remembered, oldest first (lazily: entries gone meanwhile are skipped)."""

    heap: list[tuple[int, int, bytes]] = field(default_factory=list)  # (time, seq, key)
    count: int = 0
    future: int = 0
    floor: int = -1  # its openings at or below this are refused (one of its was evicted)


@dataclass(slots=True, frozen=True)
class _Entry:
    time_ms: int
    seq: int
    source: str
    future: bool


class ReplayCache:
    """Openings answered recently, so a recorded one replayed is not answered again (see the module doc).

    ``capacity`` bounds the openings remembered in all; ``per_source`` (default an eighth of it) those of
    one source; ``future_per_source`` those of one source dated more than :data:`FUTURE_SKEW_MS` ahead;
    ``max_sources`` the sources tracked at once (a new source beyond it is refused).
    """

    __slots__ = (
        "_capacity",
        "_floor",
        "_future_per_source",
        "_heap",
        "_max_sources",
        "_per_source",
        "_seen",
        "_seq",
        "_sources",
        "_window",
    )

    def __init__(
        self,
        *,
        window_ms: int = FRESHNESS_WINDOW_MS,
        capacity: int = DEFAULT_REPLAY_CAPACITY,
        per_source: int | None = None,
        future_per_source: int = 32,
        max_sources: int | None = None,
    ) -> None:
        share = max(1, capacity // 8) if per_source is None else per_source
        sources = 2 * capacity if max_sources is None else max_sources
        if window_ms < 0 or capacity < 1 or share < 1 or future_per_source < 0 or sources < 1:
            raise MalformedError(
                "replay cache needs window_ms >= 0, capacity, per_source and max_sources >= 1, "
                f"future_per_source >= 0; got {window_ms}, {capacity}, {share}, {sources}, "
                f"{future_per_source}"
            )
        self._window = window_ms
        self._capacity = capacity
        self._per_source = share
        self._future_per_source = future_per_source
        self._max_sources = sources
        self._seen: dict[bytes, _Entry] = {}
        self._heap: list[tuple[int, int, bytes]] = []  # every source's, oldest first, for expiry
        self._sources: dict[str, _Source] = {}
        self._seq = itertools.count()
        self._floor = -1

    def __len__(self) -> int:
        return len(self._seen)

    @property
    def window_ms(self) -> int:
        """How far an opening's time may lie from ``now_ms``, either way."""
        return self._window

    @property
    def floor_ms(self) -> int:
        """Openings with a time at or below this are refused, whatever their source (-1: none yet)."""
        return self._floor

    @property
    def per_source(self) -> int:
        """Openings one source may have remembered at once."""
        return self._per_source

    @property
    def future_per_source(self) -> int:
        """Future-dated openings one source may have remembered at once."""
        return self._future_per_source

    def source_floor_ms(self, source: str) -> int:
        """Openings from ``source`` at or below this are refused (-1: none of its was evicted)."""
        record = self._sources.get(source)
        return -1 if record is None else record.floor

    def held_by(self, source: str) -> int:
        """How many openings from ``source`` are remembered."""
        record = self._sources.get(source)
        return 0 if record is None else record.count

    def is_fresh(self, time_ms: int, now_ms: int) -> bool:
        """Whether ``time_ms`` lies within the window around ``now_ms``."""
        return abs(time_ms - now_ms) <= self._window

    def for_source(self, source: str) -> OpeningCache:
        """This cache as one connection's handshake sees it: its openings count against ``source``."""
        return _SourceView(self, source)

    def admit(self, key: bytes, time_ms: int, now_ms: int, source: str = "") -> bool:
        """Record an opening from ``source`` and say whether it may be answered: fresh, above the floors,
        never seen, and within its source's share."""
        self._expire(now_ms)
        if not self.is_fresh(time_ms, now_ms) or time_ms <= self._floor or key in self._seen:
            return False
        record = self._sources.get(source)
        if record is None:
            if len(self._sources) >= self._max_sources:
                self._drop_idle_sources(now_ms)
                if len(self._sources) >= self._max_sources:
                    return False
            record = _Source()
        if time_ms <= record.floor or record.count >= self._per_source:
            return False
        future = time_ms > now_ms + FUTURE_SKEW_MS
        if future and record.future >= self._future_per_source:
            return False
        if len(self._seen) >= self._capacity and not self._evict(time_ms, source):
            return False
        self._sources[source] = record
        seq = next(self._seq)
        self._seen[key] = _Entry(time_ms, seq, source, future)
        heapq.heappush(self._heap, (time_ms, seq, key))
        heapq.heappush(record.heap, (time_ms, seq, key))
        record.count += 1
        record.future += future
        self._compact(record)
        return True

    def _expire(self, now_ms: int) -> None:
        heap, horizon = self._heap, now_ms - self._window
        while heap and heap[0][0] < horizon:
            time_ms, seq, key = heapq.heappop(heap)
            self._floor = max(self._floor, time_ms)
            entry = self._seen.get(key)
            if entry is not None and entry.seq == seq:
                self._remove(key, entry)

    def _evict(self, time_ms: int, source: str) -> bool:
        """Make room: forget the oldest opening of the source holding the most. False if that is the
        asking source and its new opening is no newer than its oldest (it cannot be told from a replay)."""
        largest = max(self._sources.items(), key=lambda item: item[1].count)
        name, record = largest
        heap = record.heap
        while heap:
            old_time, seq, key = heap[0]
            entry = self._seen.get(key)
            if entry is None or entry.seq != seq:
                heapq.heappop(heap)
                continue
            if name == source and time_ms <= old_time:
                return False
            heapq.heappop(heap)
            record.floor = max(record.floor, old_time)  # first: _remove keeps a record with a floor
            self._remove(key, entry)
            return True
        return False  # unreachable while the cache is full: the largest source holds an opening

    def _remove(self, key: bytes, entry: _Entry) -> None:
        del self._seen[key]
        record = self._sources[entry.source]
        record.count -= 1
        record.future -= entry.future
        if record.count == 0 and record.floor <= self._floor:
            del self._sources[entry.source]  # nothing of it left that the cache-wide floor does not cover

    def _drop_idle_sources(self, now_ms: int) -> None:
        horizon = now_ms - self._window
        for name in [n for n, r in self._sources.items() if r.count == 0 and r.floor < horizon]:
            # Below the window already; the cache-wide floor keeps it after a clock jump back.
            self._floor = max(self._floor, self._sources.pop(name).floor)

    def _compact(self, record: _Source) -> None:
        """Keep the lazily cleaned heaps within a small factor of what they index."""
        seen = self._seen
        if len(self._heap) > 2 * len(seen) + 64:
            self._heap = [(e.time_ms, e.seq, k) for k, e in seen.items()]
            heapq.heapify(self._heap)
        if len(record.heap) > 2 * record.count + 64:
            record.heap = [item for item in record.heap if (e := seen.get(item[2])) and e.seq == item[1]]
            heapq.heapify(record.heap)


class _SourceView:
    """A :class:`ReplayCache` seen from one source (what :meth:`ReplayCache.for_source` returns)."""

    __slots__ = ("_cache", "_source")

    def __init__(self, cache: ReplayCache, source: str) -> None:
        self._cache = cache
        self._source = source

    @property
    def window_ms(self) -> int:
        return self._cache.window_ms

    def admit(self, key: bytes, time_ms: int, now_ms: int) -> bool:
        return self._cache.admit(key, time_ms, now_ms, self._source)
