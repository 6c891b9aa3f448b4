"""The lattice source's options, parsed once into a frozen value (no Spark, no daemon: unit-testable).

Names and defaults follow Spark's Kafka source where there is a counterpart (``startingOffsets``,
``endingOffsets``, ``failOnDataLoss``, ``includeHeaders``; ``maxRecordsPerTrigger`` is Kafka's
``maxOffsetsPerTrigger``; the timestamp options: :mod:`latticed.spark.timestamps`), so a
``format("kafka")`` job ports by renaming a few options. Spark hands
options over case-insensitively; so does :func:`parse_options`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from latticed.crdt.records import MAX_OFFSET
from latticed.errors import MalformedError
from latticed.spark.time_options import OPTIONS as TIME_OPTIONS
from latticed.spark.time_options import TimeSpec, parse_time_options

#: Offset sentinels inside ``startingOffsets``/``endingOffsets`` JSON, as in Kafka.
LATEST: Final = -1
EARLIEST: Final = -2

#: A task costs Spark ~0.1 s of fixed work (launch, the Python worker's gc.collect() after it), so big
#: partitions; ``minPartitions`` spreads a backlog over the cluster's cores.
DEFAULT_MAX_RECORDS_PER_PARTITION: Final = 1_000_000
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_REPLICA_WAIT_S: Final = 60.0

#: Every option the source understands, lower-cased; anything else is a typo and fails loudly.
KNOWN: Final = frozenset(
    {
        "socket",
        "queues",
        "queuepattern",
        "startingoffsets",
        "endingoffsets",
        "maxrecordspertrigger",
        "maxrecordsperpartition",
        "minpartitions",
        "failondataloss",
        "includeheaders",
        "timeout",
        "replicawaitseconds",
        # Spark adds these itself for some code paths.
        "path",
        "paths",
    }
    | TIME_OPTIONS
)

#: ``startingOffsets``/``endingOffsets``: "earliest", "latest", or queue spec -> offset (or sentinel).
OffsetSpec = str | dict[str, int]


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Everything the source was asked to do, validated; ``socket`` stays unresolved (see daemon.py)."""

    socket: str | None
    queues: tuple[str, ...] | None
    queue_pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_records_per_trigger: int | None
    max_records_per_partition: int
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    timeout: float
    replica_wait: float
    #: ``startingTimestamp`` / ``startingOffsetsByTimestamp`` and the ending ones (latticed.spark.timestamps).
    starting_by_time: TimeSpec | None = None
    ending_by_time: TimeSpec | None = None
    by_time_strategy: str = "error"


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise MalformedError(f"lattice option {name!r}: expected true or false, got {text!r}")


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise MalformedError(f"lattice option {name!r}: expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise MalformedError(f"lattice option {name!r}: expected a positive integer, got {value}")
    return value


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise MalformedError(f"lattice option {name!r}: expected seconds, got {text!r}") from None
    if not value > 0:
        raise MalformedError(f"lattice option {name!r}: expected a positive number of seconds, got {text!r}")
    return value


def _queue_list(text: str) -> tuple[str, ...]:
    """A comma list, or a JSON array for the rare name containing a comma."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except ValueError as exc:
            raise MalformedError(f"lattice option 'queues': not a JSON array: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise MalformedError("lattice option 'queues': a JSON value must be an array of strings")
    else:
        items = stripped.split(",")
    queues = tuple(dict.fromkeys(item.strip() for item in items if item.strip()))
    if not queues:
        raise MalformedError("lattice option 'queues' names no queue")
    for queue in queues:
        owner, sep, name = queue.partition("/")
        if sep and (not owner or not name or "/" in name):
            raise MalformedError(f"lattice option 'queues': {queue!r} is neither NAME nor OWNER/NAME")
    return queues


def parse_offset_spec(name: str, text: str, *, allow_earliest: bool = True) -> OffsetSpec:
    """``earliest`` | ``latest`` | JSON ``{"QUEUE": offset}`` with -2 = earliest and -1 = latest."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered == "latest" or (lowered == "earliest" and allow_earliest):
        return lowered
    if not stripped.startswith("{"):
        choices = "'earliest', 'latest'" if allow_earliest else "'latest'"
        raise MalformedError(f"lattice option {name!r}: expected {choices} or a JSON object, got {text!r}")
    try:
        raw = json.loads(stripped)
    except ValueError as exc:
        raise MalformedError(f"lattice option {name!r}: invalid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise MalformedError(f"lattice option {name!r}: expected a JSON object of queue -> offset")
    out: dict[str, int] = {}
    for queue, offset in raw.items():
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise MalformedError(
                f"lattice option {name!r}: offset of {queue!r} is not an integer: {offset!r}"
            )
        lowest = EARLIEST if allow_earliest else LATEST
        if offset < lowest:
            raise MalformedError(
                f"lattice option {name!r}: offset of {queue!r} is {offset}; use >= 0, -1 (latest)"
                + (" or -2 (earliest)" if allow_earliest else "")
            )
        if offset > MAX_OFFSET:
            raise MalformedError(
                f"lattice option {name!r}: offset of {queue!r} is {offset}, past the last offset a queue "
                f"can reach ({MAX_OFFSET})"
            )
        out[queue] = offset
    return out


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate Spark's option map; every mistake is a MalformedError naming the option."""
    opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise MalformedError(f"unknown lattice option(s): {', '.join(unknown)} (see docs/spark.md)")

    queues = _queue_list(opts["queues"]) if "queues" in opts else None
    pattern = opts.get("queuepattern", "").strip() or None
    if (queues is None) == (pattern is None):
        raise MalformedError("lattice source: set exactly one of the options 'queues' and 'queuePattern'")

    default_start = "latest" if streaming else "earliest"
    starting = parse_offset_spec("startingOffsets", opts.get("startingoffsets", default_start))
    if "endingoffsets" in opts and streaming:
        raise MalformedError("lattice option 'endingOffsets' is for batch queries (spark.read) only")
    ending = parse_offset_spec("endingOffsets", opts.get("endingoffsets", "latest"), allow_earliest=False)
    if not streaming and (
        starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values())
    ):
        raise MalformedError(
            "lattice option 'startingOffsets': 'latest' (-1) makes no sense for a batch query"
        )
    max_per_trigger = opts.get("maxrecordspertrigger")
    min_partitions = opts.get("minpartitions")
    starting_by_time, ending_by_time, by_time_strategy = parse_time_options(opts, streaming=streaming)
    return SourceOptions(
        socket=opts.get("socket") or None,
        queues=queues,
        queue_pattern=pattern,
        starting=starting,
        ending=ending,
        max_records_per_trigger=(
            _positive_int("maxRecordsPerTrigger", max_per_trigger) if max_per_trigger is not None else None
        ),
        max_records_per_partition=_positive_int(
            "maxRecordsPerPartition",
            opts.get("maxrecordsperpartition", str(DEFAULT_MAX_RECORDS_PER_PARTITION)),
        ),
        min_partitions=(
            _positive_int("minPartitions", min_partitions) if min_partitions is not None else None
        ),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        include_headers=_bool("includeHeaders", opts.get("includeheaders", "false")),
        timeout=_seconds("timeout", opts.get("timeout", str(DEFAULT_TIMEOUT_S))),
        replica_wait=_seconds(
            "replicaWaitSeconds", opts.get("replicawaitseconds", str(DEFAULT_REPLICA_WAIT_S))
        ),
        starting_by_time=starting_by_time,
        ending_by_time=ending_by_time,
        by_time_strategy=by_time_strategy,
    )


__all__ = [
    "DEFAULT_MAX_RECORDS_PER_PARTITION",
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "SourceOptions",
    "parse_offset_spec",
    "parse_options",
]
