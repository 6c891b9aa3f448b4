"""The lattice source's pure parts, without a JVM: options, offsets, read limits, partitions, Arrow.

These are the rules the Spark tests exercise end to end; here they are checked exhaustively and fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from latticed.crdt.records import MAX_OFFSET
from latticed.errors import ForkedQueueError, MalformedError, NotFoundError
from latticed.spark.local_daemon import resolve_socket
from latticed.spark.offsets import (
    MIN_SPLIT_RECORDS,
    DataLossError,
    QueueSelection,
    QueueView,
    Range,
    allocate,
    batch_bounds,
    initial_offsets,
    latest_offsets,
    plan_ranges,
    sorted_offsets,
)
from latticed.spark.options import LATEST, parse_options

A, B, C = "aa/a", "bb/b", "cc/c"


def views(**spec: tuple[int, int]) -> dict[str, QueueView]:
    out = {}
    for key, (start, end) in spec.items():
        queue = {"a": A, "b": B, "c": C}[key]
        out[queue] = QueueView(queue, start, end)
    return out


# ------------------------------------------------------------------ options


def test_option_defaults_follow_kafka() -> None:
    streaming = parse_options({"queues": "events"}, streaming=True)
    assert streaming.starting == "latest"
    assert streaming.fail_on_data_loss is True
    assert streaming.include_headers is False
    assert streaming.max_records_per_trigger is None
    assert streaming.max_records_per_partition == 1_000_000
    assert streaming.min_partitions is None
    assert parse_options({"queues": "events"}, streaming=False).starting == "earliest"


def test_options_are_case_insensitive_and_typed() -> None:
    opts = parse_options(
        {
            "QUEUES": "a, bb/b ,a",
            "maxrecordspertrigger": "500",
            "FailOnDataLoss": "false",
            "includeHeaders": "TRUE",
            "startingOffsets": '{"a": -2, "bb/b": 7}',
            "MINPARTITIONS": "8",
        },
        streaming=True,
    )
    assert opts.queues == ("a", "bb/b")
    assert opts.min_partitions == 8
    assert opts.max_records_per_trigger == 500
    assert opts.fail_on_data_loss is False
    assert opts.include_headers is True
    assert opts.starting == {"a": -2, "bb/b": 7}
    assert parse_options({"queues": '["a,b", "c"]'}, streaming=True).queues == ("a,b", "c")


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({}, True, "exactly one of the options 'queues' and 'queuePattern'"),
        ({"queues": "a", "queuePattern": "*"}, True, "exactly one"),
        ({"queues": "a", "maxOffsetsPerTrigger": "5"}, True, "unknown lattice option"),
        ({"queues": "a", "endingOffsets": "latest"}, True, "for batch queries"),
        ({"queues": "a", "startingOffsets": "latest"}, False, "makes no sense for a batch"),
        ({"queues": "a", "startingOffsets": "{nope"}, True, "invalid JSON"),
        ({"queues": "a", "startingOffsets": '{"a": -3}'}, True, "use >= 0"),
        ({"queues": "a", "endingOffsets": '{"a": -2}'}, False, "use >= 0, -1"),
        ({"queues": "a", "maxRecordsPerTrigger": "0"}, True, "positive integer"),
        ({"queues": "a", "minPartitions": "0"}, True, "'minPartitions': expected a positive integer"),
        ({"queues": "a", "failOnDataLoss": "maybe"}, True, "true or false"),
        ({"queues": "a/b/c"}, True, "neither NAME nor OWNER/NAME"),
        ({"queues": "a", "startingOffsets": '{"a": 9223372036854775813}'}, True, "past the last offset"),
        ({"queues": "a", "endingOffsets": '{"a": 9223372036854775808}'}, False, "past the last offset"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(MalformedError, match=message):
        parse_options(options, streaming=streaming)


def test_socket_option_resolves_on_the_host_that_reads(tmp_path: Path) -> None:
    env = {"LATTICED_SOCKET": str(tmp_path / "env.sock"), "NODE_DIR": "/srv/lattice", "HOME": "/home/me"}
    assert resolve_socket(None, env) == tmp_path / "env.sock"  # as the CLI resolves it
    assert resolve_socket("", {"XDG_RUNTIME_DIR": "/run/user/7"}) == Path(
        "/run/user/7/latticed/latticed.sock"
    )
    assert resolve_socket("/run/{host}.sock", env, host="worker3") == Path("/run/worker3.sock")
    assert resolve_socket("$NODE_DIR/s.sock", env) == Path("/srv/lattice/s.sock")
    assert resolve_socket("${NODE_DIR}/{host}/s", env, host="w") == Path("/srv/lattice/w/s")
    assert resolve_socket("~/s.sock", env) == Path("/home/me/s.sock")
    assert resolve_socket("$UNSET/s", env) == Path("$UNSET/s")


def test_offsets_up_to_the_last_one_are_accepted() -> None:
    opts = parse_options({"queues": "a", "endingOffsets": f'{{"a": {MAX_OFFSET}}}'}, streaming=False)
    assert opts.ending == {"a": MAX_OFFSET}


def test_offsets_past_the_last_one_are_a_clear_error_wherever_they_come_from() -> None:
    """From a corrupt checkpoint, or a daemon reporting a queue it should have refused: no queue can
    reach them, so the query fails naming the queue instead of waiting for them forever."""
    past = MAX_OFFSET + 6
    with pytest.raises(MalformedError, match=f"offset {past} for queue {A}.*past the last offset"):
        latest_offsets({A: past}, views(a=(0, 5)), max_rows=None)
    with pytest.raises(MalformedError, match="past the last offset"):
        plan_ranges({A: 0}, {A: past}, 100)
    with pytest.raises(MalformedError, match="past the last offset"):
        plan_ranges({A: past}, {A: past + 1}, 100)
    found = [QueueView(A, 0, 5), QueueView(B, past, past)]
    with pytest.raises(MalformedError, match=f"local daemon has offset {past} for queue {B}"):
        QueueSelection(pattern="*").select(found, strict=False)
    assert list(QueueSelection(queues=(A,)).select(found, strict=True)) == [A]  # others are not our concern


# ------------------------------------------------------------------ subscription


def test_subscription_refuses_forked_and_unknown_queues() -> None:
    found = [QueueView(A, 0, 5), QueueView(B, 0, 5, forked=True), QueueView(C, 0, 1)]
    assert list(QueueSelection(queues=(A, C)).select(found, strict=True)) == [A, C]
    with pytest.raises(ForkedQueueError, match=f"queue {B} is forked"):
        QueueSelection(queues=(A, B)).select(found, strict=True)
    with pytest.raises(ForkedQueueError, match=f"queue {B} is forked"):
        QueueSelection(pattern="*").select(found, strict=False)
    with pytest.raises(NotFoundError, match="dd/d"):
        QueueSelection(queues=(A, "dd/d")).select(found, strict=True)
    assert list(QueueSelection(queues=(A, "dd/d")).select(found, strict=False)) == [A]
    assert list(QueueSelection(pattern="cc/*").select(found, strict=False)) == [C]


# ------------------------------------------------------------------ offsets


def test_initial_offsets_pin_nothing_for_latest_and_are_canonical() -> None:
    v = views(b=(3, 10), a=(0, 4))
    assert initial_offsets(v, "latest") == {A: LATEST, B: LATEST}
    assert initial_offsets(v, "earliest") == {A: 0, B: 3}
    assert initial_offsets(v, {B: 5}) == {A: 0, B: 5}  # queues left out start at earliest
    assert initial_offsets(v, {A: -1, B: -2}) == {A: LATEST, B: 3}
    assert list(initial_offsets(v, "earliest")) == [A, B]
    with pytest.raises(MalformedError, match="not subscribed"):
        initial_offsets(v, {C: 1})


def test_latest_is_pinned_by_the_first_batch_and_reads_nothing() -> None:
    v = views(a=(0, 10), b=(2, 4))
    start = {A: LATEST, B: LATEST}
    end = latest_offsets(start, v, max_rows=1)
    assert end == {A: 10, B: 4}  # pins use none of the budget
    assert plan_ranges(start, end, 100) == []
    # Re-planning the same batch after a restart gives the same (empty) read: the start is the sentinel.
    assert plan_ranges(initial_offsets(v, "latest"), end, 100) == []


def test_new_queue_is_pinned_at_earliest_then_read() -> None:
    start = {A: 10}
    v = views(a=(0, 10), b=(4, 9))
    end = latest_offsets(start, v, max_rows=None)
    assert end == {A: 10, B: 4}
    assert plan_ranges(start, end, 100) == []
    end2 = latest_offsets(end, v, max_rows=None)
    assert end2 == {A: 10, B: 9}
    assert plan_ranges(end, end2, 100) == [Range(B, 4, 9)]


def test_vanished_queue_keeps_its_offset() -> None:
    assert latest_offsets({A: 3, B: 7}, views(a=(0, 5)), max_rows=None) == {A: 5, B: 7}


def test_replica_behind_checkpoint_never_goes_backwards() -> None:
    assert latest_offsets({A: 50}, views(a=(0, 20)), max_rows=None) == {A: 50}


def test_max_rows_is_respected_and_fair() -> None:
    v = views(a=(0, 1000), b=(0, 10), c=(0, 0))
    end = latest_offsets({A: 0, B: 0, C: 0}, v, max_rows=60)
    assert end == {A: 50, B: 10, C: 0}
    assert sum(end.values()) == 60


def test_available_now_target_caps_and_hides_new_queues() -> None:
    v = views(a=(0, 100), b=(0, 5))
    target = {A: 40}
    end = latest_offsets({A: 10}, v, max_rows=None, target=target)
    assert end == {A: 40}
    assert latest_offsets(end, v, max_rows=None, target=target) == end  # done: start == end


def test_truncation_fails_or_skips() -> None:
    v = views(a=(15, 20))
    with pytest.raises(DataLossError, match=r"records 10\.\.14 of queue aa/a were truncated"):
        latest_offsets({A: 10}, v, max_rows=None)
    end = latest_offsets({A: 10}, v, max_rows=3, fail_on_data_loss=False)
    assert end == {A: 18}  # the budget counts readable records only
    # Nothing left to read after the gap: the skip still moves the offset, so it is checkpointed once.
    assert latest_offsets({A: 10}, views(a=(15, 15)), max_rows=None, fail_on_data_loss=False) == {A: 15}
    assert latest_offsets({A: 10}, views(a=(15, 20)), max_rows=1, fail_on_data_loss=False) == {A: 16}


def test_plan_ranges_splits_large_ranges() -> None:
    # Equal pieces of at most 100 records: no short last task left running alone.
    assert plan_ranges({A: 0, B: 5}, {A: 250, B: 5}, 100) == [
        Range(A, 0, 83),
        Range(A, 83, 166),
        Range(A, 166, 250),
    ]
    assert plan_ranges({A: 0}, {A: 200}, 100) == [Range(A, 0, 100), Range(A, 100, 200)]


def test_min_partitions_spreads_a_backlog_over_the_cores() -> None:
    big = MIN_SPLIT_RECORDS * 100
    assert plan_ranges({A: 0}, {A: big}, 10 * big, 2) == [Range(A, 0, big // 2), Range(A, big // 2, big)]
    # Shares go by the batch's total: the big queue is cut, the small one stays whole.
    assert plan_ranges({A: 0, B: 0}, {A: 9 * big, B: big}, 10 * big, 2) == [
        Range(A, 0, 4 * big + big // 2),
        Range(A, 4 * big + big // 2, 9 * big),
        Range(B, 0, big),
    ]
    # maxRecordsPerPartition still caps a piece.
    assert len(plan_ranges({A: 0}, {A: big}, big // 4, 2)) == 4
    # No piece below MIN_SPLIT_RECORDS: a small batch (a low-latency tail) stays one task.
    assert plan_ranges({A: 0}, {A: 5}, 10 * big, 2) == [Range(A, 0, 5)]
    small = MIN_SPLIT_RECORDS * 3 // 2
    assert plan_ranges({A: 0}, {A: small}, 10 * big, 4) == [Range(A, 0, small)]
    assert len(plan_ranges({A: 0}, {A: 4 * MIN_SPLIT_RECORDS}, 10 * big, 8)) == 4


@given(
    st.dictionaries(st.sampled_from([A, B, C]), st.tuples(st.integers(0, 50), st.integers(0, 300_000))),
    st.integers(1_000, 200_000),
    st.one_of(st.none(), st.integers(1, 64)),
)
def test_plan_ranges_cover_each_range_exactly_once(
    spans: dict[str, tuple[int, int]], max_per_partition: int, min_partitions: int | None
) -> None:
    start = {q: lo for q, (lo, n) in spans.items()}
    end = {q: lo + n for q, (lo, n) in spans.items()}
    ranges = plan_ranges(start, end, max_per_partition, min_partitions)
    for queue in spans:
        mine = [r for r in ranges if r.queue == queue]
        bounds = [start[queue]] + [r.hi for r in mine]
        assert [r.lo for r in mine] == bounds[:-1]  # consecutive pieces, no gap, no overlap
        assert bounds[-1] == end[queue]
        sizes = [r.hi - r.lo for r in mine]
        assert all(0 < size <= max_per_partition for size in sizes)
        assert not sizes or max(sizes) - min(sizes) <= 1  # equal pieces
        if min_partitions is not None and len(sizes) > -(-(end[queue] - start[queue]) // max_per_partition):
            assert min(sizes) >= MIN_SPLIT_RECORDS  # cut for minPartitions, never into tiny tasks


def test_batch_bounds() -> None:
    v = views(a=(2, 30), b=(0, 8))
    assert batch_bounds(v, "earliest", "latest") == ({A: 2, B: 0}, {A: 30, B: 8})
    assert batch_bounds(v, {A: 5}, {A: 10}) == ({A: 5, B: 0}, {A: 10, B: 8})
    with pytest.raises(MalformedError, match="before startingOffsets"):
        batch_bounds(v, {A: 10}, {A: 5})
    with pytest.raises(DataLossError):
        batch_bounds(v, {A: 0}, "latest")
    assert batch_bounds(v, {A: 0}, "latest", fail_on_data_loss=False)[0] == {A: 2, B: 0}


def test_offsets_json_is_canonical() -> None:
    messy = {"zz/z": 1, A: 2, "mm/m": 3}
    assert json.dumps(sorted_offsets(messy)) == json.dumps(messy, sort_keys=True)


@given(
    st.dictionaries(st.sampled_from([A, B, C, "dd/d", "ee/e"]), st.integers(0, 10_000)),
    st.integers(1, 20_000),
)
def test_allocate_spends_the_budget_without_exceeding_backlogs(
    available: dict[str, int], budget: int
) -> None:
    grants = allocate(available, budget)
    assert set(grants) == set(available)
    assert all(0 <= grants[q] <= available[q] for q in available)
    assert sum(grants.values()) == min(budget, sum(available.values()))
    waiting = [q for q, n in available.items() if n > 0]
    if budget >= len(waiting):
        assert all(grants[q] > 0 for q in waiting)  # nobody starves
    assert allocate(dict(reversed(list(available.items()))), budget) == grants  # order-independent


# ------------------------------------------------------------------ Arrow


def test_record_batches_match_the_schema_spark_checks() -> None:
    pytest.importorskip("pyspark")
    from latticed.spark.partition_reader import arrow_schema, record_batch  # noqa: PLC0415

    columns = {  # a `read` reply as it comes off the wire
        "offsets": [7, 8, 9],
        "keys": [b"k", None, b""],
        "values": [b"a", b"b", b"c"],
        "timestamps": [1_700_000_000_123, 1_700_000_000_124, 0],
        "headers": [[["h", b"1"]], None, [["x", b"\x00"], ["x", b"y"]]],
    }

    for include_headers in (False, True):
        schema = arrow_schema(include_headers)
        rb = record_batch(schema, columns, 2, queue=A, owner="aa", include_headers=include_headers)
        assert rb.schema.equals(schema)
        assert rb.num_rows == 2
        assert rb.column("offset").to_pylist() == [7, 8]
        assert rb.column("timestamp").to_pylist()[0].timestamp() == 1_700_000_000.123
        if include_headers:
            assert rb.column("headers").to_pylist() == [[{"key": "h", "value": b"1"}], None]


def packed_reply(columns: dict[str, Any]) -> dict[str, Any]:
    """The daemon's ``packed`` layout of a ``read`` reply, built by the daemon's own function."""
    from latticed.api.server.handlers import packed_columns_reply  # noqa: PLC0415
    from latticed.storage.reader import Columns  # noqa: PLC0415

    return packed_columns_reply(
        Columns(
            offsets=columns["offsets"],
            keys=columns["keys"],
            values=columns["values"],
            timestamps=columns["timestamps"],
            headers=columns["headers"],
        )
    )


@pytest.mark.parametrize(
    "keys",
    [[b"k", None, b"", b"key"], [None, None, None, None], [b"a", b"bb", b"", b"ccc"]],
    ids=["some-keys", "no-keys", "all-keys"],
)
@pytest.mark.parametrize("offsets", [[7, 8, 9, 10], [7, 9, 10, 12]], ids=["consecutive", "gaps"])
def test_packed_record_batches_equal_the_lists_ones(keys: list[bytes | None], offsets: list[int]) -> None:
    """The packed layout (buffers, no per-record Python) gives exactly the RecordBatch of the lists one."""
    pytest.importorskip("pyspark")
    from latticed.spark.partition_reader import (  # noqa: PLC0415
        arrow_schema,
        constant_strings,
        packed_record_batch,
        record_batch,
        reply_offsets,
    )

    for headers in ([None] * 4, [[["h", b"1"]], None, [["x", b"\x00"], ["x", b"y"]], None]):
        columns = {
            "offsets": offsets,
            "keys": keys,
            "values": [b"a", b"", b"\xff" * 300, b"d"],
            "timestamps": [1_700_000_000_123, 1_700_000_000_124, 0, 5],
            "headers": headers,
        }
        reply = packed_reply(columns)
        assert list(reply_offsets(reply)) == offsets
        for include_headers in (False, True):
            schema = arrow_schema(include_headers)
            for count in (4, 3, 1):
                want = record_batch(
                    schema, columns, count, queue=A, owner="aa", include_headers=include_headers
                )
                got = packed_record_batch(
                    schema,
                    reply,
                    count,
                    queue=constant_strings(A, 4),
                    owner=constant_strings("aa", 4),
                    include_headers=include_headers,
                )
                assert got.schema.equals(schema)
                assert got.equals(want), (count, include_headers, got.to_pylist(), want.to_pylist())


def test_the_source_keeps_pandas_out_of_spark_python_processes() -> None:
    """Importing pandas costs Spark's per-query planner process ~0.3 s more start-up and every Python
    worker ~35k more objects for the gc.collect() it runs after each task; the source must not pull it in
    (pyarrow imports it on the first pa.array()/pa.scalar() of Python objects)."""
    pytest.importorskip("pyspark")
    columns = {"offsets": [3, 4], "keys": [b"k", None], "values": [b"v", b"w"], "timestamps": [1, 2]}
    columns["headers"] = [None, None]
    script = (
        "import sys; import pyspark.sql.worker.plan_data_source_read\n"
        "from latticed.spark.partition_reader import arrow_schema, constant_strings, packed_record_batch\n"
        "import latticed.spark.source\n"
        f"reply = {packed_reply(columns)!r}\n"
        "schema = arrow_schema(False)\n"
        "q = constant_strings('aa/a', 2)\n"
        "packed_record_batch(schema, reply, 2, queue=q, owner=q, include_headers=False)\n"
        "print('pandas' in sys.modules)\n"
    )
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False", out.stderr
