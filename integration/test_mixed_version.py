"""A daemon of the previous release (built from git: integration/releases.py) and one of this build,
same network key: they connect and replicate queues, KV state and sealed queues both ways, serve each
other's work-queue consumers, and a rolling upgrade of three daemons under a live stream loses and
duplicates nothing. Every wire change keeps these passing (CHANGELOG.md, docs/operations.md)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
from daemon_calls import wait_gate_open
from daemons import LatticedProcess
from half_open_relay import HalfOpenRelay
from polling import wait_until
from releases import previous_release, run_as

from latticed.api.client.blocking_client import Client
from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack
from latticed.errors import ConnectionClosedError, LatticedError, VersionGapError
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.gossip import STALE_AFTER_S
from latticed.net.transport import open_peer
from latticed.protocol.link_gone import LINK_GONE_FEATURE, LOST_LINK_TTL_S
from latticed.protocol.replication import HELLO
from latticed.version import PROTOCOL_VERSIONS, RELEASE

Factory = Callable[..., LatticedProcess]
OLD = previous_release()


def client(daemon: LatticedProcess, timeout: float = 30) -> Client:
    return Client(daemon.socket, timeout=timeout)


def identity(daemon: LatticedProcess) -> str:
    with client(daemon) as c:
        return c.identity()


def listen_port(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        listen = c.status()["listen"]
    assert listen is not None
    return int(listen.rsplit(":", 1)[1])


def start(factory: Factory, version: str | None, *peers: LatticedProcess) -> LatticedProcess:
    """A daemon of ``version`` (None: this build) on loopback, dialling ``peers``."""
    args = ["--listen", "127.0.0.1:0", "--no-mdns"]
    for peer in peers:
        args += ["--peer", f"127.0.0.1:{listen_port(peer)}"]
    daemon = factory(args=args, start=False)
    run_as(daemon, version).start()
    return daemon


def held_end(daemon: LatticedProcess, queue: str) -> int:
    with client(daemon) as c:
        try:
            return int(c.queue_info(queue)["end_offset"])
        except LatticedError:
            return -1


def values(daemon: LatticedProcess, queue: str) -> list[bytes]:
    with client(daemon) as c:
        return [e.value for e in c.range(queue, 0, 1 << 40)]


def kv_value(daemon: LatticedProcess, key: str, owner: str) -> Any:
    with client(daemon) as c:
        try:
            return c.kv_get(key, owner=owner)
        except LatticedError:
            return None


def connected(daemon: LatticedProcess, peer: str) -> bool:
    with client(daemon) as c:
        return any(p.get("public_key") == peer and p.get("status") == "connected" for p in c.peers())


def linked(factory: Factory) -> tuple[LatticedProcess, LatticedProcess, str, str]:
    """A daemon of the previous release and one of this build dialling it, once each says the link is up:
    the two and their identities."""
    old = start(factory, OLD)
    new = start(factory, None, old)  # the new one dials the old one
    old_id, new_id = identity(old), identity(new)
    wait_until(lambda: connected(new, old_id) and connected(old, new_id), "the link between the releases")
    return old, new, old_id, new_id


def test_the_previous_release_runs_its_own_code(latticed_process: Factory) -> None:
    old = start(latticed_process, OLD)
    with client(old) as c:
        assert "release" not in c.call("hello")  # not this build's code: 0.2.0 states no release
    assert "latticed/version.py" not in old.log_text()


def test_previous_release_and_this_build_replicate_both_ways(latticed_process: Factory) -> None:
    old, new, old_id, new_id = linked(latticed_process)
    with client(old) as c:
        from_old = c.queue_create("from-old")
        c.offer_batch("from-old", [(b"o%d" % i, b"k%d" % (i % 7), ()) for i in range(500)])
        c.kv_put("greeting", b"hello from the old release")
        c.kv_hset("profile", b"name", b"old")
        sealed_old = c.queue_create("sealed-old", readers=[new_id])
        c.offer_batch("sealed-old", [(b"secret-o%d" % i, None, ()) for i in range(20)])
    with client(new) as c:
        from_new = c.queue_create("from-new", core=1)  # core 1: a 0.2.0 peer must receive it
        c.offer_batch("from-new", [(b"n%d" % i, None, ()) for i in range(500)])
        c.kv_put("greeting", b"hello from this build")
        c.kv_incr("visits", 3)
        sealed_new = c.queue_create("sealed-new", readers=[old_id])
        c.offer_batch("sealed-new", [(b"secret-n%d" % i, None, ()) for i in range(20)])
    wait_until(lambda: held_end(new, from_old) == 500, "the old release's queue on the new one")
    wait_until(lambda: held_end(old, from_new) == 500, "the new build's queue on the old one")
    wait_until(lambda: held_end(new, sealed_old) == 20, "the old release's sealed queue on the new one")
    wait_until(lambda: held_end(old, sealed_new) == 20, "the new build's sealed queue on the old one")
    wait_until(
        lambda: kv_value(new, "greeting", old_id) == b"hello from the old release", "old KV on the new one"
    )
    wait_until(lambda: kv_value(old, "greeting", new_id) == b"hello from this build", "new KV on the old one")
    assert values(new, from_old) == values(old, from_old) == [b"o%d" % i for i in range(500)]
    assert values(old, from_new) == [b"n%d" % i for i in range(500)]
    assert values(new, sealed_old) == [b"secret-o%d" % i for i in range(20)]  # the new one is a reader
    assert values(old, sealed_new) == [b"secret-n%d" % i for i in range(20)]  # and the old one
    with client(new) as c:
        assert c.kv_hget("profile", b"name", owner=old_id) == b"old"
    wait_until(lambda: kv_value(old, "visits", new_id) is not None, "the counter on the old one")
    # Live: a write after the catch-up arrives by push, both ways.
    with client(old) as c:
        c.offer("from-old", b"live-old")
    with client(new) as c:
        c.offer("from-new", b"live-new")
    wait_until(lambda: held_end(new, from_old) == 501, "a live record of the old release")
    wait_until(lambda: held_end(old, from_new) == 501, "a live record of the new build")


def test_the_previous_release_is_sent_nothing_of_a_core2_queue_and_core1_still_syncs(
    latticed_process: Factory,
) -> None:
    old, new, old_id, _new_id = linked(latticed_process)
    with client(new) as c:
        two = c.queue_create("two", core=2)
        c.offer_batch("two", [(b"t%d" % i, None, ()) for i in range(5)])
        one = c.queue_create("one", core=1)  # what a 0.2.0 peer can receive
        c.offer_batch("one", [(b"o%d" % i, None, ()) for i in range(5)])
    wait_until(lambda: held_end(old, one) == 5, "the core-1 queue on the old release")
    with client(new) as c:
        c.offer("two", b"live")  # a core-2 push neither reaches the old release nor ends the link
        c.offer("one", b"live")
    wait_until(lambda: held_end(old, one) == 6, "a live core-1 record after a core-2 one")
    assert values(old, one) == [*(b"o%d" % i for i in range(5)), b"live"]
    assert held_end(old, two) == -1  # it cannot express the queue: it never sees it
    assert peer_row(new, old_id)["withheld"] >= 1  # and the new daemon says it holds it back
    row = peer_row(new, old_id)  # the core-1 queue the link carries, pushed both ways (nothing pruned)
    assert (row["queues_eager_in"], row["queues_pruned_in"], row["queues_lazy_out"]) == (1, 0, 0)
    with client(new) as c:
        status = c.status()
        assert status["cut_off_queues"] == [] and status["replication"]["queues_cut_off"] == 0
        (blind,) = status["core2_blind_peers"]  # status names the peer that misses it
    assert blind["peer"] == old_id and blind["core2_queues"] == 1
    assert "receives none of 1 core-2 queue; upgrade it, or create queues with --core 1" in blind["message"]


def test_a_queue_the_previous_release_holds_moved_to_core2_stays_there_and_the_rest_syncs(
    latticed_process: Factory,
) -> None:
    old, new, old_id, new_id = linked(latticed_process)
    with client(new) as c:
        moved = c.queue_create("moved", core=1)  # a core-1 queue the old release receives
        c.offer_batch("moved", [(b"m%d" % i, None, ()) for i in range(5)])
        other = c.queue_create("other", core=1)
    wait_until(lambda: held_end(old, moved) == 5, "the core-1 queue on the old release")
    with client(new) as c:
        [done] = c.queue_upgrade("moved")
        assert done["converted"]
        assert c.offer("moved", b"on core 2") == 5  # the old release's end holds no write back
        c.offer("other", b"still core 1")
    wait_until(lambda: held_end(old, other) == 1, "a core-1 queue after the move")
    assert held_end(old, moved) == 5  # kept where it was: it cannot express core 2
    assert values(old, moved) == [b"m%d" % i for i in range(5)]
    assert connected(new, old_id) and connected(old, new_id)  # the link stays up
    with client(old) as c:
        from_old = c.queue_create("from-old")
        c.offer("from-old", b"o")
    wait_until(lambda: held_end(new, from_old) == 1, "the old release's writes still arrive")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peer_row(daemon: LatticedProcess, peer: str) -> dict[str, Any]:
    with client(daemon) as c:
        rows = [p for p in c.peers() if p.get("public_key") == peer]
    return rows[0] if rows else {}


def test_links_settle_on_a_version_with_the_previous_release_and_between_new_daemons(
    latticed_process: Factory,
) -> None:
    old = start(latticed_process, OLD)
    new = start(latticed_process, None, old)
    newer = start(latticed_process, None, new)
    old_id, new_id, newer_id = identity(old), identity(new), identity(newer)
    # 0.2.0 refuses the versions request (an op it does not know) and keeps the link: protocol 1.
    wait_until(lambda: peer_row(new, old_id).get("protocol") == 1, "the link to 0.2.0 to settle on 1")
    assert peer_row(new, old_id)["peer_release"] is None and peer_row(new, old_id)["withheld"] == 0
    wait_until(lambda: peer_row(new, newer_id).get("protocol") is not None, "the new link to settle")
    row = peer_row(newer, new_id)
    assert (row["protocol"], row["peer_release"]) == (max(PROTOCOL_VERSIONS), RELEASE)
    assert "lease.serve_crashed" not in old.log_text()
    assert connected(old, new_id)  # the refused request did not cost the link


def delta_counts(daemon: LatticedProcess) -> tuple[int, int]:
    """DELTAs received and their bytes (decrypted payloads), from the daemon's traffic counters."""
    with client(daemon) as c:
        counters = c.status().get("replication") or {}
    return int(counters.get("received_delta", 0)), int(counters.get("received_delta_bytes", 0))


def test_a_compact_link_and_one_to_the_previous_release_replicate_the_same_live_records(
    latticed_process: Factory,
) -> None:
    """``newer`` writes single live records; ``new`` gets them over a link that agreed on ``compact``
    and relays them to the previous release over a link that cannot: both hold the same records, and
    a 100-byte record reached ``new`` in far fewer bytes than the full encoding's ~450."""
    old = start(latticed_process, OLD)
    new = start(latticed_process, None, old)
    newer = start(latticed_process, None, new)
    new_id, newer_id = identity(new), identity(newer)
    wait_until(lambda: "compact" in (peer_row(new, newer_id).get("features") or ()), "the compact link")
    wait_until(lambda: "compact" in (peer_row(newer, new_id).get("features") or ()), "both ends agreed")
    assert not peer_row(new, identity(old)).get("features")  # 0.2.0 states none
    with client(newer) as c:
        queue = c.queue_create("live", core=1)  # core 1: it reaches the previous release
        c.offer(queue, b"first")
    wait_until(lambda: held_end(old, queue) == 1, "the queue on the previous release")
    deltas0, bytes0 = delta_counts(new)
    live = [bytes([65 + i % 26]) * 100 for i in range(30)]
    with client(newer) as c:
        for value in live:
            c.offer(queue, value)
    wait_until(lambda: held_end(old, queue) == 31, "the live records on the previous release")
    # A relay passes verified records on while its own commit of them may still be in its linger.
    wait_until(lambda: held_end(new, queue) == 31, "the live records committed on the relay")
    assert values(new, queue) == values(old, queue) == [b"first", *live]
    deltas1, bytes1 = delta_counts(new)
    assert deltas1 > deltas0
    assert (bytes1 - bytes0) / len(live) < 300, (deltas1 - deltas0, bytes1 - bytes0)


def test_a_peer_with_no_version_in_common_is_named_as_such(latticed_process: Factory) -> None:
    daemon = start(latticed_process, None)
    port = listen_port(daemon)
    future = Identity.from_seed(b"f" * 32)
    future_version = max(PROTOCOL_VERSIONS) + 1

    async def speak_a_future_protocol() -> None:
        stream = await open_peer("127.0.0.1", port, seed=future.seed, network_key=DEFAULT_NETWORK_KEY)
        await stream.send(pack([HELLO, future_version, None, b"i" * 16, {"a later": "layout"}]))
        with trio.fail_after(10):
            while await stream.receive() is not None:  # the daemon hangs up on us
                pass

    with contextlib.suppress(ConnectionClosedError):
        trio.run(speak_a_future_protocol)
    row = peer_row(daemon, future.public_key.hex())
    assert row["status"] == "incompatible", row
    assert f"the peer speaks protocol {future_version}" in row["reason"]
    assert f"this daemon speaks latticed {RELEASE}, protocol" in row["reason"]
    assert "network key" not in row["reason"]
    with client(daemon) as c:
        info = c.status()
    assert [p["peer"] for p in info["incompatible_peers"]] == [future.public_key.hex()]
    assert info["replication"]["incompatible_peers"] == 1
    assert "peer.incompatible" in daemon.log_text()
    doctor = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cli.entry import latticectl; latticectl()",
            "--socket",
            str(daemon.socket),
            "doctor",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"incompatible (no replication protocol in common: the peer speaks protocol {future_version}" in (
        doctor.stdout
    ), doctor.stdout + doctor.stderr


def test_a_newer_client_against_the_previous_release(latticed_process: Factory) -> None:
    """Commands both know work; one the older daemon does not know fails with one line naming both."""
    old = start(latticed_process, OLD)
    with client(old) as c:
        c.queue_create("q")
        assert c.offer("q", b"v") == 0
        assert [e.value for e in c.range("q", 0, 10)] == [b"v"]
        assert c.status()["queues"] == 1
        with pytest.raises(VersionGapError) as info:
            c.versions()
        assert c.identity()  # the connection is still good
    message = str(info.value)
    assert "the daemon runs latticed 0.2.0 or earlier (local API 1)" in message
    assert f"this client is latticed {RELEASE}" in message
    cli = [
        sys.executable,
        "-c",
        "from cli.entry import latticectl; latticectl()",
        "--socket",
        str(old.socket),
    ]
    listed = subprocess.run([*cli, "queue", "list"], capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and "q" in listed.stdout, listed.stderr
    new = start(latticed_process, None)
    with client(new) as c:
        assert c.versions()["release"] == RELEASE


class Stream:
    """A producer writing numbered records to one of its daemon's queues in a thread, pausable while
    that daemon restarts (a write is never half done when it stops)."""

    def __init__(self, daemon: LatticedProcess, name: str) -> None:
        self.daemon, self.name = daemon, name
        with client(daemon) as c:
            self.queue = c.queue_create(name)
        self.written = 0
        self.lock = threading.Lock()  # held by each write; the restart holds it to pause the stream
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.done.is_set():
                with self.lock, client(self.daemon) as c:
                    batch = [(b"%s-%d" % (self.name.encode(), self.written + i), None, ()) for i in range(5)]
                    c.offer_batch(self.name, batch)  # the restart lets go of the lock once its gate is open
                    self.written += len(batch)
                self.done.wait(0.01)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> list[bytes]:
        self.done.set()
        self.thread.join(30)
        assert self.error is None, self.error
        return [b"%s-%d" % (self.name.encode(), i) for i in range(self.written)]


def test_a_rolling_upgrade_under_live_streams_loses_and_duplicates_nothing(latticed_process: Factory) -> None:
    ports = [free_port() for _ in range(3)]
    daemons = []
    for i, port in enumerate(ports):
        args = ["--listen", f"127.0.0.1:{port}", "--no-mdns"]
        for other in ports[:i] + ports[i + 1 :]:
            args += ["--peer", f"127.0.0.1:{other}"]
        daemon = latticed_process(args=args, start=False)
        daemons.append(run_as(daemon, OLD).start())
    a, b, c = daemons
    ids = [identity(d) for d in daemons]
    wait_until(lambda: all(connected(d, p) for d in daemons for p in ids if p != identity(d)), "the mesh")
    streams = {"a": Stream(a, "stream-a"), "c": Stream(c, "stream-c")}
    wait_until(lambda: all(s.written >= 50 for s in streams.values()), "both streams to flow")
    for daemon, paused in ((b, None), (a, streams["a"]), (c, streams["c"])):
        with paused.lock if paused is not None else contextlib.nullcontext():
            daemon.stop()
            run_as(daemon, None).start()
            # It signs nothing until it heard what its peers hold: the stream goes on once it may.
            wait_gate_open(daemon, "the stream after the upgrade")
        me = identity(daemon)
        wait_until(
            lambda d=daemon, m=me: all(connected(d, p) for p in ids if p != m), "the upgraded one back"
        )
        # The streams go on meanwhile, and what was written so far reaches the upgraded daemon.
        for stream in streams.values():
            target = stream.written
            wait_until(
                lambda d=daemon, s=stream, t=target: held_end(d, s.queue) >= t, "catch-up after restart"
            )
    expected = {key: stream.stop() for key, stream in streams.items()}
    for stream, key in ((streams["a"], "a"), (streams["c"], "c")):
        total = len(expected[key])
        for daemon in daemons:
            wait_until(lambda d=daemon, s=stream, t=total: held_end(d, s.queue) == t, "the final records")
            assert values(daemon, stream.queue) == expected[key]  # nothing lost, nothing twice, in order
    for daemon in daemons:
        with client(daemon) as cl:
            assert cl.versions()["release"] == RELEASE  # all three run this build now


def test_remote_work_queue_consumers_across_the_releases_both_ways(latticed_process: Factory) -> None:
    old, new, old_id, new_id = linked(latticed_process)
    for owner, owner_id, worker in ((old, old_id, new), (new, new_id, old)):
        with client(owner) as c:
            c.queue_create("jobs", core=1)  # the worker on the previous release reads it
            c.offer_batch("jobs", [(b"job-%d" % i, None, ()) for i in range(5)])
            c.group_create("g", ["jobs"], max_attempts=3, retry_backoff=0, visibility=30)
        group = f"{owner_id}/g"
        wait_until(
            lambda w=worker, o=owner_id: held_end(w, f"{o}/jobs") == 5, "the jobs on the worker's side"
        )
        done = []
        with client(worker) as c:
            for _ in range(5):
                lease = c.dequeue(group)
                assert lease is not None
                c.ack(group, lease)
                done.append(lease.value)
            assert c.dequeue(group) is None
        assert sorted(done) == [b"job-%d" % i for i in range(5)]


def test_an_offer_into_the_previous_releases_queue_says_its_owner_is_too_old(
    latticed_process: Factory,
) -> None:
    old = start(latticed_process, OLD)
    new = start(latticed_process, None, old)
    old_id = identity(old)
    wait_until(lambda: connected(new, old_id), "the link between the releases")
    with client(old) as c:
        feed = c.queue_create("feed", {"producers": "*"})
    with client(new) as c, pytest.raises(LatticedError, match="does not take remote offers"):
        c.offer(feed, b"x", wait=5)
    assert held_end(old, feed) == 0


def test_queue_repair_against_the_previous_release_says_it_does_not_know_it(
    latticed_process: Factory,
) -> None:
    """A daemon of the previous release has no ``queue_repair`` (local API 1, additive): the client names
    both releases, and latticectl says so in one line (exit code 1) with nothing changed; doctor works."""
    old = start(latticed_process, OLD)
    with client(old) as c:
        c.queue_create("q")
        with pytest.raises(VersionGapError, match="does not know 'queue_repair'"):
            c.queue_repair("q")
        assert c.offer("q", b"v") == 0  # the connection is still good, the queue untouched
    cli = [
        sys.executable,
        "-c",
        "from cli.entry import latticectl; latticectl()",
        "--socket",
        str(old.socket),
    ]
    repair = subprocess.run(
        [*cli, "queue", "repair", "q"], capture_output=True, text=True, timeout=60, check=False
    )
    assert repair.returncode == 1 and "Traceback" not in repair.stderr, repair.stderr
    assert len(repair.stderr.strip().splitlines()) == 1 and "queue_repair" in repair.stderr
    doctor = subprocess.run(
        [*cli, "doctor", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert '"daemon_running": true' in doctor.stdout, doctor.stderr


def _events(daemon: LatticedProcess, event: str, peer: str) -> int:
    """How many times ``daemon`` logged ``event`` about ``peer`` (its log, every run)."""
    return sum(
        1 for line in daemon.log.read_text(errors="replace").splitlines() if event in line and peer in line
    )


@pytest.mark.parametrize("stop", ["clean", "kill9"])
def test_a_peer_back_as_the_previous_release_within_the_lost_links_memory_costs_a_link_only_if_it_died(
    latticed_process: Factory, stop: str
) -> None:
    """``link-gone``: a daemon whose link to a featureful peer died (the peer killed: no final frame)
    names that link (for 40 s) in its next dial. A peer rolled back to 0.2.0 meanwhile (its store from
    before the upgrade, same identity and address) does not know the word: that one link is dropped, then
    they sync both ways. A peer that stopped cleanly closed the link on purpose: nothing is named, and the
    rollback costs no link at all."""
    port = free_port()
    listen = ["--listen", f"127.0.0.1:{port}", "--no-mdns"]
    rolled = latticed_process(args=listen, start=False)
    run_as(rolled, OLD).start()  # its 0.2.0 store, kept for the rollback (as an upgrade keeps a copy)
    rolled_id = identity(rolled)
    rolled.stop()
    kept = latticed_process(args=listen, start=False)
    shutil.copytree(rolled.data_dir, kept.data_dir)
    run_as(rolled, None).start()  # upgraded to this build
    dialler = start(latticed_process, None, rolled)
    dialler_id = identity(dialler)
    wait_until(
        lambda: LINK_GONE_FEATURE in (peer_row(dialler, rolled_id).get("features") or ()),
        "the link between two builds with link-gone",
    )

    # Killed, the link dies on the dialler's side: it names it in its next dial, for 40 s. Stopped, the
    # peer closes it (its final frame): nothing to name.
    # The link's end is logged after its entry is gone (``peer.disconnected`` comes once the stream is
    # closed): the count is taken once that line is in, or a slow close would count as the rollback's.
    dropped_before = _events(dialler, "peer.disconnected", rolled_id) + 1
    if stop == "clean":
        rolled.stop()
    else:
        rolled.kill9()
    wait_until(
        lambda: (
            not connected(dialler, rolled_id)
            and _events(dialler, "peer.disconnected", rolled_id) >= dropped_before
        ),
        "the dialler to see the link end and log it",
    )
    lost = time.monotonic()
    run_as(kept, OLD).start()  # the same identity on 0.2.0, at the same address
    assert identity(kept) == rolled_id
    wait_until(
        lambda: connected(dialler, rolled_id) and connected(kept, dialler_id),
        "the link to the rolled-back peer",
    )
    with client(dialler) as c:
        from_new = c.queue_create("after-new", core=1)
        c.offer_batch("after-new", [(b"n%d" % i, None, ()) for i in range(5)])
    with client(kept) as c:
        from_old = c.queue_create("after-old")
        c.offer_batch("after-old", [(b"o%d" % i, None, ()) for i in range(5)])
    wait_until(lambda: held_end(kept, from_new) == 5, "this build's records on the rolled-back peer")
    wait_until(lambda: held_end(dialler, from_old) == 5, "the rolled-back peer's records on this build")
    assert values(kept, from_new) == [b"n%d" % i for i in range(5)]
    assert values(dialler, from_old) == [b"o%d" % i for i in range(5)]
    assert time.monotonic() - lost < LOST_LINK_TTL_S  # the word was still due when it redialled
    # The one link 0.2.0 drops after a kill is the first, for the word it does not know ("unknown message
    # type 9"); the next dial names nothing. After a clean stop none is dropped.
    drops = 0 if stop == "clean" else 1
    assert _events(dialler, "peer.disconnected", rolled_id) - dropped_before == drops
    assert _events(kept, "peer.protocol_error", dialler_id) == drops
    assert connected(dialler, rolled_id) and peer_row(dialler, rolled_id)["protocol"] == 1


def test_a_redial_after_a_half_open_link_is_kept_at_once_between_two_builds(
    latticed_process: Factory,
) -> None:
    """``link-gone`` between two daemons of this build: the one with the smaller key dialled the other
    (the key order keeps that link over any dial back); the other's end of it closes while the dialler's
    stays half-open. Its redial names the lost link and is kept at once, not after the dialler's end goes
    stale (``STALE_AFTER_S``, 20 s), and records written on both sides afterwards reach the other."""
    first, second = start(latticed_process, None), start(latticed_process, None)
    relay, owner = sorted((first, second), key=lambda d: bytes.fromhex(identity(d)))
    relay_id, owner_id = identity(relay), identity(owner)
    middle = HalfOpenRelay(listen_port(owner))
    try:
        with client(relay) as c:
            c.peers_add(f"127.0.0.1:{middle.port}")
        wait_until(
            lambda: (
                LINK_GONE_FEATURE in (peer_row(relay, owner_id).get("features") or ())
                and LINK_GONE_FEATURE in (peer_row(owner, relay_id).get("features") or ())
            ),
            "the relay's link to the owner, settled on link-gone",
        )
        with client(owner) as c:  # where the owner redials: the relay's own address
            c.peers_add(f"127.0.0.1:{listen_port(relay)}")

        middle.cut()  # the owner's end closes; the relay's stays open, hearing nothing
        cut_at = time.monotonic()
        wait_until(
            lambda: _events(relay, "peer.replaced_gone", owner_id) >= 1,
            "the relay to keep the owner's redial",
            timeout=STALE_AFTER_S / 2,  # before the stale rule could replace it
        )
        kept_after = time.monotonic() - cut_at
        assert kept_after < STALE_AFTER_S / 2, kept_after  # not the stale wait
        assert _events(relay, "peer.replaced_stale", owner_id) == 0
        wait_until(lambda: connected(relay, owner_id) and connected(owner, relay_id), "the new link")
        with client(owner) as c:
            from_owner = c.queue_create("after-owner", core=2)
            c.offer_batch("after-owner", [(b"o%d" % i, None, ()) for i in range(3)])
        with client(relay) as c:
            from_relay = c.queue_create("after-relay", core=2)
            c.offer_batch("after-relay", [(b"r%d" % i, None, ()) for i in range(3)])
        wait_until(lambda: held_end(relay, from_owner) == 3, "the owner's records on the relay")
        wait_until(lambda: held_end(owner, from_relay) == 3, "the relay's records on the owner")
        assert values(relay, from_owner) == [b"o%d" % i for i in range(3)]
        assert values(owner, from_relay) == [b"r%d" % i for i in range(3)]
    finally:
        middle.close()
