"""A streaming query with real PySpark on a core-2 queue that forks under it and is recovered by its
owner: with failOnDataLoss=false it is moved back to the fork point by an empty micro-batch, waits there
while the queue is frozen and reads the new epoch from the fork point. The daemon runs in-process so the
fork can be made as tests/api/test_core2_api.py makes one (a copied store's history merged)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.core2_fork import copy_writes, merge
from support.inprocess import InProcessDaemon, daemon_at

pytest.register_assert_rewrite("spark_fixtures")
pytest_plugins = ["spark_fixtures"]
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    with daemon_at(tmp_path) as d:
        yield d


def test_a_query_past_the_fork_point_goes_on_in_the_new_epoch(
    spark: Any, daemon: InProcessDaemon, tmp_path: Path
) -> None:
    client = daemon.client()
    client.queue_create("q", core=2)
    client.offer_batch("q", [(b"s%d" % i, None, []) for i in range(10)])
    df = (
        spark.readStream.format("lattice")
        .option("socket", str(daemon.socket))
        .option("queues", "q")
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "false")
        .load()
    )
    query = (
        df.writeStream.format("memory")
        .queryName("forked")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:

        def rows() -> list[tuple[int, bytes]]:
            query.processAllAvailable()
            found = spark.sql("SELECT offset, value FROM forked").collect()
            return [(r.offset, bytes(r.value)) for r in found]

        assert len(rows()) == 10
        copied = copy_writes(tmp_path / "copy", daemon, "q", 3)
        client.offer_batch("q", [(b"o0", None, []), (b"o1", None, [])])
        assert rows()[10:] == [(10, b"o0"), (11, b"o1")]  # read on what becomes the abandoned branch
        merge(daemon, copied)
        assert len(rows()) == 12  # frozen: moved back to the fork point, nothing new
        end = query.lastProgress["sources"][0]["endOffset"]
        assert (json.loads(end) if isinstance(end, str) else end) == {client.queue_info("q")["queue"]: 10}
        client.queue_recover("q")
        client.offer("q", b"new")
        assert rows()[12:] == [(10, b"new")]
        assert query.exception() is None
    finally:
        query.stop()
        client.close()


def test_a_query_stopped_through_a_fork_and_its_recovery_goes_on_in_the_new_epoch(
    spark: Any, daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """The freeze happens while the query is stopped, so no poll ever sees the queue frozen: the epoch in
    its checkpointed offsets still tells it the records it read past the new epoch's start are gone."""
    client = daemon.client()
    client.queue_create("q", core=2)
    client.offer_batch("q", [(b"s%d" % i, None, []) for i in range(10)])

    def start() -> Any:
        df = (
            spark.readStream.format("lattice")
            .option("socket", str(daemon.socket))
            .option("queues", "q")
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")
            .load()
        )
        return (
            df.select("offset", "value")
            .writeStream.format("parquet")  # a file sink: the memory sink cannot restart from a checkpoint
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )

    def rows(query: Any) -> list[tuple[int, bytes]]:
        query.processAllAvailable()
        found = spark.read.parquet(str(tmp_path / "out")).orderBy("offset", "value").collect()
        return [(r.offset, bytes(r.value)) for r in found]

    query = start()
    try:
        copied = copy_writes(tmp_path / "copy", daemon, "q", 3)
        client.offer_batch("q", [(b"o0", None, []), (b"o1", None, [])])
        assert rows(query)[10:] == [(10, b"o0"), (11, b"o1")]  # read on what becomes the abandoned branch
    finally:
        query.stop()
    merge(daemon, copied)
    client.queue_recover("q")
    client.offer("q", b"new")
    query = start()
    try:
        # The records it read on the abandoned branch stay in the sink's files; the new epoch follows.
        assert rows(query)[10:] == [(10, b"new"), (10, b"o0"), (11, b"o1")]
        end = query.lastProgress["sources"][0]["endOffset"]
        queue = client.queue_info("q")["queue"]
        assert (json.loads(end) if isinstance(end, str) else end) == {queue: 11, "epochs": {queue: 1}}
        assert query.exception() is None
    finally:
        query.stop()
        client.close()
