"""Starting and ending a read at a time: the Kafka source's ``startingTimestamp``,
``startingOffsetsByTimestamp``, ``endingTimestamp``, ``endingOffsetsByTimestamp`` and
``startingOffsetsByTimestampStrategy``, with its names and meaning.

A timestamp (ms since the epoch) becomes, per queue, the first offset whose record is stamped at or after
it (the daemon's ``offsets_for_times``; docs/operations.md, "Reading by time"). Precedence as in Kafka:
``startingTimestamp`` over ``startingOffsetsByTimestamp`` over ``startingOffsets`` (and the same for the
ending ones). A queue a by-timestamp JSON leaves out starts (ends) as ``startingOffsets``
(``endingOffsets``) says. A start with no record at or after its time fails the query, unless
``startingOffsetsByTimestampStrategy`` is ``latest`` (it then starts at the queue's end); an end with
none is the queue's end (``latest``), as Kafka's is. The lookups happen where the offsets are resolved:
at a streaming query's first start (later starts resume from the checkpoint) and at batch planning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from latticed.errors import MalformedError
from latticed.spark.offsets import QueueView
from latticed.spark.options import EARLIEST, LATEST, OffsetSpec
from latticed.spark.time_options import TimeSpec

#: ``(queue, ms)`` -> the first offset stamped at or after it (None: none is) and the queue's end.
Lookup = Callable[[str, int], tuple[int | None, int]]


def _fallback(spec: OffsetSpec, queue: str, ending: bool) -> int:
    if isinstance(spec, dict):
        return spec.get(queue, LATEST if ending else EARLIEST)
    return EARLIEST if spec == "earliest" else LATEST


def resolve(
    views: Mapping[str, QueueView],
    times: TimeSpec,
    lookup: Lookup,
    *,
    fallback: OffsetSpec,
    ending: bool,
    strategy: str = "error",
) -> dict[str, int]:
    """The offsets JSON (queue -> offset, or the -1/-2 sentinels) that ``times`` stands for; ``times``
    keys are full ``OWNER/NAME`` addresses already."""
    option = (
        ("endingOffsetsByTimestamp" if ending else "startingOffsetsByTimestamp")
        if isinstance(times, dict)
        else ("endingTimestamp" if ending else "startingTimestamp")
    )
    if isinstance(times, dict):
        unknown = sorted(set(times) - set(views))
        if unknown:
            raise MalformedError(
                f"lattice option {option!r} names queues that are not subscribed: {', '.join(unknown)}"
            )
    out: dict[str, int] = {}
    for queue in views:
        ts = times if isinstance(times, int) else times.get(queue)
        if ts is None:
            out[queue] = _fallback(fallback, queue, ending)
            continue
        offset, end = lookup(queue, ts)
        if offset is not None:
            out[queue] = offset
        elif ending:
            out[queue] = LATEST
        elif strategy == "latest":
            out[queue] = end
        else:
            raise MalformedError(
                f"lattice option {option!r}: queue {queue} holds no record stamped at or after {ts}; set "
                "startingOffsetsByTimestampStrategy to 'latest' to start at its end instead"
            )
    return out


__all__ = ["Lookup", "resolve"]
