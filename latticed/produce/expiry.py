"""Idle producers' rows expire, as Kafka expires an idle producer id's state (``producer.id.expiration.ms``).

The owner keeps one ``settings`` row of remembered sequences per queue and producer id (:mod:`.dedup`),
and a daemon that names no producer gets a new random id each run: without expiry, every producer id an
allowed identity ever used would stay on the owner for good. So the rows of a producer that wrote
nothing for ``idle`` (default :data:`DEFAULT_IDLE_S`, the daemon's ``producer_expiry_s``) go, with the
row holding its last use.

What that means for a retry: a retry of a sequence whose producer expired meanwhile is not recognised:
it is written again (a duplicate), as in Kafka. Retries come within seconds (the offer's ``--wait``), so
only a producer that comes back after being silent for the whole idle time can see one; one that must
never be written twice keeps writing more often than that, or checks what the queue holds first.

The work is bounded: each step (one storage-thread transaction, run by the retention service's timer)
looks at :data:`ROWS_PER_STEP` rows at most, from where the last step stopped, and wraps around. A row
without a last-use row (written by a release that kept none) is given the time it is first seen, so it
expires one idle time after the upgrade, not at once. A producer that writes in the same batch as the
step is left alone. A clock that steps back only keeps rows longer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

from latticed.crdt.wire import pack, unpack
from latticed.errors import LatticedError
from latticed.produce.dedup import ROW_PREFIX, used_row_name
from latticed.storage.batch import Batch
from latticed.storage.jobs import WriterView

#: Seven days, as Kafka's ``transactional.id.expiration.ms``.
DEFAULT_IDLE_S: Final = 7 * 86_400.0
#: Producer rows one step looks at, at most.
ROWS_PER_STEP: Final = 1000
#: The first name after every ``producer/...`` row (``/`` + 1 is ``0``).
_ROWS_END: Final = ROW_PREFIX[:-1] + "0"


def _used_ms(raw: Any) -> int | None:
    try:
        value = unpack(bytes(raw))
    except LatticedError:
        return None
    return value if type(value) is int else None


def expire_step(
    batch: Batch, writer: WriterView, *, after: str, now_ms: int, idle_ms: int, limit: int
) -> tuple[int, str]:
    """One step on the storage thread (its own transaction, between batches, as KV purges): look at up to
    ``limit`` producer rows after name ``after``, delete those idle since ``now_ms - idle_ms`` or longer;
    returns how many producers expired and where the next step starts (``""``: from the first again)."""
    store = writer.store
    conn = store.connection
    rows = conn.execute(
        "SELECT name FROM settings WHERE name > ? AND name < ? ORDER BY name LIMIT ?",
        (max(after, ROW_PREFIX), _ROWS_END, limit),
    ).fetchall()
    names = [str(row[0]) for row in rows]
    expired: list[str] = []
    adopted: list[str] = []
    for name in names:
        if name in batch.settings:  # written in this batch: in use
            continue
        used = conn.execute("SELECT value FROM settings WHERE name = ?", (used_row_name(name),)).fetchone()
        used_ms = None if used is None else _used_ms(used[0])
        if used_ms is None:
            adopted.append(used_row_name(name))
        elif used_ms <= now_ms - idle_ms:
            expired.append(name)
    if expired or adopted:
        store.begin()
        try:
            conn.executemany(
                "DELETE FROM settings WHERE name = ?",
                [(n,) for name in expired for n in (name, used_row_name(name))],
            )
            conn.executemany(
                "INSERT OR REPLACE INTO settings (name, value) VALUES (?, ?)",
                [(n, pack(now_ms)) for n in adopted],
            )
            store.commit()
        except BaseException as exc:
            store.rollback()
            if isinstance(exc, Exception) and not isinstance(exc, LatticedError):
                raise store.error(exc, "expire idle producers in") from exc
            raise
    return len(expired), (names[-1] if len(names) == limit else "")


class ExpiryStore(Protocol):
    """What expiry uses of the engine."""

    @property
    def clock(self) -> Callable[[], int]: ...

    async def call_in_writer(self, fn: Callable[[Batch, WriterView], Any]) -> Any: ...


class IdleProducers:
    """Expires idle producers' rows, one bounded step per :meth:`step` (the retention timer's)."""

    def __init__(self, engine: ExpiryStore, idle_s: float = DEFAULT_IDLE_S, *, limit: int = ROWS_PER_STEP):
        self.engine = engine
        self.idle_ms = int(idle_s * 1000)
        self.limit = limit
        self._after = ""

    async def step(self) -> int:
        """One step (StorageError if the disk refuses); returns the producers whose rows went."""
        now = self.engine.clock()
        after = self._after

        def run(batch: Batch, writer: WriterView) -> tuple[int, str]:
            return expire_step(batch, writer, after=after, now_ms=now, idle_ms=self.idle_ms, limit=self.limit)

        expired, self._after = await self.engine.call_in_writer(run)
        return int(expired)


__all__ = ["DEFAULT_IDLE_S", "ROWS_PER_STEP", "ExpiryStore", "IdleProducers", "expire_step"]
