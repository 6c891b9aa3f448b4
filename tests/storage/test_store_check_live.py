"""The offline doctor's store check beside a daemon still writing (one that does not answer its socket):
it reads one snapshot, so a commit landing between its reads cannot make a queue look corrupt (it would
then advise dropping a good queue); a store of a newer release's schema is not called older."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support.corrupt_daemon import BOB, replica_store, tamper

from cli.offline_store import store_checks
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
    found = check_store(replica_dir, BOB.public_key)
    assert written == [True]
    assert sorted(e["queue"].rsplit("/", 1)[1] for e in found.corrupt) == ["own", "x"]
    monkeypatch.setattr(core2_store, "load", load)
    later = check_store(replica_dir, BOB.public_key)  # the next check sees the commit
    assert sorted(e["queue"].rsplit("/", 1)[1] for e in later.corrupt) == ["good", "own", "x"]


async def test_a_store_of_a_newer_schema_is_named_newer(tmp_path: Path) -> None:
    replica_dir = await replica_store(tmp_path)
    conn = sqlite3.connect(db_path(replica_dir))
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    (check,) = store_checks(replica_dir)
    assert check.ok is None and "newer release" in check.detail and "migrates" not in check.detail
