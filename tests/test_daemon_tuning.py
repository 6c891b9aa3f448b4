"""Process-wide tuning by a daemon that owns its process: the collector's threshold and the frozen start-up
objects (an embedded daemon, as in the other tests, leaves its host process alone)."""

from __future__ import annotations

import functools
import gc
import platform
import resource
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import trio

from latticed import daemon as daemon_module
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


def test_only_a_daemon_that_owns_its_process_keeps_large_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(daemon_module, "keep_large_buffers", lambda: calls.append(True) or True)
    collector_while_running(tmp_path / "embedded", tune_gc=False)
    assert calls == []
    saved = gc.get_threshold()
    try:
        collector_while_running(tmp_path / "owner", tune_gc=True)
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
    assert calls == [True]


def _reply_faults(rounds: int) -> int:
    """Minor page faults while building and dropping ``rounds`` read-sized replies, as the server does:
    the values joined (2 MB), msgpack's output, the framed copy."""
    values = [b"x" * 100 for _ in range(20_000)]

    def reply() -> int:
        joined = b"".join(values)
        body = msgpack.packb({"values": joined, "count": len(values)}, use_bin_type=True)
        return len(b"\x00\x00\x00\x00" + body)

    for _ in range(3):
        reply()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        reply()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_freed_buffers_stay_in_the_heap() -> None:
    """In a fresh process, each such reply faults ~1,800 fresh pages by default (glibc hands the buffers
    back to the kernel); after the tuning, none."""
    script = (
        "import sys\n"
        "from test_daemon_tuning import _reply_faults\n"
        "from latticed.malloc import keep_large_buffers\n"
        "tuned = sys.argv[1] == 'tuned'\n"
        "if tuned: assert keep_large_buffers()\n"
        "print(_reply_faults(20))\n"
    )

    def faults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", script, mode],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return int(out.stdout)

    default, tuned = faults("default"), faults("tuned")
    assert tuned < 100 < 20 * 500 < default, (default, tuned)
