"""One clock tick for the daemon's periodic jobs, so that an idle daemon wakes up once for all of them.

Each job sleeps until the next multiple of its own period on trio's clock instead of for its period from
whenever it last ran. Jobs whose periods divide each other then fall due at the same instant and run in
the same pass of the event loop: one wake-up of the process every 10 s serves every link's keep-alive
(:mod:`latticed.net.gossip`), retention's check and, every third time, the disk check, where separate
timers would wake it once each. The period stays what each job asks for; only its phase is shared.
"""

from __future__ import annotations

from typing import Final

import trio

#: The daemon's base tick (seconds): keep-alives run on it, and other periodic jobs on multiples of it.
TICK_S: Final = 10.0


def next_tick(now: float, period: float) -> float:
    """The first multiple of ``period`` after ``now`` (later than ``now``, even when ``now`` is one)."""
    return (now // period + 1) * period


def shared_period(limit: float, tick: float = TICK_S) -> float:
    """The longest multiple of ``tick`` that is at most ``limit`` (``limit`` itself when shorter than a
    tick): for a job that must run at least every ``limit`` seconds and would rather share the tick."""
    return limit if limit < tick else (limit // tick) * tick


async def sleep_until_tick(period: float) -> None:
    """Sleep until the next multiple of ``period`` seconds on trio's clock (between 0 and ``period``)."""
    await trio.sleep_until(next_tick(trio.current_time(), period))


__all__ = ["TICK_S", "next_tick", "shared_period", "sleep_until_tick"]
