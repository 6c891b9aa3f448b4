"""Write jobs: what the async side asks the storage thread to do, one small object per request.

Each job validates first and only then changes the :class:`~latticed.storage.batch.Batch`, so a bad job
fails alone and the rest of its group commit goes ahead. ``result`` is meaningful only once the batch's
transaction committed (the writer then sets ``error`` to None and signals completion).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV, queue_id
from latticed.crdt.kvplan import KvRequest, plan
from latticed.crdt.queue import QueueState, Summary, VerifiedDelta
from latticed.crdt.records import Record, check_records
from latticed.errors import AlreadyExistsError, LatticedError, MalformedError
from latticed.host.retention_policy import KEYS as RETENTION_KEYS
from latticed.storage.batch import Batch
from latticed.storage.core2_queues import core2_of
from latticed.storage.store import Store

KV_NAMESPACE = "kv"


class KvSealing(Protocol):
    """How the storage thread opens the ops of sealed KV namespaces (set by latticed/storage/sealer.py)."""

    def fold_ops(
        self, ns: int, state: QueueState, appended: Sequence[Record], read: Callable[[int, int], list[Record]]
    ) -> Sequence[Record]:
        """The ops to fold after a join: ``appended`` opened, or the whole log (``read(lo, hi)``) opened
        when this daemon was given keys it lacked; ops it cannot open are left out."""
        ...

    def open_ops(self, ns: int, state: QueueState, records: Sequence[Record]) -> list[Record | None]:
        """Each record opened (None: it cannot be); records of a namespace that is not sealed as they are."""
        ...


class WriterView(Protocol):
    """What a job may use of the storage thread's writer (it runs there, inside its transaction). A
    Protocol, so jobs do not import the writer that imports them."""

    @property
    def store(self) -> Store: ...

    #: The newest HLC our own KV writes used (the next one must be later).
    kv_hlc: int

    #: Opens sealed KV ops (None: no sealer installed; a sealed namespace is then not compacted).
    kv_sealing: KvSealing | None

    def lookup(self, qid: bytes) -> int | None:
        """The local number of the queue with this id, if we hold it."""
        ...


@dataclass(frozen=True, slots=True)
class Submitter:
    """A job's waiter-side fields (see :class:`Job`), given to every job started while
    :func:`submitting` holds it: they are then set before the storage thread can see the job, where
    assigned after its start the storage thread might read ``prepare`` or ``origin`` before them."""

    notify: Callable[[], None] | None = None
    prepare: Callable[[], None] | None = None
    origin: object = None


#: Read by ``StorageBridge.start``; per task (a context variable), so no other task's jobs get it.
SUBMITTER: ContextVar[Submitter | None] = ContextVar("latticed_submitter", default=None)


@contextlib.contextmanager
def submitting(submitter: Submitter) -> Iterator[None]:
    """Jobs started in this block (by this task) carry ``submitter``'s fields from their start."""
    token = SUBMITTER.set(submitter)
    try:
        yield
    finally:
        SUBMITTER.reset(token)


class Job:
    """Base of every write job; ``done`` is called (on the writer thread) after commit or failure."""

    __slots__ = ("done", "error", "may_linger", "notify", "origin", "prepare", "result")

    def __init__(self) -> None:
        self.result: Any = None
        self.error: LatticedError | None = None
        self.done: Any = None  # set by the submitter: whatever it waits on (a trio.Event)
        #: Called (on the event loop) right after ``done`` is set, for a waiter that waits on more than
        #: this job (an API connection waits for its next request or any of its commits).
        self.notify: Callable[[], None] | None = None
        #: Called (on the event loop) while the job's batch is being committed (its ``COMMIT``, the
        #: fsync, under way), before it is known to succeed: a waiter may build its reply from ``result``
        #: meanwhile, the event loop being idle then, but sends it only after ``done`` (the commit may
        #: still fail: ``error`` is set then, and a retried batch sets a new ``result``). Called once per
        #: batch for each distinct callback: one shared by several jobs prepares all of them.
        self.prepare: Callable[[], None] | None = None
        #: Who submitted it (a connection, a peer), if it may have more jobs in flight: the group commit
        #: counts concurrent writers, and one that pipelines is still one writer.
        self.origin: object = None
        #: Nobody but a peer's ACK waits for this commit (a live push already served ahead of it), so it
        #: may wait a little for company: see :data:`latticed.storage.writer.MERGE_LINGER_S`.
        self.may_linger = False

    #: Whether this job may use the disk reserve when the disk is full (latticed/storage/reserve.py): only
    #: jobs that make room (dropping records, a retention change that will) and write little themselves.
    frees_space = False

    def apply(self, batch: Batch, writer: WriterView) -> None:
        raise NotImplementedError


class CreateQueue(Job):
    """A new queue we own, with its first signed head (version 1) carrying the initial metadata."""

    __slots__ = ("kind", "meta", "name")

    def __init__(self, name: str, meta: Mapping[str, str] | None = None, kind: int = 0) -> None:
        super().__init__()
        self.name = name
        self.meta = dict(meta or {})
        self.kind = kind

    def apply(self, batch: Batch, writer: WriterView) -> None:
        owner = batch.identity.public_key
        state = core.empty_state(owner, self.name, self.kind)
        for key, value in self.meta.items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise MalformedError("metadata is a map of non-empty text keys to text values")
        qid = state.queue_id
        if (
            writer.lookup(qid) is not None
            or qid in batch.created_qids
            or core2_of(writer).find(qid) is not None
        ):
            raise AlreadyExistsError(f"queue {owner.hex()}/{self.name} already exists")
        q = batch.create(state, writer.store.empty_view)
        batch.set_meta(q, self.meta, sign=True)  # version 1, even without metadata: the queue has a head
        self.result = q


class Append(Job):
    """Records for one owned queue; ``result`` is the first offset assigned.

    ``checked=True`` says the caller already enforced :func:`check_record` (the API does, while it builds
    the records), so the storage thread does not repeat that per-record work."""

    __slots__ = ("checked", "q", "records")

    def __init__(self, q: int, records: Sequence[Record], *, checked: bool = False) -> None:
        super().__init__()
        self.q = q
        self.records = records
        self.checked = checked

    def apply(self, batch: Batch, writer: WriterView) -> None:
        batch.require_owner(self.q, "offer")
        if not self.checked:
            check_records(self.records)
        self.result = batch.append(self.q, self.records)


class AppendMany(Job):
    """Records for several owned queues in one transaction (a work-queue group commit: dead letters and
    progress ops land together or not at all); ``result`` is the first offset assigned in each."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[tuple[int, Sequence[Record]]]) -> None:
        super().__init__()
        self.parts = parts

    def apply(self, batch: Batch, writer: WriterView) -> None:
        for q, records in self.parts:
            batch.require_owner(q, "offer")
            check_records(records)
        self.result = [batch.append(q, records) for q, records in self.parts]


class Truncate(Job):
    __slots__ = ("new_start", "q")
    frees_space = True

    def __init__(self, q: int, new_start: int) -> None:
        super().__init__()
        self.q = q
        self.new_start = new_start

    def apply(self, batch: Batch, writer: WriterView) -> None:
        batch.require_owner(self.q, "truncate")
        if self.new_start < 0:
            raise MalformedError("offsets are non-negative")
        batch.truncate(self.q, self.new_start)


class DropLocal(Job):
    """Drop a replica's records below ``floor`` here only (retention's replica cap); ``result`` is the
    first offset held afterwards."""

    __slots__ = ("floor", "q")
    frees_space = True

    def __init__(self, q: int, floor: int) -> None:
        super().__init__()
        self.q = q
        self.floor = floor

    def apply(self, batch: Batch, writer: WriterView) -> None:
        self.result = batch.drop_local(self.q, self.floor).start


class SetMeta(Job):
    __slots__ = ("frees_space", "q", "updates")

    def __init__(self, q: int, updates: Mapping[str, str | None]) -> None:
        super().__init__()
        self.q = q
        self.updates = dict(updates)
        #: A retention change is how a full disk is meant to be fixed, so it may use the reserve.
        self.frees_space = bool(self.updates) and all(key in RETENTION_KEYS for key in self.updates)

    def apply(self, batch: Batch, writer: WriterView) -> None:
        batch.require_owner(self.q, "set metadata")
        for key, value in self.updates.items():
            if not isinstance(key, str) or not key or not (value is None or isinstance(value, str)):
                raise MalformedError("metadata keys are non-empty text; values are text or nil")
        batch.set_meta(self.q, self.updates)


class Merge(Job):
    """Join a verified delta from a peer (creating the replica if we had none); ``result`` is the q,
    ``summary`` what the replica holds right after this join and ``changed`` whether the join changed it
    (both meaningful once committed: several merges of one queue may share a transaction)."""

    __slots__ = ("added", "ahead", "changed", "summary", "verified")

    def __init__(self, verified: VerifiedDelta) -> None:
        super().__init__()
        self.verified = verified
        self.summary: Summary | None = None
        self.changed = False
        #: Records this join added to what the replica holds (for the per-peer replication metrics).
        self.added = 0
        #: Set when submitted, if its records are served ahead of the commit (ahead.py): what the replica
        #: will hold once it commits.
        self.ahead: Summary | None = None

    def apply(self, batch: Batch, writer: WriterView) -> None:
        d = self.verified.delta
        qid = queue_id(d.owner, d.name, d.kind)
        q = writer.lookup(qid)
        if q is None:
            q = batch.created_qids.get(qid)
        if q is None and (q2 := core2_of(writer).find(qid)) is not None:
            # On fork core 2 here (its owner converted it): a v1 history (a 0.2.0 peer's) is not merged,
            # and is acknowledged as what it sends, so that peer keeps it where it is and the link goes on.
            self.result, self.changed = q2, False
            self.summary = core.join_verified(
                core.empty_state(d.owner, d.name, d.kind), self.verified
            ).summary()
            return
        if q is None:
            empty = core.empty_state(d.owner, d.name, d.kind)
            core.join_verified(empty, self.verified)  # raises GapError before we create anything
            q = batch.create(empty, writer.store.empty_view)
            before, proof = Summary(), None
        else:
            held = batch.state(q)
            before, proof = held.summary(), held.fork
        joined = batch.join(q, self.verified)
        after = joined.summary()
        self.result = q
        self.summary = after
        # A frozen queue's summary stays put while its proof improves: that is news too.
        self.changed = after != before or joined.fork != proof
        self.added = max(0, after.held_end - max(before.held_end, after.start))


class KvWrite(Job):
    """A write to our own KV namespace; ``result`` is what the API answers (incr's new total)."""

    __slots__ = ("request",)

    def __init__(self, request: KvRequest) -> None:
        super().__init__()
        self.request = request

    def apply(self, batch: Batch, writer: WriterView) -> None:
        owner = batch.identity.public_key
        qid = queue_id(owner, KV_NAMESPACE, KIND_KV)
        ns = writer.lookup(qid)
        if ns is None:
            ns = batch.created_qids.get(qid)
        else:
            batch.require_owner(ns, "write to")  # refused before anything changes: only this job fails
        key = self.request.key
        current = batch.kv_entry(ns, key)
        hlc = kv.hlc_next(writer.kv_hlc, batch.now_ms)
        op, result = plan(self.request, current, batch.now_ms, hlc)
        self.result = result
        if op is None:
            return
        if ns is None:
            ns = batch.create(core.empty_state(owner, KV_NAMESPACE, KIND_KV), writer.store.empty_view)
        writer.kv_hlc = hlc
        entry = kv.op_entry(op)
        batch.put_kv(ns, key, entry if current is None else kv.join_entry(current, entry))
        batch.append(ns, (Record(op.encode(), key.encode(), batch.now_ms),))


class Call(Job):
    """Run a function on the storage thread inside a batch (maintenance, tests)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Batch, WriterView], Any]) -> None:
        super().__init__()
        self.fn = fn

    def apply(self, batch: Batch, writer: WriterView) -> None:
        self.result = self.fn(batch, writer)


__all__ = [
    "KV_NAMESPACE",
    "SUBMITTER",
    "Append",
    "AppendMany",
    "Call",
    "CreateQueue",
    "DropLocal",
    "Job",
    "KvSealing",
    "KvWrite",
    "Merge",
    "SetMeta",
    "Submitter",
    "Truncate",
    "submitting",
]
