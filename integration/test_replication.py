"""Replication between real daemon processes on loopback: static peers, multi-hop, mDNS, offline
catch-up both ways, kill -9 mid-transfer, and a malicious peer."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio
from daemon_calls import write_after_start
from daemons import LatticedProcess
from held_relay import HeldRelay
from polling import wait_until

from latticed.api.client.blocking_client import Client
from latticed.crdt import queue as core
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import delta_to_wire, pack
from latticed.errors import BehindPeersError, ConnectionClosedError
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.transport import open_peer
from latticed.protocol.replication import DELTA, HELLO, PROTOCOL_VERSION

Factory = Callable[..., LatticedProcess]


def client(daemon: LatticedProcess) -> Client:
    return Client(daemon.socket, timeout=10)


def listen_port(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        listen = c.status()["listen"]
    assert listen is not None
    return int(listen.rsplit(":", 1)[1])


def start_peer(factory: Factory, *peers: LatticedProcess, extra: list[str] | None = None) -> LatticedProcess:
    args = ["--listen", "127.0.0.1:0", "--no-mdns", *(extra or [])]
    for peer in peers:
        args += ["--peer", f"127.0.0.1:{listen_port(peer)}"]
    return factory(args=args)


def holds(daemon: LatticedProcess, queue: str, end: int) -> bool:
    with client(daemon) as c:
        try:
            return int(c.queue_info(queue)["end_offset"]) >= end
        except Exception:
            return False


def values(daemon: LatticedProcess, queue: str) -> list[bytes]:
    with client(daemon) as c:
        return [e.value for e in c.range(queue, 0, 1 << 40)]


def replica_state(daemon: LatticedProcess, queue: str) -> dict[str, Any]:
    """What a replica holds of a queue beyond its records: offsets, the owner's version, metadata, fork."""
    with client(daemon) as c:
        info = c.queue_info(queue)
    return {k: info[k] for k in ("start_offset", "end_offset", "known_end", "version", "meta", "forked")}


def test_three_daemons_converge_across_hops(latticed_process: Factory) -> None:
    a = start_peer(latticed_process)
    b = start_peer(latticed_process, a)
    c = start_peer(latticed_process, b)  # a and c never meet
    with client(a) as ca:
        queue = ca.queue_create("events")
        ca.offer_batch("events", [(b"a%d" % i, None, ()) for i in range(50)])
    with client(c) as cc:
        c_queue = cc.queue_create("from-c")
        cc.offer("from-c", b"hello from c")
    wait_until(lambda: holds(c, queue, 50), "a's records on c")
    wait_until(lambda: holds(a, c_queue, 1), "c's record on a")
    assert values(c, queue) == values(b, queue) == values(a, queue) == [b"a%d" % i for i in range(50)]
    assert replica_state(c, queue) == replica_state(b, queue) == replica_state(a, queue)
    assert replica_state(a, c_queue) == replica_state(c, c_queue)
    with client(b) as cb:
        listed = {q["queue"] for q in cb.queue_list()}
        assert {queue, c_queue} <= listed
        peers = cb.peers()
        assert sum(1 for p in peers if p["connected"]) == 2
        with pytest.raises(Exception, match="owner"):
            cb.offer(queue, b"forged by b")


def test_offline_laptop_catches_up_both_ways(latticed_process: Factory) -> None:
    a = start_peer(latticed_process)
    laptop = latticed_process(args=["--no-mdns"])  # offline: no peers, not listening
    with client(a) as ca:
        office = ca.queue_create("office")
        ca.offer_batch("office", [(b"o%d" % i, None, ()) for i in range(300)])
    with client(laptop) as cl:
        trip = cl.queue_create("trip")
        cl.offer_batch("trip", [(b"t%d" % i, None, ()) for i in range(120)])
    laptop.stop()
    laptop.args = ["--listen", "127.0.0.1:0", "--no-mdns", "--peer", f"127.0.0.1:{listen_port(a)}"]
    laptop.start()
    wait_until(lambda: holds(laptop, office, 300), "office records on the laptop")
    wait_until(lambda: holds(a, trip, 120), "trip records on the office daemon")
    assert values(a, trip) == [b"t%d" % i for i in range(120)]


def test_a_restored_stale_store_may_not_write_until_it_caught_up(latticed_process: Factory) -> None:
    """A daemon restored from an old copy of its data directory holds less of its own queue than its peer.
    A write then would sign a second history at offsets the peer holds (a fork for good): it is refused
    while the catch-up runs, and lands after the true end once it is done.

    The laptop reaches home through a relay that lets home's bytes through only as the test allows: after
    the restore, a kilobyte at a time until the laptop says home is ahead, then none until the write was
    refused. The catch-up (~0.27 s here, often half over when `start()` returned) is thus held open
    rather than raced by polling, which missed it 1 in 4-6 runs."""
    home = start_peer(latticed_process)
    relay = HeldRelay(listen_port(home))
    # Not listening: home cannot dial it back around the relay.
    laptop = latticed_process(args=["--no-mdns", "--peer", f"127.0.0.1:{relay.port}"])
    with client(laptop) as c:
        queue = c.queue_create("diary")
        c.offer_batch("diary", [(b"old%d" % i, None, ()) for i in range(10)])
    wait_until(lambda: holds(home, queue, 10), "the first records at home")
    laptop.stop()
    backup = laptop.data_dir.with_name(laptop.data_dir.name + "-backup")
    shutil.copytree(laptop.data_dir, backup)
    laptop.start()
    end = 10 + 100 * 1000  # a catch-up of ~1 MB: far more than the few kB that tell the laptop home is ahead

    def batch(c: Client, n: int) -> list[int]:
        return c.offer_batch("diary", [(b"new%d" % (n * 1000 + i), None, ()) for i in range(1000)])

    # The just-started laptop signs nothing until it heard what home holds (its start gate).
    write_after_start(laptop, lambda c: batch(c, 0), "the first batch after the laptop's restart")
    with client(laptop) as c:
        for n in range(1, 100):
            batch(c, n)
    wait_until(lambda: holds(home, queue, end), "the later records at home")
    laptop.stop()
    shutil.rmtree(laptop.data_dir)
    shutil.copytree(backup, laptop.data_dir)
    relay.hold()
    laptop.start()

    def sees_home_ahead() -> bool:
        with client(laptop) as c:
            return any(lag < 0 for peer in c.peers() for lag in (peer.get("lag") or {}).values())

    while not sees_home_ahead():  # home's handshake, HELLO and digest, a kilobyte at a time
        assert relay.passed < 256 * 1024, "the laptop never heard what home holds"
        relay.allow(1024)
        wait_until(lambda: relay.spent() or sees_home_ahead(), "home's next kilobyte at the laptop")
    assert not holds(laptop, queue, end), "the catch-up is held at the relay"
    with client(laptop) as c:
        with pytest.raises(BehindPeersError, match="restored from an older copy"):
            c.offer("diary", b"after the restore")
        relay.release()
        wait_until(lambda: holds(laptop, queue, end), "the catch-up")
        offset = c.offer("diary", b"after the restore")
        assert offset == end, "the write continues the one true history"
        assert not c.queue_info(queue)["forked"]
    wait_until(lambda: holds(home, queue, end + 1), "the new record at home")
    with client(home) as c:
        assert not c.queue_info(queue)["forked"]
        assert c.peek(queue, end) == b"after the restore"
    relay.close()


def test_kill9_mid_transfer_then_converge(latticed_process: Factory) -> None:
    a = start_peer(latticed_process)
    with client(a) as ca:
        queue = ca.queue_create("backlog")
        for batch in range(20):
            ca.offer_batch("backlog", [(b"%06d" % (batch * 1000 + i), None, ()) for i in range(1000)])
    b = start_peer(latticed_process, a)
    wait_until(lambda: holds(b, queue, 1), "the transfer to start")
    b.kill9()
    b.start()
    wait_until(lambda: holds(b, queue, 20_000), "the backlog after a kill -9")
    with client(b) as cb:
        info = cb.queue_info(queue)
        assert info["end_offset"] == 20_000 and not info["forked"]
        assert cb.peek(queue, 12_345) == b"%06d" % 12_345


def test_discovery_by_mdns_on_loopback(latticed_process: Factory) -> None:
    mdns = ["--mdns", "--mdns-interface", "127.0.0.1", "--listen", "127.0.0.1:0"]
    a = latticed_process(args=mdns)
    b = latticed_process(args=mdns)
    with client(a) as ca:
        queue = ca.queue_create("lan")
        ca.offer("lan", b"found you")
    wait_until(lambda: holds(b, queue, 1), "replication after mDNS discovery")

    def found_by_mdns(daemon: Any) -> bool:
        with client(daemon) as c:
            return any("mdns" in p.get("sources", []) for p in c.peers())

    # Whichever heard the other's announcement first dialled; the other may see it as "incoming" until
    # its own browser reports the announcement too. Neither has a static peer, so one of them found the
    # other by mDNS.
    assert found_by_mdns(a) or found_by_mdns(b)
    wait_until(lambda: found_by_mdns(a) and found_by_mdns(b), "each daemon hears the other's announcement")


def test_malicious_peer_is_refused_and_nothing_is_stored(latticed_process: Factory) -> None:
    victim = start_peer(latticed_process)
    port = listen_port(victim)
    owner = Identity.from_seed(b"o" * 32)
    mallory = Identity.generate()
    honest = core.commit(
        core.empty_state(owner.public_key, "ledger"), owner, now_ms=1, records=[Record(value=b"pay 5")]
    )
    forged = dataclasses.replace(core.delta(honest), records=(Record(value=b"pay 5000"),))
    wrong_owner = dataclasses.replace(
        core.delta(core.commit(core.empty_state(mallory.public_key, "x"), mallory, now_ms=1)),
        owner=owner.public_key,
    )

    async def attack(delta: core.QueueDelta) -> None:
        stream = await open_peer("127.0.0.1", port, seed=mallory.seed, network_key=DEFAULT_NETWORK_KEY)
        await stream.send(pack([HELLO, PROTOCOL_VERSION, None]))
        await stream.send(pack([DELTA, 1, delta_to_wire(delta)]))
        with trio.fail_after(10):
            while await stream.receive() is not None:  # the daemon hangs up on us
                pass

    for bad in (forged, wrong_owner, forged):  # the third is a replay
        with contextlib.suppress(ConnectionClosedError):  # hung up cleanly or cut off: both are a refusal
            trio.run(attack, bad)
    with client(victim) as cv:
        assert all(q["owner"] != owner.public_key.hex() for q in cv.queue_list())
        counters = cv.status()["replication"]
        assert counters["rejected_deltas"] == 3
        assert counters["connected"] == 0
        assert cv.identity()  # still serving


def test_replicate_patterns_choose_which_queues_a_daemon_takes(latticed_process: Factory) -> None:
    a = start_peer(latticed_process)
    with client(a) as ca:
        public = ca.queue_create("public-news")
        private = ca.queue_create("private-diary")
        ca.offer("public-news", b"headline")
        ca.offer("private-diary", b"secret")
        marker = ca.queue_create("public-marker")
        ca.offer("public-marker", b"sent after the others")
    b = start_peer(latticed_process, a, extra=["--replicate", "*/public-*"])
    wait_until(lambda: holds(b, public, 1) and holds(b, marker, 1), "the public queues on b")
    with client(b) as cb:
        listed = {q["queue"] for q in cb.queue_list()}
    assert public in listed and private not in listed


def test_a_compacted_kv_namespace_replicates_whole(latticed_process: Factory) -> None:
    a = start_peer(latticed_process)
    b = start_peer(latticed_process, a)
    with client(a) as c:
        owner = c.identity()

    def bump(times: int) -> None:
        with client(a) as c:
            for _ in range(times):
                c.kv_incr("hits")

    workers = [threading.Thread(target=bump, args=(1100,)) for _ in range(4)]  # 4400 ops: past the threshold
    for worker in workers:
        worker.start()
    with client(a) as c:
        c.kv_put("name", b"ada")
        c.kv_hset("user", b"lang", b"en")
        c.kv_put("tmp", b"x")
        c.kv_del("tmp")
    for worker in workers:
        worker.join()
    wait_until(lambda: '"kv.compacted"' in a.log.read_text(errors="replace"), "a compaction step on A")
    with client(a) as c:
        c.kv_put("after", b"compaction")
    late = start_peer(latticed_process, a)  # sees only the compacted log

    def replica_view(daemon: LatticedProcess) -> dict[str, Any]:
        with client(daemon) as c:
            return {key: c.kv_get(key, owner=owner) for key in ("hits", "name", "user", "tmp", "after")}

    expected = {"hits": 4400, "name": b"ada", "user": {b"lang": b"en"}, "tmp": None, "after": b"compaction"}
    assert replica_view(a) == expected
    for replica in (b, late):
        wait_until(lambda r=replica: replica_view(r) == expected, "the KV view on a replica")
