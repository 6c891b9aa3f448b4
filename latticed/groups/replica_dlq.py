"""A group's dead letters as a daemon that holds a replica of it sees them (``dlq list``/``dlq show`` there).

Reading needs no owner: the DLQ is an ordinary signed queue and the group log's progress says which of
its records are settled (purged, or redriven and acked) and which were released for redelivery; the rest
are parked. Each dead letter carries its origin and attempts in its ``x-dlq`` header. What the owner did
since its last update reached this daemon is not known here, so the reply says the view may lag.
"""

from __future__ import annotations

from latticed.crdt.attempts import parse_dead_letter
from latticed.crdt.group import GroupProgress, dlq_name
from latticed.crdt.head import KIND_GROUP
from latticed.crdt.records import Record
from latticed.errors import MalformedError, NotFoundError
from latticed.groups.runtime import CATCH_UP_BYTES, CATCH_UP_RECORDS, records_of
from latticed.groups.service import GroupService
from latticed.leases.outcomes import DeadLetter
from latticed.process.logs import get_logger, log_event

log = get_logger(__name__)

#: Why a replica's answer may differ from the owner's (shown beside it).
STALE_NOTE = (
    "from this daemon's replica of the group log and its DLQ: redrives and purges on the owner show "
    "here once they have replicated"
)


def _parked(progress: GroupProgress, offset: int) -> bool:
    return not (
        offset < progress.ack_floor
        or offset in progress.acked
        or offset in progress.dead
        or offset in progress.released
    )


async def replica_dead_letters(
    service: GroupService, address: str, limit: int | None = None, only: int | None = None
) -> tuple[str, list[DeadLetter]]:
    """The DLQ's address and its parked dead letters, oldest first (at most ``limit``; ``only``: just
    the one at that DLQ offset, NotFoundError if it is not parked)."""
    engine = service.engine
    if engine.find(*engine.parse_address(address), KIND_GROUP) is None:
        raise NotFoundError(f"no group {address} here (this daemon holds no replica of its log)")
    state, spec, progress = await service.replica_progress(address)
    dlq = f"{state.owner.hex()}/{dlq_name(spec.name)}"
    q = engine.find(state.owner, dlq_name(spec.name))
    if q is None:
        raise NotFoundError(f"this daemon holds no replica of {dlq}, the dead-letter queue of {address}")
    settled = progress.get(dlq, GroupProgress())
    held = engine.state(q)
    lo, hi = max(held.start, settled.ack_floor), held.held_end
    if only is not None:
        if not (lo <= only < hi) or not _parked(settled, only):
            raise NotFoundError(f"no parked dead letter at offset {only} of {dlq} (as this daemon knows)")
        lo, hi = only, only + 1
    letters: list[DeadLetter] = []
    while lo < hi and (limit is None or len(letters) < limit):
        columns = await engine.read(q, lo, hi, CATCH_UP_RECORDS, CATCH_UP_BYTES)
        if not columns.offsets:
            break
        for offset, record in records_of(service.sealer.open_columns(q, columns)):
            if _parked(settled, offset) and (letter := _letter(dlq, offset, record)) is not None:
                letters.append(letter)
        lo = columns.offsets[-1] + 1
    if only is not None and not letters:
        raise NotFoundError(f"offset {only} of {dlq} is not a dead letter")
    return dlq, letters[:limit]


def _letter(dlq: str, offset: int, record: Record) -> DeadLetter | None:
    try:
        return DeadLetter(offset, record, parse_dead_letter(record))
    except MalformedError as exc:  # the owner's group would not have written it: show the rest
        log_event(log, "group.bad_dead_letter", level=30, queue=dlq, offset=offset, error=str(exc))
        return None


__all__ = ["STALE_NOTE", "replica_dead_letters"]
