"""Schema 9: a segment stores a record's headers equal to the record's before as one byte
(latticed/storage/header_column.py); every column reads back as the very headers, and segments stored
before schema 9 read as they did."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue as core
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.storage.header_column import pack_headers, unpack_headers
from latticed.storage.schema import MIGRATIONS, SCHEMA_VERSION
from latticed.storage.segments import Segment
from latticed.storage.store import Store, db_path

OWNER = Identity.from_seed(b"h" * 32)
NOW = 1_700_000_000_000
STAMP = [["lattice.producer", b"ab" * 32]]

_headers = st.one_of(
    st.none(),
    st.sampled_from([STAMP, [["lattice.producer", b"cd" * 32]], [["a", b""], ["b", b"x"]]]),
    st.lists(
        st.lists(st.one_of(st.text(max_size=3), st.binary(max_size=3)), min_size=2, max_size=2), max_size=2
    ),
)


def segment(headers: list[Any]) -> Segment:
    n = len(headers)
    return Segment(0, [None] * n, [b"v%d" % i for i in range(n)], list(range(n)), headers, bytes(32 * n))


@settings(max_examples=300, deadline=None)
@given(st.lists(_headers, max_size=40), st.integers(0, 40))
def test_a_column_with_and_without_repeats_reads_back_as_the_very_headers(
    column: list[Any], repeat: int
) -> None:
    column = [None if h == [] else h for h in column]  # a record without headers is stored as None
    column += [column[-1]] * repeat if column else []  # runs of one stamp, as a producer's records have
    stored = segment(column)
    decoded = Segment.decode(0, len(column), stored.chains, stored.encode()[2])
    assert decoded.headers == column
    assert decoded.records(0, len(column)) == stored.records(0, len(column))


def test_a_producers_stamp_costs_one_byte_a_record_after_the_first() -> None:
    n = 1000
    packed = pack_headers([STAMP] * n)
    assert len(packed) == 3 + len(msgpack.packb(STAMP, use_bin_type=True)) + (n - 1)
    assert unpack_headers(msgpack.unpackb(packed, raw=False)) == [STAMP] * n


def test_a_column_stored_before_schema_9_reads_as_it_did() -> None:
    column: list[Any] = [STAMP, STAMP, None, [["a", b"1"]], [["a", b"1"]], None, None]
    old = msgpack.packb([[None] * 7, [b"v"] * 7, list(range(7)), column], use_bin_type=True)
    assert Segment.decode(0, 7, bytes(32 * 7), old).headers == column


@pytest.mark.parametrize("column", [[True], [True, STAMP], [STAMP, None, True], [None, True]])
def test_a_repeat_of_nothing_is_refused(column: list[Any]) -> None:
    with pytest.raises(ValueError, match="repeats none"):
        unpack_headers(column)


def records(n: int) -> list[Record]:
    return [
        make_record(b"x" * 100, timestamp=NOW + i, headers=(("lattice.producer", b"ab" * 32),))
        for i in range(n)
    ]


def stored(path: Path, migrations: tuple[Any, ...] = MIGRATIONS) -> tuple[core.QueueState, list[Record]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    store = Store(path, migrations=migrations)
    rs = records(3000)
    one = core.commit(core.empty_state(OWNER.public_key, "one"), OWNER, now_ms=NOW, records=rs)
    store.begin()
    store.insert_queue(1, one, NOW)
    store.persist(1, store.empty_view(1, core.empty_state(OWNER.public_key, "one")), one)
    store.commit()
    store.close()
    return one, rs


def test_a_stores_records_with_one_stamp_cost_their_payload(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    one, rs = stored(path)
    conn = sqlite3.connect(path)
    try:
        data = conn.execute("SELECT sum(length(data)) FROM segments WHERE q = 1").fetchone()[0]
    finally:
        conn.close()
    assert data < len(rs) * 120  # 100-byte values and stamps; the producer stamp (~84 bytes) once a segment
    store = Store(path)
    try:
        assert store.rows.records(1, 0, len(rs)) == rs
        run = store.rows.run(1, 0, len(rs))  # what a delta sends: the stamp converted once, shared
        assert tuple(run) == tuple(rs) and run.headers is not None
        assert len({id(h) for h in run.headers}) == 1
        [loaded] = store.load()
        assert loaded.state == one
    finally:
        store.close()


def test_a_schema_8_store_is_read_the_same_after_its_upgrade(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    one, rs = stored(path, MIGRATIONS[:8])
    conn = sqlite3.connect(path)
    try:  # the rows as schema 8 wrote them: each record's headers whole
        for rowid, data in conn.execute("SELECT rowid, data FROM segments").fetchall():
            keys, values, stamps, column = msgpack.unpackb(data, raw=False)
            column = unpack_headers(column)
            old = msgpack.packb([keys, values, stamps, column], use_bin_type=True)
            conn.execute("UPDATE segments SET data = ? WHERE rowid = ?", (old, rowid))
        conn.commit()
    finally:
        conn.close()
    store = Store(path)
    try:
        assert store.migrated_from == 8
        assert store.connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 9
        assert store.rows.records(1, 0, len(rs)) == rs
        [loaded] = store.load()
        assert loaded.state == one
    finally:
        store.close()
