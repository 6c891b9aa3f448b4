"""Process-wide tuning by a daemon that owns its process: the collector's threshold and the frozen start-up
objects (an embedded daemon, as in the other tests, leaves its host process alone)."""

from __future__ import annotations

import functools
import gc
from pathlib import Path

import trio

from latticed.config import DaemonConfig
from latticed.daemon import GC_GEN0_THRESHOLD, run_daemon


def collector_while_running(tmp_path: Path, *, tune_gc: bool) -> dict[str, int]:
    """The collector's first threshold and frozen count seen while a daemon runs in this process."""
    config = DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock")
    seen: dict[str, int] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(
                functools.partial(run_daemon, config, handle_signals=False, tune_gc=tune_gc, env={})
            )
            seen["threshold"] = gc.get_threshold()[0]
            seen["frozen"] = gc.get_freeze_count()
            running.stop()

    trio.run(main)
    return seen


def test_a_daemon_that_owns_its_process_tunes_the_collector(tmp_path: Path) -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, *saved[1:])
        seen = collector_while_running(tmp_path, tune_gc=True)
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
    assert seen["threshold"] == GC_GEN0_THRESHOLD
    assert seen["frozen"] > 0


def test_an_embedded_daemon_leaves_the_collector_alone(tmp_path: Path) -> None:
    saved = gc.get_threshold()
    seen = collector_while_running(tmp_path, tune_gc=False)
    assert seen["threshold"] == saved[0]
