"""Queues whose stored value does not match what its owner signed: found when a core-2 queue loads
(records the heads do not cover, metadata that is not what the start head signs), that queue is neither
served nor merged into and its data is kept as it is; the others go on. Each is logged once
(``store.queue_corrupt``) and listed by ``latticectl doctor``, which advises ``latticectl queue repair``
(it drops the queue here, and replication fetches it again: ``latticed/api/server/repair_handlers.py``).

A replica trusts its loaded value where a peer's push leaves part of it as it was (a relay's direct path
for a next version takes the value's metadata when the push's is the same), so what the file holds is
checked against the signatures when it is read, not only when it was received."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Protocol

from latticed.crdt.head import meta_hash
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue import Meta
from latticed.errors import LatticedError, StorageError
from latticed.process.logs import get_logger, log_event
from latticed.storage.codec import decode_meta
from latticed.storage.entries import SqlRows

log = get_logger(__name__)


class StoreFile(Protocol):
    """What reading a core-2 queue needs of a store (:func:`~latticed.storage.core2_store.load`): the
    daemon's writer :class:`~latticed.storage.store.Store`, or the offline doctor's read-only file
    (:mod:`latticed.storage.store_check`), so both check a queue by the same code."""

    path: Path
    rows: SqlRows
    has_cores: bool

    @property
    def connection(self) -> sqlite3.Connection: ...

    def error(self, exc: BaseException, what: str) -> StorageError: ...


class CorruptQueueError(StorageError):
    """A queue as stored is not what its owner signed (the file was changed behind latticed's back).
    Its code stays ``storage``: clients see the StorageError they always did."""


def decode_signed_meta(raw: bytes | None, start_head: HeadV2 | None, label: str) -> Meta:
    """Stored metadata, checked against the hash ``start_head`` signs for it (None: no head yet).
    CorruptQueueError naming ``label`` (the store and queue) if it is not that, or not metadata."""
    try:
        meta = decode_meta(raw)
        ok = start_head is None or meta_hash(dict(meta)) == start_head.meta_hash
    except (LatticedError, ValueError, TypeError) as exc:  # bytes that are no metadata
        raise CorruptQueueError(f"{label}: its stored metadata cannot be read ({exc})") from exc
    if not ok:
        raise CorruptQueueError(
            f"{label}: its stored metadata is not what its signed start head says (another hash); the "
            "file was changed behind latticed's back"
        )
    return meta


def check_held(stored: tuple[int, int] | None, held: tuple[int, int], label: str) -> None:
    """CorruptQueueError unless the records stored (their bounds; None: none) are the ones ``held``."""
    lo, hi = held
    if (stored or (lo, lo)) != held:
        raise CorruptQueueError(
            f"{label} holds records {stored} but its heads say [{lo}, {hi}); the file was changed behind "
            "latticed's back"
        )


class CorruptQueues:
    """The queues found corrupt in this run, by number: written on the storage thread (one key added or
    removed at a time), read anywhere."""

    def __init__(self) -> None:
        self._found: dict[int, tuple[str, str]] = {}

    def found(self, q: int, address: str, error: CorruptQueueError) -> None:
        """Note ``q`` (``OWNER_HEX/NAME``) as corrupt; logged the first time."""
        if q not in self._found:
            self._found[q] = (address, str(error))
            log_event(log, "store.queue_corrupt", level=50, q=q, queue=address, error=str(error))

    def forget(self, q: int) -> None:
        """``q`` was dropped (its data deleted): no longer corrupt."""
        self._found.pop(q, None)

    def error(self, q: int) -> CorruptQueueError | None:
        """The error to raise for ``q`` again (None: not found corrupt)."""
        found = self._found.get(q)
        return None if found is None else CorruptQueueError(found[1])

    def entries(self, own: bytes | None = None) -> list[dict[str, Any]]:
        """``doctor``'s facts: one ``{"queue", "error", "owned"}`` a corrupt queue (``owned``: whether
        ``own``, this daemon's public key, signs it; None if not given)."""
        return [corrupt_entry(address, error, own) for address, error in list(self._found.values())]


def corrupt_entry(address: str, error: str, own: bytes | None) -> dict[str, Any]:
    """One corrupt queue as ``doctor`` and ``queue repair`` name it (``address``: ``OWNER_HEX/NAME``)."""
    owned = None if own is None else address.startswith(own.hex() + "/")
    return {"queue": address, "error": error, "owned": owned}


__all__ = [
    "CorruptQueueError",
    "CorruptQueues",
    "StoreFile",
    "check_held",
    "corrupt_entry",
    "decode_signed_meta",
]
