"""Moving core-1 queues to core 2 through a real daemon's local API and latticectl: ``queue_upgrade`` of one
queue and of all of them (offsets and records kept, writable on core 2), a ``tail --follow`` that goes on
across it without a gap or a duplicate, and what is refused (``recover`` of a queue that is not forked, a
request naming nothing)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner

import cli.ctl
from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client
from latticed.errors import MalformedError
from latticed.host.config import DaemonConfig

runner = CliRunner()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    d = start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))
    yield d
    d.stop()


@pytest.fixture
def client(daemon: InProcessDaemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


def test_an_upgraded_queue_keeps_its_offsets_and_a_tail_goes_on(
    daemon: InProcessDaemon, client: Client
) -> None:
    client.queue_create("q", {"team": "x"})
    client.offer_batch("q", [(f"s{i}".encode(), None, []) for i in range(10)])
    seen: list[tuple[int, bytes]] = []
    started = threading.Event()

    def follow() -> None:
        with daemon.client() as tailing:
            for entry in tailing.tail("q", 0, follow=True):
                seen.append((entry.offset, entry.value))
                if entry.offset == 9:
                    started.set()
                if entry.value == b"new":
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert started.wait(10)
    with pytest.raises(MalformedError, match="not forked"):
        client.queue_recover("q")
    [done] = client.queue_upgrade("q")
    assert done["converted"] and (done["epoch"], done["start_offset"], done["end_offset"]) == (1, 0, 10)
    info = client.queue_info("q")
    assert info["core"] == 2 and info["epoch"] == 1 and info["meta"] == {"team": "x"}
    assert client.offer("q", b"new") == 10
    reader.join(10)
    assert not reader.is_alive()
    assert seen == [(i, f"s{i}".encode()) for i in range(10)] + [(10, b"new")]
    assert client.read("q", 0, 20).offsets == list(range(11))
    [again] = client.queue_upgrade("q")
    assert not again["converted"] and again["end_offset"] == 11


def test_upgrade_all_and_through_latticectl(daemon: InProcessDaemon, client: Client) -> None:
    for name in ("a", "b", "c"):
        client.queue_create(name)
        client.offer(name, name.encode())
    result = runner.invoke(
        cli.ctl.app, ["--socket", str(daemon.socket), "queue", "upgrade", "a"], prog_name="latticectl"
    )
    assert result.exit_code == 0, result.output
    assert "moved to fork core 2, offsets 0..1" in result.output
    done = client.queue_upgrade(all_queues=True)
    assert sorted(d["queue"].rpartition("/")[2] for d in done) == ["b", "c"]
    assert all(d["converted"] for d in done)
    assert all(client.queue_info(n)["core"] == 2 for n in "abc")
    with pytest.raises(MalformedError, match="name a queue"):
        client.call("queue_upgrade")
    usage = runner.invoke(
        cli.ctl.app, ["--socket", str(daemon.socket), "queue", "upgrade"], prog_name="latticectl"
    )
    assert usage.exit_code == ExitCode.USAGE and "name one queue" in usage.output
