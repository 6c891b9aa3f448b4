"""Upgrading a store: the copy kept before migrating, the release recorded as the store's writer, the
refusal of a newer store naming that release, and ``latticed migrate [--dry-run]``. Killing a daemon
mid-upgrade is integration/test_upgrade_kill.py."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import cli.latticed_command
from cli.boundary import ExitCode
from latticed.crdt import queue as core
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import StorageError
from latticed.host.data_dir_lock import DataDirLock
from latticed.storage.precopy import copy_path
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION, WRITTEN_BY, written_by
from latticed.storage.store import Store, db_path
from latticed.version import RELEASE

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000
runner = CliRunner()


def rec(i: int) -> Record:
    return make_record(b"v%d" % i, key=b"k%d" % i, timestamp=NOW + i)


def old_store(path: Path, schema: int = 1, records: int = 50) -> core.QueueState:
    """A store of schema ``schema`` holding one queue of ``records`` records, as an older release left it
    (no release recorded as its writer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store = Store(path, migrations=MIGRATIONS[:schema])
    state = core.commit(
        core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=NOW, records=[rec(i) for i in range(records)]
    )
    store.begin()
    store.insert_queue(1, state, NOW)
    store.persist(1, store.empty_view(1, core.empty_state(ALICE.public_key, "q")), state)
    store.commit()
    store.close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM settings WHERE name = ?", (WRITTEN_BY,))
    conn.close()
    return state


def schema_of(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def writer_of(path: Path) -> str | None:
    conn = sqlite3.connect(path)
    try:
        return written_by(conn)
    finally:
        conn.close()


def stamp(path: Path, schema: int, writer: str | None) -> None:
    """Make the store look written by a newer release."""
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA user_version = {schema}")
        conn.execute("DELETE FROM settings WHERE name = ?", (WRITTEN_BY,))
        if writer is not None:
            conn.execute("INSERT INTO settings (name, value) VALUES (?, ?)", (WRITTEN_BY, writer))
        conn.commit()
    finally:
        conn.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def latticed(*args: str, **kwargs: Any) -> Result:
    return runner.invoke(cli.latticed_command.app, list(args), prog_name="latticed", **kwargs)


def rows(path: Path) -> list[tuple[object, ...]]:
    """Every row of the tables of schema 1, in a stable order."""
    conn = sqlite3.connect(path)
    try:
        return [
            row
            for table in ("queues", "segments", "checkpoints")
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2")
        ]
    finally:
        conn.close()


def test_an_upgrade_keeps_a_copy_that_the_older_schema_opens(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    state = old_store(path)
    original = rows(path)
    store = Store(path)
    try:
        assert store.migrated_from == 1
        [loaded] = store.load()
        assert loaded.state == state
    finally:
        store.close()
    copy = copy_path(path, 1)
    assert copy.name == "latticed.db.pre-1" and schema_of(copy) == 1
    assert not copy.with_name(copy.name + ".partial").exists()
    assert rows(copy) == original  # what the release that wrote schema 1 reads


def test_a_new_or_current_store_is_not_copied(tmp_path: Path) -> None:
    Store(db_path(tmp_path)).close()
    Store(db_path(tmp_path)).close()
    assert sorted(p.name for p in tmp_path.iterdir() if ".pre-" in p.name) == []


def test_when_the_copy_cannot_be_written_nothing_is_migrated(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old_store(path)
    copy_path(path, 1).mkdir()  # the copy cannot take its name
    with pytest.raises(StorageError, match=r"keep a copy \(latticed.db.pre-1\).*nothing was migrated"):
        Store(path)
    assert schema_of(path) == 1
    assert not (tmp_path / "latticed.db.pre-1.partial").exists()


def test_the_store_records_the_release_that_writes_it(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old_store(path, schema=SCHEMA_VERSION)  # as 0.2.0 leaves it: same schema, no record
    assert writer_of(path) is None
    Store(path).close()
    assert writer_of(path) == RELEASE
    assert not copy_path(path, SCHEMA_VERSION).exists()


def test_a_newer_store_is_refused_naming_the_release_that_wrote_it_and_what_to_do(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old_store(path, schema=SCHEMA_VERSION)
    stamp(path, SCHEMA_VERSION + 2, "0.9.1")
    before = digest(path)
    with pytest.raises(StorageError) as refused:
        Store(path)
    message = str(refused.value)
    assert f"schema version {SCHEMA_VERSION + 2}, written by latticed 0.9.1" in message
    assert f"this latticed ({RELEASE}, schema {SCHEMA_VERSION} and older)" in message
    assert "upgrade latticed to 0.9.1 or newer" in message
    assert f"latticed.db.pre-{SCHEMA_VERSION}, or a backup" in message
    assert digest(path) == before  # not even the writer's record changed
    # The copy that newer release kept when it upgraded this one's store is named when it is there.
    copy_path(path, SCHEMA_VERSION).write_bytes(b"")
    with pytest.raises(StorageError, match=rf"or restore {copy_path(path, SCHEMA_VERSION)} \(the copy kept"):
        Store(path)


def test_a_newer_store_without_a_record_names_a_newer_release(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old_store(path, schema=SCHEMA_VERSION)
    stamp(path, SCHEMA_VERSION + 1, None)
    with pytest.raises(
        StorageError, match=r"written by a release newer than this one: .*; upgrade latticed, or"
    ):
        Store(path)


# ------------------------------------------------------------------ latticed migrate


def test_dry_run_says_what_would_change_and_writes_nothing(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old_store(path)
    before = digest(path)
    result = latticed("migrate", "--dry-run", "--data-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"store {path}: schema 1 (last written by latticed 0.2.0 or earlier)" in out
    assert f"would migrate it from schema 1 to {SCHEMA_VERSION}" in out
    assert f"first keep a copy: {copy_path(path, 1)}" in out
    assert "1 -> 2: Add the KV view table" in out and "2 -> 3: Add replica floors" in out
    assert "nothing was written" in out
    assert digest(path) == before and schema_of(path) == 1
    assert not copy_path(path, 1).exists()


def test_dry_run_reads_the_data_dir_from_the_config(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old_store(db_path(data), schema=2)
    config = tmp_path / "latticed.toml"
    config.write_text(f'data_dir = "{data}"\n')
    result = latticed("migrate", "--dry-run", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert f"from schema 2 to {SCHEMA_VERSION}" in result.stdout and "1 -> 2" not in result.stdout


def test_migrate_upgrades_a_stopped_daemons_store_and_says_where_the_copy_is(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    state = old_store(path)
    result = latticed("migrate", "--data-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        f"migrated store {path} from schema 1 to {SCHEMA_VERSION}; the copy from before is "
        f"{copy_path(path, 1)} (delete it once you will not roll back)"
    )
    assert schema_of(path) == SCHEMA_VERSION and schema_of(copy_path(path, 1)) == 1
    store = Store(path)
    try:
        [loaded] = store.load()
        assert loaded.state == state and store.migrated_from == SCHEMA_VERSION
    finally:
        store.close()
    again = latticed("migrate", "--dry-run", "--data-dir", str(tmp_path))
    assert f"latticed {RELEASE} writes schema {SCHEMA_VERSION}: nothing to migrate" in again.stdout
    assert f"last written by latticed {RELEASE}" in again.stdout


def one_line_error(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    [line] = result.stderr.splitlines()
    assert line.startswith("latticed: error: ") and "Traceback" not in result.output
    return line


def test_migrate_refuses_while_a_daemon_holds_the_store(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    old_store(path)
    with DataDirLock(tmp_path):
        one_line_error(latticed("migrate", "--data-dir", str(tmp_path)), ExitCode.EXISTS)
        assert latticed("migrate", "--dry-run", "--data-dir", str(tmp_path)).exit_code == 0
    assert schema_of(path) == 1


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_migrate_refuses_a_newer_store_and_a_missing_one(tmp_path: Path, dry_run: list[str]) -> None:
    path = db_path(tmp_path)
    old_store(path, schema=SCHEMA_VERSION)
    stamp(path, SCHEMA_VERSION + 1, "0.4.0")
    line = one_line_error(latticed("migrate", *dry_run, "--data-dir", str(tmp_path)), ExitCode.STORAGE)
    assert "written by latticed 0.4.0" in line and "upgrade latticed to 0.4.0 or newer" in line
    missing = tmp_path / "elsewhere"
    line = one_line_error(latticed("migrate", *dry_run, "--data-dir", str(missing)), ExitCode.NOT_FOUND)
    assert f"no store at {db_path(missing)}" in line
    assert not missing.exists()
