"""``df.write/writeStream.format("lattice")`` end to end: real PySpark (``local[2]``, the suite's one session)
writing into real daemons. Exactly once: a job re-run with its ``writeId``, and a streaming batch Spark
runs again after its commit was lost (the checkpoint's commit log entry removed, as when the driver dies
between writing and committing), write nothing twice. A remote offer: Spark's local daemon is not the
queue's owner. A few hundred rows each, to stay fast."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("spark_fixtures")
from spark_fixtures import Daemon, free_port  # noqa: E402

from latticed.api.client.blocking_client import Entry  # noqa: E402

pytest_plugins = ["spark_fixtures"]

pytestmark = pytest.mark.timeout(180)

PRODUCER = "lattice.producer"


def qname(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def held(daemon: Daemon, queue: str) -> list[Entry]:
    return daemon.client.range(queue, 0, 100_000)


def rows(spark: Any, n: int, *, start: int = 0) -> Any:
    """``n`` rows in Kafka's sink shape, over two partitions."""
    return spark.range(start, start + n, 1, 2).selectExpr(
        "cast(id as string) as key",
        "concat('value-', cast(id as string)) as value",
        "array(named_struct('key', 'n', 'value', cast(cast(id as string) as binary))) as headers",
        "timestamp_millis(1700000000000 + id) as timestamp",
    )


def test_batch_write_lands_every_row_once_and_a_rerun_with_its_write_id_writes_nothing(
    spark: Any, lattice_daemon: Daemon
) -> None:
    name = qname("sink")
    queue = lattice_daemon.client.queue_create(name)
    me = lattice_daemon.identity()

    def write(write_id: str) -> None:
        (
            rows(spark, 300)
            .write.format("lattice")
            .mode("append")
            .option("socket", str(lattice_daemon.socket))
            .option("queue", name)
            .option("writeId", write_id)
            .option("recordsPerOffer", "64")  # several requests per task
            .save()
        )

    write("job-1")
    entries = held(lattice_daemon, queue)
    assert sorted(e.value for e in entries) == sorted(b"value-%d" % i for i in range(300))
    for e in entries:
        i = int(e.key or b"")
        assert e.value == b"value-%d" % i
        assert e.timestamp == 1_700_000_000_000 + i
        assert list(e.headers) == [("n", str(i).encode()), (PRODUCER, me.encode())]

    write("job-1")  # the same job again (a driver that died before it knew the job had finished)
    assert len(held(lattice_daemon, queue)) == 300
    write("job-2")  # another job: written again, as it should be
    assert len(held(lattice_daemon, queue)) == 600


def test_queue_column_routes_rows_and_bad_writes_are_refused_with_a_clear_error(
    spark: Any, lattice_daemon: Daemon
) -> None:
    names = [qname("even"), qname("odd")]
    queues = [lattice_daemon.client.queue_create(n) for n in names]
    df = spark.range(0, 200, 1, 2).selectExpr(
        "cast(cast(id as string) as binary) as value",
        f"case when id % 2 = 0 then '{names[0]}' else '{queues[1]}' end as queue",  # NAME or OWNER/NAME
    )
    df.write.format("lattice").mode("append").option("socket", str(lattice_daemon.socket)).save()
    assert [len(held(lattice_daemon, q)) for q in queues] == [100, 100]

    sink = df.write.format("lattice").option("socket", str(lattice_daemon.socket))
    with pytest.raises(Exception, match="append-only"):
        sink.mode("overwrite").save()
    with pytest.raises(Exception, match="unknown column"):
        df.withColumnRenamed("value", "vaule").write.format("lattice").mode("append").save()
    with pytest.raises(Exception, match="no-such-queue"):
        df.drop("queue").write.format("lattice").mode("append").option(
            "socket", str(lattice_daemon.socket)
        ).option("queue", "no-such-queue").save()
    assert [len(held(lattice_daemon, q)) for q in queues] == [100, 100]


def test_a_streaming_batch_run_again_after_its_commit_was_lost_writes_nothing_twice(
    spark: Any, lattice_daemon: Daemon, tmp_path: Path
) -> None:
    source, sink = qname("in"), qname("out")
    lattice_daemon.client.queue_create(source)
    out = lattice_daemon.client.queue_create(sink)
    offer = lattice_daemon.client.offer_batch
    offer(source, [(b"r%d" % i, b"k%d" % i, []) for i in range(200)])
    checkpoint = tmp_path / "ck"

    def run() -> int:
        """One run of the query; the rows its batches read."""
        df = (
            spark.readStream.format("lattice")
            .option("socket", str(lattice_daemon.socket))
            .option("queues", source)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("key", "value", "timestamp")
            .repartition(2)
        )
        query = (
            df.writeStream.format("lattice")
            .option("socket", str(lattice_daemon.socket))
            .option("queue", sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None
        return sum(int(p["numInputRows"]) for p in query.recentProgress)

    assert run() == 200
    assert sorted(e.value for e in held(lattice_daemon, out)) == sorted(b"r%d" % i for i in range(200))
    # the driver died after the tasks wrote, before it committed batch 0: Spark runs it again
    (checkpoint / "commits" / "0").unlink()
    assert run() == 200  # batch 0 again, every row sent again
    assert len(held(lattice_daemon, out)) == 200
    # and the query goes on: the next batch writes only what is new
    offer(source, [(b"r%d" % i, None, []) for i in range(200, 250)])
    assert run() == 50
    assert sorted(e.value for e in held(lattice_daemon, out)) == sorted(b"r%d" % i for i in range(250))


def test_executors_daemon_offers_into_another_daemons_queue(
    spark: Any, daemon_factory: Callable[..., Daemon]
) -> None:
    port = free_port()
    owner = daemon_factory(listen=("127.0.0.1", port))
    local = daemon_factory("--peer", f"127.0.0.1:{port}")
    local_id = local.identity()
    queue = owner.client.queue_create(qname("remote"), producers=[local_id])
    (
        rows(spark, 120)
        .write.format("lattice")
        .mode("append")
        .option("socket", str(local.socket))  # Spark's daemon: not the owner
        .option("queue", queue)
        .option("ownerWaitSeconds", "20")
        .save()
    )
    entries = held(owner, queue)
    assert sorted(e.value for e in entries) == sorted(b"value-%d" % i for i in range(120))
    assert {dict(e.headers)[PRODUCER] for e in entries} == {local_id.encode()}
    deadline = time.monotonic() + 20  # and they replicate back to the producer's daemon
    while len(held_or_none(local, queue)) < 120 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [e.value for e in held(local, queue)] == [e.value for e in entries]


def held_or_none(daemon: Daemon, queue: str) -> list[Entry]:
    try:
        return held(daemon, queue)
    except Exception:
        return []
