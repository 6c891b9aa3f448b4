"""The Spark source's timestamp options (Kafka's names and meaning) against a real daemon, in the one
SparkSession the suite shares: ``startingTimestamp``/``endingTimestamp`` on a batch read,
``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp`` with a queue left out, and a stream that
starts at a time. Records are written in three offers; the times are the stamps the daemon gave them,
read back, so the expected offsets follow from the definition (the first record at or after T)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("spark_fixtures")
from spark_fixtures import Daemon  # noqa: E402

pytest_plugins = ["spark_fixtures"]

pytestmark = pytest.mark.timeout(180)


def written(daemon: Daemon, prefix: str) -> tuple[str, str, list[int]]:
    """A queue with three offers of 5 records each; its name, address and the records' timestamps."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    address = daemon.client.queue_create(name)
    for batch in range(3):
        daemon.client.offer_batch(name, [(b"v%d-%d" % (batch, i), None, []) for i in range(5)])
    return name, address, [e.timestamp for e in daemon.client.range(name, 0, 14)]


def first_at(stamps: list[int], t: int) -> int:
    return next(o for o, ts in enumerate(stamps) if ts >= t)


def read(spark: Any, daemon: Daemon, **options: str) -> list[tuple[str, int]]:
    reader = spark.read.format("lattice").option("socket", str(daemon.socket))
    for key, value in options.items():
        reader = reader.option(key, value)
    return [(r.queue, r.offset) for r in reader.load().orderBy("queue", "offset").collect()]


def test_batch_reads_between_two_times(spark: Any, lattice_daemon: Daemon) -> None:
    name, address, stamps = written(lattice_daemon, "ts")
    t1, t2 = stamps[5], stamps[10]
    lo, hi = first_at(stamps, t1), first_at(stamps, t2)
    rows = read(spark, lattice_daemon, queues=name, startingTimestamp=str(t1), endingTimestamp=str(t2))
    assert rows == [(address, o) for o in range(lo, hi)] and lo <= 5 and hi <= 10
    other, other_address, _ = written(lattice_daemon, "ts2")
    rows = read(
        spark,
        lattice_daemon,
        queues=f"{name},{other}",
        startingOffsetsByTimestamp=json.dumps({name: t2}),  # `other` falls back to startingOffsets
        endingOffsetsByTimestamp=json.dumps({address: stamps[-1] + 1}),  # none that late: the end
        startingOffsets=json.dumps({other: 12}),
    )
    assert rows == sorted([(address, o) for o in range(hi, 15)] + [(other_address, o) for o in (12, 13, 14)])
    with pytest.raises(Exception, match="no record stamped at or after"):
        read(spark, lattice_daemon, queues=name, startingTimestamp=str(stamps[-1] + 1))
    late = read(
        spark,
        lattice_daemon,
        queues=name,
        startingTimestamp=str(stamps[-1] + 1),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert late == []


def test_a_stream_starts_at_a_time(spark: Any, lattice_daemon: Daemon, tmp_path: Path) -> None:
    name, _, stamps = written(lattice_daemon, "tstream")
    df = (
        spark.readStream.format("lattice")
        .option("socket", str(lattice_daemon.socket))
        .option("queues", name)
        .option("startingTimestamp", str(stamps[7]))
        .load()
    )
    query = (
        df.writeStream.format("memory")
        .queryName("by_time")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        offsets = [r.offset for r in spark.sql("SELECT offset FROM by_time ORDER BY offset").collect()]
    finally:
        query.stop()
    assert offsets == list(range(first_at(stamps, stamps[7]), 15))
