"""Retention with real daemon processes: an owner's policy bounds its store under writes and replicas follow
its signed truncations; a replica's own cap drops its oldest records while the suffix it keeps verifies
and is never served as the whole queue; ``keep_unsettled`` keeps what a consumer group has not settled;
the CLI sets and shows a policy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemons import LatticedProcess
from polling import wait_until

from latticed.api.client.blocking_client import Client
from latticed.host.retention_policy import RetentionPolicy

Factory = Callable[..., LatticedProcess]
LATTICECTL = str(Path(sys.executable).parent / "latticectl")
FAST = ["--retention-interval", "0.2"]
VALUE = b"r" * 200


def client(daemon: LatticedProcess) -> Client:
    return Client(daemon.socket, timeout=20)


def ctl(daemon: LatticedProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LATTICECTL, "--socket", str(daemon.socket), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


def listen_port(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        listen = c.status()["listen"]
    assert listen is not None
    return int(listen.rsplit(":", 1)[1])


def peer_args(*peers: LatticedProcess) -> list[str]:
    args = ["--listen", "127.0.0.1:0", "--no-mdns"]
    for peer in peers:
        args += ["--peer", f"127.0.0.1:{listen_port(peer)}"]
    return args


def db_bytes(daemon: LatticedProcess) -> int:
    """The store's main file (the WAL beside it keeps its preallocated working size on purpose)."""
    return (daemon.data_dir / "latticed.db").stat().st_size


def write(daemon: LatticedProcess, queue: str, batches: int, per_batch: int = 1000) -> int:
    with client(daemon) as c:
        last = 0
        for _ in range(batches):
            offsets = c.offer_batch(queue, [(VALUE, None, ())] * per_batch)
            last = offsets[-1]
    return last + 1


def info(daemon: LatticedProcess, queue: str) -> dict[str, Any]:
    with client(daemon) as c:
        return c.retention_get(queue)


def holds_end(daemon: LatticedProcess, queue: str, end: int) -> bool:
    with client(daemon) as c:
        try:
            return int(c.queue_info(queue)["end_offset"]) >= end
        except Exception:
            return False


def test_an_owner_policy_bounds_the_store_under_writes_and_replicas_follow(latticed_process: Factory) -> None:
    cap = 1_000_000
    owner = latticed_process(args=[*peer_args(), *FAST])
    replica = latticed_process(args=[*peer_args(owner), *FAST])
    with client(owner) as c:
        queue = c.queue_create("metrics", retention=RetentionPolicy(max_bytes=cap))
    sizes = []
    end = 0
    for _ in range(12):  # 12 x 500 kB = 6x the cap
        end = write(owner, "metrics", 2, per_batch=1250)
        wait_until(lambda: info(owner, "metrics")["bytes"] <= cap, "the owner to cut back to its cap")
        sizes.append(db_bytes(owner))
    held = info(owner, "metrics")
    assert held["start_offset"] > 0 and held["end_offset"] == end and held["bytes"] <= cap
    # The file stops growing: what one truncation frees is written again by the next records.
    assert max(sizes[6:]) <= max(sizes[:6]) + cap
    # Once writes stop, the free pages go back to the file system.
    wait_until(lambda: db_bytes(owner) <= 1.5 * cap + 512 * 1024, "the store file to shrink to its data")
    # The replica follows the signed truncations, and both copies verify against the owner's key.
    wait_until(
        lambda: (
            holds_end(replica, queue, end) and info(replica, queue)["start_offset"] == held["start_offset"]
        ),
        "the replica to follow",
    )
    for daemon in (owner, replica):
        with client(daemon) as c:
            verified = c.queue_verify(queue)
        assert verified["records"] == end - held["start_offset"]
    policy = info(replica, queue)["policy"]
    assert policy["max_bytes"] == cap  # every replica sees the policy: it is in the signed metadata
    # Expired KV keys are purged on the same schedule, from the owner's view and the replica's.
    with client(owner) as c:
        me = c.identity()
        c.kv_put("session", b"short-lived", ttl=0.3)
        c.kv_put("config", b"kept")
    wait_until(lambda: _kv(replica, me, "config") == b"kept", "the KV namespace to replicate")
    for daemon in (owner, replica):
        wait_until(lambda d=daemon: _purged(d) >= 1, "the expired key to be purged")
        assert _kv(daemon, me, "session") is None and _kv(daemon, me, "config") == b"kept"


def _kv(daemon: LatticedProcess, owner: str, key: str) -> Any:
    with client(daemon) as c:
        return c.kv_get(key, owner=owner)


def _purged(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        return int(c.status()["retention"]["kv_keys_purged"])


def test_a_replica_cap_drops_locally_and_never_serves_its_suffix_as_whole(latticed_process: Factory) -> None:
    cap = 300_000
    owner = latticed_process(args=peer_args())
    capped = latticed_process(args=[*peer_args(owner), *FAST, "--replica-max-bytes", "300kB"])
    with client(owner) as c:
        queue = c.queue_create("logs", core=1)  # a replica cap is core 1's: core 2 keeps what heads hold
    end = write(owner, "logs", 3)  # 3000 records, ~700 kB stored
    wait_until(lambda: holds_end(capped, queue, end), "the capped replica to catch up")
    wait_until(
        lambda: info(capped, queue)["floor"] > 0 and info(capped, queue)["bytes"] <= cap,
        "the capped replica to drop its oldest records",
    )
    kept = info(capped, queue)
    assert kept["bytes"] <= cap and kept["start_offset"] == kept["floor"] and kept["owner_start"] == 0
    assert kept["replica_max_bytes"] == cap and kept["end_offset"] == end
    with client(capped) as c:
        assert c.queue_verify(queue)["records"] == end - kept["floor"]  # the kept suffix verifies
        assert c.range(queue, 0, 9) == []  # dropped here...
        assert c.queue_info(queue)["known_end"] == end
    with client(owner) as c:
        assert c.queue_info(queue)["start_offset"] == 0  # ...and only here
    # New records keep arriving on top of the kept suffix, and the cap holds.
    end = write(owner, "logs", 2)
    wait_until(lambda: holds_end(capped, queue, end), "new records on the capped replica")
    wait_until(lambda: info(capped, queue)["bytes"] <= cap, "the cap to hold")
    # A newcomer that can only reach the capped replica learns the queue's head, not a gap passed off
    # as the whole queue: it holds nothing and knows how far behind it is.
    newcomer = latticed_process(args=peer_args(capped))
    wait_until(lambda: _known_end(newcomer, queue) == end, "the newcomer to hear of the queue")
    with client(newcomer) as c:
        seen = c.queue_info(queue)
        assert seen["end_offset"] == seen["start_offset"] == 0
        assert c.status()["replication_lag"] == {queue: end}
    # Once it reaches a daemon that holds the queue whole, it gets everything.
    newcomer.stop()
    newcomer.args = peer_args(owner)
    newcomer.start()
    wait_until(lambda: holds_end(newcomer, queue, end), "the newcomer to catch up from the owner")
    with client(newcomer) as c:
        assert c.queue_info(queue)["start_offset"] == 0
        assert c.queue_verify(queue)["records"] == end


def _known_end(daemon: LatticedProcess, queue: str) -> int:
    with client(daemon) as c:
        try:
            return int(c.queue_info(queue)["known_end"])
        except Exception:
            return -1


def test_keep_unsettled_keeps_what_a_group_has_not_settled(latticed_process: Factory) -> None:
    owner = latticed_process(args=FAST)
    with client(owner) as c:
        c.queue_create("jobs", retention=RetentionPolicy(max_records=20, keep_unsettled=True))
        c.group_create("workers", ["jobs"])
        c.offer_batch("jobs", [(b"job%d" % i, None, ()) for i in range(100)])
        for _ in range(30):
            lease = c.dequeue("workers")
            assert lease is not None
            c.ack("workers", lease)
        leased = c.dequeue("workers")  # offset 30: leased, not settled
        assert leased is not None and leased.offset == 30
    wait_until(lambda: info(owner, "jobs")["start_offset"] == 30, "retention to cut up to the ack floor")
    with client(owner) as c:
        assert [e.value for e in c.range("jobs", 0, 99)] == [b"job%d" % i for i in range(30, 100)]
        for _ in range(50):
            c.offer("jobs", b"more")  # past the limit again: still held at the floor
        assert c.retention_get("jobs")["start_offset"] == 30
        c.ack("workers", leased)
        c.ack_up_to("workers", "jobs", 150)
    # Everything settled: the limit applies again.
    wait_until(lambda: info(owner, "jobs")["records"] <= 20, "the limit to apply once the group settled")
    with client(owner) as c:
        assert c.queue_verify("jobs")["records"] <= 20


def test_the_cli_sets_and_shows_a_policy(latticed_process: Factory) -> None:
    owner = latticed_process(args=FAST)
    made = ctl(owner, "queue", "create", "audit", "--max-age", "7d", "--max-records", "1000")
    assert made.returncode == 0, made.stderr
    shown = ctl(owner, "queue", "retention", "show", "audit")
    assert "max age:" in shown.stdout and "7d" in shown.stdout and "1000" in shown.stdout
    changed = ctl(owner, "queue", "retention", "set", "audit", "--max-bytes", "50MB", "--max-age", "none")
    assert changed.returncode == 0 and "max bytes 47.68 MiB" in changed.stderr
    assert "max age none" in changed.stderr
    listed = ctl(owner, "--json", "meta", "list", "audit")
    assert '"retention.max_bytes": "50000000"' in listed.stdout and "max_age" not in listed.stdout
    bad = ctl(owner, "queue", "retention", "set", "audit", "--max-bytes", "lots")
    assert bad.returncode == 2 and "--max-bytes" in bad.stderr
    typo = ctl(owner, "meta", "set", "audit", "retention.max_byte", "5")
    assert typo.returncode == 2 and "unknown retention key" in typo.stderr
    verified = ctl(owner, "queue", "verify", "audit")
    assert verified.returncode == 0 and "verified 0 records" in verified.stdout
