"""Identical store reads in flight at once, read once: a relay passing a chunk on to several links is
asked for the same rows by each link's pump at the same moment, and each ask was a reader thread's read
transaction of its own (sim22c: two reads of the same 1,000 rows at once, one a link).

:class:`SharedReads` keeps the reads in flight by their request; a second asker of one awaits the
first's answer (its value, or its error raised again: the same read would fail the same way). The memo
holds a read only while it runs, so nothing is cached: an ask after it completed reads again. When the
first asker is cancelled its read's answer is lost, so the others ask again (one of them reads)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar, cast

import trio

__all__ = ["SharedReads"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class _Pending(Generic[T]):
    """One read in flight: set once it ended, with its value or its error (neither: it was cancelled)."""

    __slots__ = ("done", "error", "ok", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.ok = False
        self.value: T | None = None
        self.error: Exception | None = None


class SharedReads(Generic[K, T]):
    """Reads keyed by their request, at most one in flight per key (see the module docstring).
    ``issued`` counts the reads run, ``shared`` the asks answered by another asker's read."""

    def __init__(self) -> None:
        self._pending: dict[K, _Pending[T]] = {}
        self.issued = 0
        self.shared = 0

    def in_flight(self) -> int:
        """Reads running now (a test's and a probe's view: 0 once every read ended)."""
        return len(self._pending)

    def reading(self, key: K) -> bool:
        """Whether a read of ``key`` is in flight now (an asker would share it)."""
        return key in self._pending

    async def read(self, key: K, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``'s answer, or the one of the read of ``key`` in flight now."""
        while (pending := self._pending.get(key)) is not None:
            await pending.done.wait()
            if pending.ok:
                self.shared += 1
                return cast(T, pending.value)  # set with ok: a T
            if pending.error is not None:
                self.shared += 1
                raise pending.error
            # Its asker was cancelled (or interrupted) before the answer: ask again.
        mine: _Pending[T] = _Pending()
        self._pending[key] = mine
        self.issued += 1
        try:
            mine.value = await read()
            mine.ok = True
            return mine.value
        except Exception as exc:
            mine.error = exc
            raise
        finally:
            del self._pending[key]
            mine.done.set()
