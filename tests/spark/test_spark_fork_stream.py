"""The lattice source on a real daemon whose core-2 queue forks under a running query (no JVM: the
stream reader's planning calls and the partition reader are driven as Spark's driver and executors would
call them). The fork is made as tests/api/test_core2_api.py makes one: a copied store's history merged."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.core2_fork import copy_writes, fork, merge
from support.inprocess import InProcessDaemon

from latticed.api.client.blocking_client import Client

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
from support.spark_stream import run_batch, stream

from latticed.spark.offsets import DataLossError
from latticed.spark.partition_reader import LatticePartition, read_partition


def offer(client: Client, prefix: str, n: int) -> None:
    client.offer_batch("q", [(f"{prefix}{i}".encode(), None, []) for i in range(n)])


def forked_at_10(daemon: InProcessDaemon, client: Client, tmp_path: Path) -> str:
    """Queue ``q`` with 10 shared records, then 5 of this daemon's own and 3 of a copy: frozen at 10."""
    client.queue_create("q", core=2)
    offer(client, "s", 10)
    fork(daemon, tmp_path / "copy", "q", copy=3, own=lambda: offer(client, "o", 5))
    info = client.queue_info("q")
    assert (info["fork_point"], info["end_offset"]) == (10, 10)
    return str(info["queue"])


def test_a_query_past_the_fork_point_fails_with_what_to_do(
    daemon: InProcessDaemon, client: Client, tmp_path: Path
) -> None:
    client.queue_create("q", core=2)
    offer(client, "s", 10)
    source = stream(daemon, fail_on_data_loss=True)
    start = source.initialOffset()
    queue = next(iter(start))
    start, _ = run_batch(source, {queue: 0})
    fork(daemon, tmp_path / "copy", "q", copy=3, own=lambda: offer(client, "o", 5))
    assert run_batch(source, start)[0] == start  # at the fork point: no new data, no error
    with pytest.raises(DataLossError, match=r"forked at offset 10 .* up to offset 12"):
        run_batch(source, {queue: 12})  # a checkpoint from before the fork, past its point
    source.stop()


def test_without_fail_on_data_loss_the_query_waits_and_reads_the_new_epoch_from_the_fork_point(
    daemon: InProcessDaemon, client: Client, tmp_path: Path
) -> None:
    client.queue_create("q", core=2)
    offer(client, "s", 10)
    source = stream(daemon, fail_on_data_loss=False)
    queue = next(iter(source.initialOffset()))
    end, rows = run_batch(source, {queue: 0})
    assert end == {queue: 10} and len(rows) == 10
    copied = copy_writes(tmp_path / "copy", daemon, "q", 3)  # a copy of the store goes on from 10 ...
    offer(client, "o", 2)
    end, rows = run_batch(source, end)  # ... while the query reads two records of this daemon's branch
    assert end == {queue: 12} and [v for _, v in rows] == [b"o0", b"o1"]
    merge(daemon, copied)

    back, rows = run_batch(source, end)
    assert back == {queue: 10} and rows == []  # moved back to the fork point by an empty batch
    assert run_batch(source, back) == (back, [])  # frozen: no new data
    client.queue_recover("q")
    client.offer("q", b"new")
    end, rows = run_batch(source, back)
    assert end == {queue: 11, "epochs": {queue: 1}} and rows == [(10, b"new")]
    source.stop()


@pytest.mark.parametrize("restarted", [False, True])
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_recovery_no_poll_saw_frozen_is_still_caught(
    daemon: InProcessDaemon, client: Client, tmp_path: Path, fail_on_data_loss: bool, restarted: bool
) -> None:
    client.queue_create("q", core=2)
    offer(client, "s", 10)
    source = stream(daemon, fail_on_data_loss)
    queue = next(iter(source.initialOffset()))
    end, _ = run_batch(source, {queue: 0})
    copied = copy_writes(tmp_path / "copy", daemon, "q", 3)
    offer(client, "o", 2)
    end, rows = run_batch(source, end)
    assert end == {queue: 12} and [v for _, v in rows] == [b"o0", b"o1"]
    merge(daemon, copied)  # frozen at 10 ... and recovered before the query polls again (or restarts)
    client.queue_recover("q")
    client.offer("q", b"new")
    if restarted:
        source.stop()
        source = stream(daemon, fail_on_data_loss)
    if fail_on_data_loss:
        with pytest.raises(
            DataLossError, match=r"epoch 1 goes on from offset 10, .* up to offset 12 in epoch 0"
        ):
            run_batch(source, end)
    else:
        back, rows = run_batch(source, end)
        assert back == {queue: 10, "epochs": {queue: 1}} and rows == []
        end, rows = run_batch(source, back)
        assert end == {queue: 11, "epochs": {queue: 1}} and rows == [(10, b"new")]
    source.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_partition_planned_past_the_fork_point_stops_there(
    daemon: InProcessDaemon, client: Client, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    queue = forked_at_10(daemon, client, tmp_path)
    part = LatticePartition(queue, 8, 14, str(daemon.socket), False, fail_on_data_loss, 10.0, 30.0)
    read = read_partition(part)
    first = next(read)
    assert first.column("offset").to_pylist() == [8, 9]
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=r"forked at offset 10 .* up to offset 14"):
            next(read)
    else:
        assert list(read) == []  # not the replica wait (30 s): the rest comes in the new epoch
