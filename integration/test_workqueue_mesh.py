"""Work queues across the mesh, with real daemon and worker processes on loopback: workers on daemon B
consume a group daemon A owns (A alone grants leases), through A restarting, B's link dropping with
leases out, and A's allow-list."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from daemons import LatticedProcess
from polling import wait_until

from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client
from latticed.errors import LatticedError, NotAllowedError

LATTICECTL = str(Path(sys.executable).parent / "latticectl")

Factory = Callable[..., LatticedProcess]


def client(daemon: LatticedProcess, timeout: float = 30) -> Client:
    return Client(daemon.socket, timeout=timeout)


def ctl(daemon: LatticedProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LATTICECTL, "--socket", str(daemon.socket), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def linked(daemon: LatticedProcess, peer: str) -> bool:
    with client(daemon) as c:
        return any(p.get("public_key") == peer and p.get("status") == "connected" for p in c.peers())


def mesh(
    latticed_process: Factory, b_args: tuple[str, ...] = ()
) -> tuple[LatticedProcess, LatticedProcess, str, str]:
    """A (the owner, on a fixed port so it can restart where B looks for it) and B (the workers' daemon,
    dialling A)."""
    port = free_port()
    a = latticed_process(args=["--listen", f"127.0.0.1:{port}", "--no-mdns"])
    b = latticed_process(
        args=["--listen", "127.0.0.1:0", "--no-mdns", "--peer", f"127.0.0.1:{port}", *b_args]
    )
    with client(a) as c:
        a_id = c.identity()
    with client(b) as c:
        b_id = c.identity()
    wait_until(lambda: linked(b, a_id), "B to connect to A")
    return a, b, a_id, b_id


def replicated(daemon: LatticedProcess, queue: str, end: int) -> Callable[[], bool]:
    def check() -> bool:
        with client(daemon) as c:
            try:
                return int(c.queue_info(queue)["end_offset"]) >= end
            except LatticedError:
                return False

    return check


def group_replicated(daemon: LatticedProcess, group: str) -> Callable[[], bool]:
    """``daemon`` holds its copy of ``group`` (so it knows the group's sources, and tells the owner how
    far it holds them: the owner then sends no payload it already has)."""

    def check() -> bool:
        with client(daemon) as c:
            return any(entry["group"] == group for entry in c.group_list())

    return check


# ------------------------------------------------------------------ the same calls, remotely


def test_workers_on_another_daemon_consume_a_group_with_the_same_calls(
    latticed_process: Factory, tmp_path: Path
) -> None:
    # B replicates jobs and the group's log and DLQ, not the queue "unshared"
    a, b, a_id, b_id = mesh(latticed_process, ("--replicate", "*/jobs", "--replicate", "*/g*"))
    group = f"{a_id}/g"
    with client(a) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"job-%d" % i, None, ()) for i in range(10)])
        c.group_create("g", ["jobs"], max_attempts=3, retry_backoff=0, visibility=30)
        c.queue_create("unshared")
        c.offer("unshared", b"from the owner", key=b"k", headers={"h": b"v"})
        c.group_create("u", ["unshared"])
    wait_until(replicated(b, f"{a_id}/jobs", 10), "the source to replicate to B")
    wait_until(group_replicated(b, group), "the group to replicate to B")
    with client(b) as c:
        # dequeue + ack: the owner leases, B reads the payload from its own replica
        reply = c.call("dequeue", group=group)
        raw = reply["lease"]
        assert (raw["offset"], raw["value"], raw["group"]) == (0, b"job-0", group)
        assert raw["payload_from"] == "replica"
        assert raw["consumer"].startswith(b_id[:16] + "/")  # how A knows the remote consumer
        assert c.ack(group, raw["lease"]) == raw["correlation_id"]
        # nack with a reason, extend, ack_up_to
        lease = c.dequeue(group)
        assert lease is not None and lease.offset == 1
        assert c.extend(group, lease, 60) > time.time() + 50
        assert c.nack(group, lease, 0, reason="boom")["attempts"] == 1
        with pytest.raises(NotAllowedError, match="not leased to a worker of the calling daemon"):
            c.ack_up_to(group, f"{a_id}/jobs", 2)  # offset 1 is available again, not this daemon's lease
        lease = c.dequeue(group)
        assert lease is not None and (lease.offset, lease.attempt) == (1, 2)
        assert c.ack_up_to(group, f"{a_id}/jobs", 2) == 1  # over its own lease: allowed
        # subscribe, acks pipelined
        with c.subscribe(group, max_in_flight=3) as sub:
            seen = []
            for lease in sub:
                seen.append(lease.offset)
                sub.ack(lease, wait=False)
                if len(seen) == 5:
                    break
            sub.flush()
        assert seen == [2, 3, 4, 5, 6]
        assert sub.released is not None and sub.released <= 3  # what the window held: given back
        # a record this daemon does not hold: the owner sends it
        raw = c.call("dequeue", group=f"{a_id}/u")["lease"]
        assert (raw["payload_from"], raw["value"], raw["key"]) == ("owner", b"from the owner", b"k")
        assert raw["headers"] == [["h", b"v"]]
        c.ack(f"{a_id}/u", raw["lease"])
    with client(a) as c:
        stats = c.group_stats("g")
        assert (stats["done"], stats["leased"], stats["available"]) == (7, 0, 3)
        nacked, settled = c.group_inspect("g", "jobs", 1)["history"]  # then leased, settled by ack_up_to
        assert (nacked["outcome"], nacked["error"], settled["outcome"]) == ("nack", "boom", "acked")
        assert nacked["consumer"].startswith(b_id[:16] + "/")
    # ``latticectl work`` on B runs a command per record
    out = tmp_path / "out"
    task_sh = f'echo "$LATTICE_OFFSET $(cat)" >> {out}'
    result = ctl(b, "work", group, "--idle", "1", "--json", "--", "sh", "-c", task_sh)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"processed": 3, "acked": 3, "nacked": 0, "lost": 0}
    assert sorted(out.read_text().split("\n")[:-1]) == ["7 job-7", "8 job-8", "9 job-9"]
    # group stats on B show the owner's live counts
    stats = json.loads(ctl(b, "group", "stats", group, "--json").stdout)
    assert stats["live"] is True and (stats["done"], stats["available"]) == (10, 0)


# ------------------------------------------------------------------ the owner restarts mid-run

WORKER = r"""
import sys, time
from pathlib import Path
from latticed.api.client.blocking_client import Client
from latticed.errors import LatticedError, LeaseError, OwnerUnreachableError
sock, group, log, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
def note(*parts):
    with log.open("a") as f:
        f.write(" ".join(str(p) for p in (*parts, time.time())) + "\n")
with Client(sock, timeout=60) as c:
    while not stop.exists():
        try:
            lease = c.dequeue(group, wait=1)
        except LatticedError as exc:
            note("dequeue_failed", type(exc).__name__)
            time.sleep(0.1)
            continue
        if lease is None:
            continue
        note("start", lease.offset, lease.lease, lease.attempt)
        time.sleep(0.02)
        try:
            c.ack(group, lease)
            note("acked", lease.offset, lease.lease)
        except LeaseError:
            note("stale", lease.offset, lease.lease)
        except OwnerUnreachableError:
            note("unreachable", lease.offset, lease.lease)
"""


def test_owner_restart_mid_run_loses_nothing_and_repeats_only_redeliveries(
    latticed_process: Factory, tmp_path: Path
) -> None:
    a, b, a_id, _ = mesh(latticed_process)
    total = 120
    group = f"{a_id}/g"
    with client(a) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"%d" % i, None, ()) for i in range(total)])
        c.group_create("g", ["jobs"], visibility=5, retry_backoff=0)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    stop = tmp_path / "stop"
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    env = {**os.environ}
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), str(b.socket), group, str(log), str(stop)],
            env=env,
            start_new_session=True,
        )
        for log in logs
    ]

    def lines() -> list[list[str]]:
        """Every worker's log, in time order (each line ends with when it was written)."""
        found = [line.split() for log in logs if log.exists() for line in log.read_text().splitlines()]
        return sorted(found, key=lambda parts: float(parts[-1]))

    try:
        wait_until(lambda: sum(p[0] == "acked" for p in lines()) >= total // 4, "a quarter to be done")
        assert _done(a) < total
        a.kill9()  # mid-run: leases out, acks on their way
        a.start()
        wait_until(lambda: _done(a) == total, "every record to be done at the owner", timeout=60)
    finally:
        stop.touch()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
    events = lines()
    text = "\n".join(" ".join(p) for p in events)
    outcome = {p[2]: p[0] for p in events if p[0] in ("acked", "stale", "unreachable")}
    by_offset: dict[int, list[str]] = defaultdict(list)
    for parts in events:
        if parts[0] == "start":
            by_offset[int(parts[1])].append(parts[2])
    assert set(by_offset) == set(range(total)), f"a record was never processed:\n{text}"
    duplicates = {o: tokens for o, tokens in by_offset.items() if len(tokens) > 1}
    for offset, tokens in duplicates.items():
        # each earlier delivery's lease ended without its ack counting (lost in the restart): only then
        # does the owner hand the record out again
        assert all(outcome.get(t) != "acked" for t in tokens[:-1]), f"offset {offset} done twice:\n{text}"
    assert len(duplicates) <= sum(v != "acked" for v in outcome.values()), text
    with client(a) as c:
        stats = c.group_stats("g")
    assert stats["ack_floor"][f"{a_id}/jobs"] == total and stats["leased"] == 0


def _done(daemon: LatticedProcess) -> int:
    try:
        with client(daemon, timeout=5) as c:
            return int(next(iter(c.group_stats("g")["ack_floor"].values())))
    except LatticedError:
        return -1


# ------------------------------------------------------------------ faults


def test_a_dropped_link_with_leases_out_and_an_unreachable_owner(latticed_process: Factory) -> None:
    a, b, a_id, _ = mesh(latticed_process)
    group = f"{a_id}/g"
    with client(a) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"%d" % i, None, ()) for i in range(4)])
        c.group_create("g", ["jobs"], visibility=3, retry_backoff=0)
    with client(b) as c:
        kept, expiring = c.dequeue(group), c.dequeue(group)
        assert kept is not None and expiring is not None
        assert c.extend(group, kept, 60)
    assert ctl(b, "peers", "block", a_id).returncode == 0  # the link drops, and stays down
    wait_until(lambda: not linked(b, a_id), "the link to drop")
    stats = json.loads(ctl(b, "group", "stats", group, "--json").stdout)
    assert stats["live"] is False and "not connected" in stats["stale"]
    t0 = time.monotonic()
    unreachable = ctl(b, "dequeue", group, "--wait", "1")
    assert unreachable.returncode == ExitCode.OWNER_UNREACHABLE == 14, unreachable.stderr
    assert unreachable.stderr.startswith("latticectl: error: ") and unreachable.stderr.count("\n") == 1
    assert ctl(b, "ack", group, kept.lease).returncode == ExitCode.OWNER_UNREACHABLE
    # meanwhile the owner expires the lease of the worker it cannot hear from, as usual
    with client(a) as c:
        wait_until(lambda: c.group_stats("g")["leased"] == 1, "the owner to expire one lease")
    assert ctl(b, "peers", "unblock", a_id).returncode == 0
    wait_until(lambda: linked(b, a_id), "B to reconnect")
    assert time.monotonic() - t0 >= 1.0
    assert ctl(b, "ack", group, kept.lease).returncode == 0  # the owner still held it
    stale = ctl(b, "ack", group, expiring.lease)
    assert stale.returncode == ExitCode.LEASE == 9, stale.stderr
    with client(a) as c:
        stats = c.group_stats("g")
        assert (stats["done"], stats["leased"], stats["available"]) == (1, 0, 3)
        assert c.group_inspect("g", "jobs", expiring.offset)["history"][0]["outcome"] == "expired"


def test_the_owner_expires_the_leases_of_a_vanished_remote_worker(latticed_process: Factory) -> None:
    a, b, a_id, _ = mesh(latticed_process)
    with client(a) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"%d" % i, None, ()) for i in range(3)])
        c.group_create("g", ["jobs"], visibility=2, retry_backoff=0)
    with client(b) as c:
        sub = c.subscribe(f"{a_id}/g", max_in_flight=2)
        assert next(sub).offset == 0
        with client(a) as owner:
            assert owner.group_stats("g")["leased"] == 2
        b.kill9()  # the worker's daemon and its subscription vanish with two leases out
    with client(a) as c:
        wait_until(lambda: c.group_stats("g")["available"] == 3, "the owner to expire both leases")
        history = c.group_inspect("g", "jobs", 0)["history"]
        assert [h["outcome"] for h in history] == ["expired"]


def test_the_allow_list_is_checked_against_the_authenticated_identity(latticed_process: Factory) -> None:
    a, b, a_id, b_id = mesh(latticed_process)
    stranger = "ab" * 32
    with client(a) as c:
        c.queue_create("jobs")
        c.offer("jobs", b"x")
        c.group_create("open", ["jobs"])
        c.group_create("mine", ["jobs"], remote_consumers=[])
        c.group_create("theirs", ["jobs"], remote_consumers=[stranger])
        c.group_create("ours", ["jobs"], remote_consumers=[b_id])
        listed = {g["group"]: g["remote_consumers"] for g in c.group_list()}
        assert listed == {"open": "any", "mine": [], "theirs": [stranger], "ours": [b_id]}
    for name in ("mine", "theirs"):
        refused = ctl(b, "dequeue", f"{a_id}/{name}")
        assert refused.returncode == ExitCode.NOT_OWNER, refused.stderr
        assert "allow-list" in refused.stderr and b_id in refused.stderr
    for name in ("open", "ours"):
        got = ctl(b, "dequeue", f"{a_id}/{name}", "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["value"] == "x"
    with client(a) as c:
        assert c.group_stats("mine")["leased"] == 0
