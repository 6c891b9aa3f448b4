"""The Spark source's timestamp options without Spark: parsing (Kafka's names, batch-only endings, the
strategy) and how a time becomes an offset per queue (precedence, fallback, no record that late)."""

from __future__ import annotations

import pytest

from latticed.errors import MalformedError
from latticed.spark.offsets import QueueView
from latticed.spark.options import EARLIEST, LATEST, parse_options
from latticed.spark.timestamps import resolve

VIEWS = {"o/a": QueueView("o/a", 0, 10), "o/b": QueueView("o/b", 0, 10)}


def lookup(queue: str, ts: int) -> tuple[int | None, int]:
    """Queue a is stamped 100, 110, ..., 190; b likewise plus 1000."""
    base = 100 if queue == "o/a" else 1100
    offset = max(0, -(-(ts - base) // 10))
    return (offset, 10) if offset < 10 else (None, 10)


def test_parsing() -> None:
    o = parse_options({"queues": "a", "startingTimestamp": "150", "endingTimestamp": "170"}, streaming=False)
    assert (o.starting_by_time, o.ending_by_time, o.by_time_strategy) == (150, 170, "error")
    o = parse_options({"queues": "a", "startingOffsetsByTimestamp": '{"a": 5}'}, streaming=True)
    assert o.starting_by_time == {"a": 5}
    with pytest.raises(MalformedError, match="batch queries only"):
        parse_options({"queues": "a", "endingTimestamp": "1"}, streaming=True)
    with pytest.raises(MalformedError, match="'error' or 'latest'"):
        parse_options({"queues": "a", "startingOffsetsByTimestampStrategy": "earliest"}, streaming=True)
    with pytest.raises(MalformedError, match="milliseconds since the epoch"):
        parse_options({"queues": "a", "startingTimestamp": "9:00"}, streaming=True)


def test_resolving() -> None:
    assert resolve(VIEWS, 155, lookup, fallback="latest", ending=False) == {"o/a": 6, "o/b": 0}
    assert resolve(VIEWS, {"o/a": 155}, lookup, fallback="earliest", ending=False) == {
        "o/a": 6,
        "o/b": EARLIEST,
    }
    assert resolve(VIEWS, {"o/b": 5000}, lookup, fallback={"o/a": 3}, ending=True) == {
        "o/a": 3,
        "o/b": LATEST,
    }
    with pytest.raises(MalformedError, match="no record stamped at or after 5000"):
        resolve(VIEWS, 5000, lookup, fallback="latest", ending=False)
    assert resolve(VIEWS, 5000, lookup, fallback="latest", ending=False, strategy="latest") == {
        "o/a": 10,
        "o/b": 10,
    }
    with pytest.raises(MalformedError, match="not subscribed"):
        resolve(VIEWS, {"o/c": 1}, lookup, fallback="latest", ending=False)
