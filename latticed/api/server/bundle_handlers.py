"""``bundle_want``, ``bundle_export`` and ``bundle_import``: the daemon's side of ``latticectl bundle``.

The file never touches a path the daemon opens for the client: an export streams to the client as
``data`` frames, an import streams from it the same way, so the CLI and the daemon may run as different
users and the daemon reads nothing the client could not have sent it.

An import is two passes. The first spools the bytes into a private file in the data directory while it
decodes every section and verifies every delta exactly as a peer's (``verify_delta``), and the file's own
digest and signature at its end: a bundle damaged anywhere is refused before anything is merged. The
second reads the spool back, verifies each delta again (what the merge path takes is a ``VerifiedDelta``)
and merges it as replication's catch-up does, several in flight. Memory stays at a few sections whatever
the size; the spool is unlinked as soon as it is made, so it never outlives the import.
"""

from __future__ import annotations

import collections
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

import trio

from latticed.api.messages import arg_bytes, error_reply, unpack
from latticed.api.server.context import Context, Handler, Reply, Request, StreamHandler
from latticed.bundle.format import BundleReader, BundleWriter, LogKey, decode_want, encode_want
from latticed.bundle.plan import lacks, records_lacking, selected, worth_writing
from latticed.crdt.head import QueueKind
from latticed.crdt.queue import QueueDelta, QueueState, Summary, VerifiedDelta
from latticed.crdt.signing import Identity
from latticed.errors import (
    GapError,
    IntegrityError,
    LatticedError,
    MalformedError,
    NotFoundError,
    TamperedError,
)
from latticed.process.logs import get_logger, log_event
from latticed.protocol.replication import held_after
from latticed.storage.jobs import Merge

if TYPE_CHECKING:
    from latticed.api.server.connection import Connection

log = get_logger(__name__)

#: Bounds of one delta chunk in a bundle (replication's catch-up chunk, larger: a file has no window).
CHUNK_RECORDS: Final = 16_384
CHUNK_BYTES: Final = 4 << 20
#: Bytes of the file per ``data`` frame, both ways.
DATA_FRAME_BYTES: Final = 1 << 20
#: Merges submitted ahead of the one awaited (the storage thread joins them in order, verifying goes on).
MERGES_IN_FLIGHT: Final = 4
#: How often an import reports how far its merge got.
PROGRESS_EVERY_S: Final = 0.5


class BundleStore(Protocol):
    """What bundles use of the engine: its replica side (as replication does) and its identity."""

    identity: Identity

    def queues(self, kind: int = ...) -> list[int]: ...

    def state(self, q: int) -> QueueState: ...

    async def delta_for(
        self,
        owner: bytes,
        name: str,
        since: Summary | None,
        max_records: int | None = None,
        kind: int = ...,
        *,
        max_bytes: int | None = None,
    ) -> QueueDelta: ...

    async def verify_delta(self, delta: QueueDelta) -> VerifiedDelta: ...

    def submit_merge(self, verified: VerifiedDelta, origin: object = None) -> Merge: ...

    async def merged(self, job: Merge) -> Merge: ...

    def clock(self) -> int: ...


def _store(ctx: Context) -> BundleStore:
    return cast(BundleStore, ctx.engine)


def holdings(engine: BundleStore) -> dict[LogKey, Summary]:
    """Every log this daemon holds with a signed head, by key."""
    out: dict[LogKey, Summary] = {}
    for kind in QueueKind:
        for q in engine.queues(kind):
            state = engine.state(q)
            if state.head is not None:
                out[(state.owner, state.name, state.kind)] = state.summary()
    return out


async def bundle_want(ctx: Context, request: Request) -> Reply:
    engine = _store(ctx)
    held = holdings(engine)
    return {"want": encode_want(engine.identity.public_key, held), "logs": len(held)}


def _patterns(request: Request) -> list[str]:
    raw = request.get("select", [])
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise MalformedError("'select' is a list of names or glob patterns")
    return raw


async def bundle_export(ctx: Context, conn: Connection, request: Request) -> bool:
    """Stream a bundle to the client: a first frame with what it will carry, ``data`` frames, ``done``."""
    rid = request.get("id")
    engine = _store(ctx)
    patterns = _patterns(request)
    raw_want = arg_bytes(request, "want", optional=True)
    want = decode_want(raw_want) if raw_want is not None else None
    theirs = want.holds if want is not None else {}
    plan = [
        (key, ours)
        for key, ours in holdings(engine).items()
        if selected(patterns, key[0], key[1]) and lacks(ours, theirs.get(key))
    ]
    total = sum(records_lacking(ours, theirs.get(key)) for key, ours in plan)
    # Bundles carry core-1 logs only: the core-2 queues selected are named, never silently missing.
    core2 = ctx.engine.core2
    left_out = [
        core2.address(q) for q in core2.queues() if selected(patterns, core2.row(q).owner, core2.row(q).name)
    ]
    first: dict[str, object] = {"id": rid, "ok": True, "logs": len(plan), "total_records": total}
    await conn.send({**first, "core2_left_out": left_out} if left_out else first)
    writer = BundleWriter(engine.identity, engine.clock(), incremental=want is not None)
    out = bytearray(writer.start())
    written = 0
    logs = 0

    async def flush(at_least: int) -> None:
        nonlocal out, written
        while len(out) >= at_least and out:
            piece = bytes(out[:DATA_FRAME_BYTES])
            del out[:DATA_FRAME_BYTES]
            written += len(piece)
            await conn.send({"id": rid, "ok": True, "data": piece, "records": writer.records})

    for key, ours in plan:
        owner, name, kind = key
        since = theirs.get(key)
        wrote = False
        while True:
            try:
                delta = await engine.delta_for(owner, name, since, CHUNK_RECORDS, kind, max_bytes=CHUNK_BYTES)
            except NotFoundError:
                break
            if not worth_writing(delta, since):
                break
            out += writer.delta(delta)
            wrote = True
            await flush(DATA_FRAME_BYTES)
            after = held_after(delta, since)
            if not delta.records or after == since or after.held_end >= ours.held_end:
                break
            since = after
        logs += wrote
    out += writer.finish()
    await flush(1)
    log_event(log, "bundle.exported", logs=logs, records=writer.records, bytes=written)
    await conn.send(
        {"id": rid, "ok": True, "done": True, "logs": logs, "records": writer.records, "bytes": written}
    )
    return True


# ------------------------------------------------------------------------------------------ import


class _Spool:
    """The bundle's bytes as they came, in a private file of the data directory, unlinked as soon as it
    is made: only this open descriptor reaches it, and nothing is left behind however the import ends
    (the daemon killed included); its space is freed when it is closed."""

    def __init__(self, data_dir: Path) -> None:
        fd, name = tempfile.mkstemp(prefix=".bundle-import-", suffix=".tmp", dir=data_dir)
        try:
            os.unlink(name)
        except OSError:
            os.close(fd)
            raise
        self.file = os.fdopen(fd, "w+b")

    def close(self) -> None:
        self.file.close()


async def _receive_into(conn: Connection, spool: _Spool, reader: BundleReader, engine: BundleStore) -> int:
    """Pass one: every ``data`` frame into the spool and the reader, each delta verified; the records'
    count once the client says ``end`` and the bundle's own end checked out."""
    while True:
        frame = await conn.receive_frame()
        if frame is None:
            raise TamperedError("the client left before the end of the bundle")
        message = unpack(frame)
        if not isinstance(message, dict):
            raise MalformedError("a bundle_import frame is a map with 'data' or 'end'")
        if message.get("end") is True:
            end = reader.close()
            return end.records
        data = message.get("data")
        if not isinstance(data, bytes):
            raise MalformedError("a bundle_import frame is a map with 'data' (bytes) or 'end'")
        await trio.to_thread.run_sync(spool.file.write, data)
        # Decoding a few MiB of sections is off the event loop too.
        for section in await trio.to_thread.run_sync(reader.feed, data):
            if isinstance(section, QueueDelta):
                await _verified(engine, section)


async def _verified(engine: BundleStore, delta: QueueDelta) -> VerifiedDelta:
    try:
        return await engine.verify_delta(delta)
    except (IntegrityError, MalformedError) as exc:
        who = f"{delta.owner.hex()}/{delta.name}"
        raise TamperedError(
            f"a delta of {who} [{delta.from_offset}, {delta.end_offset}) does not verify: {exc}"
        ) from exc


class _Merges:
    """Pass two's pipeline: verified deltas submitted in order, at most MERGES_IN_FLIGHT awaited later."""

    def __init__(self, engine: BundleStore) -> None:
        self.engine = engine
        self.jobs: collections.deque[tuple[Merge, LogKey, int]] = collections.deque()
        self.records = 0
        self.changed = 0
        self.logs: set[LogKey] = set()
        #: Logs whose deltas did not connect to what this daemon holds: the rest of them is skipped.
        self.skipped: dict[LogKey, str] = {}

    async def submit(self, delta: QueueDelta) -> None:
        key = (delta.owner, delta.name, delta.kind)
        if key in self.skipped:
            return
        verified = await _verified(self.engine, delta)
        self.jobs.append((self.engine.submit_merge(verified, origin="bundle"), key, len(delta.records)))
        while len(self.jobs) > MERGES_IN_FLIGHT:
            await self.settle_one()

    async def settle_one(self) -> None:
        job, key, records = self.jobs.popleft()
        try:
            await self.engine.merged(job)
        except GapError as exc:
            self.skipped.setdefault(key, str(exc))
            return
        self.records += records
        self.logs.add(key)
        self.changed += job.changed

    async def drain(self) -> None:
        while self.jobs:
            await self.settle_one()


async def bundle_import(ctx: Context, conn: Connection, request: Request) -> bool:
    """Receive a bundle (``data`` frames, then ``end``), verify all of it, then merge it; progress frames
    while merging, then ``done``. Any failure is one error reply and the connection closes (the client may
    still be sending)."""
    rid = request.get("id")
    engine = _store(ctx)
    spool = await trio.to_thread.run_sync(_Spool, ctx.data_dir)
    try:
        try:
            total = await _receive_into(conn, spool, BundleReader(), engine)
            merges = await _merge_spool(conn, rid, spool, engine, total)
        except LatticedError as exc:
            log_event(log, "bundle.refused", level=30, error=str(exc))
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, LatticedError):
                await conn.send(error_reply(rid, exc))
            return False
    finally:
        await trio.to_thread.run_sync(spool.close)
    skipped = [
        {"log": f"{o.hex()}/{n}", "kind": k, "reason": why} for (o, n, k), why in merges.skipped.items()
    ]
    log_event(log, "bundle.imported", logs=len(merges.logs), records=merges.records, changed=merges.changed)
    await conn.send(
        {
            "id": rid,
            "ok": True,
            "done": True,
            "logs": len(merges.logs),
            "records": merges.records,
            "changed": merges.changed,
            "skipped": skipped,
        }
    )
    return True


async def _merge_spool(conn: Connection, rid: Any, spool: _Spool, engine: BundleStore, total: int) -> _Merges:
    """Pass two: the spool read back through a fresh reader, each delta verified again and merged."""
    await trio.to_thread.run_sync(spool.file.seek, 0)
    reader = BundleReader()
    merges = _Merges(engine)
    last = time.monotonic()
    while True:
        data = await trio.to_thread.run_sync(spool.file.read, DATA_FRAME_BYTES)
        if not data:
            break
        for section in await trio.to_thread.run_sync(reader.feed, data):
            if isinstance(section, QueueDelta):
                await merges.submit(section)
        if time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            await conn.send({"id": rid, "ok": True, "progress": merges.records, "total_records": total})
    reader.close()
    await merges.drain()
    return merges


OPS: dict[str, Handler] = {"bundle_want": bundle_want}
STREAMS: dict[str, StreamHandler] = {"bundle_export": bundle_export, "bundle_import": bundle_import}

__all__ = ["OPS", "STREAMS", "BundleStore", "bundle_export", "bundle_import", "bundle_want", "holdings"]
