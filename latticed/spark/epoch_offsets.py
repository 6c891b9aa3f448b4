"""The epochs a streaming query's offsets were planned in, so a recovery it never saw is still caught.

A core-2 queue that forked is frozen at its fork point until its owner recovers it in a new epoch, which
goes on from that point (:mod:`latticed.crdt.epochs`). The driver sees a freeze by polling; a recovery
that happened while the query was stopped, or between two polls, leaves no frozen view to see, and a
query whose checkpoint is past the new epoch's start has read records the recovery abandoned. So an
offset also names, per core-2 queue in an epoch above 0, the epoch it was planned in, under the key
``"epochs"`` (queue keys are always ``OWNER/NAME``, so it names no queue). A queue missing there was planned
in epoch 0: offsets of queues that never recovered keep their old form, and so do old checkpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from latticed.process.logs import get_logger, log_event
from latticed.spark.offsets import DataLossError, Offsets, QueueView, sorted_offsets

log = get_logger(__name__)

#: The offsets key holding ``{"OWNER/NAME": epoch}``.
EPOCHS_KEY: Final = "epochs"

Epochs = dict[str, int]


def split_epochs(raw: Mapping[str, Any]) -> tuple[Offsets, Epochs]:
    """A checkpointed offset as (next offset per queue, epoch per queue that has one)."""
    offsets = {queue: int(value) for queue, value in raw.items() if queue != EPOCHS_KEY}
    epochs = raw.get(EPOCHS_KEY) or {}
    return offsets, {queue: int(epoch) for queue, epoch in epochs.items()}


def with_epochs(
    offsets: Mapping[str, int], views: Mapping[str, QueueView], seen: Mapping[str, int]
) -> dict[str, Any]:
    """``offsets`` with the epoch each queue is at now (a queue the daemon no longer lists keeps the epoch
    it had); canonical key order, as Spark compares the JSON text."""
    epochs = dict(seen)
    epochs.update({queue: view.epoch for queue, view in views.items() if view.core == 2})
    kept = {queue: epoch for queue, epoch in sorted(epochs.items()) if epoch > 0 and queue in offsets}
    out: dict[str, Any] = dict(sorted_offsets(offsets))
    if kept:
        out[EPOCHS_KEY] = kept
    return dict(sorted(out.items()))


def recovery_message(queue: str, view: QueueView, seen: int, offset: int) -> str:
    """Why a query past a recovered queue's epoch start stopped, and the way on."""
    return (
        f"queue {queue} was recovered by its owner after a fork: epoch {view.epoch} goes on from offset "
        f"{view.epoch_start}, but this query read records up to offset {offset} in epoch {seen}, past that "
        f"point, on a history the recovery abandoned (failOnDataLoss is true). Restart the query with "
        f"failOnDataLoss=false to read the new epoch from offset {view.epoch_start} (the "
        f"{offset - view.epoch_start} record(s) it read past it are superseded)."
    )


def past_recovery(
    queue: str, offset: int, seen: int, view: QueueView, *, fail_on_data_loss: bool
) -> int | None:
    """Where a query at ``offset``, planned in epoch ``seen``, goes on: None if no recovery since then took
    records it read; else the new epoch's start (``fail_on_data_loss`` false) or DataLossError."""
    if view.core != 2 or view.epoch <= seen or offset <= view.epoch_start:
        return None
    if fail_on_data_loss:
        raise DataLossError(recovery_message(queue, view, seen, offset))
    log_event(
        log,
        "spark.recovery_rewind",
        logging.WARNING,
        queue=queue,
        epoch=view.epoch,
        epoch_start=view.epoch_start,
        checkpoint=offset,
        lost=offset - view.epoch_start,
    )
    return view.epoch_start


__all__ = ["EPOCHS_KEY", "Epochs", "past_recovery", "recovery_message", "split_epochs", "with_epochs"]
