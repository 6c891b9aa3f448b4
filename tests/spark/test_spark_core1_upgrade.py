"""The lattice source across its queue's move from fork core 1 to core 2 (``queue upgrade``) on a real
daemon (no JVM: the stream reader's planning calls and partition reads driven as Spark would): the queue's
epoch becomes 1 and its ``epoch_start`` is the end at conversion, which no checkpoint of the query can be
past, so offsets go on, running or restarted, with ``failOnDataLoss`` true, and nothing is read twice."""

from __future__ import annotations

import pytest
from support.inprocess import InProcessDaemon

from latticed.api.client.blocking_client import Client

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
from support.spark_stream import run_batch, stream


@pytest.mark.parametrize("restarted", [False, True])
@pytest.mark.parametrize("read_all_first", [True, False])
def test_a_query_goes_on_across_a_conversion_to_core_2(
    daemon: InProcessDaemon, client: Client, restarted: bool, read_all_first: bool
) -> None:
    client.queue_create("q", core=1)  # a core-1 queue, to upgrade
    client.offer_batch("q", [(b"s%d" % i, None, []) for i in range(10)])
    source = stream(daemon, fail_on_data_loss=True)
    queue = next(iter(source.initialOffset()))
    checkpoint, _ = run_batch(source, {queue: 0})
    if not read_all_first:
        checkpoint = {queue: 6}  # an older checkpoint: the query stopped before its last batch committed
    [done] = client.queue_upgrade("q")
    assert done["converted"]
    info = client.queue_info("q")
    assert (info["core"], info["epoch"], info["epoch_start"]) == (2, 1, 10)
    client.offer_batch("q", [(b"n%d" % i, None, []) for i in range(3)])
    if restarted:
        source.stop()
        source = stream(daemon, fail_on_data_loss=True)
    end, rows = run_batch(source, checkpoint)  # a checkpoint at or below epoch_start is not lost
    assert end == {queue: 13, "epochs": {queue: 1}}
    first = checkpoint[queue]
    assert rows == [(i, b"s%d" % i) for i in range(first, 10)] + [(10 + i, b"n%d" % i) for i in range(3)]
    client.offer("q", b"live")
    assert run_batch(source, end) == ({queue: 14, "epochs": {queue: 1}}, [(13, b"live")])
    source.stop()
