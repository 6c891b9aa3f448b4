"""What ``queue repair`` and the offline ``doctor`` read of a queue found corrupt: the engine names why
(``corrupt_error``), what its drop deletes (``stored_bounds``, the records as they lie) and whose queue it
is (``owned``); ``check_store`` reads a stopped daemon's store read-only and finds the same queues the
daemon finds at load, writing nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from support.corrupt_daemon import ALICE, BOB, NOW, own_queue_with_a_peer_copy, replica_store

from latticed.crdt.records import make_record
from latticed.errors import NotFoundError
from latticed.storage.corruption import corrupt_entry
from latticed.storage.engine import Engine
from latticed.storage.store import db_path
from latticed.storage.store_check import check_store


async def test_the_engine_names_why_what_a_drop_deletes_and_whose_queue_it_is(tmp_path: Path) -> None:
    replica_dir = await replica_store(tmp_path)
    async with Engine.open(replica_dir, BOB) as bob:
        x, own, good = (
            bob.core2.lookup(o, n)
            for o, n in ((ALICE.public_key, "x"), (BOB.public_key, "own"), (BOB.public_key, "good"))
        )
        assert x is not None and own is not None and good is not None
        assert await bob.core2.corrupt_error(good) is None
        error = await bob.core2.corrupt_error(x)
        assert error is not None and "signed start head" in str(error)
        assert await bob.core2.corrupt_error(own) is not None
        assert await bob.core2.stored_bounds(x) == (0, 3)
        assert await bob.core2.stored_bounds(own) == (0, 2)
        owned = {e["queue"]: e["owned"] for e in bob.core2.corrupt_entries()}
        assert owned == {f"{ALICE.public_key.hex()}/x": False, f"{BOB.public_key.hex()}/own": True}
        await bob.core2.drop(x)
        assert [e["queue"] for e in bob.core2.corrupt_entries()] == [f"{BOB.public_key.hex()}/own"]


def test_corrupt_entries_say_whose_queue_only_when_the_key_is_known() -> None:
    own = BOB.public_key
    assert corrupt_entry(f"{own.hex()}/q", "e", own)["owned"] is True
    assert corrupt_entry(f"{ALICE.public_key.hex()}/q", "e", own)["owned"] is False
    assert corrupt_entry(f"{own.hex()}/q", "e", None) == {
        "queue": f"{own.hex()}/q",
        "error": "e",
        "owned": None,
    }


async def test_the_offline_check_finds_what_the_daemon_finds_and_writes_nothing(tmp_path: Path) -> None:
    replica_dir = await replica_store(tmp_path)
    before = hashlib.sha256(db_path(replica_dir).read_bytes()).hexdigest()
    found = check_store(replica_dir, BOB.public_key)
    assert found.current and found.checked == 3
    assert sorted((e["queue"], e["owned"]) for e in found.corrupt) == sorted(
        [(f"{ALICE.public_key.hex()}/x", False), (f"{BOB.public_key.hex()}/own", True)]
    )
    assert all("signed start head" in e["error"] for e in found.corrupt)
    assert hashlib.sha256(db_path(replica_dir).read_bytes()).hexdigest() == before
    async with Engine.open(replica_dir, BOB) as bob:
        await bob.core2.load_all()
        daemon = sorted(e["queue"] for e in bob.core2.corrupt_entries())
    assert daemon == sorted(e["queue"] for e in found.corrupt)


def test_the_offline_check_of_no_store_or_an_older_schema_reads_no_queue(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no store at"):
        check_store(tmp_path)
    conn = sqlite3.connect(db_path(tmp_path))
    conn.execute("PRAGMA user_version = 4")
    conn.close()
    found = check_store(tmp_path)
    assert not found.current and found.schema == 4 and found.checked == 0 and found.corrupt == []


async def test_our_own_queue_dropped_comes_back_from_a_peer_and_takes_writes(tmp_path: Path) -> None:
    """What ``queue repair --drop`` promises of our own queue: a peer's copy is merged back (it carries
    our signatures), identical, and we go on writing after it."""
    mine, peer = await own_queue_with_a_peer_copy(tmp_path)
    async with Engine.open(mine, BOB) as bob, Engine.open(peer, ALICE) as alice:
        q = bob.core2.lookup(BOB.public_key, "own")
        assert q is not None and await bob.core2.corrupt_error(q) is not None
        await bob.core2.drop(q)
        held = alice.core2.lookup(BOB.public_key, "own")
        assert held is not None
        back = (await bob.core2.merge(await alice.core2.delta_for(held, None))).q
        value = await bob.core2.value(back)
        assert value.held == (0, 2) and dict(value.meta) == {"team": "b"}
        assert await bob.append(back, [make_record(b"o2", timestamp=NOW + 2)]) == 2
