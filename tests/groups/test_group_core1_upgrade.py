"""A consumer group whose source queue its owner moves from fork core 1 to core 2 (``queue upgrade``) under
it, on a real daemon: the group keeps its floor and attempt history and goes on leasing the records
written after the conversion, a waiting dequeue woken by them (core-2 commits do not pass through the
change fanout), before and after a restart; the group's dead-letter queue and a sealed queue stay on
core 1."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process

from latticed.api.client.blocking_client import Client
from latticed.api.client.group_client import Lease
from latticed.errors import OtherCoreError
from latticed.host.config import DaemonConfig


def start(tmp_path: Path) -> InProcessDaemon:
    return start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))


def lease(client: Client) -> Lease:
    got = client.dequeue("g", wait=10)
    assert got is not None
    return got


def waiting_dequeue(daemon: InProcessDaemon) -> tuple[threading.Thread, list[Lease | None]]:
    """A dequeue that waits up to a minute, in a thread: it must be woken well before that."""
    out: list[Lease | None] = []

    def run() -> None:
        with daemon.client() as c:
            out.append(c.dequeue("g", wait=60))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_group_goes_on_across_its_sources_move_to_core_2(tmp_path: Path) -> None:
    daemon = start(tmp_path)
    try:
        with daemon.client() as c:
            c.queue_create("q")
            c.offer_batch("q", [(b"r%d" % i, None, []) for i in range(3)])
            c.group_create("g", ["q"], max_attempts=5)
            c.ack("g", lease(c))  # offset 0 done: the floor moves to 1
            first = lease(c)
            assert (first.offset, first.attempt) == (1, 1)
            c.nack("g", first, delay=0, reason="flaky")
            second = lease(c)
            assert (second.offset, second.attempt) == (1, 2)  # retried first, its history kept
            third = lease(c)
            assert third.offset == 2
            with pytest.raises(OtherCoreError, match="dead-letter queue of group g"):
                c.queue_upgrade("g.dlq")

            [done] = c.queue_upgrade("q")
            assert done["converted"] and c.queue_info("q")["core"] == 2
            c.nack("g", second, delay=0, reason="flaky again")
            again = lease(c)
            assert (again.offset, again.attempt) == (1, 3)  # same record, same history, on core 2
            c.ack("g", again)
            c.ack("g", third)
            thread, out = waiting_dequeue(daemon)
            assert c.offer("q", b"after") == 3  # a core-2 commit wakes the waiting consumer
            thread.join(30)
            assert not thread.is_alive()
            [woken] = out
            assert woken is not None and (woken.offset, woken.value, woken.attempt) == (3, b"after", 1)
            c.ack("g", woken)
            stats = c.group_stats("g")
            assert stats["ends"][str(c.queue_info("q")["queue"])] == 4
            dlq = c.queue_info("g.dlq")
            assert dlq.get("core", 1) == 1
    finally:
        daemon.stop()

    daemon = start(tmp_path)  # restarted: the group finds its core-2 source and its floor
    try:
        with daemon.client() as c:
            assert c.dequeue("g", wait=0) is None  # everything before was acknowledged
            thread, out = waiting_dequeue(daemon)
            assert c.offer("q", b"later") == 4
            thread.join(30)
            assert not thread.is_alive()
            [woken] = out
            assert woken is not None and (woken.offset, woken.value) == (4, b"later")
    finally:
        daemon.stop()


def test_a_sealed_queue_stays_on_core_1(tmp_path: Path) -> None:
    daemon = start(tmp_path)
    try:
        with daemon.client() as c:
            c.queue_create("secret", readers=[])
            c.offer("secret", b"hidden")
            with pytest.raises(OtherCoreError, match="sealed"):
                c.queue_upgrade("secret")
            [listed] = c.queue_upgrade(all_queues=True)
            assert not listed["converted"] and "sealed" in listed["error"]
            assert c.queue_info("secret").get("core", 1) == 1
    finally:
        daemon.stop()
