"""What this node holds, as one replica among its peers: queue states and their addresses, and the
verify-then-merge path for a peer's delta, and the deltas a peer lacks.

Every node is a replica of each queue it holds, its own included; :class:`~latticed.storage.engine.Engine`
adds what only the owner does (signed writes, behind the owner fence) and the local API's reads. The
states come from the storage thread's published values (committed only, in memory); records are read on
the pool, or taken from the :class:`~latticed.storage.live.LiveCache` when it holds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Final

import trio

from latticed.crdt import queue as core
from latticed.crdt.head import KIND_QUEUE, check_name, fresh_queue_id, queue_id
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.crdt.records import RecordRun
from latticed.crdt.signing import Identity, parse_public_key
from latticed.errors import (
    GapError,
    IntegrityError,
    LatticedError,
    MalformedError,
    NotFoundError,
    OtherCoreError,
    StorageError,
)
from latticed.storage.ahead import VerifiedAhead
from latticed.storage.bridge import StorageBridge
from latticed.storage.entries import SqlRows, StoredEntries
from latticed.storage.jobs import Merge
from latticed.storage.live import LiveCache
from latticed.storage.reader import StoreReader
from latticed.storage.verify import verify_queue
from latticed.storage.writer import StorageMetrics, Writer

ADDRESS_CACHE_SIZE: Final = 4096
#: A peer's delta this small is verified on the event loop (see :meth:`ReplicaView.verify_delta`).
INLINE_VERIFY_RECORDS: Final = 64
INLINE_VERIFY_BYTES: Final = 64 * 1024


class ReplicaView:
    """Queue states, addressing, and joining and serving deltas; all methods run on the event loop."""

    def __init__(
        self,
        writer: Writer,
        bridge: StorageBridge,
        live: LiveCache,
        identity: Identity,
        metrics: StorageMetrics | None = None,
    ) -> None:
        self._writer = writer
        #: Hears of every verification failure (off when None).
        self._metrics = metrics
        #: The storage thread's bridge (jobs, reads; :meth:`StorageBridge.hold` for tests).
        self.bridge = bridge
        #: The live-push cache this view and the engine feed (tests look at it through its methods).
        self.live = live
        bridge.on_reload = live.reset  # after a stale spell: wake every waiter, keep nothing cached
        self.identity = identity
        #: Resolved addresses (a queue's number never changes once it exists; a drop takes its entries
        #: out: :meth:`forget`), so hot requests skip the parsing and hashing of ``resolve``.
        self._addresses: dict[tuple[str, int], int] = {}
        #: Re-checks a stored queue on fork core 2 (the engine's core-2 view sets it).
        self._verify2: Callable[[int], Awaitable[int]] | None = None

    # ------------------------------------------------------------------ addressing and state
    @property
    def public_key(self) -> bytes:
        return self.identity.public_key

    def resolve(self, address: str, kind: int = KIND_QUEUE, *, writing: bool = False) -> int:
        """``NAME`` (ours) or ``OWNER_HEX/NAME`` to the queue's number; if we hold none, the error
        :meth:`not_held` gives (``writing``: the caller is about to write to it)."""
        if not isinstance(address, str):
            raise MalformedError("a queue is addressed as NAME or OWNER_HEX/NAME")
        q = self._addresses.get((address, kind))
        if q is not None:
            return q
        owner, name = self.parse_address(address)
        # Not through queue_id's cache: a client can name any number of queues that do not exist, and
        # the names that do are cached just below.
        qid = fresh_queue_id(owner, name, kind)
        q = self._writer.lookup(qid)
        if q is None:
            q = self._writer.core2.committed_q(qid)  # a queue on fork core 2
        if q is None:
            raise self.not_held(owner, name, kind, writing=writing)
        if len(self._addresses) >= ADDRESS_CACHE_SIZE:
            self._addresses.clear()
        self._addresses[(address, kind)] = q
        return q

    def not_held(self, owner: bytes, name: str, kind: int, *, writing: bool = False) -> LatticedError:
        """What a request naming a queue we hold none of is answered (the engine says more of ours)."""
        return NotFoundError(f"no queue {owner.hex()}/{name}")

    def forget(self, q: int) -> None:
        """Take dropped queue ``q``'s addresses out of the cache (their names find nothing now, or a queue
        created again by the name, under a new number)."""
        self._addresses = {key: n for key, n in self._addresses.items() if n != q}

    def parse_address(self, address: str) -> tuple[bytes, str]:
        if not isinstance(address, str):
            raise MalformedError("a queue is addressed as NAME or OWNER_HEX/NAME")
        owner_hex, sep, name = address.rpartition("/")
        owner = parse_public_key(owner_hex) if sep else self.public_key
        check_name(name)
        return owner, name

    def find(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> int | None:
        return self._writer.lookup(queue_id(owner, name, kind))

    def state(self, q: int) -> QueueState:
        """The newest committed value (never includes uncommitted writes).

        Its heads, metadata, bounds and ``summary()`` are in memory; its records are not, and its entries
        read rows through the storage thread's connection, so do not read records from it here: use the
        engine's ``read`` or ``row``, or :meth:`delta_for`. OtherCoreError for a queue on fork core 2
        (its value is the engine's ``core2.value``); NotFoundError for a number on neither core (one
        taken before its queue was dropped: the client gets ``not_found``, not an internal error)."""
        try:
            return self._writer.states[q]
        except KeyError:
            row = self._writer.core2.committed_row(q)
            if row is None:
                raise NotFoundError(f"no queue #{q} (dropped?)") from None
            raise OtherCoreError(
                f"queue {row.owner.hex()}/{row.name} is on fork core 2, which this operation does not reach"
            ) from None

    def owned(self, q: int) -> bool:
        state = self._writer.states.get(q)
        if state is None and (row := self._writer.core2.committed_row(q)) is not None:
            return row.owner == self.public_key
        return self.state(q).owner == self.public_key

    def address(self, q: int) -> str:
        state = self._writer.states.get(q)
        if state is None and (row := self._writer.core2.committed_row(q)) is not None:
            return f"{row.owner.hex()}/{row.name}"
        state = self.state(q)
        return f"{state.owner.hex()}/{state.name}"

    def created_ms(self, q: int) -> int:
        row = self._writer.core2.committed_row(q)
        return row.created_ms if row is not None else self._writer.created_ms.get(q, 0)

    def queues(self, kind: int = KIND_QUEUE) -> list[int]:
        return [q for q, state in list(self._writer.states.items()) if state.kind == kind]

    def summary(self, owner: bytes, name: str, kind: int = KIND_QUEUE) -> Summary | None:
        q = self.find(owner, name, kind)
        return None if q is None else self.state(q).summary()

    # ------------------------------------------------------------------ a peer's deltas
    async def verify_delta(self, delta: QueueDelta) -> core.VerifiedDelta:
        """Check a peer's delta against its owner's signatures and hash chain, before anything of it is
        stored. A small one (a live push) is checked right here: a thread hop costs more than its one
        signature; anything bigger on a worker thread, off the event loop."""
        verified = self.verify_now(delta)
        if verified is not None:
            return verified
        try:
            base = _empty_state(delta.owner, delta.name, delta.kind)
            verified = await trio.to_thread.run_sync(core.verify_delta, base, delta)
        except (IntegrityError, MalformedError) as exc:
            if self._metrics is not None:
                self._metrics.verification_failed(exc)
            raise
        return verified

    def verify_now(self, delta: QueueDelta) -> core.VerifiedDelta | None:
        """:meth:`verify_delta` of a small delta (a live push), right here; None: one that big is
        checked off the event loop (call :meth:`verify_delta`)."""
        if (
            len(delta.records) > INLINE_VERIFY_RECORDS
            or len(delta.checkpoints) > 1
            or delta.fork is not None
            or core.payload_bytes(delta.records) > INLINE_VERIFY_BYTES
        ):
            return None
        try:
            return core.verify_delta(_empty_state(delta.owner, delta.name, delta.kind), delta)
        except (IntegrityError, MalformedError) as exc:
            if self._metrics is not None:
                self._metrics.verification_failed(exc)
            raise

    def submit_merge(self, verified: core.VerifiedDelta, origin: object = None) -> Merge:
        """Queue the join and write of a verified delta right now; :meth:`merged` waits for it.

        The storage thread takes jobs in the order they were submitted, several per transaction, so a
        caller that submits deltas in order without waiting between them gets them joined in that order
        while it verifies the next ones (a catch-up pipeline). A live push that extends what we hold is
        shown to live tails and relayed before its commit (:meth:`LiveCache.note_ahead`), and its commit
        may then wait a few milliseconds for the next pushes, so that several share one transaction."""
        job = Merge(verified)
        job.origin = origin
        if self.live.may_go_ahead(verified):
            d = verified.delta
            q = self.find(d.owner, d.name, d.kind)
            if q is not None:
                self.live.note_ahead(q, self.state(q), job)
                # Served ahead: tails and relays have it, only the sender's ACK waits for the commit.
                job.may_linger = job.ahead is not None
        self.bridge.start(job)
        return job

    async def merged(self, job: Merge) -> Merge:
        """Wait until ``job``'s transaction committed (so its records are durable); raises its error."""
        await self.bridge.outcome(job)
        return job

    async def merge_delta(self, delta: QueueDelta) -> QueueState:
        """Verify a peer's delta (off the event loop), then join and persist it; wakes tails.

        Raises IntegrityError for anything forged (nothing is stored), GapError when it does not
        connect to what we hold."""
        job = await self.merged(self.submit_merge(await self.verify_delta(delta)))
        q: int = job.result
        return self.state(q)

    def ahead_for(self, owner: bytes, name: str, kind: int, since: Summary | None) -> VerifiedAhead | None:
        """The records ahead of our commit (ahead.py), if a peer summarised by ``since`` is to be served
        from them: it holds at least what we have committed, and we have more on its way to the store."""
        q = self.find(owner, name, kind)
        return None if q is None else self.live.ahead_for(q, self.state(q), since)

    async def delta_for(
        self,
        owner: bytes,
        name: str,
        since: Summary | None,
        max_records: int | None = None,
        kind: int = KIND_QUEUE,
        *,
        max_bytes: int | None = None,
    ) -> QueueDelta:
        """What a replica summarised by ``since`` lacks: from the last commit's records when they are all
        it lacks (:meth:`LiveCache.pushed_delta`), else read from the store on a reader thread."""
        q = self.find(owner, name, kind)
        if q is None:
            raise NotFoundError(f"no queue {owner.hex()}/{name}")
        state = self.state(q)
        pushed = self.live.pushed_delta(q, state, since, max_records, max_bytes)
        if pushed is not None:
            return pushed

        def compute(reader: StoreReader) -> QueueDelta:
            entries = state.entries
            assert isinstance(entries, StoredEntries)
            return core.delta(
                dataclasses.replace(state, entries=entries.rebind(reader.rows)),
                since,
                max_records,
                max_bytes,
                read=lambda lo, hi: _read_run(reader, q, lo, hi),
            )

        result = await self.bridge.read(compute)
        if result.tip is not None:
            self.live.remember_chain(q, result.tip.end, result.tip.head_hash)
        return result

    async def verify(self, q: int) -> int:
        """Re-check a stored queue against its owner's signatures, on a reader (writes go on)."""
        try:
            if self._verify2 is not None and self._writer.core2.committed_row(q) is not None:
                return await self._verify2(q)
            state = self.state(q)
            return await self.bridge.read(lambda r: verify_queue(r.conn, q, state))
        except (IntegrityError, StorageError) as exc:
            if self._metrics is not None:
                self._metrics.verification_failed(exc)
            raise


def _read_run(reader: StoreReader, q: int, lo: int, hi: int) -> RecordRun:
    """Committed records ``[lo, hi)`` of queue ``q`` as a run: the segments' columns, concatenated (what
    a delta sends; no Record object is built)."""
    run = SqlRows(reader.conn).run(q, lo, hi)
    if len(run) != hi - lo:
        # Only a reader racing a truncation can see this: the rows it was promised are gone.
        raise GapError(f"records [{lo}, {hi}) of queue #{q} are no longer all stored (truncated); retry")
    return run


__all__ = ["ADDRESS_CACHE_SIZE", "INLINE_VERIFY_BYTES", "INLINE_VERIFY_RECORDS", "ReplicaView"]


@lru_cache(maxsize=1024)
def _cached_empty_state(owner: bytes, name: str, kind: int) -> QueueState:
    return core.empty_state(owner, name, kind)


def _empty_state(owner: bytes, name: str, kind: int) -> QueueState:
    """The state a peer's delta is verified against (immutable, so one per queue serves every delta of
    it); arguments of other types go to :func:`core.empty_state` uncached, which rejects them as it
    always did. A refused name raises there and is not cached."""
    if type(owner) is bytes and type(name) is str and type(kind) is int:
        return _cached_empty_state(owner, name, kind)
    return core.empty_state(owner, name, kind)
