"""The executor side of the Spark source on a host whose daemon lags the driver's.

The driver plans a micro-batch from its own daemon; an executor reads it from its host's replica, which
may not hold the queue yet, or not all of it. Both are replica lag: ``read_partition`` polls, with
backoff, up to ``replicaWaitSeconds``, and then fails with a ``ReplicaLagError`` naming host and socket.
No Spark session: the partition reader is called directly against an in-process daemon.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.inprocess import InProcessDaemon, daemon_at

from latticed.crdt import queue as core
from latticed.crdt.records import RecordRun
from latticed.crdt.signing import Identity
from latticed.errors import NotFoundError

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
from latticed.spark import partition_reader as reader
from latticed.spark.partition_reader import LatticePartition, ReplicaLagError, read_partition

ALICE = Identity.from_seed(b"a" * 32)
QUEUE = f"{ALICE.public_key.hex()}/q"


def alice_delta(n: int) -> core.QueueDelta:
    """Alice's queue with ``n`` records, as the delta replication would bring to this host."""
    state = core.empty_state(ALICE.public_key, "q")
    run = RecordRun([b"v%d" % i for i in range(n)], [None] * n, [1000 + i for i in range(n)], [()] * n)
    return core.delta(core.commit(state, ALICE, now_ms=1, records=run), None, None)


def replicate(daemon: InProcessDaemon, delta: core.QueueDelta) -> None:
    engine = daemon.handle.engine

    async def merge() -> None:
        await engine.merged(engine.submit_merge(await engine.verify_delta(delta)))

    daemon.call(merge)


def partition(daemon: InProcessDaemon, lo: int, hi: int, replica_wait: float) -> LatticePartition:
    return LatticePartition(
        queue=QUEUE,
        lo=lo,
        hi=hi,
        socket=str(daemon.socket),
        include_headers=False,
        fail_on_data_loss=True,
        timeout=10.0,
        replica_wait=replica_wait,
    )


def offsets(batches: list[Any]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    """A daemon that does not hold Alice's queue (yet)."""
    with daemon_at(tmp_path) as d:
        yield d


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Count the reader's ``read`` calls, and those the daemon answered with "no queue"."""
    seen: dict[str, Any] = {"reads": 0, "missing": 0, "first_missing": threading.Event()}
    real = reader.read_columns

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        seen["reads"] += 1
        try:
            return real(*args, **kwargs)
        except NotFoundError:
            seen["missing"] += 1
            seen["first_missing"].set()
            raise

    monkeypatch.setattr(reader, "read_columns", counted)
    return seen


def test_a_queue_that_arrives_within_the_wait_is_read(daemon: InProcessDaemon, polls: dict[str, Any]) -> None:
    got: dict[str, Any] = {}

    def read() -> None:
        try:
            got["batches"] = list(read_partition(partition(daemon, 0, 5, replica_wait=30.0)))
        except BaseException as exc:
            got["error"] = exc

    executor = threading.Thread(target=read)
    executor.start()
    assert polls["first_missing"].wait(10)  # the daemon said "no queue", and the reader kept going
    replicate(daemon, alice_delta(5))
    executor.join(30)
    assert not executor.is_alive()
    assert "error" not in got, got.get("error")
    assert offsets(got["batches"]) == [0, 1, 2, 3, 4]
    assert polls["missing"] >= 1


def test_a_queue_that_never_arrives_is_replica_lag_naming_host_and_socket(
    daemon: InProcessDaemon, polls: dict[str, Any]
) -> None:
    wait = 0.6
    started = time.monotonic()
    with pytest.raises(ReplicaLagError) as raised:
        list(read_partition(partition(daemon, 0, 5, replica_wait=wait)))
    elapsed = time.monotonic() - started
    assert wait <= elapsed < wait + 5
    # Polled with backoff (10 ms doubling, at most 0.5 s), not in a busy loop.
    assert 3 <= polls["reads"] == polls["missing"] <= 10
    message = str(raised.value)
    assert f"host {socket.gethostname()}" in message
    assert f"socket {daemon.socket}" in message
    assert f"does not hold queue {QUEUE}" in message
    assert "offsets 0..4" in message and "0.6s (option replicaWaitSeconds)" in message
    assert isinstance(raised.value.__cause__, NotFoundError)


def test_records_that_never_arrive_are_replica_lag_naming_host_and_socket(daemon: InProcessDaemon) -> None:
    replicate(daemon, alice_delta(2))  # the driver's daemon planned [0, 5); this one holds 2
    with pytest.raises(ReplicaLagError) as raised:
        list(read_partition(partition(daemon, 0, 5, replica_wait=0.3)))
    message = str(raised.value)
    assert f"host {socket.gethostname()} (socket {daemon.socket})" in message
    assert f"holds queue {QUEUE} only up to offset 2" in message and "read up to 5" in message
