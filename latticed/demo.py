"""The main job, ``make demo``: a short real run that shows what latticed does.

This stage runs the lattice core in one process: an owner writes, a replica catches up through
verified deltas, a forgery and a replayed delta are refused, and an owner that signs two histories is
caught with a fork proof. Later stages add daemons, replication and the Spark tail.
"""

from __future__ import annotations

import dataclasses

from latticed import Identity, IntegrityError, LatticeQueue, Record
from latticed.kv import KvNamespace


def say(text: str) -> None:
    print(f"  {text}")


def lattice_demo() -> None:
    print("== lattice core")
    alice = Identity.generate()
    events = LatticeQueue.create(alice, "events")
    for i in range(5):
        events.offer(f"event {i}".encode(), key=b"user-%d" % (i % 2), headers={"seq": str(i)})
    first, last = events.start_offset, events.end_offset - 1
    say(f"alice wrote offsets {first}..{last} to {alice.public_hex[:12]}…/events")

    bob_copy = LatticeQueue.empty_replica(alice.public_key, "events")
    bob_copy.merge(events.delta(bob_copy.summary()))
    say(f"bob's replica verified and merged: {bob_copy.range(0, 10)}")

    events.truncate(2)
    events.offer(b"event 5")
    catch_up = events.delta(bob_copy.summary())
    bob_copy.merge(catch_up)
    say(
        f"truncation and a new record arrive as a delta of {len(catch_up.records)} record(s): "
        f"start={bob_copy.start_offset} end={bob_copy.end_offset}"
    )

    forged = dataclasses.replace(catch_up, records=(Record(value=b"forged"),))
    try:
        bob_copy.merge(forged)
    except IntegrityError as exc:
        say(f"forged delta refused: {type(exc).__name__}: {exc}")
    bob_copy.merge(catch_up)
    say(f"replayed delta is a no-op: end still {bob_copy.end_offset}")

    try:
        bob_copy.offer(b"not mine")
    except Exception as exc:
        say(f"bob writing to alice's queue: {type(exc).__name__}: {exc}")

    honest = LatticeQueue.create(alice, "ledger")
    honest.offer(b"pay carol 5")
    twin = LatticeQueue.create(alice, "ledger")
    twin.offer(b"pay mallory 500")
    watcher = LatticeQueue.empty_replica(alice.public_key, "ledger")
    watcher.merge(honest.state)
    watcher.merge(twin.state)
    proof = watcher.equivocation
    assert proof is not None
    proof.verify()
    say(f"alice signed two histories of 'ledger': forked={watcher.forked}, proof verifies")

    print("== KV state")
    kv = KvNamespace.create(alice)
    kv.put("greeting", b"hello")
    kv.incr("visits", 3)
    kv.hset("profile", b"name", b"alice")
    kv.sadd("tags", b"p2p")
    mirror = KvNamespace.replica(alice.public_key)
    mirror.merge(kv.delta(mirror.summary()))
    say(f"replicated KV: {mirror.items()}")


def main() -> None:
    lattice_demo()


if __name__ == "__main__":
    main()
