"""Moving core-1 queues to core 2 through a real daemon's local API and latticectl: ``queue_upgrade`` of one
queue and of all of them (offsets and records kept, writable on core 2), a ``tail --follow`` that goes on
across it without a gap or a duplicate, and what is refused (``recover`` of a queue that is not forked, a
request naming nothing)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner

import cli.ctl
from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client
from latticed.crdt import queue as core
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import MalformedError
from latticed.host.config import DaemonConfig
from latticed.host.identity_key import load_or_create_identity
from latticed.host.paths import identity_key_path
from latticed.storage.jobs import Append, CreateQueue, Job, Merge
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

runner = CliRunner()
NOW = 1_700_000_000_000


def test_an_upgraded_queue_keeps_its_offsets_and_a_tail_goes_on(
    daemon: InProcessDaemon, client: Client
) -> None:
    client.queue_create("q", {"team": "x"}, core=1)  # a core-1 queue, to upgrade
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
        client.queue_create(name, core=1)
        client.offer(name, name.encode())
    assert {q["name"]: q["core"] for q in client.queue_list()} == dict.fromkeys("abc", 1)
    result = runner.invoke(
        cli.ctl.app, ["--socket", str(daemon.socket), "queue", "upgrade", "a"], prog_name="latticectl"
    )
    assert result.exit_code == 0, result.output
    assert "moved to fork core 2, offsets 0..1" in result.output
    done = client.queue_upgrade(all_queues=True)
    assert sorted(d["queue"].rpartition("/")[2] for d in done) == ["b", "c"]
    assert all(d["converted"] for d in done)
    assert all(client.queue_info(n)["core"] == 2 for n in "abc")
    # listed once each, on core 2 (the core-2 listing follows commits: the move is one)
    assert {q["name"]: q["core"] for q in client.queue_list()} == dict.fromkeys("abc", 2)
    with pytest.raises(MalformedError, match="name a queue"):
        client.call("queue_upgrade")
    usage = runner.invoke(
        cli.ctl.app, ["--socket", str(daemon.socket), "queue", "upgrade"], prog_name="latticectl"
    )
    assert usage.exit_code == ExitCode.USAGE and "name one queue" in usage.output


def test_recover_of_a_forked_core1_queue_whose_rows_are_on_disk(tmp_path: Path) -> None:
    """The owner's store and a copy both wrote past 20 shared records and the copy's history reached the
    owner (two heads of one version: where they part is read from the stored chain values). ``recover``
    through the API converts it from there: the rows are read on the storage thread, not the event loop
    (whose read of the writer's connection failed with SQLite's ProgrammingError)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    identity = load_or_create_identity(identity_key_path(data))
    _forked_store(tmp_path, data, identity)
    d = start_in_process(DaemonConfig(data_dir=data, socket_path=tmp_path / "api.sock"))
    try:
        with d.client() as c:
            assert c.queue_info("q")["forked"] is True
            done = c.queue_recover("q")
            assert (done["epoch"], done["start_offset"], done["end_offset"]) == (1, 0, 20)
            assert c.offer("q", b"after") == 20
            assert c.read("q", 0, 30).offsets == list(range(21))
    finally:
        d.stop()


def _forked_store(tmp_path: Path, data: Path, identity: Identity) -> None:
    def writer_at(path: Path) -> Writer:
        w = Writer(db_path(path), identity, clock=lambda: NOW)
        w.open()
        return w

    def run(w: Writer, *jobs: Job) -> None:
        w.process(list(jobs))
        for job in jobs:
            assert job.error is None, job.error

    owner = writer_at(data)
    create = CreateQueue("q")  # a core-1 queue (core 2 has its own job)
    run(owner, create)
    q: int = create.result
    run(owner, Append(q, [make_record(b"s%d" % i, timestamp=NOW + i) for i in range(20)]))
    owner.stop()
    shutil.copytree(data, tmp_path / "copy")
    copy = writer_at(tmp_path / "copy")
    run(copy, Append(q, [make_record(b"copy%d" % i, timestamp=NOW) for i in range(3)]))
    theirs = core.delta(copy.states[q], None)
    copy.stop()
    owner = writer_at(data)
    try:
        run(owner, Append(q, [make_record(b"own%d" % i, timestamp=NOW) for i in range(5)]))
        run(owner, Merge(core.verify_delta(core.empty_state(identity.public_key, "q"), theirs)))
        state = owner.states[q]
        assert state.forked and state.fork is not None and state.fork.offset < 0
    finally:
        owner.stop()
