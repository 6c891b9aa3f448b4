"""Same-run baselines for the latency benchmarks: how late this host wakes a process that sleeps, and how
long its disk takes to make a small write durable.

A p99 target of a few milliseconds means little while the host itself wakes a sleeping process 5-10 ms
late at p99 (CPU steal on a shared VM, other load), or while one bare ``fdatasync`` of a commit's worth
of bytes takes as long: every acknowledged write pays one. :class:`WakeProbe` and :class:`FsyncProbe`
measure exactly that, each in a process of its own, while a benchmark runs, so every latency figure
comes with the host's own floor from the same minutes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self


def _probe(interval: float, stop: Any, out: Any) -> None:
    lateness: list[float] = []
    while not stop.is_set():
        start = time.monotonic()
        time.sleep(interval)
        lateness.append(time.monotonic() - start - interval)
    out.put(lateness)


def _fsync_probe(directory: str, size: int, interval: float, stop: Any, out: Any) -> None:
    """Overwrite ``size`` bytes in place in a preallocated file and ``fdatasync`` them, every
    ``interval`` seconds: what a WAL commit that reuses its file costs the disk, nothing else (no
    file growth, so no filesystem journal commit)."""
    slots = 64
    durations: list[float] = []
    fd, path = tempfile.mkstemp(prefix="fsync-probe-", dir=directory)
    try:
        os.write(fd, b"\0" * (size * slots))
        os.fsync(fd)
        block = os.urandom(size)
        i = 0
        while not stop.is_set():
            start = time.perf_counter()
            os.pwrite(fd, block, (i % slots) * size)
            os.fdatasync(fd)
            durations.append(time.perf_counter() - start)
            i += 1
            time.sleep(interval)
    finally:
        os.close(fd)
        os.unlink(path)
        out.put(durations)


class _Probe:
    """A probe function run in a separate process for the duration of a ``with`` block; its samples
    (seconds, sorted) are in ``samples`` afterwards."""

    def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
        context = mp.get_context("spawn")
        self._stop = context.Event()
        self._out: Any = context.Queue()
        self._process = context.Process(target=target, args=(*args, self._stop, self._out), daemon=True)
        self.samples: list[float] = []

    def __enter__(self) -> Self:
        self._process.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self.samples = sorted(self._out.get(timeout=30))
        self._process.join(10)

    def _figures(self) -> str:
        """p50, p99, p99.9 and max: a path with several wake-ups (or flushes) per sample meets the single
        probe's far tail about that many times as often, so its p99 tracks the probe's p99.9."""
        s = self.samples

        def q(p: float) -> float:
            return s[min(len(s) - 1, int(len(s) * p))] * 1e3

        return f"p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, p99.9 {q(0.999):.2f} ms, max {s[-1] * 1e3:.2f} ms"


class FsyncProbe(_Probe):
    """``with FsyncProbe(directory) as probe: ...`` then ``probe.summary()``: how long this disk took to
    make ``size`` bytes durable, once every ``interval`` seconds, over the block. Put ``directory`` on
    the benchmarked store's filesystem. The probe adds a little disk load of its own (one small flush
    every 10 ms by default against the hundreds per second a latency benchmark makes)."""

    def __init__(self, directory: Path, size: int = 8192, interval: float = 0.01) -> None:
        super().__init__(_fsync_probe, (str(directory), size, interval))
        self.size = size

    def summary(self) -> str:
        if not self.samples:
            return "disk flush: no samples"
        return (
            f"disk: a bare {self.size // 1024} KiB overwrite + fdatasync over the same run "
            f"({len(self.samples)} of them, in a separate process): {self._figures()}"
        )


class WakeProbe(_Probe):
    """``with WakeProbe() as probe: ...`` then ``probe.summary()``: how late each sleep of ``interval``
    seconds woke, over the block."""

    def __init__(self, interval: float = 0.002) -> None:
        super().__init__(_probe, (interval,))

    def summary(self) -> str:
        if not self.samples:
            return "host wake-up lateness: no samples"
        return (
            f"host wake-up lateness over the same run ({len(self.samples)} sleeps of a separate process): "
            f"{self._figures()}"
        )
