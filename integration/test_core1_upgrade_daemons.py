"""Core-1 queues moved to fork core 2 between real daemon processes on loopback: the owner's `latticectl
queue upgrade` reaches a replica that held the queue on core 1, which converts its copy and receives the
new records, a `tail --follow` on it going on across the conversion with no gap or duplicate; and a forked
core-1 queue (its owner's store copied, both writing) recovered by `latticectl queue recover` on the owner
becomes writable again everywhere."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from daemon_calls import LatticedProcess, client, ctl, dial_address, info, write_after_start
from polling import wait_until
from test_core2_daemons import BIN, Lines, values

from latticed.errors import BehindPeersError

Factory = Callable[..., LatticedProcess]
LOCAL = ["--listen", "127.0.0.1:0", "--no-mdns"]


def offered(daemon: LatticedProcess, value: bytes) -> bool:
    """Whether the owner took ``value`` (not yet while a peer's older claim holds its writes back)."""
    with client(daemon) as c:
        try:
            c.offer("events", value)
        except BehindPeersError:
            return False
    return True


def test_an_upgrade_reaches_a_core1_replica_and_its_tail_goes_on(latticed_process: Factory) -> None:
    owner = latticed_process(args=LOCAL)
    replica = latticed_process(args=[*LOCAL, "--peer", dial_address(owner)])
    with client(owner) as c:
        queue = c.queue_create("events", {"team": "x"}, core=1)
        c.offer_batch("events", [(b"old-%d" % i, None, ()) for i in range(10)])
    wait_until(lambda: info(replica, queue).get("end_offset") == 10, "the core-1 queue on the replica")
    assert info(replica, queue).get("core", 1) == 1

    tail = subprocess.Popen(
        [str(BIN / "latticectl"), "--socket", str(replica.socket), "tail", queue, "--from", "0", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert tail.stdout is not None
        out = Lines(tail.stdout)
        assert [out.next() for _ in range(10)] == [f"{i}\told-{i}\n" for i in range(10)]

        upgraded = ctl(owner, "queue", "upgrade", "events")
        assert upgraded.exit_code == 0, upgraded.output
        assert "moved to fork core 2, offsets 0..10" in upgraded.output
        wait_until(lambda: info(replica, queue).get("core") == 2, "the replica to convert its copy")
        facts = info(replica, queue)
        assert (facts["epoch"], facts["start_offset"], facts["end_offset"]) == (1, 0, 10)
        assert facts["meta"] == {"team": "x"} and facts["forked"] is False

        with client(owner) as c:
            c.offer_batch("events", [(b"new-%d" % i, None, ()) for i in range(3)])
        wait_until(lambda: info(replica, queue).get("end_offset") == 13, "the new records on the replica")
        assert values(replica, queue) == [
            *(b"old-%d" % i for i in range(10)),
            *(b"new-%d" % i for i in range(3)),
        ]
        # The tail goes on where it was: the next lines are the new records, once each.
        assert [out.next() for _ in range(3)] == [f"{10 + i}\tnew-{i}\n" for i in range(3)]
        with client(owner) as c:
            c.offer("events", b"last")
        assert out.next() == "13\tlast\n"
        assert tail.poll() is None  # still following
    finally:
        tail.kill()
        tail.wait()


def test_a_forked_core1_queue_recovered_by_its_owner_is_writable_everywhere(
    latticed_process: Factory,
) -> None:
    relay = latticed_process(args=LOCAL)
    owner = latticed_process(args=LOCAL)
    with client(owner) as c:
        queue = c.queue_create("events", core=1)
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
    with client(copy) as c:
        c.peers_add(hub)
    for daemon in (relay, owner):
        wait_until(lambda d=daemon: info(d, queue).get("forked") is True, "the fork flagged")
    copy.stop()  # the operator keeps the owner's run of the identity

    plain = ctl(owner, "queue", "upgrade", "events")
    assert plain.exit_code != 0 and "queue recover" in plain.output, plain.output
    recovered = ctl(owner, "queue", "recover", "events")
    assert recovered.exit_code == 0, recovered.output
    point = info(owner, queue)["end_offset"]
    assert 10 <= point <= 15 and info(owner, queue)["core"] == 2
    # Writable again once the relay's core-1 claim past the fork point is superseded (it converts too).
    wait_until(lambda: offered(owner, b"after"), "the owner's first write of the new epoch")
    for daemon in (owner, relay):
        wait_until(lambda d=daemon: info(d, queue).get("end_offset") == point + 1, "the new epoch")
        facts = info(daemon, queue)
        assert facts["core"] == 2 and facts["epoch"] == 1 and facts["forked"] is False
        got = values(daemon, queue)
        assert got[:10] == [b"shared-%d" % i for i in range(10)] and got[-1] == b"after"
        assert got == values(owner, queue)  # one history everywhere
