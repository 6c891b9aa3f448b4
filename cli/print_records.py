"""Printing many records: ``range`` and a bounded ``tail`` (no ``--follow``), with a progress bar when
it is worth one (:mod:`cli.progress`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from cli.output import emit, emit_entries, note_unreadable
from cli.progress import MIN_RECORDS_FOR_BAR, over_records
from latticed.api.client.blocking_client import Client, Entry


def _wants_bar(wanted: int) -> bool:
    return wanted >= MIN_RECORDS_FOR_BAR and sys.stderr.isatty() and not sys.stdout.isatty()


def print_range(client: Client, queue: str, lo: int, hi: int, *, as_json: bool) -> int:
    """Print the records of ``[lo, hi]`` page by page as they arrive; returns how many. Records of a
    sealed queue this identity cannot open are named on stderr (with ``as_json``, a ``{"queue", "offset",
    "unreadable": true}`` line stands in each one's place); NotReaderError (exit 13) if none could be."""
    total: int | None = None
    if _wants_bar(hi - lo + 1):
        info = client.queue_info(queue)
        total = max(min(hi + 1, info["end_offset"]) - max(lo, info["start_offset"]), 0)
    printed = 0
    runs: list[tuple[int, int]] = []
    marked = 0  # offsets below this were named already (JSON Lines, in offset order)
    address = queue  # the queue's full address, from the first record

    def mark_below(offset: int) -> None:
        nonlocal marked
        for a, b in runs:
            for o in range(max(a, marked), min(b + 1, offset)):
                emit({"queue": address, "offset": o, "unreadable": True}, None, as_json=True)
        marked = max(marked, offset)

    def counted() -> Iterator[Entry]:
        nonlocal printed, address
        for entry in client.range_pages(queue, lo, hi, unreadable=runs):
            address = entry.queue
            if as_json and runs:
                mark_below(entry.offset)
            printed += 1
            yield entry

    emit_entries(over_records(counted(), total, "reading"), as_json=as_json)
    if runs:
        if as_json and printed:
            mark_below(hi + 1)
        note_unreadable(queue, runs, none_read=not printed)
    return printed


def print_tail(client: Client, queue: str, offset: int | None, last: int | None, *, as_json: bool) -> None:
    """Print the records from ``offset`` (or the last ``last``) to the end present now."""
    total: int | None = None
    if _wants_bar(MIN_RECORDS_FOR_BAR):
        info = client.queue_info(queue)
        start = info["start_offset"] if offset is None else max(offset, info["start_offset"])
        total = info["end_offset"] - start if last is None else min(last, info["end_offset"] - start)
    entries = client.tail(queue, offset, follow=False, last=last)
    emit_entries(over_records(entries, total, "reading"), as_json=as_json)


__all__ = ["print_range", "print_tail"]
