"""Parsing the Kafka source's timestamp options (``startingTimestamp``, ``startingOffsetsByTimestamp``,
``endingTimestamp``, ``endingOffsetsByTimestamp``, ``startingOffsetsByTimestampStrategy``); what they
mean and how they become offsets: :mod:`latticed.spark.timestamps`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from latticed.errors import MalformedError

#: Option names (lower-cased, as Spark hands them over).
STARTING_TIMESTAMP: Final = "startingtimestamp"
STARTING_BY_TIMESTAMP: Final = "startingoffsetsbytimestamp"
ENDING_TIMESTAMP: Final = "endingtimestamp"
ENDING_BY_TIMESTAMP: Final = "endingoffsetsbytimestamp"
STRATEGY: Final = "startingoffsetsbytimestampstrategy"
OPTIONS: Final = frozenset(
    {STARTING_TIMESTAMP, STARTING_BY_TIMESTAMP, ENDING_TIMESTAMP, ENDING_BY_TIMESTAMP, STRATEGY}
)

#: One time for every queue, or a queue -> time map.
TimeSpec = int | dict[str, int]


def _ms(option: str, value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise MalformedError(f"lattice option {option!r}: expected milliseconds since the epoch, got {value!r}")


def _parse(opts: Mapping[str, str], one: str, per_queue: str, display: tuple[str, str]) -> TimeSpec | None:
    if one in opts:
        return _ms(display[0], opts[one])
    if per_queue not in opts:
        return None
    try:
        raw = json.loads(opts[per_queue])
    except ValueError as exc:
        raise MalformedError(f"lattice option {display[1]!r}: invalid JSON: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise MalformedError(f"lattice option {display[1]!r}: expected a JSON object of queue -> ms")
    return {str(queue): _ms(display[1], ts) for queue, ts in raw.items()}


def parse_time_options(
    opts: Mapping[str, str], *, streaming: bool
) -> tuple[TimeSpec | None, TimeSpec | None, str]:
    """The starting and ending time specs (None: not set) and the strategy, from lower-cased options."""
    starting = _parse(
        opts, STARTING_TIMESTAMP, STARTING_BY_TIMESTAMP, ("startingTimestamp", "startingOffsetsByTimestamp")
    )
    ending = _parse(
        opts, ENDING_TIMESTAMP, ENDING_BY_TIMESTAMP, ("endingTimestamp", "endingOffsetsByTimestamp")
    )
    if ending is not None and streaming:
        raise MalformedError(
            "lattice options 'endingTimestamp'/'endingOffsetsByTimestamp' are for batch queries only"
        )
    strategy = opts.get(STRATEGY, "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise MalformedError(
            f"lattice option 'startingOffsetsByTimestampStrategy': 'error' or 'latest', not {strategy!r}"
        )
    return starting, ending, strategy


__all__ = ["OPTIONS", "TimeSpec", "parse_time_options"]
