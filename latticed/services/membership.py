"""Which network this daemon is in, and changing it while it runs (``latticectl invite`` and ``join``).

The replication service (:mod:`latticed.net.replication_service`) lives under one network key: the handshake,
the mDNS announcements and every link depend on it. :class:`Membership` owns that service for the composition
root. It starts it when there is anything to replicate with (a listen address, static peers, or peers saved by
an earlier run), and :meth:`Membership.join` stores the invite's key in the configured key file (none
configured: ``network.key`` in the data directory, which the next start reads), stops the service (links
close, the peer book is saved) and starts it again under the new key, on the port it had, with the inviter in
the peer book. So a join needs no restart, and the next start reads the same key.

Joining never silently cuts a daemon off from a network it is part of. If it holds a private key other than
the invite's and already shares that key with a peer (one it remembers, sees announced, or is connected
to, the inviter aside), ``join`` refuses unless forced. A key nobody else has used yet (fresh from
``latticed init``) and the public default key are simply replaced.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ifaddr
import trio

from latticed.crdt.signing import Identity
from latticed.errors import AlreadyExistsError, LatticedError, MalformedError
from latticed.host.config import DaemonConfig
from latticed.host.invite import MAX_ADDRESSES, Invite, encode_invite
from latticed.host.netkey import DEFAULT_NETWORK_KEY, network_key_fingerprint, replace_network_key
from latticed.net.discovery import mdns_addresses
from latticed.net.gossip import LinkExtension
from latticed.net.peer_faults import load_rules
from latticed.net.ports import ReplicaStore
from latticed.net.replication_service import Replication, load_peer_book, run_replication
from latticed.net.reports import PeerMetrics
from latticed.process.logs import get_logger, log_event
from latticed.protocol.addresses import HostPort
from latticed.storage.wiring import ChangeFanout, OwnerFence

log = get_logger(__name__)

__all__ = ["Membership", "advertised_addresses"]


@dataclass(slots=True)
class _Running:
    service: Replication
    scope: trio.CancelScope
    done: trio.Event


def _fmt(address: HostPort) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertised_addresses(listen: HostPort) -> list[HostPort]:
    """Where peers can reach a daemon bound to ``listen``: a wildcard stands for this host's addresses.

    ``0.0.0.0`` gives every non-loopback IPv4 address (loopback if there is none, as for mDNS); ``::`` every
    global or unique-local IPv6 address (link-local ones need a scope id the other host cannot know).
    """
    host, port = listen
    if host in ("", "0.0.0.0"):
        hosts = mdns_addresses(())
    elif host == "::":
        hosts = []
        for adapter in ifaddr.get_adapters():
            for ip in adapter.ips:
                if isinstance(ip.ip, tuple):
                    address = ipaddress.IPv6Address(ip.ip[0])
                    if not (address.is_loopback or address.is_link_local):
                        hosts.append(str(address))
        hosts = list(dict.fromkeys(hosts)) or ["::1"]
    else:
        hosts = [host]
    return [(h, port) for h in hosts][:MAX_ADDRESSES]


class Membership:
    """The replication service under the current network key; restarts it when the key changes.

    Built by the composition root before anything runs (the API's context holds it from the start);
    :meth:`run` owns the service until cancelled. ``changes`` and ``fence`` are handed to each replication
    service it starts."""

    def __init__(
        self,
        engine: ReplicaStore,
        identity: Identity,
        config: DaemonConfig,
        network_key: bytes,
        *,
        changes: ChangeFanout,
        fence: OwnerFence,
        metrics: PeerMetrics | None = None,
        extension: LinkExtension | None = None,
    ) -> None:
        self._engine = engine
        self._metrics = metrics
        self._extension = extension
        self._identity = identity
        self._config = config
        self._key = network_key
        self._changes = changes
        self._fence = fence
        self._nursery: trio.Nursery | None = None
        self._running: _Running | None = None
        self._lock = trio.Lock()

    @property
    def service(self) -> Replication | None:
        """The replication service running now (None before :meth:`run` starts one, between a key
        change's stop and start, or when there is nothing to replicate with)."""
        return self._running.service if self._running is not None else None

    async def run(self, *, task_status: trio.TaskStatus[Membership] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the replication service until cancelled (see the module docstring)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                config = self._config
                saved = load_peer_book(config.data_dir, self._identity.public_key)
                if (
                    config.listen is not None
                    or config.peers
                    or len(saved)
                    or load_rules(config.data_dir).added
                ):
                    await self.start()
                task_status.started(self)
                await trio.sleep_forever()
            finally:
                self._nursery = None

    @property
    def network_fingerprint(self) -> str:
        return network_key_fingerprint(self._key)

    @property
    def config(self) -> DaemonConfig:
        """The config replication runs under (``join`` may have pinned its listen port)."""
        return self._config

    @property
    def uses_public_key(self) -> bool:
        """Whether the network key is the documented public default (anyone can join)."""
        return self._key == DEFAULT_NETWORK_KEY

    async def ensure_started(self) -> Replication:
        """The replication service, started if it is not running (``latticectl peers add``: a daemon
        with nothing to replicate with until now)."""
        async with self._lock:
            return self.service if self.service is not None else await self.start()

    async def start(self) -> Replication:
        """Start the replication service under the current key (it must not be running)."""
        assert self._running is None
        nursery = self._nursery
        if nursery is None:
            raise LatticedError("network membership is not running (the daemon is starting or stopping)")
        done = trio.Event()
        scope = trio.CancelScope()
        config, key = self._config, self._key

        async def run(task_status: trio.TaskStatus[Replication]) -> None:
            try:
                with scope:
                    await run_replication(
                        self._engine,
                        self._identity,
                        config,
                        changes=self._changes,
                        fence=self._fence,
                        network_key=key,
                        metrics=self._metrics,
                        extension=self._extension,
                        background=nursery,
                        task_status=task_status,
                    )
            finally:
                done.set()

        service: Replication = await nursery.start(run)
        self._running = _Running(service, scope, done)
        return service

    async def stop(self) -> None:
        """Stop the replication service and wait until it has closed its links and saved its peer book."""
        running, self._running = self._running, None
        if running is None:
            return
        running.scope.cancel()
        await running.done.wait()

    def invite(self, addresses: Sequence[HostPort] = ()) -> str:
        """A token for another daemon to join this network (see :mod:`latticed.host.invite`); a secret."""
        if self._key == DEFAULT_NETWORK_KEY:
            raise MalformedError(
                "this daemon uses the public default network key, which everyone already has: give it a "
                "private one first (`latticed init`, or `latticed network-key new PATH` and "
                "--network-key-file PATH)"
            )
        if not addresses:
            service = self.service
            if service is None or service.listen_address is None:
                raise MalformedError(
                    "this daemon does not accept peers, so nobody could use an invite to it: set listen in "
                    "its config, or name a reachable address with --address HOST:PORT"
                )
            addresses = advertised_addresses(service.listen_address)
        return encode_invite(Invite(self._key, self._identity.public_key, tuple(addresses)))

    def _peers_sharing_key(self, inviter: bytes) -> list[str]:
        """Identities this daemon knows under its current key, other than the inviter (hex, sorted)."""
        service = self.service
        book = (
            service.book
            if service is not None
            else load_peer_book(self._config.data_dir, self._identity.public_key)
        )
        known = {s.public_key for s in book.snapshot() if s.public_key is not None and s.state != "self"}
        if service is not None:
            known |= {key.hex() for key in service.gossip.links}
        known.discard(inviter.hex())
        known.discard(self._identity.public_hex)
        return sorted(k for k in known if k is not None)

    async def join(self, invite: Invite, *, force: bool = False) -> dict[str, Any]:
        """Store the invite's key, restart replication under it if it changed, and dial the inviter."""
        async with self._lock:
            if invite.identity == self._identity.public_key:
                raise MalformedError("that invite is this daemon's own: run join on the other daemon")
            if invite.network_key == DEFAULT_NETWORK_KEY:
                raise MalformedError("that invite holds the public default network key: refusing to use it")
            allowed = self._config.allowed_peers
            if allowed and invite.identity.hex() not in allowed:
                raise MalformedError(
                    f"this daemon accepts only the peers in allowed_peers, and the inviter "
                    f"{invite.identity.hex()} is not one of them: add it to its config first"
                )
            old_fingerprint = network_key_fingerprint(self._key)
            new_fingerprint = network_key_fingerprint(invite.network_key)
            changed = invite.network_key != self._key
            if changed:
                await self._switch_key(invite, force=force, old=old_fingerprint, new=new_fingerprint)
            service = self.service if self.service is not None else await self.start()
            for address in invite.addresses:
                service.remember(address, invite.identity)
            log_event(
                log,
                "network.joined",
                network=new_fingerprint,
                previous=old_fingerprint if changed else None,
                peer=invite.identity.hex(),
                addresses=[_fmt(a) for a in invite.addresses],
            )
            return {
                "network": new_fingerprint,
                "previous_network": old_fingerprint if changed else None,
                "key_changed": changed,
                "key_file": str(self._config.network_key_path),
                "peer": invite.identity.hex(),
                "addresses": [_fmt(a) for a in invite.addresses],
                "listen": service.listen,
            }

    async def _switch_key(self, invite: Invite, *, force: bool, old: str, new: str) -> None:
        path = self._config.network_key_path  # with no key file configured: network.key in the data dir
        if self._key != DEFAULT_NETWORK_KEY and not force:
            sharing = self._peers_sharing_key(invite.identity)
            if sharing:
                shown = ", ".join(k[:16] for k in sharing[:3]) + (", ..." if len(sharing) > 3 else "")
                raise AlreadyExistsError(
                    f"this daemon is in network {old} with {len(sharing)} other peer(s) ({shown}); joining "
                    f"network {new} cuts it off from them: pass --force to switch anyway (then join them to "
                    "the new network too)"
                )
        await trio.to_thread.run_sync(replace_network_key, path, invite.network_key)
        previous = self.service
        if previous is not None and previous.listen_address is not None:
            # Bind the port we had (it may have been 0 = any): peers and announcements know that one.
            self._config = dataclasses.replace(self._config, listen=previous.listen_address)
        await self.stop()
        self._key = invite.network_key
        log_event(log, "network.key_replaced", path=str(path), network=new, previous=old)
        await self.start()
