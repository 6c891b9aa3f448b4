"""KvNamespace: the signed single-writer KV namespace as a library object."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed import Identity, IntegrityError, MalformedError, NotOwnerError
from latticed.crdt import kv as kvcore
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.crdt.records import Record
from latticed.facades.kv_namespace import KvNamespace
from latticed.facades.lattice_queue import LatticeQueue

ALICE = Identity.from_seed(b"a" * 32)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_values_hashes_sets_counters_and_tombstones() -> None:
    ns = KvNamespace.create(ALICE, clock=Clock())
    ns.put("a", b"1")
    ns.put("a", b"2")
    assert ns.get("a") == b"2"
    assert ns.incr("n") == 1 and ns.incr("n", 5) == 6 and ns.get("n") == 6
    ns.hset("h", b"f1", b"x")
    ns.hset("h", b"f2", b"y")
    ns.hdel("h", b"f1")
    assert ns.get("h") == {b"f2": b"y"}
    ns.sadd("s", b"m1")
    ns.sadd("s", b"m2")
    ns.srem("s", b"m1")
    assert ns.get("s") == {b"m2"}
    ns.delete("a")
    assert ns.get("a") is None
    assert set(ns.items()) == {"n", "h", "s"}
    assert ns.items("h") == {"h": {b"f2": b"y"}}


def test_a_put_replaces_a_collection_and_a_field_write_restarts_one() -> None:
    ns = KvNamespace.create(ALICE, clock=Clock())
    ns.hset("k", b"old", b"1")
    ns.put("k", b"plain")
    assert ns.get("k") == b"plain"
    ns.hset("k", b"new", b"2")
    assert ns.get("k") == {b"new": b"2"}  # the old field belonged to a previous life of the key


def test_ttl_expires_by_the_injected_clock() -> None:
    clock = Clock()
    ns = KvNamespace.create(ALICE, clock=clock)
    ns.put("session", b"tok", ttl_ms=500)
    assert ns.get("session") == b"tok"
    clock.now += 500  # a TTL counts from the next millisecond (test_kv_planner.py)
    assert ns.get("session") == b"tok"
    clock.now += 1
    assert ns.get("session") is None


def test_replica_converges_through_deltas_and_refuses_writes() -> None:
    clock = Clock()
    ns = KvNamespace.create(ALICE, clock=clock)
    ns.put("a", b"1")
    ns.hset("h", b"f", b"v")
    replica = KvNamespace.replica(ALICE.public_key, clock=clock)
    replica.merge(ns.delta(replica.summary()))
    ns.incr("n", 3)
    ns.delete("a")
    replica.merge(ns.delta(replica.summary()))
    assert replica.items() == ns.items() == {"h": {b"f": b"v"}, "n": 3}
    assert replica.view == ns.view
    with pytest.raises(NotOwnerError):
        replica.put("x", b"y")
    with pytest.raises(NotOwnerError):
        replica.delete("missing")  # a write that would change nothing is still not the replica's to make


def test_forged_ops_are_rejected_and_change_nothing() -> None:
    clock = Clock()
    ns = KvNamespace.create(ALICE, clock=clock)
    ns.put("balance", b"10")
    replica = KvNamespace.replica(ALICE.public_key, clock=clock)
    delta = ns.delta(replica.summary())
    evil = kvcore.Op("put", 1 << 40, "balance", b"1000000").encode()
    forged = dataclasses.replace(delta, records=(Record(value=evil, key=b"balance"),))
    with pytest.raises(IntegrityError):
        replica.merge(forged)
    assert replica.items() == {}
    replica.merge(delta)
    assert replica.get("balance") == b"10"


def test_hlc_orders_writes_even_when_the_wall_clock_steps_back() -> None:
    clock = Clock()
    ns = KvNamespace.create(ALICE, clock=clock)
    ns.put("k", b"first")
    clock.now -= 10_000
    ns.put("k", b"second")
    assert ns.get("k") == b"second"


@pytest.mark.parametrize(
    "write",
    [
        lambda ns: ns.incr("n", 1.5),
        lambda ns: ns.incr("n", True),
        lambda ns: ns.put("k", "text"),
        lambda ns: ns.put("k", b"v", ttl_ms=0),
        lambda ns: ns.put("k", b"v", ttl_ms=2.5),
        lambda ns: ns.hset("h", "field", b"v"),
        lambda ns: ns.sadd("s", 7),
    ],
    ids=["incr-float", "incr-bool", "put-str", "ttl-0", "ttl-float", "hset-str-field", "sadd-int"],
)
def test_a_write_of_the_wrong_type_is_refused_before_it_is_signed(write: Any) -> None:
    """An op the log could not decode would be signed for good and wedge every later fold."""
    ns = KvNamespace.create(ALICE, clock=Clock())
    ns.incr("n")
    before = ns.state
    with pytest.raises(MalformedError):
        write(ns)
    assert ns.state == before
    ns.put("a", b"1")
    assert ns.items() == {"a": b"1", "n": 1}


#: Entries an owner's signed op log may hold that are not ops this version can decode.
NOT_OPS = [
    b"\xc1",  # not msgpack
    b"",
    msgpack.packb(["put", 1, "k"]),  # too few fields
    msgpack.packb(["zap", 1, "k", None, None, None, False]),  # an op kind from a newer writer
    msgpack.packb(["put", 1, "k", "text, not bytes", None, None, False]),
]


def op_log(clock: Clock) -> LatticeQueue:
    """An owned namespace's op log, so a test can sign entries that are not ops into it."""
    return LatticeQueue(core.empty_state(ALICE.public_key, "kv", KIND_KV), ALICE, clock)


@pytest.mark.parametrize("junk", NOT_OPS)
def test_a_signed_entry_that_is_not_an_op_is_skipped_and_later_merges_still_apply(junk: bytes) -> None:
    """The owner signed it, so the log keeps it; it changes no key, on every replica (as the daemon's
    fold does). Refusing it left the log ahead of the view and every later merge raising."""
    clock = Clock()
    log = op_log(clock)
    ns = KvNamespace(log, clock)
    ns.put("a", b"1")
    log.offer(junk, key=b"junk")
    ns.put("b", b"2")
    replica = KvNamespace.replica(ALICE.public_key, clock=clock)
    replica.merge(ns.delta(replica.summary()))
    assert replica.items() == ns.items() == {"a": b"1", "b": b"2"}
    assert replica.state == ns.state  # the whole log merged, the entry included
    ns.put("c", b"3")
    ns.delete("a")
    replica.merge(ns.delta(replica.summary()))
    assert replica.items() == ns.items() == {"b": b"2", "c": b"3"}
    assert replica.view == ns.view
    reloaded = KvNamespace(LatticeQueue.replica(replica.state, clock), clock)  # a fold from scratch
    assert reloaded.view == ns.view


OPS = st.builds(
    lambda op, key, value: kvcore.Op(op, 0, key, value, None if op in ("put", "del", "incr") else b"m"),
    st.sampled_from(["put", "del", "hset", "sadd"]),
    st.sampled_from(["a", "b", "c"]),
    st.binary(max_size=4),
)


@settings(max_examples=40, deadline=None)
@given(entries=st.lists(st.one_of(OPS, st.sampled_from(NOT_OPS), st.binary(max_size=12)), max_size=12))
def test_a_replica_of_any_signed_log_merges_whole_and_matches_the_owner(entries: list[object]) -> None:
    clock = Clock()
    log = op_log(clock)
    replica = KvNamespace.replica(ALICE.public_key, clock=clock)
    for i, entry in enumerate(entries):
        if isinstance(entry, kvcore.Op):
            clock.now += 1
            log.offer(dataclasses.replace(entry, hlc=clock.now << kvcore.HLC_LOGICAL_BITS).encode())
        else:
            assert isinstance(entry, bytes)
            log.offer(entry)
        if i % 3 == 2:
            replica.merge(log.delta(replica.summary()))
    replica.merge(log.delta(replica.summary()))
    owner = KvNamespace(log, clock)
    assert replica.state == log.state
    assert replica.view == owner.view
    decoded, _ = kvcore.decode_ops(r.value for r in log.range_entries(0, log.end_offset))
    assert replica.view == kvcore.apply_ops({}, decoded)
