"""A daemon whose data directory is a small full disk (a real tmpfs): ``status`` shows its free space as it
is now, a failed write has it sampled again, ``truncate`` and ``queue retention set`` still work and
``latticectl store compact`` gives the space back."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner

import cli.ctl
from latticed.errors import StorageError
from latticed.host.config import DaemonConfig
from latticed.host.diskspace import DiskUsage
from latticed.services.health import Health
from latticed.storage.space import store_bytes
from latticed.storage.store import db_path

MIB = 1 << 20


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    """A daemon on a 48 MiB tmpfs (root only: the suite runs as root), unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], check=True)
    try:
        d = start_in_process(DaemonConfig(data_dir=mount / "data", socket_path=tmp_path / "api.sock"))
        try:
            yield d
        finally:
            d.stop()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(daemon: InProcessDaemon, queue: str) -> StorageError:
    with daemon.client() as c:
        c.queue_create(queue)
        for size in (256_000, 8000, 200):
            try:
                for _ in range(10_000):
                    c.offer_batch(queue, [(os.urandom(size), None, ())] * 4)
            except StorageError as exc:
                failure = exc
    assert "full" in str(failure)
    return failure


def test_status_shows_the_free_space_of_now(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        before = c.call("status")["status"]["disk"]["free_bytes"]
        (daemon.config.data_dir / "ballast").write_bytes(os.urandom(6 * MIB))
        after = c.call("status")["status"]["disk"]["free_bytes"]
    assert before - after >= 6 * MIB


def test_a_truncation_and_a_retention_change_work_on_a_full_disk_and_compact_gives_space_back(
    daemon: InProcessDaemon,
) -> None:
    fill(daemon, "fill")
    db = db_path(daemon.config.data_dir)
    with daemon.client() as c:
        status = c.call("status")["status"]
        assert status["disk"]["free_bytes"] < MIB, "the full disk shows at once"
        end = c.queue_info("fill")["end_offset"]
        c.retention_set("fill", max_records=10)
        result = c.truncate("fill", end - 10)
        assert result["start_offset"] >= end - 10  # retention may have dropped them first
        c.offer("fill", b"room again")
    runner = CliRunner()
    done = runner.invoke(
        cli.ctl.app, ["store", "compact", "--socket", str(daemon.socket), "--json"], prog_name="latticectl"
    )
    assert done.exit_code == 0, done.output
    text = runner.invoke(cli.ctl.app, ["store", "compact", "--socket", str(daemon.socket)])
    assert text.exit_code == 0 and "store compacted" in text.stderr
    assert store_bytes(db) < 20 * MIB
    with daemon.client() as c:
        assert c.call("status")["status"]["disk"]["free_bytes"] > 20 * MIB


def test_a_failed_write_has_the_disk_sampled_at_once(daemon: InProcessDaemon) -> None:
    engine = daemon.handle.engine
    told = []
    wired = engine.on_storage_error
    assert wired is not None, "the daemon has its health hear of failed writes"
    engine.on_storage_error = lambda: (told.append(1), wired())  # type: ignore[func-returns-value]
    fill(daemon, "fill")
    assert told


def test_health_samples_the_disk_when_told_of_a_failed_write(tmp_path: Path) -> None:
    sampled = [threading.Event(), threading.Event()]

    def usage(path: Path) -> DiskUsage:
        sampled[0 if not sampled[0].is_set() else 1].set()
        return DiskUsage(str(path), 10, 100)

    async def main() -> None:
        health = Health(engine=None, data_dir=tmp_path, usage=usage, interval=3600)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(health.run)
            assert sampled[0].is_set() and not sampled[1].is_set()
            health.disk_suspect()
            with trio.fail_after(10):  # not at the next interval, an hour away
                await trio.to_thread.run_sync(sampled[1].wait)
            nursery.cancel_scope.cancel()

    trio.run(main)
