"""The offline doctor's store check beside a daemon still writing (one that does not answer its socket):
it reads one snapshot, so a commit landing between its reads cannot make a queue look corrupt (it would
then advise dropping a good queue); a store of a newer release's schema is not called older."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support.corrupt_daemon import BOB, replica_store, tamper

from cli.offline_store import store_checks
from latticed.errors import NotFoundError
from latticed.storage import core2_store
from latticed.storage.corruption import StoreFile
from latticed.storage.schema import MIGRATIONS
from latticed.storage.store import db_path
from latticed.storage.store_check import check_store


async def test_a_commit_between_the_checks_reads_is_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replica_dir = await replica_store(tmp_path)
    load = core2_store.load
    written: list[bool] = []

    def load_beside_a_writer(store: StoreFile, row: core2_store.Queue2Row) -> object:
        if not written:  # the daemon commits after the check read the index: the check must not see it
            tamper(replica_dir, "good")
            written.append(True)
        return load(store, row)

    monkeypatch.setattr(core2_store, "load", load_beside_a_writer)
    daemon = sqlite3.connect(db_path(replica_dir))  # a daemon running on it: its -wal and -shm exist
    daemon.execute("SELECT count(*) FROM queues").fetchone()
    found = check_store(replica_dir, BOB.public_key)
    assert written == [True]
    assert sorted(e["queue"].rsplit("/", 1)[1] for e in found.corrupt) == ["own", "x"]
    monkeypatch.setattr(core2_store, "load", load)
    later = check_store(replica_dir, BOB.public_key)  # the next check sees the commit
    assert sorted(e["queue"].rsplit("/", 1)[1] for e in later.corrupt) == ["good", "own", "x"]
    daemon.close()


async def test_a_daemon_starting_on_a_store_closed_cleanly_while_it_is_read_leaves_it_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replica_dir = await replica_store(tmp_path)
    load = core2_store.load

    def load_as_a_daemon_starts(store: StoreFile, row: core2_store.Queue2Row) -> object:
        tamper(replica_dir, "good")  # opened, written and closed (checkpointed into the file) meanwhile
        return load(store, row)

    monkeypatch.setattr(core2_store, "load", load_as_a_daemon_starts)
    with pytest.raises(NotFoundError, match="changed while it was read"):
        check_store(replica_dir, BOB.public_key)


async def test_a_store_of_a_newer_schema_is_named_newer(tmp_path: Path) -> None:
    replica_dir = await replica_store(tmp_path)
    conn = sqlite3.connect(db_path(replica_dir))
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    (check,) = store_checks(replica_dir)
    assert check.ok is None and "newer release" in check.detail and "migrates" not in check.detail


async def test_the_check_creates_no_file_beside_a_store_closed_cleanly(tmp_path: Path) -> None:
    replica_dir = await replica_store(tmp_path)
    before = sorted(p.name for p in replica_dir.iterdir())
    assert not any(name.endswith(("-wal", "-shm")) for name in before)
    assert len(check_store(replica_dir, BOB.public_key).corrupt) == 2
    assert sorted(p.name for p in replica_dir.iterdir()) == before  # a root doctor left no root-owned -shm
    (db_path(replica_dir).with_name("latticed.db-wal")).write_bytes(b"")  # a WAL, and no -shm to read it by
    (check,) = store_checks(replica_dir)
    assert check.ok is None and "start the daemon" in check.detail
    assert not db_path(replica_dir).with_name("latticed.db-shm").exists()
