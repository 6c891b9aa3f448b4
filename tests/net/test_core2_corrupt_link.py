"""review23: what a queue found corrupt does to the links of peers that hold it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio
import trio.testing
from support.gossip_hosts import MemoryReplicaHost
from support.gossip_tcp import link_gossips_tcp
from test_core2_relay_ahead import ALICE, BOB, KEY, Memory2, acks_sent

from latticed.crdt.records import Record
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.gossip import Gossip
from latticed.protocol.core2_steps import outgoing
from latticed.storage.codec import pack
from latticed.storage.engine import Engine
from latticed.storage.store import db_path


async def test_a_peer_holding_a_queue_found_corrupt_here_keeps_its_link(tmp_path: Path) -> None:
    """fix23 ended the link of every peer holding a queue found corrupt here (its merge raised, "a merge
    of this peer's delta failed", noted against the peer): the peer is not at fault and its other queues
    would stop replicating. Its deltas of that queue are answered as not held, and nothing is stored."""
    a2 = Memory2()
    a = (ALICE, Gossip(MemoryReplicaHost(), ALICE.public_key, host2=a2))
    a2.gossip = a[1]
    a2.put([Record(value=b"x-0")])
    first = outgoing(a2.memory.states2[KEY], None, 100, 1 << 20).delta
    async with Engine.open(tmp_path, BOB) as engine:
        verified, against = await engine.core2.verify(first)
        await engine.core2.merge(first, verified, against)
    conn = sqlite3.connect(db_path(tmp_path))
    conn.execute("UPDATE queue2 SET meta = ?", (pack([["team", "evil"]]),))
    conn.commit()
    conn.close()
    async with Engine.open(tmp_path, BOB) as engine, trio.open_nursery() as nursery:
        b2 = EngineCore2Host(engine)
        await b2.load()
        b = (BOB, Gossip(MemoryReplicaHost(), BOB.public_key, host2=b2))
        await link_gossips_tcp(nursery, a, b)
        await acks_sent(b[1], 1)  # the delta A sends on linking: answered "nothing held", not a fault
        a2.put([Record(value=b"x-1")])
        await acks_sent(b[1], 2)
        await trio.testing.wait_all_tasks_blocked()
        assert ALICE.public_key in b[1].links and b[1].counters["protocol_errors"] == 0
        assert b[1].queue_errors.last(ALICE.public_key, KEY) is None
        assert await b2.delta2_for(KEY, None, 10, 1 << 20) is None  # never served either
        q = engine.core2.lookup(*KEY)
        assert q is not None and engine.core2.loaded(q) is None
        nursery.cancel_scope.cancel()
