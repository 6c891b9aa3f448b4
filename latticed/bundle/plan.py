"""What an export carries, decided without I/O: which logs the patterns select, whether the other side
(as its want file describes it) lacks anything of one, and where the next chunk starts once a chunk is
written — the same order replication keeps (:func:`~latticed.protocol.replication.has_news`), so a bundle
carries what a peer link would have sent."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from latticed.crdt.queue import QueueDelta, Summary
from latticed.protocol.replication import has_news, held_after, is_ahead


def selected(patterns: Sequence[str], owner: bytes, name: str) -> bool:
    """Whether a log is asked for: no patterns is everything; else a pattern (a glob) matches its name
    or its ``OWNER_HEX/NAME``."""
    if not patterns:
        return True
    label = f"{owner.hex()}/{name}"
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(label, p) for p in patterns)


def lacks(ours: Summary, theirs: Summary | None) -> bool:
    """Whether the other side may lack something of a log we hold (no want file: it lacks everything)."""
    return ours.version > 0 and has_news(ours, theirs)


def worth_writing(delta: QueueDelta, since: Summary | None) -> bool:
    """A delta with something the other side lacks: records, metadata, a fork proof or a newer head."""
    if delta.head is None and delta.fork is None:
        return False
    return (
        since is None
        or bool(delta.records)
        or delta.meta is not None
        or delta.fork is not None
        or is_ahead(held_after(delta, since), since)
    )


def records_lacking(ours: Summary, theirs: Summary | None) -> int:
    """About how many records an export of this log carries (for progress)."""
    start = ours.held_start
    if theirs is not None and theirs.held_end >= start and theirs.held_end <= ours.held_end:
        start = theirs.held_end
    return max(ours.held_end - start, 0)


__all__ = ["lacks", "records_lacking", "selected", "worth_writing"]
