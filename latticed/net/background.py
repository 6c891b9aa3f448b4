"""Background tasks of a service that forwards requests over the peer links (remote offers, remote
groups): work that outlives the request that started it (a pipelining client's forwarded offer, a lease
given back for a caller that left) runs in the nursery of the service's own :meth:`Background.run`, so
the daemon cancels it with the service, never with the request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from latticed.errors import LatticedError

__all__ = ["Background"]


class Background:
    """A service's nursery for its background tasks; :meth:`spawn` before :meth:`run` started raises
    :class:`LatticedError` with ``not_running`` (the service's own words)."""

    def __init__(self, not_running: str) -> None:
        self._not_running = not_running
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery until cancelled (start it with ``nursery.start``)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the background, beyond the caller's lifetime."""
        if self._nursery is None:
            raise LatticedError(self._not_running)
        self._nursery.start_soon(fn, *args)
