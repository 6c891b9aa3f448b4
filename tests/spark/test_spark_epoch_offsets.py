"""A recovery the driver never saw frozen: the offsets name the epoch each core-2 queue was planned in,
so a checkpoint past the new epoch's start is caught on the next poll, or after a restart (no daemon, no
JVM: fake views)."""

from __future__ import annotations

import logging

import pytest

from latticed.process.logs import record_fields
from latticed.spark.epoch_offsets import EPOCHS_KEY, past_recovery, split_epochs, with_epochs
from latticed.spark.offsets import DataLossError, QueueView

Q = "ab12/ledger"
OLD = "cd34/plain"


def at(epoch: int, epoch_start: int, end: int, core: int = 2) -> QueueView:
    return QueueView(Q, 0, end, core=core, epoch=epoch, epoch_start=epoch_start)


def test_the_view_reads_epoch_and_its_start_from_queue_info() -> None:
    info = {"queue": Q, "start_offset": 0, "end_offset": 11, "core": 2, "epoch": 1, "epoch_start": 10}
    assert QueueView.from_info(info) == at(1, 10, 11)
    assert (QueueView.from_info({"queue": Q, "start_offset": 0, "end_offset": 3}).epoch, 0) == (0, 0)


def test_offsets_keep_their_old_form_until_a_queue_has_recovered() -> None:
    views = {Q: at(0, 0, 5), OLD: QueueView(OLD, 0, 7)}
    assert with_epochs({Q: 5, OLD: 7}, views, {}) == {OLD: 7, Q: 5}
    out = with_epochs({Q: 11, OLD: 7}, {Q: at(2, 10, 11), OLD: views[OLD]}, {})
    assert out == {OLD: 7, Q: 11, EPOCHS_KEY: {Q: 2}} and list(out) == sorted(out)
    assert split_epochs(out) == ({OLD: 7, Q: 11}, {Q: 2})
    # A queue the daemon stopped listing keeps the epoch its offset was planned in.
    assert with_epochs({Q: 11}, {}, {Q: 2}) == {Q: 11, EPOCHS_KEY: {Q: 2}}


def test_a_checkpoint_past_a_recovery_it_never_saw_fails_naming_the_epoch_and_what_to_do() -> None:
    with pytest.raises(DataLossError, match=r"epoch 1 goes on from offset 10, .* up to offset 12 in epoch 0"):
        past_recovery(Q, 12, 0, at(1, 10, 11), fail_on_data_loss=True)


def test_without_fail_on_data_loss_it_goes_back_to_the_new_epochs_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="latticed.spark.epoch_offsets"):
        assert past_recovery(Q, 12, 0, at(1, 10, 11), fail_on_data_loss=False) == 10
    warned = [record_fields(r) for r in caplog.records if r.msg == "spark.recovery_rewind"]
    assert [(w["epoch_start"], w["checkpoint"], w["lost"]) for w in warned] == [(10, 12, 2)]


@pytest.mark.parametrize(
    ("offset", "seen", "view"),
    [
        (10, 0, at(1, 10, 11)),  # at the new epoch's start: nothing read past it
        (12, 1, at(1, 10, 13)),  # planned in this epoch: what it read is the new epoch's
        (12, 0, at(1, 10, 13, core=1)),  # core 1 has no epochs
        (12, 0, at(0, 0, 13)),  # never recovered
    ],
)
def test_nothing_read_past_a_recovery_goes_on(offset: int, seen: int, view: QueueView) -> None:
    assert past_recovery(Q, offset, seen, view, fail_on_data_loss=True) is None
