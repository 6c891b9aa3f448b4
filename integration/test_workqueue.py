"""Work queues with real daemon and worker processes: at-least-once under killed workers and a killed
daemon, group progress replicating to a second daemon, and the CLI as scripts use it (``work``,
``dequeue --env`` evaluated by sh, exit codes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemons import LatticedProcess
from polling import wait_until

from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client
from latticed.errors import LeaseError

WAIT_S = 30.0
LATTICECTL = str(Path(sys.executable).parent / "latticectl")

Factory = Callable[..., LatticedProcess]


def client(daemon: LatticedProcess) -> Client:
    return Client(daemon.socket, timeout=10)


def ctl(daemon: LatticedProcess, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LATTICECTL, "--socket", str(daemon.socket), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def kill_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


# ------------------------------------------------------------------ at-least-once


def test_killed_workers_leases_expire_and_records_are_redelivered(
    latticed_process: Factory, tmp_path: Path
) -> None:
    """Workers (``latticectl work``) run a task per record; one is killed -9 mid-task. Its leases stop
    being renewed, expire, and the records are done by the others: none lost, none done twice."""
    daemon = latticed_process()
    total = 24
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"job-%d" % i, None, ()) for i in range(total)])
        c.group_create("work", ["jobs"], visibility=3, retry_backoff=0)
    log, victim = tmp_path / "log", tmp_path / "victim"
    task = (
        f'echo "start $LATTICE_OFFSET $LATTICE_ATTEMPT" >> {log}; '
        f'if [ "$LATTICE_OFFSET" = 7 ] && [ "$LATTICE_ATTEMPT" = 1 ]; then '
        f"echo $PPID > {victim}; sleep 60; fi; "
        f'echo "done $LATTICE_OFFSET $LATTICE_ATTEMPT $(cat)" >> {log}'
    )
    argv = [LATTICECTL, "--socket", str(daemon.socket), "work", "work", "-c", "2", "--idle", "4"]
    workers = [
        subprocess.Popen([*argv, "--", "sh", "-c", task], start_new_session=True, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    try:
        # The shell creates the file before it writes the pid into it: wait for the whole line.
        wait_until(
            lambda: victim.exists() and victim.read_text().endswith("\n"), "a worker to start the long task"
        )
        pid = int(victim.read_text())
        [killed] = [w for w in workers if w.pid == pid]
        kill_group(killed)  # the worker and its task, mid-task
        for worker in workers:
            if worker is not killed:
                code = worker.wait(60)
                assert worker.stderr is not None
                assert code == 0, f"worker exited {code}: {worker.stderr.read().decode(errors='replace')}"
    finally:
        for worker in workers:
            kill_group(worker)
    text = log.read_text()
    lines = [line.split() for line in text.splitlines()]
    done = Counter(int(parts[1]) for parts in lines if parts[0] == "done")
    started: dict[int, list[int]] = {}
    for parts in lines:
        if parts[0] == "start":
            started.setdefault(int(parts[1]), []).append(int(parts[2]))
    assert set(done) == set(range(total)), f"no record lost; the task log:\n{text}"
    # Done twice only if it was delivered again, i.e. a lease ended without an ack in between (a worker
    # stalled past its visibility on a very slow machine); normally every record is done exactly once.
    assert all(n == 1 or len(started[offset]) > 1 for offset, n in done.items()), text
    # The killed task's record came back after its lease expired.
    assert done[7] == 1 and started[7] == [1, 2], text
    # Each attempt number at most once (log lines of concurrent attempts may land in either order). One
    # may be missing from the log: the killed worker may have leased a second record and died before that
    # task wrote its "start"; the record then comes back as attempt 2.
    assert all(len(set(attempts)) == len(attempts) for attempts in started.values()), text
    assert all(max(attempts) <= len(attempts) + 1 for attempts in started.values()), text
    with client(daemon) as c:
        stats = c.group_stats("work")
    assert (stats["done"], stats["available"], stats["leased"], stats["dead"]) == (total, 0, 0, 0)
    assert next(iter(stats["ack_floor"].values())) == total


def test_kill9_of_the_daemon_keeps_acks_and_redelivers_the_rest(latticed_process: Factory) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"%d" % i, None, ()) for i in range(20)])
        c.group_create("work", ["jobs"], visibility=300)
        leases = [c.dequeue("work") for _ in range(10)]
        acked = set()
        for lease in leases[::2]:
            assert lease is not None
            c.ack("work", lease)  # durable before it returns
            acked.add(lease.offset)
    daemon.kill9()  # five leases outstanding, ten records never leased
    daemon.start()
    with client(daemon) as c:
        with pytest.raises(LeaseError, match="unknown lease"):
            c.ack("work", leases[1])  # type: ignore[arg-type]
        redelivered = {}
        while (lease := c.dequeue("work")) is not None:
            redelivered[lease.offset] = lease.attempt
            c.ack("work", lease)
        stats = c.group_stats("work")
    assert set(redelivered) == set(range(20)) - acked
    assert set(redelivered.values()) == {1}  # a daemon crash is not held against a record
    assert next(iter(stats["ack_floor"].values())) == 20


# ------------------------------------------------------------------ replication


def listen_port(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        listen = c.status()["listen"]
    return int(listen.rsplit(":", 1)[1])


def test_group_progress_and_dead_letters_replicate(latticed_process: Factory) -> None:
    a = latticed_process(args=["--listen", "127.0.0.1:0", "--no-mdns"])
    b = latticed_process(
        args=["--listen", "127.0.0.1:0", "--no-mdns", "--peer", f"127.0.0.1:{listen_port(a)}"]
    )
    with client(a) as c:
        owner = c.identity()
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"%d" % i, None, ()) for i in range(10)])
        c.group_create("work", ["jobs"], max_attempts=1, retry_backoff=0)
        for _ in range(6):
            c.ack("work", c.dequeue("work"))  # type: ignore[arg-type]
        poison = c.dequeue("work")
        assert poison is not None and c.nack("work", poison)["dead_lettered"]
        expected = c.group_stats("work")["ack_floor"]
    source = f"{owner}/jobs"
    assert expected[source] == 7  # the dead letter settles its offset too

    def replica_floor() -> int:
        with client(b) as c:
            try:
                return int(c.group_stats(f"{owner}/work")["ack_floor"][source])
            except Exception:
                return -1

    wait_until(lambda: replica_floor() == 7, "the replica to see the ack floor")
    with client(b) as c:
        wait_until(lambda: c.queue_info(f"{owner}/work.dlq")["end_offset"] == 1, "the DLQ to replicate")
        stats = c.group_stats(f"{owner}/work")  # the owner is connected: its live counts
        assert stats["running"] is False and stats["live"] is True
        assert stats["dead"] == 1 and stats["ack_floor"] == expected and stats["available"] == 3
        [dead] = c.range(f"{owner}/work.dlq", 0, 0)
        assert (
            dead.value == poison.value
            and dict(dead.headers)["correlation-id"] == poison.correlation_id.encode()
        )
        assert any(g["group"] == f"{owner}/work" and not g["running"] for g in c.group_list())
        # b runs a group of its own over a's (replicated) queue; a blocked dequeue wakes on arrivals
        wait_until(lambda: c.queue_info(source)["end_offset"] == 10, "the source to replicate")
        c.group_create("mirror", [source])
        assert len([c.ack("mirror", lease) for lease in iter(lambda: c.dequeue("mirror"), None)]) == 10
        with client(a) as producer:
            producer.offer("jobs", b"late")
        late = c.dequeue("mirror", wait=WAIT_S)
        assert late is not None and (late.offset, late.value) == (10, b"late")


# ------------------------------------------------------------------ the CLI in scripts


def test_work_runs_a_command_per_record_acks_and_nacks(latticed_process: Factory, tmp_path: Path) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        c.queue_create("mail")
        c.offer_batch("mail", [(b"hello", None, ()), (b"fail", None, ()), (b"world", b"k", ())])
        c.group_create("senders", ["mail"], max_attempts=2, retry_backoff=0)
    out = tmp_path / "out"
    task = f'v=$(cat); echo "$v $LATTICE_ATTEMPT $LATTICE_GROUP" >> {out}; [ "$v" != fail ]'
    result = ctl(daemon, "work", "senders", "--idle", "1", "--json", "--", "sh", "-c", task)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"processed": 4, "acked": 2, "nacked": 2, "lost": 0}
    assert sorted(out.read_text().splitlines()) == [
        "fail 1 senders",
        "fail 2 senders",
        "hello 1 senders",
        "world 1 senders",
    ]
    [dead] = json.loads(ctl(daemon, "dlq", "list", "senders", "--json").stdout)
    assert (dead["value"], dead["attempts"], dead["offset"]) == ("fail", 2, 1)
    stats = json.loads(ctl(daemon, "group", "stats", "senders", "--json").stdout)
    assert (stats["available"], stats["leased"], stats["done"], stats["dead"]) == (0, 0, 2, 1)
    assert ctl(daemon, "dlq", "redrive", "senders", "--all").stdout.strip() == "1"
    assert ctl(daemon, "dlq", "purge", "senders", "--all").stdout.strip() == "0"  # redriven: not parked


def test_dequeue_env_output_evaluates_in_sh(latticed_process: Factory) -> None:
    daemon = latticed_process()
    payload = b'it\'s $HOME and "quotes"\nline two'
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer("jobs", payload, headers={"correlation-id": b"corr 1; rm -rf /"})
        c.group_create("g", ["jobs"])
    script = (
        f"lease=$({LATTICECTL} dequeue g --env) || exit 9\n"
        'eval "$lease"\n'
        'cat "$LATTICE_PAYLOAD"; echo\n'
        'echo "$LATTICE_GROUP|$LATTICE_OFFSET|$LATTICE_ATTEMPT|$LATTICE_CORRELATION_ID"\n'
        f'{LATTICECTL} ack "$LATTICE_GROUP" "$LATTICE_LEASE"\n'
        'test ! -e "$LATTICE_PAYLOAD" || exit 7\n'  # ack removed it
    )
    env = {**os.environ, "LATTICED_SOCKET": str(daemon.socket)}
    result = subprocess.run(["sh", "-c", script], check=False, capture_output=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().split("\n")
    assert "\n".join(lines[:2]).encode() == payload
    assert lines[2] == "g|0|1|corr 1; rm -rf /"
    assert lines[3] == "corr 1; rm -rf /"  # ack echoes the correlation id
    with client(daemon) as c:
        assert c.group_stats("g")["done"] == 1


def test_stale_lease_empty_wait_and_json(latticed_process: Factory) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer("jobs", b"one")
        c.group_create("g", ["jobs"])
    got = ctl(daemon, "dequeue", "g", "--json")
    lease = json.loads(got.stdout)
    assert {"offset", "lease", "attempt", "value", "correlation_id"} <= set(lease)
    assert (lease["offset"], lease["attempt"], lease["value"]) == (0, 1, "one")
    assert ctl(daemon, "ack", "g", lease["lease"]).returncode == 0
    stale = ctl(daemon, "ack", "g", lease["lease"])
    assert stale.returncode == ExitCode.LEASE == 9 and stale.stdout == ""
    assert stale.stderr.count("\n") == 1 and stale.stderr.startswith("latticectl: error: stale lease")
    t0 = time.monotonic()
    empty = ctl(daemon, "dequeue", "g", "--wait", "0.3")
    assert empty.returncode == ExitCode.EMPTY == 10 and time.monotonic() - t0 >= 0.3
    assert empty.stderr == "latticectl: error: no record available in group g within 0.3s\n"
    assert ctl(daemon, "nack", "g", "nope.1").returncode == ExitCode.LEASE


# ------------------------------------------------------------------ durable attempt history


def test_attempt_history_survives_a_restart_for_pending_done_and_dead_records(
    latticed_process: Factory,
) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"%d" % i, None, ()) for i in range(3)])
        c.group_create("g", ["jobs"], max_attempts=2, retry_backoff=0, retention=3600)
        done = c.dequeue("g")
        assert done is not None and done.offset == 0
        c.nack("g", done, 0, reason="flaky: exit 75")
        done = c.dequeue("g")
        assert done is not None and done.offset == 0
        c.ack("g", done)
        pending = c.dequeue("g")
        assert pending is not None and pending.offset == 1
        c.nack("g", pending, 3600, reason="bad input")  # retried in an hour
        for _ in range(2):  # offset 2 fails twice: dead-lettered
            lease = c.dequeue("g")
            assert lease is not None and lease.offset == 2
            c.nack("g", lease, 0, reason="poison")
    daemon.stop()  # a clean stop; leases were local, the history is in the group log
    daemon.start()
    with client(daemon) as c:

        def history(offset: int) -> tuple[str, list[tuple[int, str, str]]]:
            task = c.group_inspect("g", "jobs", offset)
            return task["state"], [(h["attempt"], h["outcome"], h["error"]) for h in task["history"]]

        assert history(0) == ("done", [(1, "nack", "flaky: exit 75"), (2, "acked", "")])
        assert history(1) == ("available", [(1, "nack", "bad input")])  # retry timers were local
        assert history(2) == ("dead", [(1, "nack", "poison"), (2, "nack", "poison")])
        assert c.group_inspect("g", "jobs", 0)["correlation_id"] == done.correlation_id
    shown = ctl(daemon, "group", "inspect", "g", "jobs", "0")
    assert (
        shown.returncode == 0
        and "attempt 1: nack by pid" in shown.stdout
        and "flaky: exit 75" in shown.stdout
    )


# ------------------------------------------------------------------ claim, edit, delete


def test_claim_hands_idle_leases_to_the_caller(latticed_process: Factory) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"a", None, ()), (b"b", None, ())])
        c.group_create("g", ["jobs"], visibility=300)
        stuck = c.dequeue("g")  # a worker that went quiet
        assert stuck is not None
    assert ctl(daemon, "claim", "g", "--min-idle", "60").returncode == ExitCode.EMPTY  # not idle that long
    time.sleep(0.3)  # idleness is measured in time: let some pass
    got = ctl(daemon, "claim", "g", "--min-idle", "0.2", "--count", "5", "--json")
    assert got.returncode == 0, got.stderr
    [claimed] = json.loads(got.stdout)
    assert (claimed["offset"], claimed["attempt"], claimed["value"]) == (0, 2, "a")
    assert ctl(daemon, "ack", "g", stuck.lease).returncode == ExitCode.LEASE  # the quiet worker lost it
    assert ctl(daemon, "ack", "g", claimed["lease"]).returncode == 0
    with client(daemon) as c:
        history = c.group_inspect("g", "jobs", 0)["history"]
    assert [h["outcome"] for h in history] == ["claimed", "acked"]


def test_edit_and_delete_and_what_they_do_to_leases_in_flight(latticed_process: Factory) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"%d" % i, None, ()) for i in range(4)])
        c.group_create("g", ["jobs"], visibility=300, max_attempts=5)
        old = c.dequeue("g")
        assert old is not None
    edited = ctl(daemon, "group", "edit", "g", "--visibility", "7", "--max-attempts", "2", "--json")
    assert edited.returncode == 0, edited.stderr
    assert (json.loads(edited.stdout)["visibility_s"], json.loads(edited.stdout)["max_attempts"]) == (7, 2)
    with client(daemon) as c:
        assert c.group_inspect("g", "jobs", old.offset)["expires_at"] == old.expires_at  # unchanged
        new = c.dequeue("g")
        assert new is not None and new.expires_at - time.time() < 8  # the new visibility
        assert c.group_list()[0]["visibility_s"] == 7  # in the signed definition too
        assert c.dequeue("g") is not None and c.dequeue("g") is not None  # all four leased now
    assert ctl(daemon, "group", "edit", "g").returncode == ExitCode.USAGE  # nothing to change
    assert ctl(daemon, "group", "edit", "g", "--filter", "key=(").returncode == ExitCode.USAGE
    # a consumer blocked on the group when it is deleted is told so
    with client(daemon) as c:
        before = c.group_stats("g")["consumers"]  # the one holding the leases (its connection closed)
    waiter = subprocess.Popen(
        [LATTICECTL, "--socket", str(daemon.socket), "dequeue", "g", "--wait", "30"],
        stderr=subprocess.PIPE,
        text=True,
    )
    with client(daemon) as c:
        wait_until(lambda: c.group_stats("g")["consumers"] > before, "the waiter to block")
    deleted = ctl(daemon, "group", "delete", "g")
    assert deleted.returncode == 0 and "4 lease(s) in flight voided" in deleted.stderr
    assert waiter.wait(30) == ExitCode.NOT_FOUND and "deleted" in (
        waiter.stderr.read() if waiter.stderr else ""
    )
    assert ctl(daemon, "ack", "g", old.lease).returncode == ExitCode.NOT_FOUND
    assert ctl(daemon, "group", "stats", "g").returncode == ExitCode.NOT_FOUND
    with client(daemon) as c:
        assert c.group_list() == []
        c.group_create("g", ["jobs"])  # the name is free again: a new group, from the start
        assert c.group_stats("g")["available"] == 4


# ------------------------------------------------------------------ the DLQ as people read it


def test_range_and_dlq_show_print_the_dead_letter_header_as_fields(latticed_process: Factory) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        owner = c.identity()
        c.queue_create("jobs")
        c.offer("jobs", b"poison", headers={"trace": b"t1"})
        c.group_create("g", ["jobs"], max_attempts=1)
        lease = c.dequeue("g")
        assert lease is not None
        c.nack("g", lease, reason="parse error: line 1")
    text = ctl(daemon, "range", "g.dlq", "0", "0")
    assert text.returncode == 0, text.stderr
    fields = dict(part.split("=", 1) for part in text.stdout.rstrip("\n").split("\t")[1:-1])
    assert fields["trace"] == "t1"
    assert (fields["dlq.queue"], fields["dlq.offset"], fields["dlq.attempts"]) == (f"{owner}/jobs", "0", "1")
    assert (fields["dlq.reason"], fields["dlq.last_error"]) == ("nack", "parse error: line 1")
    assert "x-dlq" not in text.stdout and "\\x" not in text.stdout  # never the raw msgpack
    [entry] = [
        json.loads(line) for line in ctl(daemon, "range", "g.dlq", "0", "0", "--json").stdout.splitlines()
    ]
    dlq = dict(entry["headers"])["x-dlq"]
    assert (dlq["queue"], dlq["offset"], dlq["attempts"], dlq["last_error"]) == (
        f"{owner}/jobs",
        0,
        1,
        "parse error: line 1",
    )
    shown = ctl(daemon, "dlq", "show", "g", "0")
    assert shown.returncode == 0 and "last_error:" in shown.stdout and "parse error: line 1" in shown.stdout
    assert "x-dlq" not in shown.stdout
    assert ctl(daemon, "offer", "g.dlq", "forged").returncode == ExitCode.NOT_OWNER
    assert ctl(daemon, "queue", "create", "x.dlq").returncode == ExitCode.USAGE


def test_work_with_a_command_that_does_not_exist_fails_cleanly_and_leases_nothing(
    latticed_process: Factory,
) -> None:
    daemon = latticed_process()
    with client(daemon) as c:
        c.queue_create("jobs")
        c.offer("jobs", b"x")
        c.group_create("g", ["jobs"])
    result = ctl(daemon, "work", "g", "--idle", "1", "--", "/does/not/exist", "--flag")
    assert result.returncode == ExitCode.ERROR, result.stderr
    assert result.stderr.count("\n") == 1 and "/does/not/exist" in result.stderr
    assert result.stderr.startswith("latticectl: error: cannot run the command")
    with client(daemon) as c:
        stats = c.group_stats("g")
        assert (stats["available"], stats["leased"]) == (1, 0)
        assert c.group_inspect("g", "jobs", 0)["history"] == []
