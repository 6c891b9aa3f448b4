"""fix23 (review22c's note 2): a core-2 queue whose stored metadata is not what its start head signs is
found corrupt when it loads, as one whose records its heads do not cover: it is neither served nor
merged into, its data is kept, it is logged once (``store.queue_corrupt``) and ``doctor`` lists it; the
daemon starts and serves its other queues."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
from support.inprocess import daemon_at

from latticed.crdt.head import meta_hash
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import StorageError
from latticed.process.logs import EVENT_ATTR, FIELDS_ATTR
from latticed.storage.codec import pack
from latticed.storage.corruption import CorruptQueueError, check_held, decode_signed_meta
from latticed.storage.engine import Engine
from latticed.storage.store import db_path

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
NOW = 1_700_000_000_000


class _Head:
    def __init__(self, meta: dict[str, str]) -> None:
        self.meta_hash = meta_hash(meta)


def test_stored_metadata_is_checked_against_the_signed_hash() -> None:
    raw = pack([["team", "x"]])
    assert decode_signed_meta(raw, _Head({"team": "x"}), "q") == (("team", "x"),)  # type: ignore[arg-type]
    assert decode_signed_meta(raw, None, "q") == (("team", "x"),)
    with pytest.raises(CorruptQueueError, match="q: its stored metadata is not what"):
        decode_signed_meta(raw, _Head({"team": "y"}), "q")  # type: ignore[arg-type]
    with pytest.raises(CorruptQueueError, match="cannot be read"):
        decode_signed_meta(b"\xc1", None, "q")
    check_held((3, 5), (3, 5), "q")
    check_held(None, (4, 4), "q")
    with pytest.raises(CorruptQueueError, match=r"holds records \(3, 6\)"):
        check_held((3, 6), (3, 5), "q")


def _tamper(data_dir: Path, name: str, meta: dict[str, str]) -> bytes:
    """Write other metadata into queue ``name``'s core-2 row, behind latticed's back; returns the row's
    bytes as tampered (what must still be there after)."""
    conn = sqlite3.connect(db_path(data_dir))
    try:
        conn.execute(
            "UPDATE queue2 SET meta = ? WHERE q = (SELECT q FROM queues WHERE name = ?)",
            (pack([[k, v] for k, v in meta.items()]), name),
        )
        conn.commit()
        return _row(conn, name)
    finally:
        conn.close()


def _row(conn: sqlite3.Connection, name: str) -> bytes:
    found = conn.execute(
        "SELECT meta, start_head, tips FROM queue2 WHERE q = (SELECT q FROM queues WHERE name = ?)", (name,)
    ).fetchone()
    return b"".join(bytes(part) for part in found)


async def test_a_replica_neither_serves_nor_merges_into_a_queue_with_tampered_metadata(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="latticed")
    owner_dir, replica_dir = tmp_path / "alice", tmp_path / "bob"
    owner_dir.mkdir()
    replica_dir.mkdir()
    async with Engine.open(owner_dir, ALICE) as alice:
        x = await alice.create_queue("x", {"team": "x"}, core=2)
        await alice.append(x, [make_record(b"v0", timestamp=NOW)])
        first = await alice.core2.delta_for(x, None)
        async with Engine.open(replica_dir, BOB) as bob:
            verified, against = await bob.core2.verify(first)
            await bob.core2.merge(first, verified, against)
            own = await bob.create_queue("own", core=2)
        tampered = _tamper(replica_dir, "x", {"team": "evil"})
        await alice.append(x, [make_record(b"v1", timestamp=NOW + 1)])
        second = await alice.core2.delta_for(x, None)
    async with Engine.open(replica_dir, BOB) as bob:
        q = bob.core2.lookup(ALICE.public_key, "x")
        assert q is not None
        await bob.core2.load_all()  # as at start-up: the corrupt one left out, the others loaded
        assert bob.core2.loaded(own) is not None and bob.core2.loaded(q) is None
        for _ in range(2):  # refused at each use, logged once
            with pytest.raises(CorruptQueueError, match="stored metadata is not what its signed start head"):
                await bob.core2.value(q)
        with pytest.raises(StorageError):
            verified, against = await bob.core2.verify(second)
            await bob.core2.merge(second, verified, against)
        assert await bob.append(own, [make_record(b"mine", timestamp=NOW)]) == 0
        entries = bob.core2.corrupt_entries()
        assert [e["queue"] for e in entries] == [f"{ALICE.public_key.hex()}/x"]
        assert "signed start head" in entries[0]["error"]
    events = [r for r in caplog.records if getattr(r, EVENT_ATTR, "") == "store.queue_corrupt"]
    assert len(events) == 1 and getattr(events[0], FIELDS_ATTR)["queue"] == f"{ALICE.public_key.hex()}/x"
    conn = sqlite3.connect(db_path(replica_dir))
    try:
        assert _row(conn, "x") == tampered  # nothing rewritten, nothing deleted
        assert conn.execute("SELECT count(*) FROM segments WHERE q = ?", (q,)).fetchone()[0] >= 1
    finally:
        conn.close()


def test_a_daemon_with_a_corrupt_queue_starts_serves_the_others_and_doctor_names_it(tmp_path: Path) -> None:
    with daemon_at(tmp_path) as d, d.client() as client:
        client.queue_create("bad", {"team": "x"}, core=2)
        client.queue_create("good", {"team": "y"}, core=2)
        client.offer("bad", b"b0")
        client.offer("good", b"g0")
    _tamper(tmp_path / "data", "bad", {"team": "evil"})
    with daemon_at(tmp_path) as d, d.client() as client:
        assert client.read("good", 0).values == [b"g0"]
        with pytest.raises(StorageError, match="changed behind latticed's back"):
            client.read("bad", 0)
        with pytest.raises(StorageError):
            client.offer("bad", b"b1")
        assert client.offer("good", b"g1") == 1
        assert [q["name"] for q in client.queue_list()] == ["good"]
        store = [c for c in client.doctor() if c["check"] == "store"]
        assert len(store) == 1 and store[0]["ok"] is False
        assert "/bad: its stored metadata" in store[0]["detail"]
