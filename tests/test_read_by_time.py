"""Reading by time through the daemon: ``offsets_for_times``, ``latticectl tail --since/--from-time`` and
``range --from-time/--to-time``, on a queue this daemon owns and on one it holds as a replica, with
records stamped at known times (the owner's clock is set by the test)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from latticed.crdt.signing import Identity
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig
from latticed.process.clock import wall_ms

runner = CliRunner()
BOB = Identity.from_seed(b"b" * 32)
HOUR = 3_600_000


class SetClock:
    """The owner's clock, set by the test: every record offered reads ``now``."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    d = start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))
    yield d
    d.stop()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def offsets(result: Result) -> list[int]:
    assert result.exit_code == 0, result.output
    return [json.loads(line)["offset"] for line in result.stdout.splitlines()]


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def test_the_owner_reads_from_a_time_on(daemon: InProcessDaemon) -> None:
    t0 = wall_ms() - 5 * HOUR
    clock = SetClock(t0)
    daemon.handle.engine.clock = clock  # type: ignore[method-assign]
    stamps = [t0, t0 + HOUR, t0 + 2 * HOUR, t0 + HOUR + 1, t0 + 4 * HOUR, t0 + 4 * HOUR + 5]
    with daemon.client() as c:
        c.queue_create("q")
        for i, ts in enumerate(stamps):  # offset 3: the clock stepped back
            clock.now = ts
            assert c.offer("q", b"r%d" % i) == i
        assert c.offsets_for_times("q", t0) == (0, t0)
        assert c.offsets_for_times("q", t0 + HOUR + 1) == (2, t0 + 2 * HOUR)  # the first at or after
        assert c.offsets_for_times("q", t0 + 3 * HOUR) == (4, t0 + 4 * HOUR)
        assert c.offsets_for_times("q", t0 + 5 * HOUR) is None
    assert offsets(ctl(daemon, "tail", "q", "--since", "2h", "--json")) == [4, 5]
    assert offsets(ctl(daemon, "tail", "q", "--from-time", iso(t0 + HOUR), "--json")) == [1, 2, 3, 4, 5]
    assert offsets(ctl(daemon, "tail", "q", "--from-time", str(t0 + HOUR + 1), "--json")) == [2, 3, 4, 5]
    ranged = ctl(
        daemon, "range", "q", "--from-time", iso(t0 + HOUR), "--to-time", iso(t0 + 3 * HOUR), "--json"
    )
    assert offsets(ranged) == [1, 2, 3]
    assert offsets(ctl(daemon, "range", "q", "--to-time", iso(t0), "--json")) == [0]
    nothing = ctl(daemon, "tail", "q", "--since", "1m")
    assert nothing.exit_code == 0 and nothing.stdout == ""
    both = ctl(daemon, "tail", "q", "--since", "1h", "--from", "3")
    assert both.exit_code == 2 and "give one of" in both.stderr
    bad = ctl(daemon, "tail", "q", "--from-time", "yesterday-ish")
    assert bad.exit_code == 2 and "ISO 8601" in bad.stderr


def test_a_replica_reads_from_a_time_on(daemon: InProcessDaemon) -> None:
    t0 = 1_700_000_000_000
    clock = SetClock(t0)
    feed = LatticeQueue.create(BOB, "feed", clock=clock)
    for i in range(3000):  # more than one segment
        clock.now = t0 + 1000 * i
        feed.offer(b"f%d" % i)
        if i % 500 == 499:
            feed.commit()
    feed.commit()
    daemon.call(daemon.handle.engine.merge_delta, feed.delta())
    address = f"{BOB.public_key.hex()}/feed"
    with daemon.client() as c:
        assert c.queue_info(address)["end_offset"] == 3000
        assert c.offsets_for_times(address, t0 + 2_500_500) == (2501, t0 + 2_501_000)
        assert c.offsets_for_times(address, 0) == (0, t0)
    assert offsets(ctl(daemon, "tail", address, "--from-time", iso(t0 + 2_997_000), "--json")) == [
        2997,
        2998,
        2999,
    ]
