"""Process-wide tuning by a daemon that owns its process: the collector's threshold and the frozen start-up
objects (an embedded daemon, as in the other tests, leaves its host process alone)."""

from __future__ import annotations

import functools
import gc
from pathlib import Path

import trio

from latticed.config import DaemonConfig
from latticed.daemon import GC_GEN0_THRESHOLD, run_daemon


def test_a_daemon_that_owns_its_process_tunes_the_collector(tmp_path: Path) -> None:
    config = DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock")
    saved = gc.get_threshold()
    seen: dict[str, int] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(
                functools.partial(run_daemon, config, handle_signals=False, tune_gc=True, env={})
            )
            seen["threshold"] = gc.get_threshold()[0]
            seen["frozen"] = gc.get_freeze_count()
            running.stop()

    try:
        gc.set_threshold(700, *saved[1:])
        trio.run(main)
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
    assert seen["threshold"] == GC_GEN0_THRESHOLD
    assert seen["frozen"] > 0


def test_an_embedded_daemon_leaves_the_collector_alone(tmp_path: Path) -> None:
    config = DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock")
    saved = gc.get_threshold()
    seen: dict[str, int] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(
                functools.partial(run_daemon, config, handle_signals=False, tune_gc=False, env={})
            )
            seen["threshold"] = gc.get_threshold()[0]
            running.stop()

    trio.run(main)
    assert seen["threshold"] == saved[0]
