"""Process-wide tuning by a daemon that owns its process: the collector's threshold and the frozen start-up
objects (an embedded daemon, as in the other tests, leaves its host process alone)."""

from __future__ import annotations

import functools
import gc
import platform
import resource
import subprocess
import sys
import weakref
from pathlib import Path

import msgpack
import pytest
import trio
import trio.testing

from latticed import daemon as daemon_module
from latticed.api.server.connection import LARGE_FRAME_BYTES
from latticed.api.server.give_back import MemoryGiveBack
from latticed.api.server.op_table import build_op_table
from latticed.api.server.request_router import parse_request
from latticed.daemon import GC_GEN0_THRESHOLD, run_daemon
from latticed.host.config import DaemonConfig
from latticed.process.malloc import SPIKE_BYTES, TRIM_THRESHOLD, give_back_after_spike, give_back_when_idle


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
            seen["cycle_freed"] = _a_later_cycle_is_freed()
            running.stop()

    trio.run(main)
    return seen


class _Node:
    other: object = None


def _a_later_cycle_is_freed() -> int:
    """1 if a reference cycle made now (after the daemon froze its start-up objects) is freed by a
    collection: freezing exempts what existed then, not what is made later."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    return int(gone() is None)


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
    assert seen["cycle_freed"] == 1


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
        "from latticed.process.malloc import keep_large_buffers\n"
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


# ------------------------------------------------------ memory given back after a spike


def test_give_back_only_what_a_spike_left_idle() -> None:
    released: list[int] = []

    def release(keep: int) -> bool:
        released.append(keep)
        return True

    steady = TRIM_THRESHOLD + SPIKE_BYTES
    assert not give_back_after_spike(free_bytes=lambda: steady, release=release)  # kept warm for reuse
    assert not give_back_after_spike(free_bytes=lambda: None, release=release)  # not glibc: nothing to do
    assert released == []
    assert give_back_after_spike(free_bytes=lambda: steady + 1, release=release)
    assert released == [TRIM_THRESHOLD]  # what is kept on purpose stays


async def test_large_requests_are_followed_by_one_check_per_burst(
    autojump_clock: trio.testing.MockClock,
) -> None:
    checks: list[int] = []
    give_back = MemoryGiveBack(lambda: checks.append(len(checks)) or True, delay=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(give_back.run)
        await trio.sleep(5)
        assert checks == []  # nothing large: never a check
        for _ in range(5):  # a burst, from t=5.0 to 5.4
            give_back.note()
            await trio.sleep(0.1)
        await trio.sleep(0.3)
        assert checks == []  # one delay after the first note has not passed
        await trio.sleep(1)
        assert len(checks) == 1 and give_back.released == 1  # one check for the whole burst
        await trio.sleep(5)
        assert len(checks) == 1
        give_back.note()
        await trio.sleep(2)
        assert len(checks) == 2
        nursery.cancel_scope.cancel()


def test_an_idle_api_gives_back_what_lies_free_beyond_the_amount_kept() -> None:
    released: list[int] = []

    def release(keep: int) -> bool:
        released.append(keep)
        return True

    assert not give_back_when_idle(free_bytes=lambda: TRIM_THRESHOLD, release=release)  # kept warm
    assert not give_back_when_idle(free_bytes=lambda: None, release=release)
    assert released == []
    assert give_back_when_idle(free_bytes=lambda: TRIM_THRESHOLD + 1, release=release)  # no spike needed
    assert released == [TRIM_THRESHOLD]


async def test_a_burst_of_small_requests_is_followed_by_one_check_once_the_api_is_quiet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Many small requests (a flood of errors) leave memory behind with none of them large: once they add
    up to a burst, the API going quiet is followed by one idle check; traffic below that, or still
    going on, is left alone."""
    large_checks: list[float] = []
    idle_checks: list[float] = []
    give_back = MemoryGiveBack(
        lambda: large_checks.append(trio.current_time()) or False,
        release_idle=lambda: idle_checks.append(trio.current_time()) or True,
        delay=1.0,
        burst_bytes=10_000,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(give_back.run)
        for _ in range(50):  # 5,000 bytes: no burst
            give_back.received(100)
        await trio.sleep(5)
        assert idle_checks == []
        start = trio.current_time()
        for _ in range(300):  # 30 s of requests, 30,000 bytes more
            give_back.received(100)
            await trio.sleep(0.1)
        assert idle_checks == []  # still busy: its warm memory is in use
        await trio.sleep(2.5)  # quiet for one whole delay: seen within two
        assert len(idle_checks) == 1 and start + 30 + 1.0 <= idle_checks[0] <= start + 30 + 2.0
        assert give_back.released == 1 and large_checks == []  # none of them was large
        await trio.sleep(10)
        assert len(idle_checks) == 1  # one check per burst
        give_back.received(LARGE_FRAME_BYTES)  # a large one still has its own check
        await trio.sleep(2)
        assert len(large_checks) == 1
        nursery.cancel_scope.cancel()


def test_what_is_not_a_request_is_refused_before_it_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame of tiny containers decodes to tens of times its size: one that cannot be a request (not a
    map) is refused without building those objects."""
    from latticed.api.server import request_router  # noqa: PLC0415

    def no_decoding(data: bytes) -> object:
        raise AssertionError("decoded")

    monkeypatch.setattr(request_router, "unpack_request", no_decoding)
    ops = build_op_table()
    for body in (msgpack.packb([{}] * 10_000), msgpack.packb([[1]] * 10_000), b"", b"\x00"):
        request, reply = parse_request(body, ops)
        assert request is None and reply is not None and reply["error"]["code"] == "malformed"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_memory_a_spike_left_in_the_heap_is_given_back() -> None:
    """With large buffers kept in the heap (as the daemon does), 160 MB freed between small survivors stays
    resident; giving it back returns it to the kernel."""
    script = (
        "from latticed.process.malloc import give_back_after_spike, keep_large_buffers\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20\n"
        "assert keep_large_buffers()\n"
        "big, small = [], []\n"
        "for i in range(40):\n"
        "    big.append(b'x' * (4 << 20)); small.append(b'y' * 2000 + bytes([i]))\n"
        "del big\n"
        "retained = rss()\n"
        "assert give_back_after_spike()\n"
        "print(retained, rss())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    retained, after = map(int, out.stdout.split())
    assert after < retained - 100, (retained, after)
