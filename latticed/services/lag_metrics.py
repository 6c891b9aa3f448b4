"""Per-queue replication lag as metrics whose label count stays bounded however many queues there are:
how many queues are behind, as a histogram of by how much (fixed buckets, no queue label). Which queue,
and why: ``latticectl queue why NAME``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client.core import HistogramMetricFamily

#: Upper bounds (records behind) of the buckets.
BUCKETS: Final = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


def lag_histogram(lags: Iterable[int]) -> HistogramMetricFamily:
    """``latticed_queue_lag_records``: queues held here that are behind their owner's newest head, by
    how many records (queues that are not behind are not counted)."""
    behind = [n for n in lags if n > 0]
    buckets = [(str(le), sum(1 for n in behind if n <= le)) for le in BUCKETS]
    buckets.append(("+Inf", len(behind)))
    return HistogramMetricFamily(
        "latticed_queue_lag_records",
        "Queues behind their owner's newest head, by how many records (ask `latticectl queue why NAME`).",
        buckets=buckets,
        sum_value=sum(behind),
    )


__all__ = ["BUCKETS", "lag_histogram"]
