"""The storage thread's core-2 queues: their committed values, and what one group commit stages for them.

Beside the core-1 :class:`~latticed.storage.batch.Batch`, the writer keeps one :class:`Core2Queues`. A
group commit :meth:`~Core2Queues.begin`\\ s a staging area, its jobs (:mod:`latticed.storage.core2_jobs`)
stage values in it, the owner's appends to one queue are signed together as one head
(:meth:`~Core2Queues.sign_pending`), :meth:`~Core2Queues.write` writes the difference in the batch's
transaction, and only once that committed (WAL fsynced) does :meth:`~Core2Queues.publish` make the new
values current and the jobs' callers get their answers. A failed batch leaves the committed values as
they were: the next one begins afresh.

A value is loaded from the store the first time a job or a read needs it (:func:`core2_store.load`), not
when the store opens. Everything here runs on the storage thread (its values read through the writer's
connection).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, cast

from latticed.crdt import queue2
from latticed.crdt.queue.state import EntryView
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record, RecordRun
from latticed.crdt.signing import Identity
from latticed.errors import NotFoundError
from latticed.storage import core2_fresh, core2_store
from latticed.storage.core2_store import Queue2Row
from latticed.storage.corruption import CorruptQueueError, CorruptQueues
from latticed.storage.entries import StoredEntries
from latticed.storage.store import Store

__all__ = ["Change2", "Core2Queues", "core2_of"]


@dataclass(frozen=True, slots=True)
class Change2:
    """A core-2 queue changed by a committed batch: its new value (None: dropped). What tails wake on
    and what the event loop's readers take as the queue's newest value."""

    q: int
    state: QueueState2 | None


@dataclass(slots=True)
class _Staged:
    before: QueueState2
    state: QueueState2
    appends: list[Sequence[Record]] = field(default_factory=list)
    appended: int = 0
    meta: dict[str, str | None] = field(default_factory=dict)
    #: The end ``state`` holds, and the value it was read from: a batch of single offers asks for it
    #: at each one while ``state`` stays the same object (its pending appends are not signed yet).
    end_of: QueueState2 | None = None
    held_end: int = 0
    #: The value a job found we may sign the next head of (:meth:`Core2Queues.vouch`): the owner's
    #: checks are about the value, so the batch's next offers to it need not repeat them.
    owned: QueueState2 | None = None

    def end(self) -> int:
        """The end of ``state`` plus the appends pending on it."""
        if self.end_of is not self.state:
            self.end_of, self.held_end = self.state, self.state.held[1]
        return self.held_end + self.appended


def _joined(parts: list[Sequence[Record]]) -> Sequence[Record]:
    if len(parts) == 1:
        return parts[0]
    if all(type(part) is RecordRun for part in parts):
        return RecordRun.join(parts)  # type: ignore[arg-type]
    return [record for part in parts for record in part]


class _Core2Writer(Protocol):
    core2: Core2Queues


def core2_of(writer: object) -> Core2Queues:
    """A job's writer's core-2 queues (the storage thread's :class:`~latticed.storage.writer.Writer` has
    them; jobs see the writer through the narrower :class:`~latticed.storage.jobs.WriterView`)."""
    return cast(_Core2Writer, writer).core2


class Core2Queues:
    """Core-2 queues of one store, on the storage thread (see the module docstring)."""

    #: Whether a merge places a fresh replica's new queue straight from its verified delta and the
    #: group commit writes such queues together (:mod:`latticed.storage.core2_fresh`); off: the generic
    #: path (tests and bench/bench_fresh_merge.py compare the two).
    fresh_batched: bool = True

    def __init__(self) -> None:
        self._store: Store | None = None
        self._rows: dict[int, Queue2Row] = {}
        self._values: dict[int, QueueState2] = {}
        self._by_qid: dict[bytes, int] = {}
        # One group commit's staging (reset by begin).
        self._identity: Identity | None = None
        self._now_ms = 0
        self._allocate: Callable[[], int] | None = None
        self._staged: dict[int, _Staged] = {}
        self._new: dict[int, Queue2Row] = {}
        #: The queues created (or converted) in this staging by id, so :meth:`find` does not scan them.
        self._staged_qids: dict[bytes, int] = {}
        #: New queues staged with their first value (:meth:`create`'s ``first``), each with whether that
        #: value's records begin where the queue's empty run does (the generic join appends them to the
        #: stored run then, and replaces it otherwise: :meth:`Store.append_new` notes the runs alike).
        self._fresh: dict[int, bool] = {}
        self._evidence: list[tuple[int, int, int, tuple[Record, ...]]] = []
        self._drops: set[int] = set()
        self._written: dict[int, QueueState2] = {}
        #: Core-1 queues this batch converts (latticed/storage/core1_convert.py), and those the last
        #: published batch converted (the writer then forgets them as core-1 queues).
        self._converting: dict[int, Queue2Row] = {}
        self.converted: list[int] = []
        #: Whether the last write deleted rows (the writer then gives space back).
        self.deleted = False
        #: Queues whose stored value was found not to be what their owner signed (kept across reloads).
        self.corrupt = CorruptQueues()

    # ------------------------------------------------------------------ committed values
    def open(self, store: Store) -> None:
        """Read which core-2 queues the store holds (their values load on first use)."""
        self._store = store
        for row in core2_store.index(store):
            self._rows[row.q] = row
            self._by_qid[row.queue_id] = row.q

    def reload(self, store: Store) -> None:
        """Forget every value and staged change and read the index again (the writer's repair after
        publishing a commit failed halfway). Readers elsewhere see the rows swapped in whole, and values
        not loaded (None: they are loaded on the storage thread), never a stale one."""
        rows = {row.q: row for row in core2_store.index(store)}
        self.abort()
        self.converted = []
        self._values.clear()  # in place: ``loaded_lookup`` hands out its ``get``
        self._rows = rows
        self._by_qid = {row.queue_id: q for q, row in rows.items()}
        self._store = store

    @property
    def store(self) -> Store:
        assert self._store is not None, "core-2 queues are not open"
        return self._store

    def find(self, qid: bytes) -> int | None:
        """The number of the core-2 queue with id ``qid`` (committed, or created in this batch)."""
        q = self._by_qid.get(qid)
        return self._staged_qids.get(qid) if q is None else q

    def queues(self) -> list[int]:
        return sorted(self._rows)

    def committed_q(self, qid: bytes) -> int | None:
        """The number of the committed core-2 queue with id ``qid`` (safe off the storage thread: it
        reads only what :meth:`publish` replaced)."""
        return self._by_qid.get(qid)

    def committed_row(self, q: int) -> Queue2Row | None:
        """``q``'s row if it is a committed core-2 queue (safe off the storage thread)."""
        return self._rows.get(q)

    def loaded(self, q: int) -> QueueState2 | None:
        """``q``'s committed value if loaded (safe off the storage thread; None: load it there)."""
        return self._values.get(q)

    def loaded_lookup(self) -> Callable[[int], QueueState2 | None]:
        """:meth:`loaded` as one C call (the committed values' ``dict.get``: the dict is only ever
        updated in place), for a scan of every queue (``queue list``)."""
        return self._values.get

    def row(self, q: int) -> Queue2Row:
        row = self._rows.get(q) or self._new.get(q) or self._converting.get(q)
        if row is None:
            raise NotFoundError(f"no core-2 queue #{q}")
        return row

    def committed(self, q: int) -> QueueState2:
        """The newest committed value of ``q`` (loaded from the store on first use). CorruptQueueError
        for a queue whose stored value is not what its owner signed (found at its load, raised again at
        each use: it is neither served nor merged into)."""
        value = self._values.get(q)
        if value is None:
            row = self._rows.get(q)
            if row is None:
                raise NotFoundError(f"no core-2 queue #{q} (committed)")
            if (corrupt := self.corrupt.error(q)) is not None:
                raise corrupt
            try:
                value = self._values[q] = core2_store.load(self.store, row)
            except CorruptQueueError as exc:
                self.corrupt.found(q, f"{row.owner.hex()}/{row.name}", exc)
                raise
        return value

    # ------------------------------------------------------------------ one group commit
    def begin(self, identity: Identity, now_ms: int, allocate: Callable[[], int]) -> None:
        self._identity, self._now_ms, self._allocate = identity, now_ms, allocate
        self.abort()
        self.converted = []
        self.deleted = False

    @property
    def identity(self) -> Identity:
        assert self._identity is not None, "no batch begun"
        return self._identity

    @property
    def now_ms(self) -> int:
        return self._now_ms

    @property
    def pending(self) -> bool:
        """Whether this batch has anything to write."""
        return bool(self._new or self._evidence or self._drops or self._converting) or any(
            s.state is not s.before or s.appends or s.meta for s in self._staged.values()
        )

    def _stage(self, q: int) -> _Staged:
        staged = self._staged.get(q)
        if staged is None:
            if q in self._drops:
                raise NotFoundError(f"core-2 queue #{q} is being dropped")
            value = self.committed(q)
            staged = self._staged[q] = _Staged(value, value)
        return staged

    def state(self, q: int) -> QueueState2:
        """``q``'s value with everything staged so far (pending appends signed first)."""
        return self._flush(q)

    def peek(self, q: int) -> QueueState2:
        """``q``'s staged value without its pending appends (nothing is signed)."""
        return self._stage(q).state

    def end(self, q: int) -> int:
        return self._stage(q).end()

    def vouched(self, q: int) -> QueueState2 | None:
        """``q``'s staged value if :meth:`vouch` was called for that very value in this batch."""
        staged = self._stage(q)
        return staged.state if staged.owned is staged.state else None

    def vouch(self, q: int, state: QueueState2) -> None:
        """Note that the owner's checks passed for ``state``, ``q``'s staged value (pending appends
        unsigned): they are not repeated for it in this batch."""
        self._stage(q).owned = state

    def create(self, state: QueueState2, first: Callable[[int], QueueState2] | None = None) -> int:
        """Stage a new queue (``state`` empty); returns its number. ``first``: the queue's first value
        given its number (a fresh replica's, placed from a verified delta: :func:`core2_fresh.as_queue`),
        staged at once and written with the batch's other such queues (:meth:`_write_new`)."""
        assert self._allocate is not None
        q = self._allocate()
        row = Queue2Row(q, state.queue_id, state.owner, state.name, state.kind, self._now_ms)
        empty = replace(state, entries=cast(EntryView, StoredEntries(self.store.rows, q, state.held[0], 0)))
        self._new[q] = row
        self._staged_qids[row.queue_id] = q
        placed = empty if first is None else first(q)
        self._staged[q] = _Staged(empty, placed)
        if first is not None:
            self._fresh[q] = placed.held[0] == empty.held[0]
        return q

    def convert(self, row: Queue2Row, before: QueueState2, state: QueueState2) -> None:
        """Stage core-1 queue ``row.q`` as a core-2 one: ``before`` holds nothing but reads its core-1
        records as stored, ``state`` is its first core-2 value (records it keeps are cut from those)."""
        self._converting[row.q] = row
        self._staged_qids[row.queue_id] = row.q
        self._staged[row.q] = _Staged(before, state)

    def append(self, q: int, records: Sequence[Record], meta: Mapping[str, str | None]) -> int:
        """Stage the owner's records and metadata changes (checked); returns the first offset."""
        staged = self._stage(q)
        first = staged.end()
        if records:
            staged.appends.append(records)
            staged.appended += len(records)
        staged.meta.update(meta)
        return first

    def set(self, q: int, state: QueueState2) -> None:
        """Stage ``state`` as ``q``'s new value (pending appends were signed into it)."""
        self._stage(q).state = state

    def keep_evidence(self, q: int, epoch: int, first: int, records: Sequence[Record]) -> None:
        if records:
            self._evidence.append((q, epoch, first, tuple(records)))

    def drop(self, q: int) -> None:
        """Stage ``q``'s deletion: NotFoundError if it is not committed. A queue found corrupt may be
        dropped (its peers send it again whole): the way out that keeps the store's other queues."""
        with contextlib.suppress(CorruptQueueError):
            self.committed(q)
        self._staged.pop(q, None)
        self._drops.add(q)

    def sign_pending(self) -> None:
        """Sign every queue's pending appends and metadata (one head per queue per batch)."""
        for q in list(self._staged):
            self._flush(q)

    def _flush(self, q: int) -> QueueState2:
        staged = self._stage(q)
        if staged.appends or staged.meta:
            records = _joined(staged.appends) if staged.appends else ()
            staged.state = queue2.commit(
                staged.state,
                self.identity,
                now_ms=self._now_ms,
                records=records,
                meta_updates=staged.meta or None,
            )
            staged.appends, staged.appended, staged.meta = [], 0, {}
        return staged.state

    def write(self) -> None:
        """Write the staged changes in the writer's open transaction."""
        store = self.store
        done = self._write_new(store) if self._fresh else frozenset()
        if len(done) < len(self._new):
            new = [
                (q, self._staged[q].before, row.created_ms) for q, row in self._new.items() if q not in done
            ]
            core2_store.insert_many(store, new)
        for q in self._converting:
            core2_store.adopt(store, q, self._staged[q].before)
        for q, staged in self._staged.items():
            if staged.state is not staged.before and q not in done:
                self._written[q], deleted = core2_store.persist(store, q, staged.before, staged.state)
                self.deleted = self.deleted or deleted
        for q, epoch, first, records in self._evidence:
            core2_store.add_evidence(store, q, epoch, first, records)
        for q in self._drops:
            core2_store.drop(store, q, None if self.corrupt.error(q) is not None else self.committed(q))
            self.deleted = True

    def _write_new(self, store: Store) -> frozenset[int]:
        """Write the new queues staged with their first value together (those still as
        :func:`core2_fresh.writable` takes them: the rest go the generic way); returns their numbers."""
        fresh = [
            (q, state, self._new[q].created_ms)
            for q in self._new
            if q in self._fresh and core2_fresh.writable(store, q, state := self._staged[q].state)
        ]
        if not fresh:
            return frozenset()
        appended = frozenset(q for q, _, _ in fresh if self._fresh[q])
        for (q, _, _), written in zip(fresh, core2_fresh.write_new(store, fresh, appended), strict=True):
            self._written[q] = written
        return frozenset(q for q, _, _ in fresh)

    def changes(self) -> list[Change2]:
        """The queues this batch's write changed (their written values; None: dropped). Taken before
        :meth:`publish`, so that listeners hear of a committed batch even if publishing it fails."""
        return [Change2(q, value) for q, value in self._written.items()] + [
            Change2(q, None) for q in self._drops
        ]

    def publish(self) -> None:
        """After the transaction committed: the written values become the committed ones. The changes
        are the writer's to take first (:meth:`changes`), once a batch: built here again, they cost a
        second object a queue written (a fresh replica's batches write thousands)."""
        for q, row in self._new.items():
            self._rows[q] = row
            self._by_qid[row.queue_id] = q
            self._values.setdefault(q, self._staged[q].before)
        self._values.update(self._written)
        for q, row in self._converting.items():
            self._rows[q] = row
            self._by_qid[row.queue_id] = q
            self._values.setdefault(q, self._staged[q].state)
        self.converted = list(self._converting)
        for q in self._drops:
            row = self._rows.pop(q)
            self._by_qid.pop(row.queue_id, None)
            self._values.pop(q, None)
            self.corrupt.forget(q)  # dropped: no longer named by doctor
        self.abort()

    def abort(self) -> None:
        """Forget this batch's staging (its transaction did not commit: a failed batch; also once
        published): the committed values stay as they were, and :meth:`find` no longer names its queues."""
        self._staged, self._new, self._evidence, self._drops, self._written = {}, {}, [], set(), {}
        self._converting, self._staged_qids, self._fresh = {}, {}, {}
