"""A store of schema 5 (this build's: fork cores, core-2 queues) and the previous release: 0.2.0 refuses
it, saying it is newer, and leaves it as it was (nothing misread, nothing written); the copy this build
kept when it upgraded the store is what a rollback opens (integration/test_upgrade_kill.py runs that)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from releases import previous_release, release_source

from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.storage.core2_jobs import Commit2, CreateQueue2
from latticed.storage.schema import SCHEMA_VERSION
from latticed.storage.store import db_path
from latticed.storage.writer import Writer

ALICE = Identity.from_seed(b"r" * 32)
NOW = 1_700_000_000_000
OPEN = """
import sys
from pathlib import Path
from latticed.errors import StorageError
from latticed.storage.store import Store
try:
    Store(Path(sys.argv[1])).close()
except StorageError as exc:
    print(exc)
    sys.exit(7)
"""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_previous_release_refuses_a_schema_5_store_and_leaves_it_alone(tmp_path: Path) -> None:
    assert SCHEMA_VERSION >= 5  # schema 6 packs core-2 rows: still newer than 0.2.0's
    writer = Writer(db_path(tmp_path), ALICE, clock=lambda: NOW)
    writer.open()
    try:
        jobs = [CreateQueue2("q"), Commit2(1, [make_record(b"x", timestamp=NOW)])]
        for job in jobs:
            writer.process([job])
            assert job.error is None, job.error
    finally:
        writer.stop()  # a clean close: everything in the main file, no WAL left
    path = db_path(tmp_path)
    before = digest(path)
    source = release_source(previous_release())
    env = {**os.environ, "PYTHONPATH": str(source)}
    old = subprocess.run(
        [sys.executable, "-c", OPEN, str(path)], env=env, cwd=source, capture_output=True, check=False
    )
    assert old.returncode == 7, old.stderr.decode()[-2000:]
    assert f"schema version {SCHEMA_VERSION}, newer than this latticed" in old.stdout.decode()
    assert digest(path) == before
