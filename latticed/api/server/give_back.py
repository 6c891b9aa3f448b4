"""Giving idle heap memory back to the system after bursts of API requests (latticed/process/malloc.py).

Apart from the server (:mod:`.api_server`) so that the connection loop stays one module's reading: this
is the server's memory policy, told of every request frame and run beside the listener.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio

from latticed.api.server.connection import LARGE_FRAME_BYTES
from latticed.process.logs import get_logger, log_event
from latticed.process.malloc import give_back_after_spike, give_back_when_idle

log = get_logger(__name__)

#: How long after a large request the heap is checked for memory to give back (one check per burst), and
#: how long the API must stay quiet after a burst of requests before the idle check.
GIVE_BACK_DELAY_S: Final = 1.0
#: Request bytes (any number of requests, errors included) that make a burst: once the API goes quiet
#: after one, free heap memory beyond what is kept on purpose is handed back.
BURST_BYTES: Final = 4 << 20


class MemoryGiveBack:
    """Hands idle heap memory back to the system after bursts of requests (latticed/process/malloc.py).

    Connections report every request frame (:meth:`received`). A large one (or a large frame cut off with
    its connection: :meth:`note`) is followed :data:`GIVE_BACK_DELAY_S` later by a check, one for all the
    notes of a burst, that releases memory only if much more than the amount kept on purpose lies free:
    steady bulk traffic keeps its warm pages. Many requests of any size (a flood of errors, say) leave
    memory behind without any one being large: once they add up to :data:`BURST_BYTES` and the API then
    stays quiet for :data:`GIVE_BACK_DELAY_S`, everything free beyond the amount kept is released."""

    def __init__(
        self,
        release: Callable[[], bool] = give_back_after_spike,
        *,
        release_idle: Callable[[], bool] = give_back_when_idle,
        delay: float = GIVE_BACK_DELAY_S,
        burst_bytes: int = BURST_BYTES,
    ) -> None:
        self._release = release
        self._release_idle = release_idle
        self._delay = delay
        self._burst_bytes = burst_bytes
        self._noted = trio.Event()
        #: Request bytes received since the last idle check.
        self._received = 0
        self._burst = trio.Event()
        #: How many checks released memory.
        self.released = 0

    def note(self) -> None:
        self._noted.set()

    def received(self, size: int) -> None:
        """A request frame of ``size`` bytes was read (called for every frame: keep it cheap)."""
        if size >= LARGE_FRAME_BYTES:
            self._noted.set()
        self._received += size
        if self._received >= self._burst_bytes:
            self._burst.set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._after_large_requests)
            nursery.start_soon(self._when_quiet)

    async def _after_large_requests(self) -> None:
        while True:
            await self._noted.wait()
            await trio.sleep(self._delay)  # let the burst end: the notes meanwhile share this check
            self._noted = trio.Event()
            self._check(self._release)

    async def _when_quiet(self) -> None:
        while True:
            await self._burst.wait()
            while True:  # until a whole delay passes without a request
                seen = self._received
                await trio.sleep(self._delay)
                if self._received == seen:
                    break
            self._received = 0
            self._burst = trio.Event()
            self._check(self._release_idle)

    def _check(self, release: Callable[[], bool]) -> None:
        # On the event loop: ~10 ms per 100 MB released, and at most once per burst.
        if release():
            self.released += 1
            log_event(log, "api.memory_released")


__all__ = ["BURST_BYTES", "GIVE_BACK_DELAY_S", "MemoryGiveBack"]
