"""Accept loops for the daemon's listeners (peers, local API, metrics), in place of
``trio.serve_listeners``, which logs an ERROR with a traceback for every failed ``accept`` when the process
runs out of descriptors: thousands of identical lines while a flood lasts. Here running out (EMFILE,
ENFILE, ENOBUFS, ENOMEM) is one WARNING when it starts and one INFO line, with the count, when an accept
succeeds again; meanwhile the loop retries every :data:`RETRY_S`.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

import trio

from latticed.process.logs import get_logger, log_event

__all__ = ["CAPACITY_ERRNOS", "RETRY_S", "serve_listeners"]

log = get_logger(__name__)

CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Seconds between accepts while descriptors are exhausted.
RETRY_S: Final = 0.1

StreamT = TypeVar("StreamT", bound=trio.abc.AsyncResource)


class _Episode:
    """One listener's run of failed accepts, logged once when it starts and once when it ends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 0

    def failed(self, error: OSError) -> None:
        self.failures += 1
        if self.failures == 1:
            code = errno.errorcode.get(error.errno or 0, str(error.errno))
            log_event(
                log,
                f"{self.name}.accept_exhausted",
                level=logging.WARNING,
                error=f"{code}: {os.strerror(error.errno or 0)}",
                hint="out of file descriptors: new connections wait until some close (raise LimitNOFILE, "
                "or find who holds so many connections); logged once until accepting works again",
            )

    def succeeded(self) -> None:
        if self.failures:
            log_event(log, f"{self.name}.accept_recovered", failed_accepts=self.failures)
            self.failures = 0


async def serve_listeners(
    handler: Callable[[StreamT], Awaitable[object]],
    listeners: Sequence[trio.abc.Listener[StreamT]],
    *,
    name: str,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on every listener until cancelled, one ``handler`` task per connection (like trio's, minus
    the log flood); ``name`` prefixes the events logged (``peer``, ``api``, ``metrics``)."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, handler, nursery, _Episode(name))
        task_status.started()


async def _accept_loop(
    listener: trio.abc.Listener[StreamT],
    handler: Callable[[StreamT], Awaitable[object]],
    nursery: trio.Nursery,
    episode: _Episode,
) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:
                if error.errno not in CAPACITY_ERRNOS:
                    raise
                episode.failed(error)
                await trio.sleep(RETRY_S)
                continue
            episode.succeeded()
            nursery.start_soon(_run_handler, handler, stream)


async def _run_handler(handler: Callable[[StreamT], Awaitable[object]], stream: StreamT) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)
