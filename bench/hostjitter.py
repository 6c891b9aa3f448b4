"""A same-run baseline for the latency benchmarks: how late this host wakes a process that sleeps.

A p99 target of a few milliseconds means little while the host itself wakes a sleeping process 5-10 ms
late at p99 (CPU steal on a shared VM, other load). :class:`WakeProbe` measures exactly that, in a
process of its own, while a benchmark runs, so every latency figure comes with the host's own floor
from the same minutes.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from types import TracebackType
from typing import Any, Self


def _probe(interval: float, stop: Any, out: Any) -> None:
    lateness: list[float] = []
    while not stop.is_set():
        start = time.monotonic()
        time.sleep(interval)
        lateness.append(time.monotonic() - start - interval)
    out.put(lateness)


class WakeProbe:
    """``with WakeProbe() as probe: ...`` then ``probe.summary()``: how late each sleep of ``interval``
    seconds woke, over the block."""

    def __init__(self, interval: float = 0.002) -> None:
        context = mp.get_context("spawn")
        self._stop = context.Event()
        self._out: Any = context.Queue()
        self._process = context.Process(target=_probe, args=(interval, self._stop, self._out), daemon=True)
        self.lateness: list[float] = []

    def __enter__(self) -> Self:
        self._process.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self.lateness = sorted(self._out.get(timeout=30))
        self._process.join(10)

    def summary(self) -> str:
        late = self.lateness
        if not late:
            return "host wake-up lateness: no samples"
        p50, p99 = late[len(late) // 2], late[min(len(late) - 1, int(len(late) * 0.99))]
        return (
            f"host wake-up lateness over the same run ({len(late)} sleeps of a separate process): "
            f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {late[-1] * 1e3:.2f} ms"
        )
