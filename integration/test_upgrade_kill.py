"""A daemon killed (``kill -9``) in the middle of upgrading its store: the store still opens on the next
start, the upgrade resumes, nothing is lost, and the copy of the older store kept before migrating is
whole. The kill lands exactly where the test wants it: the daemon is told to stop at one point of the
upgrade (``LATTICED_TEST_PAUSE_MIGRATION``), logs that it is there, and the test kills it then.

The store is one an older release left: schema 1, built with that release's migrations as the upgrade
tests in tests/ do, holding several queues of signed records. And the other way: a rollback to the
previous release restores the copy kept when this build upgraded its store."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemons import LatticedProcess
from polling import wait_until
from releases import previous_release, run_as

from latticed.api.client.blocking_client import Client
from latticed.crdt import queue as core
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import ProtocolError
from latticed.storage.precopy import PAUSE_ENV, copy_path
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.store import Store, db_path

Factory = Callable[..., LatticedProcess]
ALICE = Identity.from_seed(b"m" * 32)
NOW = 1_700_000_000_000
QUEUES, RECORDS, BATCH = 4, 3000, 500


def schema_1_store(data_dir: Path) -> dict[str, list[bytes]]:
    """A store of schema 1 with ``QUEUES`` queues of ``RECORDS`` records; returns what each holds."""
    data_dir.mkdir(parents=True)
    store = Store(db_path(data_dir), migrations=MIGRATIONS[:1])
    held: dict[str, list[bytes]] = {}
    for q in range(1, QUEUES + 1):
        name = f"old-{q}"
        empty = core.empty_state(ALICE.public_key, name)
        state, values = empty, []
        for first in range(0, RECORDS, BATCH):
            batch = [b"%s-%06d" % (name.encode(), i) + b"." * 200 for i in range(first, first + BATCH)]
            records = [make_record(v, key=v[:12], timestamp=NOW + first + i) for i, v in enumerate(batch)]
            state = core.commit(state, ALICE, now_ms=NOW + first, records=records)
            values += batch
        store.begin()
        store.insert_queue(q, state, NOW)
        store.persist(q, store.empty_view(q, empty), state)
        store.commit()
        held[f"{ALICE.public_hex}/{name}"] = values
    store.close()
    return held


def schema_of(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def events(daemon: LatticedProcess, name: str) -> list[dict[str, Any]]:
    """The daemon's log events called ``name`` (it logs one JSON object per line)."""
    found = []
    for line in daemon.log.read_text(errors="replace").splitlines():
        if line.startswith("{") and (event := json.loads(line)).get("event") == name:
            found.append(event)
    return found


def paused(daemon: LatticedProcess, where: str) -> bool:
    if daemon.proc.poll() is not None:
        raise AssertionError(f"latticed exited before pausing at {where}:\n{daemon.log_text()}")
    return "store.migration_paused" in daemon.log_text()


def kill_at(factory: Factory, data_dir: Path, where: str) -> LatticedProcess:
    """Start a daemon on ``data_dir`` that stops at ``where`` in its upgrade, and kill -9 it there."""
    daemon = factory(data_dir=data_dir, start=False, env={PAUSE_ENV: where}, args=["--no-mdns"])
    daemon.start(wait=False)
    wait_until(lambda: paused(daemon, where), f"the upgrade to pause at {where}")
    daemon.kill9()
    daemon.env.pop(PAUSE_ENV)
    return daemon


def holds(daemon: LatticedProcess, expected: dict[str, list[bytes]]) -> None:
    with Client(daemon.socket, timeout=30) as c:
        listed = {f"{q['owner']}/{q['name']}" for q in c.queue_list()}
        assert listed == set(expected)
        for queue, values in expected.items():
            assert [e.value for e in c.range(queue, 0, 1 << 40)] == values, queue


def test_a_kill_inside_a_migration_step_resumes_from_the_last_step_and_keeps_everything(
    latticed_process: Factory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    expected = schema_1_store(data_dir)
    path = db_path(data_dir)
    # Inside the last step's transaction, its work done, before it commits: the step before committed.
    daemon = kill_at(latticed_process, data_dir, str(SCHEMA_VERSION))
    assert schema_of(path) == SCHEMA_VERSION - 1
    assert schema_of(copy_path(path, 1)) == 1  # kept before the first step
    dry_run = subprocess.run(
        [sys.executable, "-m", "latticed", "migrate", "--dry-run", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"migrate it from schema {SCHEMA_VERSION - 1} to {SCHEMA_VERSION}" in dry_run
    assert f"resume the upgrade from schema 1, interrupted: keep its copy {copy_path(path, 1)}" in dry_run
    daemon.start()
    holds(daemon, expected)
    assert schema_of(path) == SCHEMA_VERSION
    [migrated] = events(daemon, "store.migrated")
    assert (migrated["from_version"], migrated["to_version"]) == (SCHEMA_VERSION - 1, SCHEMA_VERSION)
    assert migrated["copy"] == str(copy_path(path, 1))  # the copy of the store as it was, kept once
    assert sorted(p.name for p in data_dir.iterdir() if ".pre-" in p.name) == ["latticed.db.pre-1"]
    daemon.stop()
    # The copy kept before the upgrade is whole: this build opens it too (upgrading a copy of it).
    restored = tmp_path / "restored"
    restored.mkdir()
    db_path(restored).write_bytes(copy_path(path, 1).read_bytes())
    again = latticed_process(data_dir=restored, args=["--no-mdns"])
    holds(again, expected)


def test_a_kill_while_the_copy_is_written_leaves_the_store_untouched(
    latticed_process: Factory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    expected = schema_1_store(data_dir)
    path = db_path(data_dir)
    daemon = kill_at(latticed_process, data_dir, "copy")
    assert schema_of(path) == 1
    assert not copy_path(path, 1).exists()  # no half copy under the name an operator restores from
    daemon.start()
    holds(daemon, expected)
    assert schema_of(path) == SCHEMA_VERSION and schema_of(copy_path(path, 1)) == 1
    assert not copy_path(path, 1).with_name("latticed.db.pre-1.partial").exists()


def test_a_rollback_to_the_previous_release_restores_the_copy_kept_at_the_upgrade(
    latticed_process: Factory,
) -> None:
    """This build changed the store schema, so a rollback is docs/operations.md's "Rolling back": stop,
    move the upgraded store away, rename the copy ``latticed.db.pre-N`` to ``latticed.db``, start the
    previous release. It opens the copy and reads everything it had written."""
    daemon = latticed_process(args=["--no-mdns"], start=False)
    run_as(daemon, previous_release()).start()
    with Client(daemon.socket, timeout=30) as c:
        c.queue_create("written-by-old")
        c.offer_batch("written-by-old", [(b"o%d" % i, None, ()) for i in range(100)])
        c.kv_put("greeting", b"from the previous release")
        me = c.identity()
    daemon.stop()
    before = schema_of(db_path(daemon.data_dir))
    run_as(daemon, None).start()  # this build upgrades it, keeping the copy
    with Client(daemon.socket, timeout=30) as c:
        assert c.offsets_for_times("written-by-old", 0) == (0, c.first("written-by-old").timestamp)  # type: ignore[union-attr]
    daemon.stop()
    path = db_path(daemon.data_dir)
    assert schema_of(path) == SCHEMA_VERSION > before
    copy = copy_path(path, before)
    for suffix in ("", "-wal", "-shm"):
        moved = path.with_name(path.name + suffix)
        if moved.exists():
            moved.rename(moved.with_name(moved.name + ".upgraded"))
    copy.rename(path)
    run_as(daemon, previous_release()).start()
    with Client(daemon.socket, timeout=30) as c:
        with pytest.raises(ProtocolError, match="versions"):  # the previous release: no such op
            c.versions()
        assert [e.value for e in c.range(f"{me}/written-by-old", 0, 1 << 40)] == [
            b"o%d" % i for i in range(100)
        ]
        assert c.kv_get("greeting", owner=me) == b"from the previous release"
