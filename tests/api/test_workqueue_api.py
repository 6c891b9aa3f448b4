"""Work queues through the local API against in-process daemons (trio in a background thread): groups,
leases and fencing, retries to the DLQ and back, filters, blocking dequeue woken by appends, subscriptions
and their windows, consumer caps, connection loss, restart and compaction of the group log.

Each test uses its own queue and group names on one module daemon; restart tests get their own daemon.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.inprocess import InProcessDaemon, start_in_process

from cli.boundary import ExitCode, exit_code_for
from latticed.api.client.blocking_client import Client
from latticed.api.client.group_client import GroupOps
from latticed.errors import (
    AlreadyExistsError,
    CapacityError,
    EmptyError,
    LeaseError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
)
from latticed.groups import committer
from latticed.host.config import DaemonConfig

_names = itertools.count(1)


Daemon = InProcessDaemon


def start_daemon(root: Path) -> Daemon:
    return start_in_process(
        DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"), "workqueue-daemon"
    )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("wq"))
    yield d
    d.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


def fresh(client: Client, records: int = 0, **group: Any) -> tuple[str, str]:
    """A new queue with ``records`` records (values r0, r1, ...) and a group over it."""
    n = next(_names)
    queue, name = f"q{n}", f"g{n}"
    client.queue_create(queue)
    if records:
        client.offer_batch(queue, [(b"r%d" % i, None, ()) for i in range(records)])
    client.group_create(name, [queue], **group)
    return queue, name


def wait_until(check: Any, what: str, timeout: float = 10.0) -> None:
    """For what only the daemon's other tasks can tell (a connection it noticed closing)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def drain(client: Client, group: str) -> list[bytes]:
    values = []
    while (lease := client.dequeue(group)) is not None:
        values.append(lease.value)
        client.ack(group, lease)
    return values


# ------------------------------------------------------------------ groups and leases


def test_dequeue_ack_echoes_correlation_ids_and_fences_stale_leases(client: Client) -> None:
    queue, group = fresh(client)
    client.offer(queue, b"with-id", headers={"correlation-id": b"order-42"})
    client.offer(queue, b"plain")
    first = client.dequeue(group)
    assert first is not None and (first.offset, first.attempt, first.value) == (0, 1, b"with-id")
    assert first.correlation_id == "order-42" and first.group == group and first.queue.endswith("/" + queue)
    assert client.ack(group, first) == "order-42"
    with pytest.raises(LeaseError, match="already acked"):
        client.ack(group, first)
    second = client.dequeue(group)
    assert second is not None and len(second.correlation_id) == 32  # derived: same on every delivery
    reply = client.nack(group, second, delay=0)
    assert reply["correlation_id"] == second.correlation_id and reply["attempts"] == 1
    again = client.dequeue(group)
    assert again is not None and again.attempt == 2 and again.correlation_id == second.correlation_id
    with pytest.raises(LeaseError, match="unknown lease"):
        client.ack(group, "nonsense.1")
    client.ack(group, again)
    stats = client.group_stats(group)
    assert (stats["available"], stats["leased"], stats["done"], stats["dead"]) == (0, 0, 2, 0)
    assert next(iter(stats["ack_floor"].values())) == 2


def test_group_create_refusals(client: Client) -> None:
    queue, group = fresh(client)
    with pytest.raises(AlreadyExistsError):
        client.group_create(group, [queue])
    with pytest.raises(NotFoundError):
        client.group_create("nope-g", ["no-such-queue"])
    with pytest.raises(MalformedError, match="filter"):
        client.group_create("badfilter-g", [queue], filter="header.=x")
    with pytest.raises(MalformedError, match="dead-letter"):
        client.group_create(group, [queue, f"{group}.dlq"])  # its own DLQ (it exists: the group made it)
    with pytest.raises(MalformedError):
        client.group_create("neg-g", [queue], visibility=-1)
    with pytest.raises(NotFoundError):
        client.dequeue("no-such-group")
    assert any(g["group"] == group and g["running"] for g in client.group_list())


def test_nack_to_dead_letter_with_history_then_redrive_and_purge(client: Client) -> None:
    _, group = fresh(client, 2, max_attempts=2, retry_backoff=0)
    for attempt in (1, 2):
        lease = client.dequeue(group)
        assert lease is not None and (lease.offset, lease.attempt) == (0, attempt)
        reply = client.nack(group, lease)
    assert reply["dead_lettered"] and reply["retry_at"] is None
    [letter] = client.dlq_list(group)
    assert (letter["offset"], letter["attempts"], letter["reason"], letter["value"]) == (0, 2, "nack", b"r0")
    assert [a["outcome"] for a in letter["history"]] == ["nack", "nack"]
    assert letter["correlation_id"] == lease.correlation_id
    assert client.dlq_show(group, letter["dlq_offset"])["history"] == letter["history"]
    assert client.group_stats(group)["dead"] == 1
    assert client.dlq_redrive(group) == 1 and client.dlq_list(group) == []
    values = []
    while (lease := client.dequeue(group)) is not None:
        values.append((lease.value, lease.queue.endswith(".dlq"), lease.attempt, lease.correlation_id))
        client.nack(group, lease, delay=0) if lease.queue.endswith(".dlq") else client.ack(group, lease)
    # r1 done; the redriven r0 failed twice more (fresh budget) and is back in the DLQ, same correlation id
    assert values[0][:2] == (b"r1", False) or values[-1][:2] == (b"r1", False)
    [again] = client.dlq_list(group)
    assert again["attempts"] == 4 and [a["attempt"] for a in again["history"]] == [1, 2, 3, 4]
    assert again["correlation_id"] == letter["correlation_id"] and again["offset"] == 0
    with pytest.raises(NotFoundError):
        client.dlq_purge(group, [again["dlq_offset"] + 10])
    assert client.dlq_purge(group, [again["dlq_offset"], again["dlq_offset"]]) == 1
    stats = client.group_stats(group)
    assert stats["dead"] == 0 and stats["available"] == 0 and stats["leased"] == 0


def test_out_of_order_acks_advance_the_floor(client: Client) -> None:
    _, group = fresh(client, 5)
    leases = [client.dequeue(group) for _ in range(5)]
    assert all(lease is not None for lease in leases)

    def floor() -> int:
        return int(next(iter(client.group_stats(group)["ack_floor"].values())))

    for index in (4, 2, 1):
        client.ack(group, leases[index])  # type: ignore[arg-type]
    assert floor() == 0
    client.ack(group, leases[0])  # type: ignore[arg-type]
    assert floor() == 3
    client.ack(group, leases[3])  # type: ignore[arg-type]
    assert floor() == 5


def test_ack_up_to_settles_leased_and_pending(client: Client) -> None:
    queue, group = fresh(client, 6)
    held = client.dequeue(group)
    assert held is not None
    assert client.ack_up_to(group, queue, 4) == 4
    with pytest.raises(LeaseError, match="ack_up_to"):
        client.ack(group, held)
    assert drain(client, group) == [b"r4", b"r5"]


def test_filter_takes_matching_records_only(client: Client) -> None:
    n = next(_names)
    queue = f"fq{n}"
    client.queue_create(queue)
    client.offer(queue, b"a", key=b"user-1", headers={"type": b"email"})
    client.offer(queue, b"b", key=b"user-2", headers={"type": b"sms"})
    client.offer(queue, b"c", key=b"admin", headers={"type": b"email"})
    client.group_create(f"fg{n}", [queue], filter='header.type=email && key^="user-"')
    assert drain(client, f"fg{n}") == [b"a"]
    client.offer(queue, b"d", key=b"user-9", headers={"type": b"email"})
    assert drain(client, f"fg{n}") == [b"d"]
    # the floor moves past filtered-out records too
    assert next(iter(client.group_stats(f"fg{n}")["ack_floor"].values())) == 4


def test_a_dequeue_right_after_an_acknowledged_offer_gets_it(client: Client) -> None:
    queue, group = fresh(client)
    for i in range(30):  # no wait: the record must not depend on how fast the group's feeder runs
        client.offer(queue, b"now%d" % i)
        lease = client.dequeue(group)
        assert lease is not None and lease.value == b"now%d" % i
        client.ack(group, lease)


def test_blocking_dequeue_is_woken_by_an_append(client: Client, daemon: Daemon) -> None:
    queue, group = fresh(client)
    got: dict[str, Any] = {}

    def consumer() -> None:
        with daemon.client() as c:
            got["lease"] = c.dequeue(group, wait=20)
            got["at"] = time.monotonic()

    thread = threading.Thread(target=consumer)
    thread.start()
    # Its first dequeue registers the consumer and, with nothing to feed, parks on the group's event with
    # no checkpoint between: once stats count it, it is blocked (an append before that would not wake it).
    wait_until(lambda: client.group_stats(group)["consumers"] == 1, "the dequeue to block")
    sent = time.monotonic()
    client.offer(queue, b"wake")
    thread.join(20)
    assert got["lease"] is not None and got["lease"].value == b"wake"
    assert got["at"] - sent < 2.0, "dequeue should return promptly after the append"


def test_dequeue_wait_runs_out(client: Client) -> None:
    _, group = fresh(client)
    t0 = time.monotonic()
    assert client.dequeue(group, wait=0.2) is None
    assert 0.15 < time.monotonic() - t0 < 5


def test_expired_lease_is_redelivered_and_extend_keeps_one(client: Client) -> None:
    _, group = fresh(client, 2, visibility=1.0, retry_backoff=0)
    short = client.dequeue(group)
    kept = client.dequeue(group)
    assert short is not None and kept is not None
    client.extend(group, kept, 30)
    again = client.dequeue(group, wait=10)  # woken by the expiry timer, not by polling
    assert again is not None and (again.offset, again.attempt) == (short.offset, 2)
    with pytest.raises(LeaseError):
        client.ack(group, short)
    client.ack(group, kept)
    client.ack(group, again)
    task = client.group_inspect(group, again.queue, again.offset)
    assert task["state"] == "done" and task["attempts"] == 2


def test_dequeue_leases_outlive_their_connection(daemon: Daemon, client: Client) -> None:
    """The CLI pattern: one process dequeues and exits, another acks."""
    _, group = fresh(client, 1)
    with daemon.client() as other:
        lease = other.dequeue(group)
    assert lease is not None
    assert client.ack(group, lease.lease) == lease.correlation_id


def test_a_waiter_that_hangs_up_gets_no_lease(daemon: Daemon, client: Client) -> None:
    queue, group = fresh(client)
    conn = client.open_stream(5)
    conn.send({"v": 1, "id": 1, "op": "dequeue", "group": group, "wait": 60})
    consumers = lambda: client.group_stats(group)["consumers"]  # noqa: E731
    wait_until(lambda: consumers() == 1, "the waiter to register")
    conn.close()  # ...and gives up
    wait_until(lambda: consumers() == 0, "the daemon to notice the hang-up")
    client.offer(queue, b"x")
    lease = client.dequeue(group, wait=5)
    assert lease is not None and lease.attempt == 1


def test_consumer_and_in_flight_caps(daemon: Daemon, client: Client) -> None:
    _, group = fresh(client, 3, max_consumers=1, max_in_flight=1)
    lease = client.dequeue(group)
    assert lease is not None
    with pytest.raises(CapacityError, match="1 leases"):
        client.dequeue(group)
    with daemon.client() as other, pytest.raises(CapacityError, match="consumers"):
        other.dequeue(group)
    client.ack(group, lease)


# ------------------------------------------------------------------ subscriptions


def test_subscription_window_and_acks_here_or_elsewhere(daemon: Daemon, client: Client) -> None:
    queue, group = fresh(client, 5, retry_backoff=0)
    with daemon.client() as worker, worker.subscribe(group, max_in_flight=2) as sub:
        first, second = next(sub), next(sub)
        assert [first.value, second.value] == [b"r0", b"r1"]
        assert client.group_stats(group)["leased"] == 2  # the window is full: nothing more pushed
        assert sub.ack(first) == first.correlation_id  # on the subscription's own connection
        third = next(sub)
        client.ack(group, second)  # from another connection: frees the window too
        fourth = next(sub)
        assert [third.value, fourth.value] == [b"r2", b"r3"]
        sub.ack(third, wait=False)
        sub.ack(fourth, wait=False)
        sub.flush()
        fifth = next(sub)
        client.offer(queue, b"late")
        sixth = next(sub)
        assert (fifth.value, sixth.value) == (b"r4", b"late")
    # closing gave back the two it held (each counted as an attempt), for others to take
    stats = client.group_stats(group)
    assert (stats["leased"], stats["done"]) == (0, 4)
    again = client.dequeue(group)
    assert again is not None and again.attempt == 2


def test_a_dropped_subscription_releases_its_leases(daemon: Daemon, client: Client) -> None:
    _, group = fresh(client, 3, retry_backoff=0)
    worker = daemon.client()
    sub = worker.subscribe(group, max_in_flight=3)
    assert [next(sub).value for _ in range(3)] == [b"r0", b"r1", b"r2"]
    sub._conn.close()  # the worker dies without unsubscribing
    lease = client.dequeue(group, wait=10)
    assert lease is not None and lease.attempt == 2
    assert client.group_inspect(group, lease.queue, lease.offset)["history"][0]["outcome"] == "released"
    worker.close()


def test_a_subscription_window_never_passes_the_groups_in_flight_cap(daemon: Daemon, client: Client) -> None:
    _, group = fresh(client, 3, max_in_flight=1)
    with daemon.client() as worker, worker.subscribe(group, max_in_flight=3) as sub:
        first = next(sub)
        assert client.group_stats(group)["leased"] == 1
        sub.ack(first)
        assert next(sub).value == b"r1"


def test_errors_inside_a_subscription_are_replies(daemon: Daemon, client: Client) -> None:
    _, group = fresh(client, 1)
    with daemon.client() as worker, worker.subscribe(group) as sub:
        lease = next(sub)
        with pytest.raises(LeaseError):
            sub.ack("bogus.1")
        with pytest.raises(LeaseError):
            sub.extend("bogus.1", 5)
        assert sub.extend(lease, 60) > time.time() + 50
        sub.ack(lease)


# ------------------------------------------------------------------ restart and compaction


def test_restart_keeps_acks_and_redelivers_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer, "COMPACT_AT", 8)  # compact the group log while we go
    d = start_daemon(tmp_path)
    with d.client() as c:
        c.queue_create("jobs")
        c.offer_batch("jobs", [(b"j%d" % i, None, ()) for i in range(40)])
        c.group_create("work", ["jobs"], max_attempts=3, retry_backoff=0)
        leases = [c.dequeue("work") for _ in range(30)]
        for lease in leases[:25]:
            c.ack("work", lease)  # type: ignore[arg-type]
        c.nack("work", leases[25], delay=0)  # type: ignore[arg-type]
        c.ack("work", leases[29])  # type: ignore[arg-type]
        stats = c.group_stats("work")
        assert stats["done"] == 26 and stats["log"]["start"] > 0  # compacted to a snapshot
    d.stop()
    d = start_daemon(tmp_path)
    try:
        with d.client() as c:
            with pytest.raises(LeaseError, match="unknown"):
                c.ack("work", leases[26])  # type: ignore[arg-type]
            # attempt histories outlive compaction and the restart: a pending record's, a done one's
            assert [h["outcome"] for h in c.group_inspect("work", "jobs", 25)["history"]] == ["nack"]
            early = c.group_inspect("work", "jobs", 0)  # acked before the log was compacted, repeatedly
            assert early["state"] == "done" and [h["outcome"] for h in early["history"]] == ["acked"]
            assert early["correlation_id"] == leases[0].correlation_id  # type: ignore[union-attr]
            got = {}
            while (lease := c.dequeue("work")) is not None:
                got[lease.value] = lease.attempt
                c.ack("work", lease)
            expected = {b"j%d" % i for i in [25, 26, 27, 28, *range(30, 40)]}
            assert set(got) == expected
            assert got[b"j25"] == 2  # its failed attempt was durable
            stats = c.group_stats("work")
            assert next(iter(stats["ack_floor"].values())) == 40
    finally:
        d.stop()


def test_exit_codes_of_work_queue_errors() -> None:
    assert exit_code_for(LeaseError("stale")) == ExitCode.LEASE == 9
    assert exit_code_for(EmptyError("nothing")) == ExitCode.EMPTY == 10
    assert exit_code_for(CapacityError("full")) == ExitCode.CAPACITY == 11


def test_the_dlq_namespace_is_reserved_and_only_the_group_writes_its_dlq(
    daemon: Daemon, client: Client
) -> None:
    queue, group = fresh(client, 1, max_attempts=1)
    with pytest.raises(MalformedError, match="reserved"):
        client.queue_create(f"{group}-x.dlq")
    with pytest.raises(MalformedError, match="reserved"):
        client.queue_create(f"{group}-y", meta={"dlq_of": f"{group}-y"})
    with pytest.raises(MalformedError, match="reserved"):
        client.meta_set(queue, "dlq_of", group)
    # a queue of such a name from before the rule (an older store) is never adopted by a group
    engine = daemon.handle.engine
    daemon.call(engine.create_queue, f"{group}-old.dlq", {})
    with pytest.raises(AlreadyExistsError, match="not the dead-letter queue"):
        client.group_create(f"{group}-old", [queue])
    lease = client.dequeue(group)
    assert lease is not None and client.nack(group, lease, reason="no")["dead_lettered"]
    dlq = f"{group}.dlq"
    for write in (
        lambda: client.offer(dlq, b"forged"),
        lambda: client.offer_batch(dlq, [(b"forged", None, ())]),
        lambda: client.truncate(dlq, 1),
        lambda: client.meta_set(dlq, "team", "x"),
    ):
        with pytest.raises(NotOwnerError, match="only the group writes"):
            write()
    [letter] = client.dlq_list(group)
    assert (letter["last_error"], letter["attempts"]) == ("no", 1)
    assert client.queue_info(dlq)["end_offset"] == 1


class _Recorder(GroupOps):
    """Records what the client would put on the wire instead of sending it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.sent.append((op, args))
        return {"group": {}}


def test_group_create_and_edit_put_every_setting_on_the_wire_under_its_wire_name() -> None:
    rec = _Recorder()
    rec.group_create("g", ["q"], visibility=3.0, retry_backoff=0.5, remote_consumers=("aa",))
    rec.group_edit("g", backoff_cap=9.0, retention=60.0, max_in_flight=4, remote_consumers="any")
    rec.group_edit("g", description="d")
    unset = dict.fromkeys(
        ("filter", "max_attempts", "visibility_s", "retry_backoff_s", "backoff_cap_s", "retention_s"), None
    ) | dict.fromkeys(("max_consumers", "max_in_flight", "description", "remote_consumers"), None)
    assert rec.sent == [
        (
            "group_create",
            {
                "name": "g",
                "queues": ["q"],
                **unset,
                "visibility_s": 3.0,
                "retry_backoff_s": 0.5,
                "remote_consumers": ["aa"],
            },
        ),
        (
            "group_edit",
            {
                "group": "g",
                **unset,
                "backoff_cap_s": 9.0,
                "retention_s": 60.0,
                "max_in_flight": 4,
                "remote_consumers": "any",
            },
        ),
        ("group_edit", {"group": "g", **unset, "description": "d"}),
    ]
    with pytest.raises(TypeError, match="visibility_s"):
        rec.group_create("g", ["q"], visibility_s=3.0)  # type: ignore[call-arg]
