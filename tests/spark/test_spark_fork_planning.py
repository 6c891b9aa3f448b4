"""Planning a micro-batch of a core-2 queue frozen at a fork point, against a fake view (no daemon, no
JVM): a query behind the fork point reads up to it and then has no new data; one past it fails, or with
failOnDataLoss=false is moved back to the fork point and goes on from there in the owner's new epoch."""

from __future__ import annotations

import logging

import pytest

from latticed.errors import ForkedQueueError
from latticed.process.logs import record_fields
from latticed.spark.offsets import (
    DataLossError,
    QueueSelection,
    QueueView,
    batch_bounds,
    latest_offsets,
    plan_ranges,
)

Q = "ab12/ledger"


def frozen(start: int = 0, point: int = 10) -> dict[str, QueueView]:
    """As ``queue_list`` shows a frozen core-2 queue: its end is the fork point."""
    return {Q: QueueView(Q, start, point, forked=True, core=2, fork_point=point)}


def recovered(end: int) -> dict[str, QueueView]:
    return {Q: QueueView(Q, 0, end, core=2)}


def test_the_view_reads_core_and_fork_point_from_queue_info() -> None:
    info = {"queue": Q, "start_offset": 0, "end_offset": 10, "forked": True, "core": 2, "fork_point": 10}
    assert QueueView.from_info(info) == frozen()[Q] and frozen()[Q].frozen
    old = QueueView.from_info({"queue": Q, "start_offset": 0, "end_offset": 3})  # a daemon before core 2
    assert (old.core, old.fork_point, old.frozen) == (1, None, False)


def test_a_frozen_core2_queue_is_subscribed_a_forked_core1_queue_is_not() -> None:
    select = QueueSelection(queues=(Q,))
    assert select.select(frozen().values(), strict=True) == frozen()
    with pytest.raises(ForkedQueueError, match=f"queue {Q} is forked"):
        select.select([QueueView(Q, 0, 10, forked=True)], strict=True)


def test_behind_the_fork_point_reads_up_to_it_then_has_no_new_data() -> None:
    assert latest_offsets({Q: 4}, frozen(), max_rows=None) == {Q: 10}
    assert latest_offsets({Q: 4}, frozen(), max_rows=3) == {Q: 7}
    assert latest_offsets({Q: 10}, frozen(), max_rows=None) == {Q: 10}
    assert latest_offsets({Q: 10}, frozen(), max_rows=None, fail_on_data_loss=False) == {Q: 10}
    assert latest_offsets({Q: -1}, frozen(), max_rows=None) == {Q: 10}  # "latest" pinned at the fork


def test_past_the_fork_point_fails_naming_queue_fork_point_and_what_to_do() -> None:
    with pytest.raises(DataLossError) as caught:
        latest_offsets({Q: 12}, frozen(), max_rows=None)
    message = str(caught.value)
    assert f"queue {Q} forked at offset 10" in message and "up to offset 12" in message
    assert "latticectl queue recover ledger" in message and "failOnDataLoss=false" in message


def test_without_fail_on_data_loss_it_waits_at_the_fork_point_and_goes_on_in_the_new_epoch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        back = latest_offsets({Q: 12}, frozen(), max_rows=None, fail_on_data_loss=False)
    assert back == {Q: 10}  # one empty batch moves the checkpoint back to the fork point ...
    assert plan_ranges({Q: 12}, back, 100) == []
    warned = [record_fields(r) for r in caplog.records if r.getMessage() == "spark.fork_rewind"]
    assert [(w["fork_point"], w["checkpoint"], w["lost"]) for w in warned] == [(10, 12, 2)]
    # ... where it has no new data while frozen, and reads the new epoch from there once recovered.
    assert latest_offsets(back, frozen(), max_rows=None, fail_on_data_loss=False) == back
    assert latest_offsets(back, recovered(15), max_rows=None, fail_on_data_loss=False) == {Q: 15}
    assert [(r.lo, r.hi) for r in plan_ranges(back, {Q: 15}, 100)] == [(10, 15)]


def test_a_batch_read_stops_at_the_fork_point() -> None:
    assert batch_bounds(frozen(), "earliest", "latest") == ({Q: 0}, {Q: 10})
    with pytest.raises(DataLossError, match="forked at offset 10"):
        batch_bounds(frozen(), {Q: 12}, "latest")
    assert batch_bounds(frozen(), {Q: 12}, "latest", fail_on_data_loss=False) == ({Q: 10}, {Q: 10})
