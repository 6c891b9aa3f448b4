"""Queues on fork core 2 between real daemon processes on loopback: an owner's store copied to a second
daemon, both writing, then both meeting a relay: every replica freezes the queue at the records both
histories share, a following tail on the relay says so, and the owner's ``queue recover`` makes it
writable again everywhere, the tail going on with the new records. And core 2 beside core 1 on one link."""

from __future__ import annotations

import queue as queue_mod
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from daemon_calls import LatticedProcess, client, ctl, dial_address, info, write_after_start
from polling import wait_until

Factory = Callable[..., LatticedProcess]
LOCAL = ["--listen", "127.0.0.1:0", "--no-mdns"]
BIN = Path(sys.executable).parent
WAIT_S = 30.0


def values(daemon: LatticedProcess, queue: str) -> list[bytes]:
    with client(daemon) as c:
        return [e.value for e in c.range(queue, 0, 1 << 40)]


class Lines:
    """Lines of a child's stream, read by a thread so a test can wait for the next one with a timeout."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._lines: queue_mod.Queue[bytes] = queue_mod.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._lines.put(line)

    def next(self) -> str:
        return self._lines.get(timeout=WAIT_S).decode()


def test_a_copied_core2_store_forks_every_replica_meets_frozen_and_the_owner_recovers(
    latticed_process: Factory,
) -> None:
    relay = latticed_process(args=LOCAL)
    owner = latticed_process(args=LOCAL)
    with client(owner) as c:
        queue = c.queue_create("events", core=2)
        c.offer_batch("events", [(b"shared-%d" % i, None, ()) for i in range(10)])
        c.peers_add(dial_address(relay))
    wait_until(lambda: info(relay, queue).get("end_offset") == 10, "the 10 shared records on the relay")

    # The owner's data directory copied to a second machine; both write while the relay is away.
    relay.stop()
    owner.stop()
    copy = latticed_process(start=False, args=LOCAL)
    shutil.copytree(owner.data_dir, copy.data_dir)
    owner.start()
    copy.start()
    # Each signs once it heard what the peers it knew of hold, or found them gone (its start gate).
    owner_batch = [(b"owner-%d" % i, None, ()) for i in range(5)]
    write_after_start(owner, lambda c: c.offer_batch("events", owner_batch), "the owner's 5 records")
    copy_batch = [(b"copy-%d" % i, None, ()) for i in range(3)]
    write_after_start(copy, lambda c: c.offer_batch("events", copy_batch), "the copy's 3 records")
    relay.start()
    hub = dial_address(relay)
    with client(owner) as c:
        c.peers_add(hub)
    wait_until(lambda: info(relay, queue).get("end_offset") == 15, "the owner's 15 records on the relay")

    tail = subprocess.Popen(
        [str(BIN / "latticectl"), "--socket", str(relay.socket), "tail", queue, "--from", "0", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert tail.stdout is not None and tail.stderr is not None
        out, err = Lines(tail.stdout), Lines(tail.stderr)
        seen = [out.next() for _ in range(15)]
        assert seen[14] == "14\towner-4\n"

        with client(copy) as c:
            c.peers_add(hub)
        replicas = (owner, copy, relay)
        for daemon in replicas:
            wait_until(lambda d=daemon: info(d, queue).get("forked") is True, "the fork flagged")
        for daemon in replicas:
            wait_until(lambda d=daemon: info(d, queue).get("end_offset") == 10, "frozen at the fork point")
            facts = info(daemon, queue)
            assert (facts["fork_point"], facts["start_offset"], facts["end_offset"]) == (10, 0, 10)
            assert values(daemon, queue) == [b"shared-%d" % i for i in range(10)]  # the same records
        shown = ctl(relay, "queue", "info", queue)
        assert shown.exit_code == 0 and "forked at offset 10" in shown.output, shown.output
        line = err.next()
        assert "forked at offset 10" in line and "waiting for its owner's recovery" in line, line

        # The owner recovers; what it writes next reaches every replica, and the tail goes on with it.
        epoch = info(owner, queue)["epoch"] + 1
        recovered = ctl(owner, "queue", "recover", "events")
        assert recovered.exit_code == 0, recovered.output
        with client(owner) as c:
            c.offer_batch("events", [(b"after-%d" % i, None, ()) for i in range(2)])
        for daemon in replicas:
            wait_until(lambda d=daemon: info(d, queue).get("end_offset") == 12, "the new epoch everywhere")
            facts = info(daemon, queue)
            assert facts["forked"] is False and facts["epoch"] == epoch
            assert values(daemon, queue) == [
                *(b"shared-%d" % i for i in range(10)),
                b"after-0",
                b"after-1",
            ]
        line = err.next()
        assert f"recovered by its owner (epoch {epoch}): going on from offset 10" in line, line
        assert [out.next(), out.next()] == ["10\tafter-0\n", "11\tafter-1\n"]
    finally:
        tail.kill()
        tail.wait()


def test_a_core2_and_a_core1_queue_replicate_between_two_daemons(latticed_process: Factory) -> None:
    a = latticed_process(args=LOCAL)
    b = latticed_process(args=[*LOCAL, "--peer", dial_address(a)])
    with client(a) as c:
        two = c.queue_create("two", core=2)
        one = c.queue_create("one", core=1)  # the two cores side by side: this one is core 1
        c.offer_batch("two", [(b"t%d" % i, None, ()) for i in range(300)])
        c.offer_batch("one", [(b"o%d" % i, None, ()) for i in range(300)])
    wait_until(lambda: info(b, two).get("end_offset") == 300, "the core-2 queue on the replica")
    wait_until(lambda: info(b, one).get("end_offset") == 300, "the core-1 queue on the replica")
    assert info(b, two)["core"] == 2 and info(b, one).get("core", 1) == 1
    assert values(b, two) == [b"t%d" % i for i in range(300)]
    assert values(b, one) == [b"o%d" % i for i in range(300)]
    with client(a) as c:
        c.offer("two", b"live")
    wait_until(lambda: info(b, two).get("end_offset") == 301, "a live core-2 record")
