"""Core-2 queues as the event loop sees them: which queue numbers are on core 2, their newest committed
values, the owner's writes behind the owner fence, and reads of their records on a reader connection.

The :class:`~latticed.storage.engine.Engine` holds one :class:`Core2View` and hands a queue number to it
whenever that number is a core-2 queue, so the local API reaches both cores through one set of calls.
The storage thread publishes a core-2 queue's new value before the engine hears of the commit (a
:class:`~latticed.storage.core2_queues.Change2`), so a value read here is never older than the wake-up a
waiter got; a value not loaded yet is loaded on the storage thread on first use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, Protocol, cast

import trio

from latticed.crdt.head import KIND_QUEUE, QueueKind, queue_id
from latticed.crdt.queue.state import QueueState
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.errors import BehindPeersError, NotFoundError, NotOwnerError
from latticed.storage import segments
from latticed.storage.core1_convert import ConversionBusyError, UpgradeQueue
from latticed.storage.core2_engine import Core2Engine, Core2Host, reading_through
from latticed.storage.core2_jobs import Commit2
from latticed.storage.core2_queues import Core2Queues
from latticed.storage.core2_store import Queue2Row
from latticed.storage.core2_verify import verify_queue2
from latticed.storage.corruption import CorruptQueueError
from latticed.storage.entries import StoredEntries
from latticed.storage.live import LiveCache
from latticed.storage.reader import Columns, RawRow, StoreReader, columns_of
from latticed.storage.wiring import OwnerFence


class AheadValues(Protocol):
    """Replication's live pushes verified on the event loop whose merge is pending
    (:class:`~latticed.net.core2_ahead.AheadPushes`)."""

    def value(self, q: int, loaded: QueueState2 | None = None) -> QueueState2 | None: ...


class Core2ViewHost(Core2Host, Protocol):
    """What the view uses of the engine beyond :class:`Core2Host`."""

    @property
    def public_key(self) -> bytes: ...

    @property
    def live(self) -> LiveCache: ...


__all__ = ["Core2View", "frozen_since_ms", "recover_hint"]

#: How many group commits a conversion waits for one that does not also write the queue on core 1.
_CONVERT_TRIES: Final = 100


def recover_hint(name: str) -> str:
    return f"latticectl queue recover {name}"


def frozen_since_ms(state: QueueState2) -> int | None:
    """When a forked queue froze, as far as its heads tell: the newest head either branch signed (no
    record signed later is accepted by any replica). None if not forked."""
    if not state.forked:
        return None
    return max(tip.head.timestamp for tip in state.chains.tips)


def epoch_start(state: QueueState2) -> int:
    """Where the newest epoch's own records begin: the end of its first head (the fork point its owner
    recovered from), 0 in epoch 0. A reader that read past it in an older epoch read records the recovery
    abandoned, even if it never saw the queue frozen (the Spark source checks this on restart)."""
    chains = state.chains
    if chains.epoch == 0:
        return 0
    if chains.shared:
        return chains.shared[0][1]
    return min((tip.leaves()[0][1] for tip in chains.tips), default=0)


class Core2View(Core2Engine):
    """The engine's core-2 queues on the event loop (see the module docstring)."""

    def __init__(self, engine: Core2ViewHost, queues: Core2Queues, fence: OwnerFence) -> None:
        super().__init__(engine)
        self._host = engine
        self._queues = queues
        self._fence = fence
        self._public_key = engine.public_key
        self._repairing = trio.Lock()  # ``queue repair``'s drops, one at a time (:meth:`drop_corrupt`)
        #: Called on the event loop with each committed core-2 value (None: dropped), after the queue's
        #: waiters were woken: replication's pushes subscribe here.
        self.on_change: Callable[[int, QueueState2 | None], None] | None = None
        #: Further listeners of core-2 commits (the groups service: new records in a source; our queue dropped
        #: by `queue repair --drop` coming back).
        self.listeners: tuple[Callable[[int, QueueState2 | None], None], ...] = (self._maybe_back,)
        #: Live pushes verified on the event loop whose merge is pending (set by replication): a live
        #: tail shows their records before the commit (:meth:`ahead_columns`).
        self.ahead: AheadValues | None = None

    @contextmanager
    def subscribed(self, listener: Callable[[int, QueueState2 | None], None]) -> Iterator[None]:
        """``listener`` hears of every core-2 commit (after :attr:`on_change`) while the block runs."""
        self.listeners = (*self.listeners, listener)
        try:
            yield
        finally:
            listeners = list(self.listeners)
            listeners.remove(listener)
            self.listeners = tuple(listeners)

    # ------------------------------------------------------------------ which queues
    def holds(self, q: int) -> bool:
        """Whether ``q`` is a committed core-2 queue."""
        return self._queues.committed_row(q) is not None

    def lookup(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> int | None:
        return self._queues.committed_q(queue_id(owner, name, kind))

    def row(self, q: int) -> Queue2Row:
        """``q``'s committed row; NotFoundError if it is not on core 2 (dropped while a request held it)."""
        row = self._queues.committed_row(q)
        if row is None:
            raise NotFoundError(f"queue #{q} is not on core 2")
        return row

    def address(self, q: int) -> str:
        row = self.row(q)
        return f"{row.owner.hex()}/{row.name}"

    def owned(self, q: int) -> bool:
        return self.row(q).owner == self._public_key

    def queues(self, kind: int = KIND_QUEUE) -> list[int]:
        return [q for q in self._queues.queues() if (r := self._queues.committed_row(q)) and r.kind == kind]

    def changed(self, q: int) -> trio.Event:
        """Set at the next commit of ``q`` (take it before reading the value it is to follow)."""
        return self._host.live.changed(q)

    def followed(self, q: int) -> bool:
        """Whether a tail or a group here waits for ``q``'s next commit (it sees only committed values)."""
        return self._host.live.followed(q)

    async def load_all(self) -> None:
        """Load every core-2 queue's committed value (on the storage thread), so that what reads loaded
        values only (:meth:`forked_entries`, a scrape) sees them all; later ones load as they commit.
        A queue found corrupt is left out (logged, and listed by :meth:`corrupt_entries`)."""
        for kind in QueueKind:
            for q in self.queues(kind):
                with contextlib.suppress(CorruptQueueError):
                    await self.value(q)

    def corrupt_entries(self) -> list[dict[str, Any]]:
        """``doctor``'s facts: the queues whose stored value was found not to be what its owner signed."""
        return self._queues.corrupt.entries(self._public_key)

    async def corrupt_error(self, q: int) -> CorruptQueueError | None:
        """Why ``q`` is corrupt (loading it first if it was not loaded yet); None if it is not."""
        try:
            await self.value(q)
        except CorruptQueueError as exc:
            return exc
        return None

    async def stored_bounds(self, q: int) -> tuple[int, int] | None:
        """The records stored for ``q`` as they lie, whatever its heads say: first and end offset (None:
        none). What dropping a corrupt queue deletes."""
        found: tuple[int, int] | None = await self._engine.bridge.read(
            lambda reader: segments.bounds(reader.conn, q)
        )
        return found

    def _maybe_back(self, _q: int, state: QueueState2 | None) -> None:
        """A commit of our queue dropped by ``queue repair --drop``: remembered no more once it is back."""
        if self._fence.dropped and state is not None and state.owner == self._public_key:
            self._fence.dropped.back(state.name, state.kind, state.held[1])

    async def drop_corrupt(self, q: int, end: int) -> bool:
        """``queue repair``'s drop of ``q`` if it is still there and corrupt (False: it is not, two
        repairs raced); our own is first remembered durably as dropped at ``end``
        (:mod:`latticed.storage.dropped_own`), so that it takes no write until it is back. One at a time."""
        async with self._repairing:
            try:
                row = self.row(q)
                if await self.corrupt_error(q) is None:
                    return False
            except NotFoundError:
                return False
            if row.owner == self._public_key:
                await trio.to_thread.run_sync(self._fence.dropped.remember, row.name, row.kind, end)
            await self.drop(q)
            return True

    async def release_dropped(self, name: str) -> int | None:
        """``queue repair NAME --release``: our dropped queue ``name`` may be written again (no peer
        holds it); the end it was dropped at, None if it was not."""
        end: int | None = await trio.to_thread.run_sync(self._fence.dropped.release, name)
        return end

    def forked_entries(self) -> list[dict[str, Any]]:
        """``status``'s ``forked_queues`` entries of the frozen core-2 queues among the loaded values
        (every one once :meth:`load_all` ran): the one list status, doctor and metrics read."""
        out = []
        for kind in QueueKind:
            for q in self.queues(kind):
                state = self._queues.loaded(q)
                if state is not None and state.forked:
                    out.append(self.fork_entry(q, state))
        return out

    def fork_entry(self, q: int, state: QueueState2) -> dict[str, Any]:
        """A frozen core-2 queue as ``status`` lists forks (core 1's fields, and where and when it froze)."""
        owned = self.owned(q)
        return {
            "queue": self.address(q),
            "kind": QueueKind(state.kind).name.lower(),
            "proof": None,
            "owned": owned,
            "core": 2,
            "fork_point": state.chains.fork_point,
            "frozen_since_ms": frozen_since_ms(state),
            "recover": recover_hint(state.name) if owned else None,
        }

    def held_end_now(self, q: int) -> int | None:
        """Where ``q`` ends as far as its loaded value says, without waiting (None: not loaded yet)."""
        loaded = self._queues.loaded(q)
        return None if loaded is None else loaded.held[1]

    def loaded(self, q: int) -> QueueState2 | None:
        """``q``'s newest committed value if loaded already (None: :meth:`value` loads it)."""
        return self._queues.loaded(q)

    def loaded_lookup(self) -> Callable[[int], QueueState2 | None]:
        """:meth:`loaded` as one C call, for a scan of every queue."""
        return self._queues.loaded_lookup()

    async def value(self, q: int) -> QueueState2:
        """``q``'s newest committed value (loaded on the storage thread the first time)."""
        loaded = self._queues.loaded(q)
        return loaded if loaded is not None else await self.state(q)

    def went_ahead(self, q: int) -> None:
        """A verified live push of ``q`` is on its way to the disk: wake the live tails (they show it)."""
        self._host.live.wake(q)

    def ahead_columns(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """For a live tail: records from ``lo`` (the committed end or past it) of verified live pushes
        still on their way to the disk, from memory (empty: none there, or any doubt). They are the
        owner's signed records at those offsets, verified against the value they extend: what this
        replica stores there, now or after a crash and a catch-up, is the same, unless the owner forked
        the queue, which a tail is told of as for committed records (storage/ahead.py is core 1's)."""
        loaded = self._queues.loaded(q)
        ahead = self.ahead
        value = None if ahead is None or loaded is None or loaded.forked else ahead.value(q, loaded)
        if value is None or loaded is None or max_records <= 0:
            return Columns()
        first, end = loaded.held[1], value.held[1]
        entries = value.entries
        if not first <= lo < end or not isinstance(entries, StoredEntries) or value.forked:
            return Columns()
        written = entries.lo + entries.stored  # rows before it are on disk: not read here
        records, _ = entries.overlay
        if lo < written or value.chains.epoch != loaded.chains.epoch:
            return Columns()
        try:  # both in memory (a value's last stored chain value is cached); any doubt: nothing
            same = first == value.held[0] or value.chain_at(first) == loaded.chain_at(first)
        except Exception:
            same = False
        if not same:
            return Columns()
        return columns_of(written, records, lo, hi, max_records=max_records, max_bytes=max_bytes)

    # ------------------------------------------------------------------ the owner's writes
    def _check_fence(self, owner: bytes, name: str, kind: int, held_end: int, what: str) -> None:
        reason = self._fence.reason_of(owner, name, kind, held_end)
        if reason is not None:
            raise BehindPeersError(f"cannot {what} {owner.hex()}/{name} yet: {reason}")

    def require_owner(self, q: int, what: str) -> None:
        """NotOwnerError unless we own ``q``; BehindPeersError while the owner fence holds it."""
        row = self.row(q)
        if row.owner != self._public_key:
            raise NotOwnerError(f"cannot {what}: not the owner of {self.address(q)}")
        loaded = self._queues.loaded(q)  # not loaded yet: judged as holding nothing (the safe side)
        self._check_fence(row.owner, row.name, row.kind, 0 if loaded is None else loaded.held[1], what)

    async def create_queue(self, name: str, meta: Mapping[str, str] | None, kind: int = KIND_QUEUE) -> int:
        if (gone := self._fence.creating(name, kind)) is not None:
            raise BehindPeersError(f"cannot create {self._public_key.hex()}/{name} yet: {gone}")
        self._check_fence(self._public_key, name, kind, 0, "create")
        return await self.create(name, meta, kind)

    def start_commit(
        self,
        q: int,
        records: Sequence[Record],
        meta: Mapping[str, str | None] | None = None,
        *,
        checked: bool = False,
    ) -> Commit2:
        """Queue the owner's records for the next group commit; its first offset is ``await outcome``.
        A frozen queue refuses them in the job (ForkedQueueError)."""
        self.require_owner(q, "offer" if records else "set metadata")
        return self._engine.bridge.start(Commit2(q, records, meta, checked=checked))

    async def recover_queue(self, q: int, *, keep_mine: bool = False) -> int:
        self.require_owner(q, "recover")
        return await self.recover(q, keep_mine=keep_mine)

    async def upgrade_core1(
        self, q: int, state: QueueState, *, recover: bool = False, keep_mine: bool = False
    ) -> tuple[int, int]:
        """Convert our core-1 queue ``q`` (committed as ``state``) to core 2 (:class:`UpgradeQueue`);
        returns what it holds then. A group commit that also writes it on core 1 defers it to the next."""
        if state.owner != self._public_key:
            raise NotOwnerError(f"cannot convert {state.owner.hex()}/{state.name}: not its owner")
        self._check_fence(state.owner, state.name, state.kind, state.held_end, "convert")
        for _ in range(_CONVERT_TRIES - 1):
            try:
                return cast(
                    tuple[int, int], await self._run(UpgradeQueue(q, recover=recover, keep_mine=keep_mine))
                )
            except ConversionBusyError:
                await trio.lowlevel.checkpoint()
        return cast(tuple[int, int], await self._run(UpgradeQueue(q, recover=recover, keep_mine=keep_mine)))

    async def truncate_queue(self, q: int, new_start: int) -> int:
        self.require_owner(q, "truncate")
        return await self.truncate(q, new_start)

    # ------------------------------------------------------------------ reads
    async def read(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns:
        """Committed records in ``[lo, hi)`` clamped to what the queue holds, bounded as core 1's."""
        start, end = (await self.value(q)).held
        lo, hi = max(lo, start), min(hi, end)
        if hi <= lo or max_records <= 0:
            return Columns()
        columns: Columns = await self._engine.bridge.read(
            lambda r: r.columns(q, lo, hi, max_records, max_bytes)
        )
        return columns

    async def read_row(self, q: int, offset: int) -> RawRow | None:
        start, end = (await self.value(q)).held
        if not start <= offset < end:
            return None
        row: RawRow | None = await self._engine.bridge.read(lambda reader: reader.row(q, offset))
        return row

    async def verify_stored(self, q: int) -> int:
        """Re-check a stored core-2 queue against its owner's signatures, on a reader."""
        state = await self.value(q)

        def check(reader: StoreReader) -> int:
            return verify_queue2(reader.conn, q, reading_through(state, reader.rows))

        checked: int = await self._engine.bridge.read(check)
        return checked

    def info(self, q: int, state: QueueState2) -> dict[str, Any]:
        """``queue info``'s fields of a core-2 queue (what core 1 shows, plus core, epoch, fork point)."""
        row = self.row(q)
        chains = state.chains
        lo, hi = state.held
        tips = chains.tips
        info: dict[str, Any] = {
            "owner": row.owner.hex(),
            "name": row.name,
            "queue": self.address(q),
            "core": 2,
            "epoch": chains.epoch,
            "epoch_start": epoch_start(state),
            "start_offset": lo,
            "end_offset": hi,
            "size": hi - lo,
            "meta": dict(state.meta),
            "forked": state.forked,
            "fork_point": chains.fork_point,
            "frozen_since_ms": frozen_since_ms(state),
            "known_end": max((t.head.end for t in tips), default=hi),
            "version": max((t.head.version for t in tips), default=0),
            "owned": row.owner == self._public_key,
            "created_ms": row.created_ms,
            "sealed": None,
        }
        return info
