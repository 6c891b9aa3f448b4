"""Replication as a daemon service: the TCP listener, the dialer, mDNS discovery and the gossip links,
wired to the engine.

Discovery only yields addresses (mDNS sightings, static and remembered peers go into the
:class:`PeerBook`); the dialer turns due addresses into authenticated streams; every stream, dialled or
accepted, becomes a :class:`Gossip` link. The engine is the :class:`ReplicaHost`: summaries come from its
in-memory heads, deltas are read on reader threads, and merges are verified off the event loop before the
storage thread joins and stores them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from latticed.config import DaemonConfig
from latticed.crdt.head import QueueKind
from latticed.crdt.queue import QueueDelta, QueueState, Summary, VerifiedDelta
from latticed.crdt.signing import Identity, parse_public_key
from latticed.errors import LatticedError, NotFoundError
from latticed.logs import get_logger, log_event
from latticed.net.discovery import DiscoveredPeer, run_discovery
from latticed.net.gossip import PEER_TIMEOUT_S, STALE_AFTER_S, Gossip, PendingMerge
from latticed.net.ports import ReplicaStore
from latticed.net.transport import open_peer, secure_accept
from latticed.netkey import DEFAULT_NETWORK_KEY, network_key_fingerprint, read_network_key
from latticed.protocol.addresses import HostPort
from latticed.protocol.handshake import ReplayCache
from latticed.protocol.peerbook import Backoff, PeerBook
from latticed.protocol.replication import QueueKey
from latticed.storage.jobs import Merge
from latticed.storage.wiring import ChangeFanout, OwnerFence

log = get_logger(__name__)

PEERS_FILE = "peers.json"
DIAL_TIMEOUT_S = 10.0
MAX_DIALS_AT_ONCE = 8
#: On a LAN a peer is usually back within seconds: retry at least this often.
MAX_BACKOFF_S = 30.0
#: Let the kernel give up on a stalled TCP link about when the gossip layer would (ms).
TCP_USER_TIMEOUT_MS = int(PEER_TIMEOUT_S * 1000)


def _tune_socket(stream: trio.abc.Stream) -> None:
    """Bound how long a stalled link lingers in retransmit backoff after a partition."""
    if isinstance(stream, trio.SocketStream) and hasattr(socket, "TCP_USER_TIMEOUT"):
        with contextlib.suppress(OSError):
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)


def queue_key(state: QueueState) -> QueueKey:
    return (state.owner, state.name, state.kind)


class EngineHost:
    """The engine seen as a replica host (which queues we take is the session's subscription)."""

    def __init__(self, engine: ReplicaStore) -> None:
        self.engine = engine

    def summaries(self) -> Mapping[QueueKey, Summary]:
        out: dict[QueueKey, Summary] = {}
        for kind in QueueKind:
            for q in self.engine.queues(kind):
                state = self.engine.state(q)
                if state.head is not None:
                    out[queue_key(state)] = state.summary()
        return out

    async def delta_for(
        self, key: QueueKey, since: Summary | None, max_records: int, max_bytes: int
    ) -> QueueDelta | None:
        owner, name, kind = key
        ahead = self.engine.ahead_for(owner, name, kind, since)
        if ahead is not None and since is not None:
            # Relayed as it came, before our own commit; None: wait for the commit (it pushes again).
            return ahead.delta_from(since)
        try:
            return await self.engine.delta_for(owner, name, since, max_records, kind, max_bytes=max_bytes)
        except NotFoundError:
            return None

    async def verify_delta(self, delta: QueueDelta) -> VerifiedDelta:
        return await self.engine.verify_delta(delta)

    def submit_merge(self, verified: VerifiedDelta, peer: bytes) -> PendingMerge:
        return _EngineMerge(self.engine, self.engine.submit_merge(verified, origin=peer))


class _EngineMerge:
    """A merge job on the storage thread, awaited once its transaction committed."""

    __slots__ = ("engine", "job")

    def __init__(self, engine: ReplicaStore, job: Merge) -> None:
        self.engine = engine
        self.job = job

    @property
    def ahead(self) -> Summary | None:
        return self.job.ahead

    async def result(self) -> tuple[Summary, bool]:
        job = await self.engine.merged(self.job)
        assert job.summary is not None
        return job.summary, job.changed


@dataclass
class Replication:
    """The running replication service, for status, ``latticectl peers`` and tests."""

    engine: ReplicaStore
    identity: Identity
    config: DaemonConfig
    network_key: bytes
    gossip: Gossip
    book: PeerBook
    listen_address: HostPort | None = None
    wake_dialer: trio.Event = field(default_factory=trio.Event)
    allowed: frozenset[bytes] | None = None
    #: Handshake openings answered recently: a recorded one replayed to us gets no answer.
    replay_cache: ReplayCache = field(default_factory=ReplayCache)

    @property
    def listen(self) -> str | None:
        return _fmt(self.listen_address)

    def counters(self) -> dict[str, int]:
        return {**self.gossip.stats(), "connected": len(self.gossip.links)}

    def peers(self) -> list[dict[str, Any]]:
        """Every known peer: identity, address, how found, connected, and lag per queue."""
        lags = self.gossip.peer_lag()
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for status in self.book.snapshot():
            row = dataclasses.asdict(status)
            key = status.public_key
            row["address"] = f"{status.host}:{status.port}"
            row["connected"] = key is not None and bytes.fromhex(key) in self.gossip.links
            row["lag"] = lags.get(key or "", {})
            rows.append(row)
            if key:
                seen.add(key)
        for public_key, link in self.gossip.links.items():
            if public_key.hex() not in seen:
                rows.append(
                    {
                        "public_key": public_key.hex(),
                        "address": link.address,
                        "sources": [link.via],
                        "state": "connected",
                        "connected": True,
                        "lag": lags.get(public_key.hex(), {}),
                    }
                )
        return rows

    def lag(self) -> dict[str, int]:
        """Per queue we hold: how far behind the owner's signed end we are (records)."""
        out = {}
        for kind in QueueKind:
            for q in self.engine.queues(kind):
                state = self.engine.state(q)
                behind = state.known_end - state.held_end
                if behind > 0:
                    out[f"{state.owner.hex()}/{state.name}"] = behind
        return out

    def remember(self, address: HostPort, public_key: bytes) -> None:
        """Keep a peer vouched for out of band (an invite), save the book, and dial it now."""
        self.book.remember(address, public_key, now=time.time())
        self._save_book()
        self.wake_dialer.set()

    def _save_book(self) -> None:
        path = self.config.data_dir / PEERS_FILE
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(self.book.to_json())
            tmp.replace(path)
        except OSError as exc:
            log_event(log, "peers.save_failed", level=logging.WARNING, error=str(exc))


def load_network_key(config: DaemonConfig) -> bytes:
    """The configured key, or the public default when none is configured."""
    if config.network_key_file is None:
        return DEFAULT_NETWORK_KEY
    return read_network_key(config.network_key_file)


def load_peer_book(data_dir: Path, own: bytes) -> PeerBook:
    """The peers saved by an earlier run (an unreadable file is logged and ignored: they come back)."""
    path = data_dir / PEERS_FILE
    with contextlib.suppress(FileNotFoundError):
        try:
            return PeerBook.from_json(
                path.read_text(), now=time.time(), own_public_key=own, backoff=Backoff(cap=MAX_BACKOFF_S)
            )
        except LatticedError as exc:
            log_event(log, "peers.unreadable", level=logging.WARNING, path=str(path), error=str(exc))
    return PeerBook(own_public_key=own, backoff=Backoff(cap=MAX_BACKOFF_S))


async def run_replication(
    engine: ReplicaStore,
    identity: Identity,
    config: DaemonConfig,
    *,
    changes: ChangeFanout,
    fence: OwnerFence,
    network_key: bytes | None = None,
    task_status: trio.TaskStatus[Replication] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen, dial, discover and gossip until cancelled; under ``network_key`` (default: the config's).

    While it runs it pushes every commit it hears of from ``changes`` and holds the owner ``fence``."""
    if network_key is None:
        network_key = load_network_key(config)
    if network_key == DEFAULT_NETWORK_KEY:
        log_event(
            log,
            "replication.insecure_network_key",
            level=logging.WARNING,
            hint="using the documented default network key: anyone can join; use --network-key-file",
        )
    allowed = frozenset(parse_public_key(p) for p in config.allowed_peers) or None
    patterns = config.replicate or None
    host = EngineHost(engine)
    gossip = Gossip(
        host, identity.public_key, subscription=patterns, max_message_bytes=config.max_frame_bytes
    )
    book = load_peer_book(config.data_dir, identity.public_key)
    book.add_static(config.peers, now=time.time())
    service = Replication(engine, identity, config, network_key, gossip, book, allowed=allowed)

    def on_change(state: QueueState) -> None:
        if state.head is not None:
            gossip.local_change(queue_key(state), state.summary())

    def behind(state: QueueState) -> str | None:
        return gossip.behind_reason(queue_key(state), state.held_end)

    wiring = contextlib.ExitStack()
    try:
        wiring.enter_context(changes.subscribed(on_change))
        wiring.enter_context(fence.held_by(behind))
        async with trio.open_nursery() as nursery:
            if config.listen is not None:
                service.listen_address = await nursery.start(_listen, service)
            nursery.start_soon(_dial_loop, service)
            if config.mdns and service.listen_address is not None:
                send, receive = trio.open_memory_channel[DiscoveredPeer](64)
                await nursery.start(
                    lambda task_status: run_discovery(
                        network_key=network_key,
                        identity_public_key=identity.public_key,
                        port=service.listen_address[1] if service.listen_address else 0,
                        interfaces=config.mdns_interfaces,
                        found=send,
                        task_status=task_status,
                    )
                )
                nursery.start_soon(_discovered, service, receive)
            log_event(
                log,
                "replication.ready",
                listen=_fmt(service.listen_address),
                peers=len(config.peers),
                mdns=bool(config.mdns and service.listen_address),
                network=network_key_fingerprint(network_key),
            )
            task_status.started(service)
    finally:
        wiring.close()
        service._save_book()


def _is_stale(service: Replication, peer: bytes) -> bool:
    link = service.gossip.links.get(peer)
    return link is None or trio.current_time() - link.last_heard > STALE_AFTER_S


def _fmt(address: HostPort | None) -> str | None:
    return None if address is None else f"{address[0]}:{address[1]}"


async def _listen(service: Replication, *, task_status: trio.TaskStatus[HostPort]) -> None:
    assert service.config.listen is not None
    host, port = service.config.listen
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    address: HostPort = (host, int(bound[1]))

    async def handler(stream: trio.SocketStream) -> None:
        peer_address = "?"
        remote: HostPort | None = None
        with contextlib.suppress(OSError):
            name = stream.socket.getpeername()
            remote = (str(name[0]), int(name[1]))
            peer_address = f"{name[0]}:{name[1]}"
        _tune_socket(stream)
        try:
            secure = await secure_accept(
                stream,
                seed=service.identity.seed,
                network_key=service.network_key,
                allowed=service.allowed,
                max_message_size=service.gossip.max_message_bytes,
                replay_cache=service.replay_cache,
            )
        except LatticedError as exc:
            log_event(log, "peer.handshake_failed", level=logging.INFO, address=peer_address, error=str(exc))
            await trio.aclose_forcefully(stream)
            return
        # Recorded in the book (never dialled) so the dialer does not redial an identity that is connected.
        if remote is not None:
            service.book.connected(remote, secure.remote_public_key, time.time(), incoming=True)
        try:
            await service.gossip.run_peer(secure, peer_address, "incoming")
        finally:
            if remote is not None:
                service.book.disconnected(remote, time.time())
                service.wake_dialer.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(address)


async def _discovered(service: Replication, receive: trio.MemoryReceiveChannel[DiscoveredPeer]) -> None:
    async for peer in receive:
        if service.book.add(peer.address, "mdns", now=time.time(), public_key=peer.public_key):
            log_event(log, "peer.discovered", peer=peer.public_key.hex(), address=f"{peer.host}:{peer.port}")
        service.wake_dialer.set()


async def _dial_loop(service: Replication) -> None:
    """Dial whatever the peer book says is due; sleep until the next due time or a new sighting."""
    async with trio.open_nursery() as nursery:
        while True:
            service.wake_dialer = trio.Event()
            now = time.time()
            for address in service.book.due(now, limit=MAX_DIALS_AT_ONCE):
                nursery.start_soon(_dial, service, address)
            next_due = service.book.next_due(time.time())
            wait = 60.0 if next_due is None else max(0.05, next_due - time.time())
            with trio.move_on_after(wait):
                await service.wake_dialer.wait()


async def _dial(service: Replication, address: HostPort) -> None:
    host, port = address
    try:
        stream = await open_peer(
            host,
            port,
            seed=service.identity.seed,
            network_key=service.network_key,
            allowed=service.allowed,
            timeout=DIAL_TIMEOUT_S,
            max_message_size=service.gossip.max_message_bytes,
        )
    except LatticedError as exc:
        service.book.failed(address, time.time())
        log_event(log, "peer.dial_failed", level=logging.DEBUG, address=f"{host}:{port}", error=str(exc))
        service.wake_dialer.set()
        return
    peer = stream.remote_public_key
    _tune_socket(stream.transport_stream)
    if peer in service.gossip.links and not _is_stale(service, peer):
        # Already connected to this identity (it dialled us): this dial only proves the address works.
        service.book.connected(address, peer, time.time())
        await stream.aclose()
        service.book.disconnected(address, time.time())
        return
    service.book.connected(address, peer, time.time())
    service._save_book()
    try:
        sources = service.book.status(address).sources
        via = "static" if "static" in sources else (sources[0] if sources else "static")
        await service.gossip.run_peer(stream, f"{host}:{port}", via)
    finally:
        service.book.disconnected(address, time.time())
        service.wake_dialer.set()
