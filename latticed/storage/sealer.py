"""Sealed queues on this daemon: seal the owner's writes, open records on read, share and unshare.

The cryptography and the metadata layout are pure (:mod:`latticed.privacy`); this binds them to the
engine and to this daemon's identity. The API handlers call it (one call per read or write), so everything
below the API (store, replication, truncation, relaying) only ever sees envelopes.

* **Writes.** The API seals a batch on the event loop with the current epoch's key and 24 random bytes of
  nonce per record, then hands the envelopes to the storage thread in a :class:`SealedAppend` job. A key
  epoch that began in between (an ``unshare`` committed, or staged earlier in the same group commit) is
  seen there: the job seals its records again under the new epoch before they get offsets, so no record at
  or past an epoch's start is sealed under an older key.
* **Reads.** Envelopes are opened with the content keys wrapped to this daemon's identity (each opened once
  and kept in memory). A record sealed under an epoch this identity was not given raises
  :class:`~latticed.errors.NotReaderError`; a bulk read returns the records it can open before the first
  one it cannot, so a reader removed at offset N reads up to N and then gets the error.
* **Epochs.** ``unshare`` starts a new epoch from the queue's end as the storage thread sees it (inside the
  group commit that signs it), wrapped to the remaining readers; ``share`` wraps the current epoch's key
  (optionally every earlier one too) to a new reader. Both run one at a time per queue.
* **KV namespaces.** The owner's ops are sealed in the group commit that plans them (:class:`SealedKvWrite`);
  the storage thread opens a join's ops before folding them into a reader's view, and the ops it compacts
  (:meth:`Sealer.install` hooks both in, see :class:`~latticed.storage.jobs.KvSealing`).

Why one module: :class:`Sealer` binds one identity's keys to the store: sealing writes, opening reads,
``share`` and ``unshare`` all consult the same epoch keys and must agree on which epoch a record belongs to;
the cryptography is pure and lives in :mod:`latticed.privacy`.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

import trio

from latticed.crdt import kv
from latticed.crdt.head import KIND_KV, KIND_QUEUE
from latticed.crdt.kvplan import KvRequest
from latticed.crdt.queue import Meta, QueueState
from latticed.crdt.records import Record, check_records
from latticed.crdt.signing import Identity
from latticed.errors import (
    AlreadyExistsError,
    LatticedError,
    MalformedError,
    NotReaderError,
    OtherCoreError,
    TamperedError,
)
from latticed.privacy import meta as sealed_meta
from latticed.privacy.crypto import (
    NONCE_SIZE,
    decode_inner,
    envelope_epoch,
    open_values,
    seal_run,
    unwrap_content_key,
)
from latticed.privacy.meta import Sealing
from latticed.storage.batch import Batch
from latticed.storage.jobs import KV_NAMESPACE, Append, Job, KvSealing, KvWrite, WriterView
from latticed.storage.reader import Columns, RawRow


class SealableStore(Protocol):
    """What the sealer uses of the engine (:class:`~latticed.storage.engine.Engine`): its plain writes and
    reads, and the owner's seams (ownership and fence checks, starting a sealed job, the storage thread's
    hook for sealed KV ops). A Protocol, so services that seal see no engine class."""

    @property
    def identity(self) -> Identity: ...

    def state(self, q: int) -> QueueState: ...

    def address(self, q: int) -> str: ...

    def kv_namespace(self, owner: bytes | None) -> int | None: ...

    def start_append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> Job: ...

    async def append_many(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> list[int]: ...

    async def outcome(self, job: Job) -> Any: ...

    async def create_queue(
        self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE
    ) -> int: ...

    async def set_meta(self, q: int, updates: Mapping[str, str | None]) -> None: ...

    async def call_in_writer(self, fn: Callable[[Batch, WriterView], Any]) -> Any: ...

    async def kv_write(self, request: KvRequest) -> Any: ...

    async def row(self, q: int, offset: int) -> RawRow | None: ...

    def require_owner(self, q: int, what: str) -> None: ...

    def check_fence(self, q: int, what: str) -> None: ...

    def start_job(self, job: Job) -> Job: ...

    def install_kv_sealing(self, sealing: KvSealing) -> None: ...


class Sealer:
    """This daemon's sealing state: parsed metadata per queue, opened content keys. One per engine: the
    composition root builds it and hands it to everything that seals or opens records."""

    def __init__(self, engine: SealableStore) -> None:
        self.engine = engine
        self.identity = engine.identity
        #: Per queue: the metadata tuple last parsed and what it states (compared by identity: cheap).
        self._parsed: dict[int, tuple[Meta, Sealing | None]] = {}
        #: Wrapped key -> content key, for the wraps to this identity that were opened.
        self._opened: dict[bytes, bytes] = {}
        self._locks: dict[int, trio.Lock] = {}
        #: Per sealed KV namespace held here: the epochs this identity could open when its view was last
        #: folded (storage thread). Unknown after a start, so the first join then folds the whole log.
        self._kv_folded: dict[int, frozenset[int]] = {}

    # ------------------------------------------------------------------ what a queue's metadata states
    def _parse(self, q: int, meta: Meta, owner: bytes) -> Sealing | None:
        found = self._parsed.get(q)
        if found is not None and found[0] is meta:
            return found[1]
        try:
            sealed = any(_is_sealed_key(k) for k, _ in meta)
            sealing = sealed_meta.parse(dict(meta), owner) if sealed else None
        except MalformedError as exc:
            # Committed metadata its owner signed: broken means an integrity problem, not bad usage.
            raise TamperedError(f"{self.engine.address(q)}: {exc}") from exc
        self._parsed[q] = (meta, sealing)
        return sealing

    def sealing(self, q: int) -> Sealing | None:
        """The committed sealing of queue ``q`` (None: not sealed; a queue on fork core 2 never is)."""
        try:
            state = self.engine.state(q)
        except OtherCoreError:
            return None
        return self._parse(q, state.meta, state.owner)

    def _staged_sealing(self, batch: Batch, q: int) -> Sealing | None:
        """The sealing as the group commit being built sees it (storage thread): committed metadata plus
        changes staged by earlier jobs of the batch."""
        staged = batch.staged.get(q)
        state = staged.state if staged is not None else batch.state(q)
        if staged is None or not any(sealed_meta.is_reserved(k) for k in staged.meta):
            return self._parse(q, state.meta, state.owner)
        merged = dict(state.meta)
        for key, value in staged.meta.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return sealed_meta.parse(merged, state.owner)

    def describe(self, q: int) -> dict[str, Any] | None:
        """``queue info``'s view of the sealing (None: not sealed). Broken sealing metadata (signed by a
        broken owner) is shown, not raised, so it cannot stop ``queue list`` of every other queue."""
        try:
            sealing = self.sealing(q)
        except TamperedError as exc:
            return {"error": str(exc), "readable": False}
        return None if sealing is None else sealing.describe(self.identity.public_key)

    def content_key(self, q: int, sealing: Sealing, epoch: int) -> bytes:
        """Epoch ``epoch``'s content key, opened with this identity; NotReaderError if it was not given."""
        if not 0 <= epoch < len(sealing.epochs):
            # Not an epoch we were left out of: one the owner's signed metadata never declared.
            raise TamperedError(
                f"{self.engine.address(q)}: a record is sealed under key epoch {epoch}, which the queue's "
                f"metadata does not declare (epochs 0..{len(sealing.epochs) - 1})"
            )
        wrapped = sealing.epochs[epoch].wraps.get(self.identity.public_key)
        if wrapped is None:
            where = f" (its records from offset {sealing.epochs[epoch].start})"
            what, how = "queue", "queue share"
            if self.engine.state(q).kind == KIND_KV:
                what, how = "KV namespace", "kv share"
            raise NotReaderError(
                f"{what} {self.engine.address(q)} is sealed and this daemon's identity "
                f"{self.identity.public_key.hex()} is not a reader of its key epoch {epoch}{where}: "
                f"its owner can share it with this identity (latticectl {how})"
            )
        key = self._opened.get(wrapped)
        if key is None:
            key = self._opened[wrapped] = unwrap_content_key(wrapped, self.identity)
        return key

    # ------------------------------------------------------------------ writes
    def start_append(self, q: int, records: Sequence[Record]) -> Job:
        """Start the append of ``records`` (checked) to queue ``q``: sealed if the queue is sealed."""
        engine = self.engine
        sealing = self.sealing(q)
        if sealing is None:
            return engine.start_append(q, records, checked=True)
        engine.require_owner(q, "offer")
        return engine.start_job(self.append_job(q, records))

    def append_job(self, q: int, records: Sequence[Record]) -> Job:
        """The job appending ``records`` (checked) to queue ``q``, sealed if it is, not started yet (for a
        job that wraps it: a producer's idempotent append); the caller checks ownership."""
        sealing = self.sealing(q)
        if sealing is None:
            return Append(q, records, checked=True)
        sealed = self._seal(q, sealing, records)
        return SealedAppend(self, q, records, sealed, sealing.current.number)

    async def append_many(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> list[int]:
        """:meth:`Engine.append_many <latticed.storage.engine.Engine.append_many>` (one transaction), with
        the parts of sealed queues sealed."""
        engine = self.engine
        sealed: list[Part] = []
        for q, records in parts:
            sealing = self.sealing(q)
            if sealing is None:
                sealed.append((q, records, None, -1))
            else:
                sealed.append((q, records, self._seal(q, sealing, records), sealing.current.number))
        if all(part[2] is None for part in sealed):
            return await engine.append_many(parts)
        for q, _ in parts:
            engine.require_owner(q, "offer")
        firsts: list[int] = await engine.outcome(engine.start_job(SealedAppendMany(self, sealed)))
        return firsts

    def _seal(self, q: int, sealing: Sealing, records: Sequence[Record]) -> Sequence[Record]:
        epoch = sealing.current.number
        key = self.content_key(q, sealing, epoch)
        qid = self.engine.state(q).queue_id
        return seal_run(key, qid, epoch, records, os.urandom(NONCE_SIZE * len(records)))

    async def create_queue(
        self, name: str, meta: Mapping[str, str], readers: Iterable[bytes], kind: int = KIND_QUEUE
    ) -> int:
        """A new queue of ours, sealed to ``readers`` and its owner from offset 0."""
        check_user_meta(meta)
        me = self.identity.public_key
        content_key = os.urandom(32)
        sealed = sealed_meta.seal_new(me, readers, content_key, os.urandom)
        q = await self.engine.create_queue(name, {**meta, **sealed}, kind)
        self._opened[_own_wrap(sealed, 0, me)] = content_key
        return q

    def _lock(self, q: int) -> trio.Lock:
        lock = self._locks.get(q)
        if lock is None:
            lock = self._locks[q] = trio.Lock()
        return lock

    def _require_sealing(self, q: int, what: str) -> Sealing:
        try:
            self.engine.require_owner(q, what)
        except OtherCoreError:  # a queue on fork core 2 is never sealed
            raise MalformedError(f"cannot {what} {self.engine.address(q)}: it is not sealed") from None
        sealing = self.sealing(q)
        if sealing is None:
            raise MalformedError(f"cannot {what} {self.engine.address(q)}: it is not sealed")
        return sealing

    async def share(self, q: int, reader: bytes, *, history: bool = False) -> list[int]:
        """Give ``reader`` the current epoch's key (``history``: every earlier epoch's too); returns the
        epochs it was newly given (empty: it had them)."""
        async with self._lock(q):
            sealing = self._require_sealing(q, "share")
            numbers = range(len(sealing.epochs)) if history else (sealing.current.number,)
            me = self.identity.public_key
            keys = {n: self.content_key(q, sealing, n) for n in numbers if me in sealing.epochs[n].wraps}
            updates = sealed_meta.share(sealing, reader, keys, os.urandom)
            if updates:
                await self.engine.set_meta(q, updates)
            return sorted(n for n in keys if reader not in sealing.epochs[n].wraps)

    async def unshare(self, q: int, reader: bytes) -> tuple[bool, int, int]:
        """Remove ``reader``: a new key epoch, wrapped to the readers left, from the queue's next offset.
        Returns (whether it was a reader, the current epoch, its first offset)."""
        if reader == self.identity.public_key:
            raise MalformedError("the owner is always a reader of its sealed queue")
        async with self._lock(q):
            sealing = self._require_sealing(q, "unshare")
            if reader not in sealing.readers:
                return False, sealing.current.number, sealing.current.start
            epoch, start = await self.rotate(q, drop=reader)
            return True, epoch, start

    async def rotate(self, q: int, *, drop: bytes | None = None) -> tuple[int, int]:
        """Start a new key epoch at the queue's end (without ``drop`` among its readers); returns the
        epoch and its first offset."""
        self._require_sealing(q, "rotate the key of")
        content_key = os.urandom(32)
        me = self.identity.public_key

        def rotate_in_writer(batch: Batch, writer: WriterView) -> tuple[int, int]:
            batch.require_owner(q, "rotate the key of")
            current = self._staged_sealing(batch, q)
            if current is None:
                raise MalformedError("the queue is not sealed")
            start = batch.end(q)
            updates = sealed_meta.rotate(current, content_key, current.readers - {drop}, start, os.urandom)
            batch.set_meta(q, updates)
            number = current.current.number + 1
            self._opened[_decoded(updates[sealed_meta.wrap_key(number, me)])] = content_key
            return number, start

        result: tuple[int, int] = await self.engine.call_in_writer(rotate_in_writer)
        return result

    # ------------------------------------------------------------------ KV namespaces
    def install(self) -> None:
        """Let the storage thread open sealed KV ops (fold them on a reader, judge them when compacting).
        Called once by the daemon, before replication starts."""
        self.engine.install_kv_sealing(self)

    async def seal_kv(self, readers: Iterable[bytes]) -> int:
        """Create this daemon's KV namespace sealed (only before its first write: its ops so far, in
        plaintext, could not be taken back)."""
        if self.engine.kv_namespace(None) is not None:
            raise AlreadyExistsError(
                "this daemon's KV namespace exists already; a namespace is sealed when it is created, "
                "before its first write"
            )
        return await self.create_queue(KV_NAMESPACE, {}, readers, KIND_KV)

    async def kv_write(self, request: KvRequest) -> Any:
        """:meth:`Engine.kv_write <latticed.storage.engine.Engine.kv_write>`, sealed if our namespace is."""
        engine = self.engine
        ns = engine.kv_namespace(None)
        sealing = None if ns is None else self.sealing(ns)
        if ns is None or sealing is None:
            return await engine.kv_write(request)
        engine.check_fence(ns, "write")
        self.content_key(ns, sealing, sealing.current.number)  # opened here, not on the storage thread
        return await engine.outcome(engine.start_job(SealedKvWrite(self, ns, request)))

    def check_kv(self, owner: bytes | None) -> None:
        """Refuse to read a sealed KV namespace unless this daemon opens every epoch of it: its view is the
        fold of every op, so one epoch it cannot open makes every value suspect (NotReaderError)."""
        ns = self.engine.kv_namespace(owner)
        if ns is None:
            return
        sealing = self.sealing(ns)
        if sealing is None:
            return
        for epoch in sealing.epochs:
            if self.identity.public_key not in epoch.wraps:
                self.content_key(ns, sealing, epoch.number)  # raises NotReaderError

    def fold_ops(
        self, ns: int, state: QueueState, appended: Sequence[Record], read: Callable[[int, int], list[Record]]
    ) -> Sequence[Record]:
        """:class:`~latticed.storage.jobs.KvSealing`: the ops of a join to fold, opened (storage thread)."""
        sealing = self._parse(ns, state.meta, state.owner)
        if sealing is None:
            return appended
        me = self.identity.public_key
        readable = frozenset(e.number for e in sealing.epochs if me in e.wraps)
        folded = self._kv_folded.get(ns)
        if folded is None or not readable <= folded:
            # Keys this view was not folded with (given since, or not known since the start): fold the
            # whole log again; the join makes the ops already in the view harmless.
            appended = read(state.start, state.held_end)
        self._kv_folded[ns] = readable
        return [op for op in self.open_ops(ns, state, appended) if op is not None]

    def open_ops(self, ns: int, state: QueueState, records: Sequence[Record]) -> list[Record | None]:
        """:class:`~latticed.storage.jobs.KvSealing`: each record opened, None where this identity cannot."""
        sealing = self._parse(ns, state.meta, state.owner)
        if sealing is None:
            return list(records)
        me = self.identity.public_key
        readable = {e.number for e in sealing.epochs if me in e.wraps}
        qid = state.queue_id
        out: list[Record | None] = []
        for record in records:
            try:
                epoch = envelope_epoch(record.value)
                if epoch not in readable:
                    out.append(None)
                    continue
                (inner,) = open_values(qid, (record.value,), lambda e: self.content_key(ns, sealing, e))
                op_key, value, headers = decode_inner(inner)
            except LatticedError:  # signed by the owner, yet not an envelope that opens: a broken writer
                out.append(None)
                continue
            out.append(Record(value, op_key, record.timestamp, headers))
        return out

    # ------------------------------------------------------------------ reads
    def open_columns(self, q: int, columns: Columns, *, partial: bool = False) -> Columns:
        """``columns`` with their records opened (unchanged if the queue is not sealed). ``partial``: stop
        before the first record this identity cannot open instead of failing (unless it is the first)."""
        sealing = self.sealing(q)
        if sealing is None or not columns.offsets:
            return columns
        values = columns.values
        me = self.identity.public_key
        readable = {e.number for e in sealing.epochs if me in e.wraps}
        count = len(values)
        for index, value in enumerate(values):
            if envelope_epoch(value) not in readable:
                count = index
                break
        if count < len(values) and (count == 0 or not partial):
            self.content_key(q, sealing, envelope_epoch(values[count]))  # raises NotReaderError
        qid = self.engine.state(q).queue_id
        inner = open_values(qid, values[:count], lambda e: self.content_key(q, sealing, e))
        out = Columns(offsets=columns.offsets[:count], timestamps=columns.timestamps[:count])
        if all(raw[0] == 0 for raw in inner):  # neither keys nor headers: the common case
            out.values = [raw[1:] for raw in inner]
            out.keys = [None] * count
            out.headers = [None] * count
        else:
            for raw in inner:
                key, value, headers = decode_inner(raw)
                out.keys.append(key)
                out.values.append(value)
                out.headers.append([[k, v] for k, v in headers] if headers else None)
        out.nbytes = sum(map(len, out.values))
        return out

    def open_readable(self, q: int, columns: Columns) -> tuple[Columns, list[int]]:
        """``columns`` opened without the records this identity cannot open (a reader removed by
        ``unshare`` still opens the epochs it was given), and the offsets of those left out."""
        sealing = self.sealing(q)
        if sealing is None or not columns.offsets:
            return columns, []
        me = self.identity.public_key
        readable = {e.number for e in sealing.epochs if me in e.wraps}
        keep = [i for i, value in enumerate(columns.values) if envelope_epoch(value) in readable]
        if len(keep) == len(columns):
            return self.open_columns(q, columns), []
        kept = set(keep)
        left_out = [offset for i, offset in enumerate(columns.offsets) if i not in kept]
        subset = Columns(
            offsets=[columns.offsets[i] for i in keep],
            keys=[columns.keys[i] for i in keep],
            values=[columns.values[i] for i in keep],
            timestamps=[columns.timestamps[i] for i in keep],
            headers=[columns.headers[i] for i in keep],
        )
        return self.open_columns(q, subset), left_out

    def open_row(self, q: int, offset: int, row: RawRow | None) -> RawRow | None:
        """One stored row (``engine.row``) opened, if the queue is sealed."""
        if row is None or self.sealing(q) is None:
            return row
        _, value, timestamp, _ = row
        opened = self.open_columns(q, Columns([offset], [None], [value], [timestamp], [None]))
        return opened.keys[0], opened.values[0], timestamp, opened.headers[0]


class SealedKvWrite(KvWrite):
    """A write to our own sealed KV namespace: planned like any (the owner's view is in plaintext), its
    op appended sealed under the namespace's epoch as the group commit sees it."""

    __slots__ = ("ns", "sealer")

    def __init__(self, sealer: Sealer, ns: int, request: KvRequest) -> None:
        super().__init__(request)
        self.sealer = sealer
        self.ns = ns

    def apply(self, batch: Batch, writer: WriterView) -> None:
        # Stamps must grow per key. The writer recovers its last stamp from the log's last op at start, and
        # a sealed op does not decode there, so start above what this key holds (what its join compares).
        writer.kv_hlc = max(writer.kv_hlc, _newest_hlc(batch.kv_entry(self.ns, self.request.key)))
        super().apply(cast(Batch, _SealingBatch(batch, self.sealer, self.ns)), writer)


class _SealingBatch:
    """A :class:`Batch` whose appends to one sealed namespace are sealed first (everything else is the
    batch's own)."""

    def __init__(self, batch: Batch, sealer: Sealer, ns: int) -> None:
        self._batch = batch
        self._sealer = sealer
        self._ns = ns

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def append(self, q: int, records: Sequence[Record]) -> int:
        if q == self._ns:
            sealing = self._sealer._staged_sealing(self._batch, q)
            if sealing is None:
                raise MalformedError("the KV namespace is no longer sealed")  # never, through the API
            records = self._sealer._seal(q, sealing, records)
        return self._batch.append(q, records)


def _newest_hlc(entry: kv.Entry | None) -> int:
    if entry is None:
        return 0
    return max([entry.reset[0], *(stamp[0] for stamp, _ in entry.members.values())])


class SealedAppend(Job):
    """Envelopes for one owned sealed queue; ``result`` is the first offset assigned. If the queue's key
    epoch moved on since they were sealed, the records are sealed again under the new one first."""

    __slots__ = ("epoch", "plain", "q", "sealed", "sealer")

    def __init__(
        self, sealer: Sealer, q: int, plain: Sequence[Record], sealed: Sequence[Record], epoch: int
    ) -> None:
        super().__init__()
        self.sealer = sealer
        self.q = q
        self.plain = plain
        self.sealed = sealed
        self.epoch = epoch

    def apply(self, batch: Batch, writer: WriterView) -> None:
        batch.require_owner(self.q, "offer")
        records = _current(self.sealer, batch, self.q, self.plain, self.sealed, epoch=self.epoch)
        self.result = batch.append(self.q, records)


#: One part of a :class:`SealedAppendMany`: queue, records, their envelopes and epoch (None, -1: not sealed).
Part = tuple[int, Sequence[Record], Sequence[Record] | None, int]


class SealedAppendMany(Job):
    """:class:`~latticed.storage.jobs.AppendMany` with the parts of sealed queues sealed: records for
    several owned queues in one transaction; ``result`` is each part's first offset."""

    __slots__ = ("parts", "sealer")

    def __init__(self, sealer: Sealer, parts: Sequence[Part]) -> None:
        super().__init__()
        self.sealer = sealer
        self.parts = parts

    def apply(self, batch: Batch, writer: WriterView) -> None:
        staged: list[tuple[int, Sequence[Record]]] = []
        for q, plain, sealed, epoch in self.parts:  # everything checked before the batch changes
            batch.require_owner(q, "offer")
            if sealed is None:
                check_records(plain)
                staged.append((q, plain))
            else:
                staged.append((q, _current(self.sealer, batch, q, plain, sealed, epoch=epoch)))
        self.result = [batch.append(q, records) for q, records in staged]


def _current(
    sealer: Sealer, batch: Batch, q: int, plain: Sequence[Record], sealed: Sequence[Record], *, epoch: int
) -> Sequence[Record]:
    """The envelopes to append: as sealed, or sealed again if the epoch changed since (storage thread)."""
    sealing = sealer._staged_sealing(batch, q)
    if sealing is None:
        raise MalformedError("the queue is no longer sealed")  # never, through the API
    if sealing.current.number != epoch:
        return sealer._seal(q, sealing, plain)
    return sealed


def check_user_meta(meta: Mapping[str, Any]) -> None:
    """Refuse metadata keys reserved for sealing (they change only through share/unshare)."""
    for key in meta:
        if isinstance(key, str) and sealed_meta.is_reserved(key):
            raise MalformedError(
                f"metadata key {key!r} is reserved for sealed queues (see queue share/unshare)"
            )


def _is_sealed_key(key: str) -> bool:
    return key == sealed_meta.EPOCH_KEY


def _decoded(text: str) -> bytes:
    return base64.b64decode(text)


def _own_wrap(updates: Mapping[str, str], epoch: int, me: bytes) -> bytes:
    return _decoded(updates[sealed_meta.wrap_key(epoch, me)])


__all__ = [
    "SealableStore",
    "SealedAppend",
    "SealedAppendMany",
    "SealedKvWrite",
    "Sealer",
    "check_user_meta",
]
