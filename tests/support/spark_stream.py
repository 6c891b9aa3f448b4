"""Drive the lattice source's stream reader as Spark's driver and executors would call it, on an
in-process daemon (no JVM). Import it after ``pytest.importorskip("pyspark")``."""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable

from latticed.spark.options import parse_options
from latticed.spark.source import LatticeStreamReader
from support.inprocess import InProcessDaemon


def stream(daemon: InProcessDaemon, fail_on_data_loss: bool) -> LatticeStreamReader:
    """A stream reader of the daemon's queue ``q``."""
    options = {"queues": "q", "socket": str(daemon.socket), "failOnDataLoss": str(fail_on_data_loss)}
    return LatticeStreamReader(parse_options(options, streaming=True))


def run_batch(source: LatticeStreamReader, start: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """One micro-batch: its end offset and the (offset, value) rows its partitions read."""
    end = source.latestOffset(start, ReadAllAvailable())
    rows = []
    for part in source.partitions(start, end):
        for batch in source.read(part):
            rows += zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
    return end, rows
