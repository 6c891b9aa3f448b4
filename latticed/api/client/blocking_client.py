"""The blocking client of the local API (no trio): used by the CLI and by the Spark source.

One :class:`Client` holds one connection, opened on first use; it is not thread-safe (give each thread
its own). ``tail`` opens a second, dedicated connection, so other calls keep working while a tail runs.
Errors from the daemon are raised as the :mod:`latticed.errors` class whose ``code`` they carry.

Why one module: :class:`Client` is the library's one blocking API, a method per op over the connection class
beside it; split, one class would span files. The work-queue half already lives apart
(:mod:`latticed.api.client.group_client`, mixed in), so what remains is one job.
"""

from __future__ import annotations

import os
import select
import socket
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, NoReturn, Self

import msgpack

from latticed.api.client.bundle_client import BundleOps
from latticed.api.client.group_client import GroupOps, Lease, Subscription
from latticed.api.client.packed_offer import batch_fields
from latticed.api.client.peer_client import PeerOps
from latticed.api.messages import (
    API_VERSION,
    error_from_reply,
    holds_packed,
    is_unknown_op,
    pack,
    version_gap,
)
from latticed.errors import (
    ConnectionClosedError,
    LatticedError,
    MalformedError,
    RemoteProtocolError,
    VersionGapError,
)
from latticed.host.retention_policy import UNCHANGED, RetentionPolicy, Unchanged, policy_meta
from latticed.host.socket_path import default_socket_path
from latticed.protocol.framing import FrameDecoder, encode_frame, frame_header

#: Largest reply the client accepts; the daemon's own limit (``max_frame_bytes``) is normally lower.
CLIENT_MAX_FRAME: Final = 1 << 30
#: Buffers given to one ``sendmsg`` (Linux takes at most 1,024).
_IOV_MAX: Final = 512
_RECEIVE_SIZE: Final = 1 << 18
#: The first read for a reply: under glibc's default ``mmap`` threshold (128 KiB), so that its buffer comes
#: from the heap. A 256 KiB read's buffer is an ``mmap`` and ``munmap`` each reply (~10 us) in a process
#: where nothing has raised that threshold (``msgpack.packb``'s own 256 KiB buffer per call did, by chance).
#: A larger reply's rest is read in :data:`_RECEIVE_SIZE` pieces.
_FIRST_READ: Final = 1 << 16
#: A whole reply up to this size is decoded from a copy of its body: a small reply's copy costs less than
#: the ``memoryview`` made, sliced and released to decode it in place (~0.1 us against ~0.5, of a ~10 us
#: offer); a larger one's copy would cost more.
_SLICE_MAX: Final = 4096
_FRAME_HEADER: Final = struct.Struct(">I")
_HEADER_SIZE: Final = _FRAME_HEADER.size

HeaderPairs = tuple[tuple[str, bytes], ...]

#: ``struct timeval`` as ``SO_RCVTIMEO``/``SO_SNDTIMEO`` take it (two native longs on Linux).
_TIMEVAL: Final = struct.Struct("@ll")


def set_timeout(sock: socket.socket, timeout: float | None) -> None:
    """Bound each blocking send and receive of ``sock`` by ``timeout`` seconds (None: no bound).

    Why not ``sock.settimeout``: Python then polls before every send and every receive (two more
    syscalls and a wake-up registration a request, a real share of a small request's CPU). A blocking
    socket with the kernel's ``SO_RCVTIMEO``/``SO_SNDTIMEO`` waits in the one ``recv``/``send`` instead,
    which fails with ``EAGAIN`` (``BlockingIOError``) when the time runs out, reported as the timeout.
    The bound is per call that waits (a send that keeps making progress is not cut off; a daemon that
    stops reading or answering is). A timeout of 0 or less keeps Python's own non-blocking meaning."""
    if timeout is not None and timeout <= 0:
        sock.settimeout(timeout)
        return
    sock.settimeout(None)
    if timeout is None:
        value = _TIMEVAL.pack(0, 0)  # 0: wait for ever
    else:
        seconds, micros = divmod(max(1, round(timeout * 1e6)), 1_000_000)  # at least 1 us: 0 is for ever
        value = _TIMEVAL.pack(seconds, micros)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


#: Records asked for per ``range`` request by :meth:`Client.range_pages`.
RANGE_PAGE_RECORDS: Final = 10_000


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of a queue, with its absolute offset."""

    queue: str
    offset: int
    key: bytes | None
    value: bytes
    timestamp: int
    headers: HeaderPairs


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """A bulk read as parallel lists (cheap to turn into Arrow arrays).

    ``next_offset`` is where the next read continues; ``start_offset``/``end_offset`` are the queue's
    bounds when the read ran (a first offset above the requested one means records were truncated)."""

    queue: str
    offsets: list[int]
    keys: list[bytes | None]
    values: list[bytes]
    timestamps: list[int]
    headers: list[HeaderPairs]
    next_offset: int
    start_offset: int
    end_offset: int

    def __len__(self) -> int:
        return len(self.offsets)

    def entries(self) -> list[Entry]:
        columns = {
            "offsets": self.offsets,
            "keys": self.keys,
            "values": self.values,
            "timestamps": self.timestamps,
            "headers": self.headers,
        }
        return _entries(self.queue, columns)


def _headers(raw: Any) -> HeaderPairs:
    if not raw:
        return ()
    return tuple((str(k), bytes(v)) for k, v in raw)


def _entries(queue: str, columns: Mapping[str, Any]) -> list[Entry]:
    """Entries from a reply's columns (offsets, keys, values, timestamps, headers)."""
    return [
        Entry(queue, off, key, value, ts, _headers(hdr))
        for off, key, value, ts, hdr in zip(
            columns["offsets"],
            columns["keys"],
            columns["values"],
            columns["timestamps"],
            columns["headers"],
            strict=True,
        )
    ]


def _entry(queue: str, raw: Any) -> Entry | None:
    if raw is None:
        return None
    offset, key, value, ts, headers = raw
    return Entry(queue, offset, key, value, ts, _headers(headers))


def _header_list(headers: Mapping[str, bytes] | Sequence[tuple[str, bytes]] | None) -> list[Any] | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [[k, v] for k, v in items]


def _producing(producer: str | None, seq: int | None, wait: float | None) -> dict[str, Any]:
    """The optional fields of an idempotent or remote offer (none given: the request is as it was)."""
    args: dict[str, Any] = {}
    if producer is not None:
        args["producer"], args["seq"] = producer, 0 if seq is None else seq
    if wait is not None:
        args["wait"] = wait
    return args


@dataclass(frozen=True, slots=True)
class Produced:
    """The answer to an idempotent batch: its offsets, and whether the owner had it already."""

    first: int
    count: int
    duplicate: bool


class _Connection:
    """One socket speaking frames; raises ConnectionClosedError for anything transport-level."""

    def __init__(self, path: Path, timeout: float | None) -> None:
        self.path = path
        self.timeout = timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise ConnectionClosedError(f"latticed is not running at {path}") from exc
        except TimeoutError as exc:
            sock.close()
            raise ConnectionClosedError(f"latticed at {path} did not accept within {timeout}s") from exc
        except OSError as exc:
            sock.close()
            raise ConnectionClosedError(
                f"cannot connect to latticed at {path}: {exc.strerror or exc}"
            ) from exc
        set_timeout(sock, timeout)  # connected: from here on the kernel bounds each wait
        self.sock: socket.socket | None = sock
        self.decoder = FrameDecoder(CLIENT_MAX_FRAME)
        #: A whole reply taken from the decoder by :meth:`reply_ready`, for the next :meth:`receive`.
        self._ready: bytes | None = None
        # Kept per connection (a Packer is not thread-safe; a connection is used by one thread): making
        # one per request, as ``msgpack.packb`` does, costs a 256 KiB buffer's malloc and free each time.
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def send(self, message: dict[str, Any]) -> None:
        """One request: packed, framed and written in one ``sendall`` (the path every call takes)."""
        sock = self.sock
        if sock is None:
            raise ConnectionClosedError("connection to latticed is closed")
        try:
            # messages.pack's bytes: its own packb unless a value is spliced in pre-packed.
            body = pack(message) if holds_packed(message) else self._pack(message)
            data = frame_header(len(body), CLIENT_MAX_FRAME) + body
        except (TypeError, ValueError, OverflowError) as exc:
            raise MalformedError(f"cannot encode request: {exc}") from exc
        try:
            sock.sendall(data)
        except OSError as exc:
            self._lost(exc)

    def send_many(self, messages: Sequence[dict[str, Any]]) -> None:
        """Several requests in one write (pipelining)."""
        if self.sock is None:
            raise ConnectionClosedError("connection to latticed is closed")
        try:
            data = b"".join(encode_frame(pack(m), CLIENT_MAX_FRAME) for m in messages)
        except (TypeError, ValueError, OverflowError) as exc:
            raise MalformedError(f"cannot encode request: {exc}") from exc
        self._write([data])

    def send_buffers(self, buffers: Sequence[bytes | memoryview]) -> None:
        """One request's frame already encoded in parts, written without joining them (``sendmsg``)."""
        if self.sock is None:
            raise ConnectionClosedError("connection to latticed is closed")
        self._write(buffers)

    def _write(self, buffers: Sequence[bytes | memoryview]) -> None:
        assert self.sock is not None
        views = [memoryview(b).cast("B") for b in buffers]
        try:
            while len(views) > 1:
                sent = self.sock.sendmsg(views[:_IOV_MAX])  # as much as the socket takes now
                while views and sent >= len(views[0]):
                    sent -= len(views.pop(0))
                if sent:
                    views[0] = views[0][sent:]
            if views:
                self.sock.sendall(views[0])
        except OSError as exc:
            self._lost(exc)

    def _lost(self, exc: OSError) -> NoReturn:
        """A write failed: closes the connection and raises why, one line for the CLI."""
        # The daemon may have refused the request (e.g. a frame over its limit) and hung up while we
        # were still sending: its error reply is then waiting in our receive buffer.
        reason = self._parting_error()
        self.close()
        if reason is not None:
            raise reason from exc
        if isinstance(exc, TimeoutError | BlockingIOError):  # SO_SNDTIMEO ran out (or settimeout's)
            raise ConnectionClosedError(
                f"latticed at {self.path} did not take the request within {self.timeout}s"
            ) from exc
        raise ConnectionClosedError(f"lost the connection to latticed at {self.path}: {exc}") from exc

    def _parting_error(self) -> LatticedError | None:
        if self.sock is None:
            return None
        try:
            set_timeout(self.sock, 0.5)
            reply = self.receive()
        except LatticedError:
            return None
        return error_from_reply(reply.get("error")) if not reply.get("ok") else None

    def reply_ready(self) -> bool:
        """Whether :meth:`receive` would return (or fail) without waiting: takes what the socket holds
        now, never blocks."""
        if self._ready is not None:
            return True
        decoder = self.decoder
        while True:
            try:
                frame = decoder.next_frame()
            except LatticedError:
                return True  # receive() reports it
            if frame is not None:
                self._ready = frame
                return True
            sock = self.sock
            if sock is None or decoder.eof:
                return True
            try:
                if not select.select([sock], [], [], 0)[0]:
                    return False
                data = sock.recv(_FIRST_READ)
            except OSError:
                return True  # receive() meets it again and reports it
            decoder.receive_data(data)

    def receive(self) -> dict[str, Any]:
        frame = self._ready
        if frame is not None:
            self._ready = None
            return self._decode(frame)
        decoder = self.decoder
        sock = self.sock
        if sock is not None and not decoder.buffered and not decoder.eof:
            # The usual reply: one read brings exactly one whole frame, decoded in place without the
            # decoder's copy and bookkeeping (anything else goes through the decoder, as before).
            try:
                data = sock.recv(_FIRST_READ)
            except OSError as exc:
                self._recv_failed(exc)
            size = len(data)
            if size > _HEADER_SIZE and _FRAME_HEADER.unpack_from(data)[0] == size - _HEADER_SIZE:
                if size <= _SLICE_MAX:
                    return self._decode(data[_HEADER_SIZE:])
                with memoryview(data) as view:
                    return self._decode(view[_HEADER_SIZE:])
            decoder.receive_data(data)
        while True:
            try:
                frame = decoder.next_frame()
            except LatticedError:
                self.close()
                raise
            if frame is not None:
                break
            if self.sock is None or decoder.eof:
                self.close()
                raise ConnectionClosedError(f"latticed at {self.path} closed the connection")
            try:
                data = self.sock.recv(_RECEIVE_SIZE)
            except OSError as exc:
                self._recv_failed(exc)
            decoder.receive_data(data)
        return self._decode(frame)

    def _recv_failed(self, exc: OSError) -> NoReturn:
        self.close()
        if isinstance(exc, TimeoutError | BlockingIOError):  # SO_RCVTIMEO ran out (or settimeout's)
            raise ConnectionClosedError(
                f"latticed at {self.path} did not answer within {self.timeout}s"
            ) from exc
        raise ConnectionClosedError(f"lost the connection to latticed at {self.path}: {exc}") from exc

    def _decode(self, frame: bytes | memoryview) -> dict[str, Any]:
        try:
            reply = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except Exception as exc:
            self.close()
            raise RemoteProtocolError("latticed sent an undecodable reply") from exc
        if not isinstance(reply, dict):
            self.close()
            raise RemoteProtocolError("latticed sent a reply that is not a map")
        return reply


class Client(GroupOps, PeerOps, BundleOps):
    """Blocking access to one latticed daemon over its Unix socket (work-queue calls: :class:`GroupOps`;
    peer management and the checklist: :class:`PeerOps`)."""

    def __init__(
        self, socket_path: str | os.PathLike[str] | None = None, timeout: float | None = 30.0
    ) -> None:
        self._path = Path(socket_path) if socket_path is not None else default_socket_path()
        self._timeout = timeout
        self._conn: _Connection | None = None
        self._next_id = 1
        self._api_versions: tuple[int, ...] | None = None

    @property
    def socket_path(self) -> Path:
        return self._path

    @property
    def timeout(self) -> float | None:
        return self._timeout

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and return the reply's fields (raises the daemon's error as an exception)."""
        if self._conn is None or self._conn.sock is None:
            self._conn = _Connection(self._path, self._timeout)
        rid = self._next_id
        self._next_id = rid + 1
        return self._exchange(op, rid, {"v": API_VERSION, "id": rid, "op": op, **args})

    def _exchange(self, op: str, rid: int, message: dict[str, Any]) -> dict[str, Any]:
        """:meth:`call`'s round trip for ``message`` (request ``rid``, connection open)."""
        conn = self._conn
        assert conn is not None
        conn.send(message)
        reply = conn.receive()
        if not reply.get("ok"):
            if reply.get("id") is None:
                # The daemon could not tell which request failed (a framing error): it hangs up next.
                self.close()
            error = error_from_reply(reply.get("error"))
            if op != "hello" and is_unknown_op(error):
                raise version_gap(op, error, self.call("hello")) from None
            raise error
        if reply.get("id") != rid:
            self.close()
            raise RemoteProtocolError(f"reply for request {reply.get('id')!r} while waiting for {rid}")
        return reply

    def call_waiting(self, op: str, wait: float, /, **args: Any) -> dict[str, Any]:
        """``call`` for a request the daemon may hold up to ``wait`` seconds (the timeout grows by it)."""
        if self._conn is None or self._conn.sock is None:
            self._conn = _Connection(self._path, self._timeout)
        sock = self._conn.sock
        assert sock is not None
        set_timeout(sock, None if self._timeout is None else self._timeout + wait)
        try:
            return self.call(op, **args)
        finally:
            if self._conn is not None and self._conn.sock is not None:
                set_timeout(self._conn.sock, self._timeout)

    def open_stream(self, timeout: float | None) -> _Connection:
        """A new, dedicated connection (tails and subscriptions)."""
        return _Connection(self._path, timeout)

    # ------------------------------------------------------------------ node
    def identity(self) -> str:
        return str(self.call("id")["identity"])

    def api_versions(self) -> tuple[int, ...]:
        """The local API versions the daemon answers (its ``hello``, asked once per client)."""
        if self._api_versions is None:
            versions = self.call("hello").get("versions")
            listed = versions if isinstance(versions, list) else []
            self._api_versions = tuple(v for v in listed if type(v) is int) or (API_VERSION,)
        return self._api_versions

    def versions(self) -> dict[str, Any]:
        """The daemon's release and the wire protocol, store schema and local API versions it speaks."""
        reply = self.call("versions")
        reply.pop("id", None)
        reply.pop("ok", None)
        return reply

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.call("status")["status"]
        return status

    def peers(self) -> list[dict[str, Any]]:
        """Known peers: identity, address, how found, connected?, lag per queue."""
        peers: list[dict[str, Any]] = self.call("peers")["peers"]
        return peers

    def invite(self, addresses: Sequence[str] = ()) -> str:
        """A one-line invite token (a secret: it holds the network key); ``addresses``: HOST:PORT to put
        in it instead of the daemon's listen addresses."""
        return str(self.call("invite", addresses=list(addresses))["token"])

    def join(self, token: str, *, force: bool = False) -> dict[str, Any]:
        """Join an invite token's network; replication restarts under its key
        (latticed.services.membership)."""
        joined: dict[str, Any] = self.call("join", token=token, force=force)["joined"]
        return joined

    # ------------------------------------------------------------------ queues
    def queue_create(
        self,
        name: str,
        meta: Mapping[str, str] | None = None,
        readers: Sequence[str] | None = None,
        *,
        retention: RetentionPolicy | None = None,
        producers: Sequence[str] | None = None,
        core: int | None = None,
    ) -> str:
        """Create one of our queues. With ``readers`` (hex identities, maybe none) a sealed one: only they
        and this daemon's identity read its records (docs/privacy.md); ``retention`` puts its policy in
        the first signed metadata; ``producers`` (identities, or ``["*"]`` for any daemon of the network)
        may offer into it from their daemons. ``core``: its fork core (2: frozen at a fork, recovered by
        its owner; 1: the legacy core a 0.2.0 daemon can receive; docs/lattice.md), None: the daemon's
        ``default_queue_core``. A daemon that cannot create core-2 queues is named before anything is
        created (an older one would ignore the field and create a core-1 queue)."""
        if core is not None and core != 1:
            hello = self.call("hello")
            if not hello.get("queue_cores"):  # a daemon from before fork core 2 (the daemon checks ``core``)
                release = hello.get("release") or "0.2.0 or earlier"
                raise VersionGapError(
                    f"the daemon runs latticed {release}, which cannot create queues on fork core {core} "
                    "(it would make a core-1 queue): upgrade the daemon, or create the queue without --core"
                )
        entries = {**(meta or {}), **(policy_meta(retention) if retention is not None else {})}
        if producers:
            from latticed.produce.policy import producers_meta  # noqa: PLC0415 - json, nacl: not for every call

            entries.update({k: v for k, v in producers_meta(producers).items() if v is not None})
        args: dict[str, Any] = {"name": name, "meta": entries}
        if readers is not None:
            args["readers"] = list(readers)
        if core is not None:
            args["core"] = core
        return str(self.call("queue_create", **args)["queue"])

    def queue_recover(self, queue: str, *, keep_mine: bool = False) -> dict[str, Any]:
        """Continue our forked core-2 queue from its fork point in a new epoch (``keep_mine``: offer again
        the records this daemon held past the fork point); returns ``epoch``, ``start_offset``,
        ``end_offset``."""
        reply = self.call("queue_recover", queue=queue, keep_mine=keep_mine)
        return {k: reply.get(k) for k in ("queue", "epoch", "start_offset", "end_offset")}

    def queue_repair(self, queue: str, *, drop: bool = False, release: bool = False) -> dict[str, Any]:
        """Drop a corrupt core-2 queue here so that replication fetches it again (``drop``: also our own
        queue, whose records no peer holds are lost; ``release``: our queue dropped so may be written again,
        no peer holding it); returns ``queue``, ``owned``, ``repaired`` (false:
        refused, nothing changed), ``records``, ``links_restarted`` and a one-line ``message``."""
        args: dict[str, Any] = {"release": True} if release else {}
        reply = self.call("queue_repair", queue=queue, drop=drop, **args)
        keys = ("queue", "owned", "repaired", "records", "links_restarted", "message")
        return {k: reply.get(k) for k in keys}

    def queue_upgrade(self, queue: str | None = None, *, all_queues: bool = False) -> list[dict[str, Any]]:
        """Convert our core-1 queue (or with ``all_queues`` every one we own) to fork core 2; one entry
        per queue: ``queue``, ``converted``, ``epoch``, ``start_offset``, ``end_offset`` (or ``error``)."""
        args: dict[str, Any] = {"all": True} if all_queues else {"queue": queue}
        queues: list[dict[str, Any]] = self.call("queue_upgrade", **args)["queues"]
        return queues

    def queue_fork_show(self, queue: str, *, limit: int = 10) -> dict[str, Any]:
        """A core-2 queue's fork as this daemon knows it: ``fork_point``, ``branches`` (each one's newest
        head), ``evidence`` (what it held past the fork point: pieces, counts, up to ``limit`` records)."""
        return {
            k: v
            for k, v in self.call("queue_fork_show", queue=queue, limit=limit).items()
            if k not in ("ok", "id")
        }

    def queue_producers(self, queue: str, producers: Sequence[str] | None) -> None:
        """Set who may offer into one of our queues from other daemons (None or empty: nobody)."""
        from latticed.produce.policy import producers_meta  # noqa: PLC0415 - json, nacl: not for every call

        for key, value in producers_meta(producers).items():
            if value is None:
                self.meta_del(queue, key)
            else:
                self.meta_set(queue, key, value)

    def queue_share(self, queue: str, reader: str, *, history: bool = False) -> list[int]:
        """Give ``reader`` the sealed queue's current key epoch (``history``: the earlier ones too);
        returns the epochs it was newly given."""
        epochs: list[int] = self.call("queue_share", queue=queue, reader=reader, history=history)["epochs"]
        return epochs

    def queue_unshare(self, queue: str, reader: str) -> dict[str, Any]:
        """Remove ``reader``: a new key epoch from the queue's next offset (``removed``, ``epoch``,
        ``start``)."""
        reply = self.call("queue_unshare", queue=queue, reader=reader)
        return {k: reply[k] for k in ("removed", "epoch", "start")}

    def queue_list(self) -> list[dict[str, Any]]:
        queues: list[dict[str, Any]] = self.call("queue_list")["queues"]
        return queues

    def queue_info(self, queue: str) -> dict[str, Any]:
        info: dict[str, Any] = self.call("queue_info", queue=queue)["info"]
        return info

    def offer(
        self,
        queue: str,
        value: bytes,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Sequence[tuple[str, bytes]] | None = None,
        *,
        producer: str | None = None,
        seq: int | None = None,
        wait: float | None = None,
    ) -> int:
        """Append one record; ``queue`` may be another daemon's that lists this one as a producer (the
        record goes to its owner, waiting up to ``wait`` seconds for it). ``producer`` and ``seq``: an
        idempotent offer (the same pair again writes nothing more and returns the same offset)."""
        if producer is None and wait is None and self._conn is not None and self._conn.sock is not None:
            # The common single offer, built as one dict in the order :meth:`call` would give it.
            rid = self._next_id
            self._next_id = rid + 1
            message = {"v": API_VERSION, "id": rid, "op": "offer", "queue": queue, "value": value, "key": key}
            message["headers"] = _header_list(headers) if headers else None
            return int(self._exchange("offer", rid, message)["offset"])
        args = _producing(producer, seq, wait)
        args.update(queue=queue, value=value, key=key, headers=_header_list(headers))
        reply = self.call("offer", **args) if wait is None else self.call_waiting("offer", wait, **args)
        return int(reply["offset"])

    def offer_batch(
        self,
        queue: str,
        records: Sequence[tuple[bytes, bytes | None, Sequence[tuple[str, bytes]]]],
        *,
        producer: str | None = None,
        seq: int | None = None,
        wait: float | None = None,
    ) -> list[int]:
        """Many records in one request and one fsync; returns their offsets (see :meth:`offer` for
        ``producer``, ``seq`` and ``wait``)."""
        if not records:
            return []
        args = _producing(producer, seq, wait)
        args.update(queue=queue, **batch_fields(records, self.api_versions()))
        reply = (
            self.call("offer_batch", **args)
            if wait is None
            else self.call_waiting("offer_batch", wait, **args)
        )
        first, count = int(reply["first"]), int(reply["count"])
        return list(range(first, first + count))

    def produce(
        self,
        queue: str,
        records: Sequence[Sequence[Any]],
        *,
        producer: str,
        seq: int,
        shared: bool = False,
        wait: float | None = None,
    ) -> Produced:
        """An idempotent batch: ``records`` are ``(value, key, headers)`` or ``(value, key, headers,
        timestamp_ms)`` (None: the owner's clock). The same ``producer`` and ``seq`` again writes nothing
        and answers as the first time did, with ``duplicate`` set. ``shared``: the producer id is the
        queue's, the same whichever daemon sends it (docs/producers.md), as for a Spark task that may
        be retried on another host."""
        args: dict[str, Any] = {"queue": queue, "producer": producer, "seq": seq}
        args.update(batch_fields(records, self.api_versions()))
        if shared:
            args["shared"] = True
        if wait is not None:
            args["wait"] = wait
        reply = (
            self.call("offer_batch", **args)
            if wait is None
            else self.call_waiting("offer_batch", wait, **args)
        )
        return Produced(int(reply["first"]), int(reply["count"]), bool(reply.get("duplicate")))

    def peek(self, queue: str, offset: int) -> bytes | None:
        value = self.call("peek", queue=queue, offset=offset)["value"]
        return None if value is None else bytes(value)

    def peek_entry(self, queue: str, offset: int) -> Entry | None:
        reply = self.call("peek_entry", queue=queue, offset=offset)
        return _entry(reply["queue"], reply["entry"])

    def first(self, queue: str) -> Entry | None:
        reply = self.call("first", queue=queue)
        return _entry(reply["queue"], reply["entry"])

    def last(self, queue: str) -> Entry | None:
        reply = self.call("last", queue=queue)
        return _entry(reply["queue"], reply["entry"])

    def offsets_for_times(self, queue: str, ts_ms: int) -> tuple[int, int] | None:
        """Kafka's ``offsetsForTimes`` for one queue: ``(offset, timestamp)`` of the first record held by
        the daemon whose timestamp (ms since the epoch; the owner's clock at offer) is at or after
        ``ts_ms``, or None when none is yet (docs/operations.md, "Reading by time")."""
        reply = self.call("offsets_for_times", queue=queue, timestamp=ts_ms)
        offset = reply.get("offset")
        return None if offset is None else (int(offset), int(reply["timestamp"]))

    def range(self, queue: str, from_offset: int, to_offset: int) -> list[Entry]:
        """Records ``[from_offset, to_offset]`` (inclusive), clamped to what the queue holds."""
        r = self.call("range", queue=queue, **{"from": from_offset, "to": to_offset})
        return _entries(r["queue"], r)

    def range_readable(
        self, queue: str, from_offset: int, to_offset: int
    ) -> tuple[list[Entry], list[tuple[int, int]]]:
        """:meth:`range` without the records of a sealed queue this identity cannot open (say, a reader
        removed by ``unshare`` reads the epochs it was given): the entries, and the ``(first, last)`` runs
        of offsets left out. A daemon that does not know the option fails the range as before (exit 13)."""
        r = self.call("range", queue=queue, skip_unreadable=True, **{"from": from_offset, "to": to_offset})
        return _entries(r["queue"], r), [(int(a), int(b)) for a, b in r.get("unreadable", ())]

    def range_pages(
        self,
        queue: str,
        from_offset: int,
        to_offset: int,
        *,
        page: int = RANGE_PAGE_RECORDS,
        unreadable: list[tuple[int, int]] | None = None,
    ) -> Iterator[Entry]:
        """:meth:`range` of any size: the records of ``[from_offset, to_offset]`` in several ``range``
        requests of at most ``page`` records each (halved while a page does not fit in one reply), as
        they arrive. Each page is all-or-error, as ``range`` is, unless ``unreadable`` is given: then the
        records of a sealed queue this identity cannot open are left out and their ``(first, last)`` runs
        appended to it, each page's before that page's entries are yielded."""
        options = {} if unreadable is None else {"skip_unreadable": True}
        lo = from_offset
        while lo <= to_offset:
            hi = min(to_offset, lo + page - 1)
            try:
                r = self.call("range", queue=queue, **options, **{"from": lo, "to": hi})
            except MalformedError as exc:
                if page > 1 and "does not fit in one reply" in str(exc):
                    page = max(page // 2, 1)
                    continue
                raise
            entries = _entries(r["queue"], r)
            if unreadable is not None:
                unreadable.extend((int(a), int(b)) for a, b in r.get("unreadable", ()))
            yield from entries
            lo = hi + 1
            if not entries:  # past the end, or this page was all truncated away
                info = self.queue_info(queue)
                if info["end_offset"] <= lo:
                    return
                lo = max(lo, info["start_offset"])

    def read(
        self, queue: str, from_offset: int, max_records: int = 10000, max_bytes: int = 8 << 20
    ) -> ReadBatch:
        r = self.call(
            "read", queue=queue, max_records=max_records, max_bytes=max_bytes, **{"from": from_offset}
        )
        return ReadBatch(
            queue=r["queue"],
            offsets=r["offsets"],
            keys=r["keys"],
            values=r["values"],
            timestamps=r["timestamps"],
            headers=[_headers(h) for h in r["headers"]],
            next_offset=r["next_offset"],
            start_offset=r["start_offset"],
            end_offset=r["end_offset"],
        )

    def read_packed(
        self, queue: str, from_offset: int, max_records: int = 10000, max_bytes: int = 8 << 20
    ) -> dict[str, Any]:
        """A bulk read in the ``packed`` layout: each column as one buffer (see the ``read`` handler's
        ``packed_columns_reply``), for readers that build Arrow arrays without per-record work. A daemon
        that predates the layout answers with lists: check ``reply.get("layout") == "packed"``."""
        return self.call(
            "read",
            queue=queue,
            layout="packed",
            max_records=max_records,
            max_bytes=max_bytes,
            **{"from": from_offset},
        )

    def tail(
        self,
        queue: str,
        from_offset: int | None = None,
        follow: bool = True,
        *,
        last: int | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> Iterator[Entry]:
        """Records from ``from_offset`` (None: the start) as they are committed, on a dedicated
        connection; ``follow=False`` stops at the end present when the tail began. ``last=N`` instead
        starts N records before the end present when the tail begins (0: only records appended from
        then on). Close the iterator (or let it be garbage collected) to stop following.

        ``on_event`` hears of a core-2 queue's fork (``event: "forked"``, ``fork_point``...) and of its
        owner's recovery (``"recovered"``, ``epoch``; records go on from the fork point); without it,
        a tail that reaches a frozen queue's fork point raises ForkedQueueError."""
        request: dict[str, Any] = {
            "v": API_VERSION,
            "id": 1,
            "op": "tail",
            "queue": queue,
            "from": from_offset,
            "follow": follow,
        }
        if last is not None:
            request["last"] = last
        if on_event is not None:
            request["events"] = True
        conn = _Connection(self._path, None if follow else self._timeout)
        try:
            conn.send(request)
            while True:
                reply = conn.receive()
                if not reply.get("ok"):
                    raise error_from_reply(reply.get("error"))
                if reply.get("done"):
                    return
                if "event" in reply:
                    if on_event is not None:
                        on_event(reply)
                    continue
                yield from _entries(reply.get("queue", queue), reply)
        finally:
            conn.close()

    def truncate(self, queue: str, new_start: int) -> dict[str, Any]:
        """Drop records before ``new_start``; returns ``dropped`` (how many) and the queue's
        ``start_offset`` and ``end_offset`` after it."""
        reply = self.call("truncate", queue=queue, new_start=new_start)
        return {k: reply.get(k) for k in ("dropped", "start_offset", "end_offset")}

    def retention_get(self, queue: str) -> dict[str, Any]:
        """A queue's retention policy (``policy``: ``max_age_ms``, ``max_bytes``, ``max_records``,
        ``keep_unsettled``) and what this daemon holds of it (``start_offset``, ``records``, ``bytes``,
        ``floor`` if it dropped records locally, ``replica_max_bytes`` on a replica)."""
        return {k: v for k, v in self.call("retention_get", queue=queue).items() if k not in ("ok", "id")}

    def retention_set(
        self,
        queue: str,
        *,
        max_age_ms: int | Unchanged | None = UNCHANGED,
        max_bytes: int | Unchanged | None = UNCHANGED,
        max_records: int | Unchanged | None = UNCHANGED,
        keep_unsettled: bool | Unchanged = UNCHANGED,
    ) -> dict[str, Any]:
        """Change parts of one of our queues' policy: a number sets a limit, None (or 0) removes it, and
        what is not given stays; returns what :meth:`retention_get` does."""
        args: dict[str, Any] = {}
        for name, value in (
            ("max_age_ms", max_age_ms),
            ("max_bytes", max_bytes),
            ("max_records", max_records),
            ("keep_unsettled", keep_unsettled),
        ):
            if not isinstance(value, Unchanged):
                args[name] = value
        reply = self.call("retention_set", queue=queue, **args)
        return {k: v for k, v in reply.items() if k not in ("ok", "id")}

    def store_compact(self) -> dict[str, Any]:
        """Give the store's free pages back to the file system (writes wait meanwhile); returns
        ``before_bytes``, ``after_bytes``, ``freed_bytes``, ``vacuumed`` and the ``disk`` figures after."""
        return {k: v for k, v in self.call("store_compact").items() if k not in ("ok", "id")}

    def queue_verify(self, queue: str) -> dict[str, Any]:
        """Re-check the stored queue against its owner's signatures (raises IntegrityError/StorageError
        if anything is off); returns ``records`` checked and the offsets held."""
        reply = self.call("queue_verify", queue=queue)
        return {k: reply.get(k) for k in ("queue", "records", "start_offset", "end_offset")}

    def meta_get(self, queue: str, key: str) -> str | None:
        value = self.call("meta_get", queue=queue, key=key)["value"]
        return None if value is None else str(value)

    def meta_set(self, queue: str, key: str, value: str) -> None:
        """Metadata values are text: anything else is refused (MalformedError), never converted."""
        self.call("meta_set", queue=queue, key=key, value=value)

    def meta_list(self, queue: str) -> dict[str, str]:
        """A queue's whole metadata map."""
        meta: dict[str, str] = self.call("meta_list", queue=queue)["meta"]
        return meta

    def meta_del(self, queue: str, key: str) -> bool:
        """Delete one metadata key of one of your queues; returns whether it was set."""
        return bool(self.call("meta_del", queue=queue, key=key)["existed"])

    # ------------------------------------------------------------------ KV
    def kv_put(self, key: str, value: bytes, ttl: float | None = None) -> None:
        self.call("kv_put", key=key, value=value, ttl=ttl)

    def kv_get(self, key: str, owner: str | None = None) -> Any:
        """bytes, an int (counter), a dict (hash), a set (set), or None."""
        reply = self.call("kv_get", key=key, owner=owner)
        return _kv_value(reply["kind"], reply["value"])

    def kv_del(self, key: str) -> None:
        self.call("kv_del", key=key)

    def kv_list(self, prefix: str = "", owner: str | None = None) -> dict[str, Any]:
        items = self.call("kv_list", prefix=prefix, owner=owner)["items"]
        return {key: _kv_value(kind, value) for key, kind, value in items}

    def kv_hset(self, key: str, field: bytes, value: bytes) -> None:
        self.call("kv_hset", key=key, field=field, value=value)

    def kv_hget(self, key: str, field: bytes, owner: str | None = None) -> bytes | None:
        value = self.call("kv_hget", key=key, field=field, owner=owner)["value"]
        return None if value is None else bytes(value)

    def kv_hgetall(self, key: str, owner: str | None = None) -> dict[bytes, bytes]:
        value = self.call("kv_hgetall", key=key, owner=owner)["value"]
        return {bytes(k): bytes(v) for k, v in value.items()}

    def kv_hdel(self, key: str, field: bytes) -> None:
        self.call("kv_hdel", key=key, field=field)

    def kv_sadd(self, key: str, member: bytes) -> None:
        self.call("kv_sadd", key=key, member=member)

    def kv_srem(self, key: str, member: bytes) -> None:
        self.call("kv_srem", key=key, member=member)

    def kv_smembers(self, key: str, owner: str | None = None) -> set[bytes]:
        return {bytes(m) for m in self.call("kv_smembers", key=key, owner=owner)["value"]}

    def kv_incr(self, key: str, by: int = 1) -> int:
        return int(self.call("kv_incr", key=key, by=by)["value"])

    def kv_seal(self, readers: Sequence[str] = ()) -> dict[str, Any]:
        """Create this daemon's KV namespace sealed to ``readers`` (hex identities) and itself; only
        before its first write (docs/privacy.md). Returns its address and sealing."""
        reply = self.call("kv_seal", readers=list(readers))
        return {"namespace": reply["namespace"], "sealed": reply["sealed"]}

    def kv_share(self, reader: str) -> list[int]:
        """Give ``reader`` every key epoch of this daemon's sealed KV namespace; returns the new ones."""
        epochs: list[int] = self.call("kv_share", reader=reader)["epochs"]
        return epochs

    def kv_unshare(self, reader: str) -> dict[str, Any]:
        """Remove ``reader`` from this daemon's sealed KV namespace (a new key epoch)."""
        reply = self.call("kv_unshare", reader=reader)
        return {k: reply[k] for k in ("removed", "epoch", "start")}


def _kv_value(kind: Any, value: Any) -> Any:
    if kind == "set":
        return {bytes(m) for m in value}
    if kind == "hash":
        return {bytes(k): bytes(v) for k, v in value.items()}
    return value


__all__ = ["Client", "Entry", "Lease", "Produced", "ReadBatch", "Subscription", "error_from_reply"]
