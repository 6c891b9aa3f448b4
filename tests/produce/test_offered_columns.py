"""Records sent as columns (``offer_batch``'s ``packed`` layout) come apart into the columns the list form
gives, by the compiled pass and the pure one alike; anything malformed is refused with a reason by the
pure path (the compiled one declines it); and the owner's run and digest are those of the same records
sent as a list, so a retry in either form is a retry."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.api.client.packed_offer import packed_fields
from latticed.crdt import columns_compiled
from latticed.crdt.records import MAX_KEY_BYTES, MAX_VALUE_BYTES
from latticed.errors import MalformedError
from latticed.produce.offered_columns import OfferedColumns, offered_columns, unpacked_pure
from latticed.produce.owner import MAX_RECORDS, offered_run

blobs = st.binary(max_size=300) | st.sampled_from([b"x" * 70_000, b""])
records = st.lists(st.tuples(blobs, st.none() | st.binary(max_size=40)), min_size=1, max_size=40)
COMPILED = columns_compiled.load()


def _columns(fields: dict[str, Any]) -> tuple[bytes, bytes, bytes, bytes | None, int]:
    return fields["values"], fields["value_lengths"], fields["keys"], fields["key_lengths"], fields["count"]


def test_the_compiled_pass_is_built() -> None:
    assert COMPILED is not None, "build it: python latticed/crdt/_columns_build.py"


@settings(max_examples=80, deadline=None)
@given(records)
def test_columns_come_apart_as_the_list_form_and_pack_as_it(rows: list[tuple[bytes, bytes | None]]) -> None:
    fields = packed_fields([(v, k, ()) for v, k in rows])
    listed = [[v, k, []] for v, k in rows]
    pure = unpacked_pure(*_columns(fields))
    assert pure == (tuple(v for v, _ in rows), tuple(k for _, k in rows), msgpack.packb(listed))
    assert COMPILED is not None
    values, value_lengths, keys, key_lengths, _ = _columns(fields)
    assert COMPILED.unpacked(values, value_lengths, keys, key_lengths, MAX_VALUE_BYTES, MAX_KEY_BYTES) == pure
    offered = offered_columns(fields, MAX_RECORDS)
    assert offered.plain and offered.rows() == listed


def _broken(fields: dict[str, Any], how: str) -> dict[str, Any]:
    out = dict(fields)
    n = out["count"]
    if how == "short values":
        out["values"] = out["values"][:-1]
    elif how == "long values":
        out["values"] += b"!"
    elif how == "negative length":
        out["value_lengths"] = struct.pack("<i", -1) + out["value_lengths"][4:]
    elif how == "value too long":
        out["value_lengths"] = struct.pack("<i", MAX_VALUE_BYTES + 1) + out["value_lengths"][4:]
    elif how == "lengths not int32":
        out["value_lengths"] += b"\0"
    elif how == "key -2":
        out["key_lengths"] = struct.pack(f"<{n}i", -2, *[-1] * (n - 1))
        out["keys"] = b""
    elif how == "key too long":
        out["key_lengths"] = struct.pack(f"<{n}i", MAX_KEY_BYTES + 1, *[-1] * (n - 1))
        out["keys"] = b"k" * (MAX_KEY_BYTES + 1)
    elif how == "keys without lengths":
        out["key_lengths"], out["keys"] = None, b"k"
    elif how == "keys short":
        out["key_lengths"], out["keys"] = struct.pack(f"<{n}i", *[1] * n), b""
    return out


HOW = [
    "short values",
    "long values",
    "negative length",
    "value too long",
    "lengths not int32",
    "key -2",
    "key too long",
    "keys without lengths",
    "keys short",
]


@pytest.mark.parametrize("how", HOW)
def test_malformed_columns_are_refused_by_the_pure_path_and_declined_by_the_compiled(how: str) -> None:
    fields = _broken(packed_fields([(b"v%d" % i, None, ()) for i in range(3)]), how)
    values, value_lengths, keys, key_lengths, _ = _columns(fields)
    assert COMPILED is not None
    assert COMPILED.unpacked(values, value_lengths, keys, key_lengths, MAX_VALUE_BYTES, MAX_KEY_BYTES) is None
    with pytest.raises(MalformedError, match="packed offer"):
        offered_columns(fields, MAX_RECORDS)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"count": 0}, "'count'"),
        ({"count": MAX_RECORDS + 1}, "'count'"),
        ({"count": True}, "'count'"),
        ({"values": "text"}, "'values' is bytes"),
        ({"value_lengths": None}, "'value_lengths' is bytes"),
        ({"keys": 5}, "'keys' is bytes"),
        ({"timestamps": b"\0" * 7}, "'timestamps'"),
        ({"timestamps": struct.pack("<3q", 1, -2, 3)}, "timestamp"),
        ({"headers": [[["h", b"v"]]]}, "'headers' is a map"),
        ({"headers": {3: [["h", b"v"]]}}, "'headers' is a map"),
        ({"headers": {"0": [["h", b"v"]]}}, "'headers' is a map"),
    ],
)
def test_malformed_fields_are_refused(change: dict[str, Any], reason: str) -> None:
    fields = {**packed_fields([(b"v%d" % i, None, ()) for i in range(3)]), **change}
    with pytest.raises(MalformedError, match=reason):
        offered_columns(fields, MAX_RECORDS)


@settings(max_examples=40, deadline=None)
@given(records, st.booleans(), st.booleans())
def test_the_owner_runs_and_digests_columns_as_the_same_list(
    rows: list[tuple[bytes, bytes | None]], headers: bool, stamps: bool
) -> None:
    sent = [
        (v, k, [("h", b"%d" % i)] if headers and i % 2 else [], i if stamps and i % 3 else None)
        for i, (v, k) in enumerate(rows)
    ]
    offered = offered_columns(packed_fields(sent), MAX_RECORDS)
    plain = not any(hs or ts is not None for _, _, hs, ts in sent)
    assert type(offered) is OfferedColumns and offered.plain is plain
    listed = [[v, k, [list(h) for h in hs], ts] for v, k, hs, ts in sent]
    run, digest = offered_run(offered, "ab" * 32, 1234, None)
    run_list, digest_list = offered_run(listed, "ab" * 32, 1234, msgpack.packb(listed))
    assert digest == digest_list
    assert (run.values, run.keys, run.timestamps, run.headers) == (
        run_list.values,
        run_list.keys,
        run_list.timestamps,
        run_list.headers,
    )


def test_a_producers_own_header_is_refused_in_columns_too() -> None:
    fields = packed_fields([(b"v", None, [("lattice.producer", b"me")])])
    with pytest.raises(MalformedError, match="set by the queue's owner"):
        offered_run(offered_columns(fields, MAX_RECORDS), "ab" * 32, 1, None)
