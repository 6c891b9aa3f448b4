"""``format("lattice")`` end to end: real PySpark (``local[2]``, one session) against real daemons.

Every test uses its own queues on the shared daemon and a fresh checkpoint. Streaming tests drive the
query with ``processAllAvailable()`` (no sleeps); Trigger.AvailableNow where a query should just finish.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("spark_fixtures")
from spark_fixtures import Daemon, free_port  # noqa: E402

pytest_plugins = ["spark_fixtures"]

pytestmark = pytest.mark.timeout(180)


def qname(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def offer_n(daemon: Daemon, queue: str, n: int, *, start: int = 0, key: bytes | None = None) -> list[int]:
    records: list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]] = [
        (b"value-%d" % i, key, []) for i in range(start, start + n)
    ]
    return daemon.client.offer_batch(queue, records)


def stream(spark: Any, daemon: Daemon, **options: str) -> Any:
    reader = spark.readStream.format("lattice").option("socket", str(daemon.socket))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def batch(spark: Any, daemon: Daemon, **options: str) -> Any:
    reader = spark.read.format("lattice").option("socket", str(daemon.socket))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def offsets_in(spark: Any, path: Path) -> list[int]:
    if not any(path.rglob("*.parquet")):
        return []
    return sorted(r.offset for r in spark.read.parquet(str(path)).select("offset").collect())


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def memory_query(spark: Any, work: Path) -> Iterator[Callable[..., Any]]:
    """Start a query into the memory sink; every query started here is stopped at the end."""
    started: list[Any] = []

    def start(df: Any, name: str) -> Any:
        query = (
            df.writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(work / f"ck-{name}"))
            .start()
        )
        started.append(query)
        return query

    yield start
    for query in started:
        query.stop()


def table(spark: Any, name: str) -> list[Any]:
    rows: list[Any] = spark.sql(f"SELECT * FROM {name} ORDER BY queue, offset").collect()
    return rows


# ------------------------------------------------------------------ streaming


def test_stream_end_to_end_latest(spark: Any, lattice_daemon: Daemon, memory_query: Any) -> None:
    """Default startingOffsets=latest: records offered before the start are skipped, later ones land."""
    name = qname("e2e")
    queue = lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 2)
    query = memory_query(stream(spark, lattice_daemon, queues=name), "e2e")
    query.processAllAvailable()
    assert table(spark, "e2e") == []

    before = int(time.time() * 1000)
    lattice_daemon.client.offer_batch(name, [(b"v%d" % i, b"k%d" % i, []) for i in range(3)])
    query.processAllAvailable()
    rows = table(spark, "e2e")
    owner = queue.split("/")[0]
    assert [(r.queue, r.owner, r.offset, r.key, r.value) for r in rows] == [
        (queue, owner, 2 + i, b"k%d" % i, b"v%d" % i) for i in range(3)
    ]
    assert all(abs(r.timestamp.timestamp() * 1000 - before) < 60_000 for r in rows)
    assert "headers" not in rows[0].asDict()


def test_restart_from_checkpoint_no_duplicates_no_gaps(
    spark: Any, lattice_daemon: Daemon, work: Path
) -> None:
    """Stop mid-backlog (Parquet sink, 25 records per batch), append more, restart: each offset once."""
    name = qname("restart")
    lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 100)
    out, ck = work / "out", work / "ck"

    def start() -> Any:
        df = stream(spark, lattice_daemon, queues=name, startingOffsets="earliest", maxRecordsPerTrigger="25")
        return (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(processingTime="0 seconds")
            .start()
        )

    query = start()
    try:
        deadline = time.monotonic() + 60
        while sum(p["numInputRows"] for p in query.recentProgress) < 50 and time.monotonic() < deadline:
            query.awaitTermination(0.05)
    finally:
        query.stop()  # mid-backlog: the next batch may be planned, running or half-written
    first_run = offsets_in(spark, out)
    assert first_run == list(range(len(first_run))) and 50 <= len(first_run) <= 100
    offer_n(lattice_daemon, name, 50, start=100)

    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert offsets_in(spark, out) == list(range(150))


def test_latest_pin_survives_crash_before_first_commit(
    spark: Any, lattice_daemon: Daemon, work: Path
) -> None:
    """startingOffsets=latest, crash before batch 0 commits (commit log removed), records appended in
    between: the rerun of batch 0 pins the same start, so nothing is skipped and nothing re-read."""
    name = qname("pin")
    lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 5)
    out, ck = work / "out", work / "ck"

    def run() -> None:
        df = stream(spark, lattice_daemon, queues=name)
        query = (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        assert not query.isActive

    run()
    assert offsets_in(spark, out) == []
    pinned = json.loads((ck / "offsets" / "0").read_text().splitlines()[-1])
    assert list(pinned.values()) == [5]  # batch 0 pinned "latest" at the end it saw
    shutil.rmtree(ck / "commits")  # as if the driver died before committing batch 0
    offer_n(lattice_daemon, name, 5, start=5)
    run()
    assert offsets_in(spark, out) == [5, 6, 7, 8, 9]


def test_max_records_per_trigger(spark: Any, lattice_daemon: Daemon, memory_query: Any) -> None:
    """No micro-batch admits more than maxRecordsPerTrigger; a small queue is not starved by a big one."""
    big, small = qname("big"), qname("small")
    for name in (big, small):
        lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, big, 200)
    offer_n(lattice_daemon, small, 10)
    df = stream(
        spark, lattice_daemon, queues=f"{big},{small}", startingOffsets="earliest", maxRecordsPerTrigger="60"
    )
    query = memory_query(df, "limited")
    query.processAllAvailable()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    counts = [p["numInputRows"] for p in progress]
    assert sum(counts) == 210
    assert max(counts) <= 60
    assert len(counts) >= 4
    end_text = progress[0]["sources"][0]["endOffset"]
    first_end = json.loads(end_text) if isinstance(end_text, str) else end_text
    assert list(first_end) == sorted(first_end)  # canonical JSON: sorted keys
    small_queue = next(q for q in first_end if q.endswith("/" + small))
    assert first_end[small_queue] == 10  # water-filling: the small backlog went in the first batch
    assert len(table(spark, "limited")) == 210


def test_queue_pattern_picks_up_new_queue(spark: Any, lattice_daemon: Daemon, memory_query: Any) -> None:
    prefix = qname("pat")
    first = lattice_daemon.client.queue_create(f"{prefix}-a")
    owner = first.split("/")[0]
    offer_n(lattice_daemon, f"{prefix}-a", 3)
    df = stream(spark, lattice_daemon, queuePattern=f"{owner}/{prefix}-*", startingOffsets="earliest")
    query = memory_query(df, "pattern")
    query.processAllAvailable()
    assert [(r.queue, r.offset) for r in table(spark, "pattern")] == [(first, i) for i in range(3)]

    second = lattice_daemon.client.queue_create(f"{prefix}-b")  # appears after the query started
    offer_n(lattice_daemon, f"{prefix}-b", 2)
    offer_n(lattice_daemon, f"{prefix}-a", 1, start=3)
    query.processAllAvailable()
    got = [(r.queue, r.offset) for r in table(spark, "pattern")]
    assert got == [(first, i) for i in range(4)] + [(second, 0), (second, 1)]


# ------------------------------------------------------------------ data loss


def test_truncation_fails_by_default_and_skips_when_asked(
    spark: Any, lattice_daemon: Daemon, work: Path
) -> None:
    name = qname("loss")
    lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 10)
    out, ck = work / "out", work / "ck"

    def run(**options: str) -> Any:
        df = stream(spark, lattice_daemon, queues=name, startingOffsets="earliest", **options)
        query = (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(Exception):  # a failed query raises; the test checks query.exception()
            query.awaitTermination(60)
        return query

    assert run().exception() is None
    assert offsets_in(spark, out) == list(range(10))

    offer_n(lattice_daemon, name, 10, start=10)
    lattice_daemon.client.truncate(name, 15)  # 10..14 were never read by the query
    failed = run()
    error = str(failed.exception())
    assert "records 10..14" in error and "truncated" in error and "failOnDataLoss" in error, error
    assert offsets_in(spark, out) == list(range(10))

    assert run(failOnDataLoss="false").exception() is None
    assert offsets_in(spark, out) == list(range(10)) + list(range(15, 20))


def test_batch_truncated_start_fails_clearly(spark: Any, lattice_daemon: Daemon) -> None:
    name = qname("bloss")
    lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 10)
    lattice_daemon.client.truncate(name, 4)
    with pytest.raises(Exception, match=r"records 0\.\.3 of queue .* were truncated"):
        batch(spark, lattice_daemon, queues=name, startingOffsets=json.dumps({name: 0})).collect()
    rows = batch(
        spark, lattice_daemon, queues=name, startingOffsets=json.dumps({name: 0}), failOnDataLoss="false"
    )
    assert [r.offset for r in rows.orderBy("offset").collect()] == list(range(4, 10))


# ------------------------------------------------------------------ batch reads, headers, errors


def test_batch_read_start_end_offsets_and_partitions(spark: Any, lattice_daemon: Daemon) -> None:
    name = qname("batch")
    queue = lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 20, key=b"k")
    df = batch(
        spark,
        lattice_daemon,
        queues=name,
        startingOffsets=json.dumps({name: 5}),  # own NAME is resolved to OWNER/NAME
        endingOffsets=json.dumps({queue: 15}),
        maxRecordsPerPartition="4",
    )
    assert df.rdd.getNumPartitions() == 3  # [5,8) [8,11) [11,15): equal pieces of at most 4
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(5, 15))
    assert [r.value for r in rows] == [b"value-%d" % i for i in range(5, 15)]
    assert {r.key for r in rows} == {b"k"}
    everything = batch(spark, lattice_daemon, queues=name)  # batch default: earliest .. latest
    assert everything.count() == 20
    empty = qname("empty")
    lattice_daemon.client.queue_create(empty)
    assert batch(spark, lattice_daemon, queues=empty).collect() == []


def test_headers_round_trip(spark: Any, lattice_daemon: Daemon, memory_query: Any) -> None:
    name = qname("hdr")
    lattice_daemon.client.queue_create(name)
    sent = [
        (b"a", b"k1", [("trace", b"\x00\xff"), ("type", b"order")]),
        (b"b", None, []),
        (b"c", b"k3", [("dup", b"1"), ("dup", b"2")]),
    ]
    lattice_daemon.client.offer_batch(name, sent)
    rows = batch(spark, lattice_daemon, queues=name, includeHeaders="true").orderBy("offset").collect()
    got = [
        (r.value, r.key, [(h.key, h.value) for h in r.headers] if r.headers is not None else []) for r in rows
    ]
    assert got == [(v, k, list(h)) for v, k, h in sent]
    assert rows[1].headers is None  # Kafka's convention for "no headers"

    df = stream(spark, lattice_daemon, queues=name, startingOffsets="earliest", includeHeaders="true")
    query = memory_query(df, "headers")
    query.processAllAvailable()
    streamed = table(spark, "headers")
    assert [[(h.key, h.value) for h in (r.headers or [])] for r in streamed] == [list(h) for _, _, h in sent]


def test_clear_errors(spark: Any, lattice_daemon: Daemon, lattice_root: Path) -> None:
    missing = lattice_root / "nobody-home.sock"
    with pytest.raises(Exception, match=r"latticed is not running at .*nobody-home\.sock"):
        spark.read.format("lattice").option("socket", str(missing)).option("queues", "x").load().collect()
    with pytest.raises(Exception, match="unknown queue 'no-such-queue'"):
        batch(spark, lattice_daemon, queues="no-such-queue").collect()
    with pytest.raises(Exception, match="exactly one of the options 'queues' and 'queuePattern'"):
        batch(spark, lattice_daemon).collect()
    with pytest.raises(Exception, match="unknown lattice option"):
        batch(spark, lattice_daemon, queues="x", maxOffsetsPerTriger="5").collect()
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("lattice").schema("value BINARY").option("queues", "x").load().collect()


# ------------------------------------------------------------------ the pipeline job


def test_tail_job_demo_and_json_columns(spark: Any, lattice_daemon: Daemon, work: Path) -> None:
    from latticed.spark import tail_job  # noqa: PLC0415

    name = qname("tail")
    queue = lattice_daemon.client.queue_create(name)
    events = [json.dumps({"user": f"u{i % 2}", "amount": i}).encode() for i in range(6)]
    lattice_daemon.client.offer_batch(name, [(e, b"u%d" % (i % 2), []) for i, e in enumerate(events)])

    rows = tail_job.run_demo_tail(lattice_daemon.socket, [name], work / "demo")
    assert [(r.name, r.offset, r.value) for r in rows] == [
        (name, i, e.decode()) for i, e in enumerate(events)
    ]

    args = tail_job.build_parser().parse_args(
        [
            "--queues",
            queue,
            "--output",
            str(work / "json"),
            "--checkpoint",
            str(work / "json-ck"),
            "--json-schema",
            "user STRING, amount INT",
            "--windows-output",
            str(work / "windows"),
            "--socket",
            str(lattice_daemon.socket),
            "--available-now",
        ]
    )
    import threading  # noqa: PLC0415

    assert tail_job.wait(tail_job.start_queries(spark, args), threading.Event()) is None
    landed = spark.read.parquet(str(work / "json"))
    assert set(landed.columns) >= {"queue", "date", "offset", "user", "amount"}
    assert sorted((r.user, r.amount) for r in landed.collect()) == sorted((f"u{i % 2}", i) for i in range(6))
    partitions = {p.name for p in (work / "json").iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert len(partitions) == 1 and next(iter(partitions)).startswith("queue=")


# ------------------------------------------------------------------ replication


class ReplicationNotWired(AssertionError):
    """The second daemon never received the queue: `latticed run --peer` does not replicate (yet)."""


def test_replicated_queue_read_through_local_daemon(
    spark: Any, daemon_factory: Any, memory_query: Any
) -> None:
    """A queue written on daemon A, replicated to daemon B; Spark only talks to B (its local daemon)."""
    port = free_port()
    origin = daemon_factory(listen=("127.0.0.1", port))
    local = daemon_factory("--peer", f"127.0.0.1:{port}")
    name = qname("repl")
    queue = origin.client.queue_create(name)
    offer_n(origin, name, 30)

    deadline = time.monotonic() + 20
    while True:
        held = {q["queue"]: q["end_offset"] for q in local.client.queue_list()}
        if held.get(queue) == 30:
            break
        if time.monotonic() > deadline:
            raise ReplicationNotWired(
                f"daemon B holds {held.get(queue)} of 30 records of {queue} after 20 s; origin log:\n"
                f"{origin.log_tail(10)}\nlocal log:\n{local.log_tail(10)}"
            )
        time.sleep(0.1)

    df = stream(spark, local, queues=queue, startingOffsets="earliest")
    query = memory_query(df, "replicated")
    query.processAllAvailable()
    assert [r.offset for r in table(spark, "replicated")] == list(range(30))
    offer_n(origin, name, 5, start=30)  # live: appended on A, read through B
    deadline = time.monotonic() + 20
    while len(table(spark, "replicated")) < 35 and time.monotonic() < deadline:
        query.processAllAvailable()
        time.sleep(0.1)
    assert [r.offset for r in table(spark, "replicated")] == list(range(35))


# ------------------------------------------------------------------ the executor side, without Spark


def partition(daemon: Daemon, queue: str, lo: int, hi: int, **overrides: Any) -> Any:
    from latticed.spark.partition_reader import LatticePartition  # noqa: PLC0415

    fields: dict[str, Any] = {
        "socket": str(daemon.socket),
        "include_headers": False,
        "fail_on_data_loss": True,
        "timeout": 10.0,
        "replica_wait": 5.0,
    }
    fields.update(overrides)
    return LatticePartition(queue=queue, lo=lo, hi=hi, **fields)


def test_executor_waits_for_a_lagging_replica_then_gives_up(lattice_daemon: Daemon) -> None:
    """The driver's daemon may be ahead of an executor's: read() waits for the records, bounded."""
    from latticed.spark.partition_reader import ReplicaLagError, read_partition  # noqa: PLC0415

    name = qname("lag")
    queue = lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 3)

    def arrive_later() -> None:
        time.sleep(0.3)
        offer_n(lattice_daemon, name, 3, start=3)  # as if replication delivered them

    import threading  # noqa: PLC0415

    feeder = threading.Thread(target=arrive_later)
    feeder.start()
    batches = list(read_partition(partition(lattice_daemon, queue, 0, 6)))
    feeder.join()
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(6))

    started = time.monotonic()
    with pytest.raises(ReplicaLagError, match=r"holds queue .* only up to offset 6, .* up to 9; .* 0\.5s"):
        list(read_partition(partition(lattice_daemon, queue, 6, 9, replica_wait=0.5)))
    assert time.monotonic() - started < 5


def test_executor_sees_truncation_after_planning(lattice_daemon: Daemon) -> None:
    from latticed.spark.partition_reader import read_partition  # noqa: PLC0415

    name = qname("late")
    queue = lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 10)
    lattice_daemon.client.truncate(name, 4)  # after the driver planned [0, 10)
    with pytest.raises(Exception, match=r"records 0\.\.3 of queue .* were truncated"):
        list(read_partition(partition(lattice_daemon, queue, 0, 10)))
    skipped = list(read_partition(partition(lattice_daemon, queue, 0, 10, fail_on_data_loss=False)))
    assert [o for b in skipped for o in b.column("offset").to_pylist()] == list(range(4, 10))
    beyond = list(read_partition(partition(lattice_daemon, queue, 0, 3, fail_on_data_loss=False)))
    assert beyond == []  # the whole range is gone


def test_packed_and_lists_layouts_read_the_same(lattice_daemon: Daemon, monkeypatch: Any) -> None:
    """The executor reads the daemon's ``packed`` layout; a daemon answering in lists (one that predates
    it) gives the same RecordBatches, across read chunks and partition ends."""
    import pyarrow as pa  # noqa: PLC0415

    from latticed.errors import MalformedError  # noqa: PLC0415
    from latticed.spark import partition_reader as reader  # noqa: PLC0415

    name = qname("layout")
    queue = lattice_daemon.client.queue_create(name)
    records: list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]] = [
        (b"v%d" % i * (i % 7), None if i % 3 == 0 else b"k%d" % i, [("h", b"%d" % i)] if i % 5 == 0 else [])
        for i in range(2500)
    ]
    lattice_daemon.client.offer_batch(name, records)
    monkeypatch.setattr(reader, "READ_RECORDS", 1000)  # several round trips per partition
    for lo, hi, headers in ((0, 2500, True), (3, 2222, False), (999, 1001, True)):
        tables = []
        for packed in (True, False):
            monkeypatch.setattr(reader, "PACKED", packed)
            batches = list(
                reader.read_partition(partition(lattice_daemon, queue, lo, hi, include_headers=headers))
            )
            tables.append(pa.Table.from_batches(batches))
        assert tables[0].equals(tables[1])
        assert tables[0].column("offset").to_pylist() == list(range(lo, hi))
        assert tables[0].column("key").to_pylist() == [records[i][1] for i in range(lo, hi)]
    reply = lattice_daemon.client.call("read", queue=name, max_records=3, **{"from": 0})
    assert reply["values"] == [b"", b"v1", b"v2v2"] and "layout" not in reply  # the default stays lists
    with pytest.raises(MalformedError, match="'layout' must be one of lists, packed"):
        lattice_daemon.client.call("read", queue=name, layout="arrow", **{"from": 0})


def test_session_tuning_reaches_spark(spark: Any) -> None:
    """The shared session runs the tuning docs/spark.md recommends: checkpoint logs written without
    Hadoop's chmod forks, and Python workers that import the installed pyspark, not Spark's zip."""
    from latticed.spark.tuning import (  # noqa: PLC0415
        CHECKPOINT_MANAGER_KEY,
        FILE_SYSTEM_MANAGERS,
        is_local_path,
        use_local_checkpoint_manager,
    )

    assert spark.conf.get(CHECKPOINT_MANAGER_KEY) == FILE_SYSTEM_MANAGERS[0]  # the pinned Spark's class
    assert use_local_checkpoint_manager(spark) == FILE_SYSTEM_MANAGERS[0]  # a configured one is kept
    assert is_local_path("/var/lib/x") and is_local_path("file:///x") and not is_local_path("hdfs://nn/x")

    def where_pyspark(_: Any) -> str:
        import pyspark  # noqa: PLC0415

        return str(pyspark.__file__)

    seen = spark.sparkContext.parallelize([0], 1).map(where_pyspark).collect()
    assert len(seen) == 1 and ".zip" not in seen[0], seen


def test_a_querys_source_runs_in_a_fork_of_the_prefork_server(
    spark: Any, lattice_daemon: Daemon, memory_query: Any
) -> None:
    """Spark's per-query source process comes warm from the prefork server (not a cold interpreter), and
    goes away with the query."""
    from latticed.spark.python_workers import _Prefork  # noqa: PLC0415

    server = _Prefork.process
    assert server is not None and server.poll() is None
    before = children_of(server.pid)
    name = qname("prefork")
    lattice_daemon.client.queue_create(name)
    offer_n(lattice_daemon, name, 3)
    query = memory_query(stream(spark, lattice_daemon, queues=name, startingOffsets="earliest"), "prefork")
    query.processAllAvailable()
    assert len(table(spark, "prefork")) == 3
    runners = children_of(server.pid) - before
    assert runners, "the query's source did not start through the prefork server"
    pidfds = [os.pidfd_open(pid) for pid in runners]
    try:
        query.stop()
        for fd in pidfds:
            assert select.select([fd], [], [], 60)[0] == [fd]  # exits with its query
    finally:
        for fd in pidfds:
            os.close(fd)


def children_of(pid: int) -> set[int]:
    """Live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found
