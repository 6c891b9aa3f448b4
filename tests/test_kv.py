"""KvNamespace: the signed single-writer KV namespace as a library object."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from latticed import Identity, IntegrityError, MalformedError, NotOwnerError
from latticed.crdt import kv as kvcore
from latticed.crdt.records import Record
from latticed.kv import KvNamespace

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
