"""LAN discovery over mDNS: advertise ``_latticed._tcp.local.`` and report other members of our network.

The TXT record carries a sealed announcement (:mod:`latticed.protocol.announce`, ``docs/discovery.md``): a
stranger on the LAN learns that a latticed daemon listens on some host:port, nothing else, and cannot forge
one. Instance and host names are random per run for the same reason.

python-zeroconf runs its own threads. The bridge into trio (see the project's notes): the browser's handler
only forwards ``(state, name)`` into a trio channel with ``trio.from_thread.run_sync``; resolving runs in a
worker thread (``trio.to_thread.run_sync(zc.get_service_info, ...)``); unregister and close run in a
shielded ``finally`` so goodbyes go out even when we are cancelled.

What is reported is a sighting, not liveness: python-zeroconf keeps a vanished peer's records for ~19
minutes, so whether a peer is up is for the connection and gossip layers to find out (see
:mod:`latticed.protocol.peerbook`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import math
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import trio
from zeroconf import Error as ZeroconfError
from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

from latticed.errors import IntegrityError, MalformedError
from latticed.host.mdns_interfaces import mdns_addresses
from latticed.host.netkey import network_key_fingerprint
from latticed.process.clock import wall_ms
from latticed.process.logs import get_logger, log_event
from latticed.protocol.addresses import HostPort
from latticed.protocol.announce import (
    DEFAULT_MAX_AGE_MS,
    DEFAULT_MAX_FUTURE_MS,
    KEY_SIZE,
    SERVICE_TYPE,
    TXT_KEY,
    ForeignAnnouncementError,
    OtherNetworks,
    new_instance_name,
    open_announcement,
    seal_announcement,
)

__all__ = [
    "DEFAULT_REANNOUNCE_INTERVAL",
    "SERVICE_TYPE",
    "DiscoveredPeer",
    "OtherNetworks",
    "mdns_addresses",
    "run_discovery",
]

log = get_logger(__name__)

#: Seconds between re-announcements with a fresh timestamp; well inside the 10-minute freshness window, so
#: a newcomer always resolves an announcement that is at most this old.
DEFAULT_REANNOUNCE_INTERVAL: Final = 180.0
#: How long one resolution may wait for a peer's SRV/TXT/A records.
DEFAULT_RESOLVE_TIMEOUT: Final = 3.0
# Browser events waiting for the trio side; beyond this they are dropped (a flood of names), with a warning.
_EVENT_BUFFER: Final = 1024
# Resolutions in flight at once (each holds a worker thread while it waits for answers).
_RESOLVERS: Final = 4
# Upper bound on registering (probing and announcing take ~1.5 s) on a loaded host.
_REGISTER_TIMEOUT: Final = 15.0
# Upper bound on unregister (goodbyes, ~0.6 s) + close at shutdown, so a wedged zeroconf cannot hang us.
_CLOSE_TIMEOUT: Final = 5.0

_Event = tuple[ServiceStateChange, str]
_Sighting = tuple[bytes, str, int]


@dataclass(frozen=True, slots=True)
class DiscoveredPeer:
    """Another member of our network announced ``public_key`` listening on ``host:port``.

    The identity and port are authenticated by the network key; the host is where mDNS says the announcer
    is, which is not: the handshake on dialing is what proves who answers there.
    """

    public_key: bytes
    host: str
    port: int
    via: Literal["mdns"] = "mdns"

    @property
    def address(self) -> HostPort:
        """``(host, port)``, the key of :class:`~latticed.protocol.peerbook.PeerBook`."""
        return self.host, self.port


def _open_zeroconf(
    bind: list[str], handler: Callable[..., None]
) -> tuple[Zeroconf, ServiceBrowser]:  # worker thread
    zc = Zeroconf(interfaces=bind, ip_version=IPVersion.V4Only)
    try:
        browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[handler])
    except BaseException:
        zc.close()
        raise
    return zc, browser


async def _announce(zc: Zeroconf, info: ServiceInfo) -> None:  # zeroconf's asyncio loop
    broadcast = await zc.async_register_service(info, allow_name_change=True)
    await broadcast


async def _register(zc: Zeroconf, info: ServiceInfo) -> bool:
    """Register ``info`` (probing, then announcing); False if zeroconf failed to (logged).

    Run on zeroconf's own loop and cancelled there when we are (a ``join`` restarting replication right
    after start-up): the blocking ``register_service`` would hold the cancellation for its ~1.5 s."""
    assert zc.loop is not None
    future = asyncio.run_coroutine_threadsafe(_announce(zc, info), zc.loop)
    try:
        await trio.to_thread.run_sync(future.result, _REGISTER_TIMEOUT, abandon_on_cancel=True)
    except (TimeoutError, ZeroconfError, OSError) as error:
        future.cancel()
        log_event(log, "mdns.register_failed", level=logging.ERROR, error=repr(error))
        return False
    except BaseException:
        future.cancel()  # its thread then returns at once
        raise
    return True


def _close_zeroconf(zc: Zeroconf, browser: ServiceBrowser, info: ServiceInfo | None) -> None:  # worker thread
    browser.cancel()
    try:
        if info is not None:
            zc.unregister_service(info)  # goodbye: peers drop us within ~0.1 s instead of ~19 minutes
    finally:
        zc.close()


async def run_discovery(
    *,
    network_key: bytes,
    identity_public_key: bytes,
    port: int,
    interfaces: Sequence[str],
    found: trio.MemorySendChannel[DiscoveredPeer],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    clock: Callable[[], int] = wall_ms,
    addresses: Sequence[str] | None = None,
    reannounce_interval: float = DEFAULT_REANNOUNCE_INTERVAL,
    resolve_timeout: float = DEFAULT_RESOLVE_TIMEOUT,
    max_age_ms: int = DEFAULT_MAX_AGE_MS,
    max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
    others: OtherNetworks | None = None,
) -> None:
    """Advertise ``port`` and send a :class:`DiscoveredPeer` to ``found`` for each new sighting; runs until
    cancelled.

    Use ``await nursery.start(run_discovery, ...)``: it returns once mDNS runs on the interfaces (its
    sockets bound, browsing), so a bad interface fails there; registering our service (~1.5 s of mDNS
    probing, logged as ``mdns.registered``) goes on in the background, since nothing needs to wait for it
    (a daemon starting, or restarting replication on ``join``). ``interfaces`` is ``mdns_interfaces``
    (see :func:`mdns_addresses`); ``addresses`` overrides what is advertised (e.g. the one address the
    daemon listens on). ``clock`` returns Unix ms.

    Each (identity, host, port) is reported once per mDNS instance name while that name stays listed:
    re-announcements are not reported again, a restart (new random name) or a return after a goodbye is.
    Our own identity, tampered, stale and future-dated announcements are ignored (logged at debug level).
    Those that do not open under our key (another network's, or tampered) are counted by instance name in
    ``others`` while mDNS lists them; a new one is logged at INFO, at most every ten minutes.
    """
    if others is None:
        others = OtherNetworks()
    if not isinstance(identity_public_key, bytes) or len(identity_public_key) != KEY_SIZE:
        raise MalformedError(f"identity public key must be {KEY_SIZE} bytes")
    # Seal once up front: validates the network key and port before anything touches the network.
    seal_announcement(network_key=network_key, public_key=identity_public_key, port=port, now_ms=clock())
    bind = mdns_addresses(interfaces)
    try:
        advertise = [str(ipaddress.IPv4Address(a)) for a in addresses] if addresses is not None else bind
    except ValueError as error:
        raise MalformedError(f"advertised addresses must be IPv4 addresses: {error}") from None
    if not advertise:
        raise MalformedError("no address to advertise")
    if not interfaces and bind == ["127.0.0.1"]:
        log_event(log, "mdns.loopback_only", level=logging.WARNING, reason="no non-loopback IPv4 address")
    instance = new_instance_name()

    def make_info(name: str) -> ServiceInfo:
        token = seal_announcement(
            network_key=network_key, public_key=identity_public_key, port=port, now_ms=clock()
        )
        return ServiceInfo(
            SERVICE_TYPE,
            name,
            port=port,
            properties={TXT_KEY: token.encode("ascii")},
            server=f"{instance}.local.",  # not the host name: it could identify the machine
            addresses=[socket.inet_aton(a) for a in advertise],
        )

    send, receive = trio.open_memory_channel[_Event](_EVENT_BUFFER)
    token = trio.lowlevel.current_trio_token()

    def forward(state: ServiceStateChange, name: str) -> None:  # trio thread
        try:
            send.send_nowait((state, name))
        except trio.WouldBlock:
            log_event(log, "mdns.event_dropped", level=logging.WARNING, name=name, state=state.name)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # we are shutting down

    def on_change(
        zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:  # zeroconf's thread: forward, nothing else
        with contextlib.suppress(trio.RunFinishedError):  # the trio run is over: nobody to tell
            trio.from_thread.run_sync(forward, state_change, name, trio_token=token)

    try:
        # Zeroconf's own threads (its event loop, the browser's) inherit this name from the worker.
        zc, browser = await trio.to_thread.run_sync(
            _open_zeroconf, bind, on_change, thread_name="ld-zeroconf"
        )
    except OSError as error:
        raise MalformedError(f"config key 'mdns_interfaces': cannot run mDNS on {bind}: {error}") from error
    registered: ServiceInfo | None = None
    try:
        # Browse events wait in the channel until we know our own (possibly renamed) instance name.
        task_status.started()
        info = make_info(f"{instance}.{SERVICE_TYPE}")
        announced = await _register(zc, info)  # False: logged; we still hear others, who can dial us
        own_name = info.name  # zeroconf renames on a (vanishingly unlikely) conflict
        if announced:
            registered = info
            log_event(
                log,
                "mdns.registered",
                name=own_name,
                port=port,
                addresses=advertise,
                interfaces=bind,
                network=network_key_fingerprint(network_key),
            )

        # name -> what it announces and we reported. Keyed by name, not identity: a restarted peer comes back
        # under a new random name while its crashed run's records linger for ~19 minutes, and must be
        # reported again so that the peer book redials it now.
        sightings: dict[str, set[_Sighting]] = {}
        resolving: dict[str, bool] = {}  # name -> another pass requested while resolving
        limiter = trio.CapacityLimiter(_RESOLVERS)

        async def resolve(name: str) -> None:
            again = True
            while again:
                info = await trio.to_thread.run_sync(
                    functools.partial(
                        zc.get_service_info, SERVICE_TYPE, name, timeout=math.ceil(resolve_timeout * 1000)
                    ),
                    limiter=limiter,
                )
                if info is not None and name in resolving:
                    await accept(name, info)
                again = resolving.pop(name, False)
                if again:
                    resolving[name] = False

        async def accept(name: str, info: ServiceInfo) -> None:
            now_ms = clock()
            try:
                value = info.properties.get(TXT_KEY)
                if value is None:
                    raise MalformedError("no announcement in the TXT record")
                announcement = open_announcement(
                    value,
                    network_key=network_key,
                    now_ms=now_ms,
                    own_public_key=identity_public_key,
                    max_age_ms=max_age_ms,
                    max_future_ms=max_future_ms,
                )
                if announcement is not None and info.port != announcement.port:
                    raise IntegrityError(f"SRV port {info.port} is not the sealed port {announcement.port}")
            except ForeignAnnouncementError as error:
                loud = others.heard(name, trio.current_time())
                log_event(
                    log,
                    "mdns.other_network",
                    level=logging.INFO if loud else logging.DEBUG,
                    name=name,
                    count=others.count,
                    reason=str(error),
                    hint="a daemon with another network key: `latticectl invite` here and "
                    "`latticectl join TOKEN` there if it is one of yours",
                )
                return
            except (MalformedError, IntegrityError) as error:
                log_event(log, "mdns.rejected", level=logging.DEBUG, name=name, reason=str(error))
                return
            others.forget(name)  # it opens now (e.g. a token modified on the way before)
            if announcement is None:
                return  # ours: same identity under another name, e.g. a record from our previous run
            new = {
                (announcement.public_key, host, announcement.port)
                for host in info.parsed_addresses(IPVersion.V4Only)
            }
            fresh = sorted(new - sightings.get(name, set()))
            sightings[name] = new
            for public_key, host, peer_port in fresh:
                log_event(
                    log,
                    "mdns.found",
                    peer=public_key.hex(),
                    host=host,
                    port=peer_port,
                    name=name,
                    age_ms=now_ms - announcement.timestamp_ms,
                )
                await found.send(DiscoveredPeer(public_key=public_key, host=host, port=peer_port))

        async def reannounce() -> None:
            nonlocal registered
            while True:
                await trio.sleep(reannounce_interval)
                info = make_info(own_name)
                await trio.to_thread.run_sync(zc.update_service, info)
                registered = info
                log_event(log, "mdns.reannounced", level=logging.DEBUG, name=own_name)

        async with trio.open_nursery() as nursery:
            if announced:
                nursery.start_soon(reannounce)
            async for state, name in receive:
                if name.lower() == own_name.lower():
                    continue
                if state is ServiceStateChange.Removed:
                    resolving.pop(name, None)  # a resolution in flight now discards its result
                    if others.forget(name):
                        log_event(log, "mdns.other_network_removed", level=logging.DEBUG, name=name)
                    if sightings.pop(name, None) is not None:
                        log_event(log, "mdns.removed", level=logging.DEBUG, name=name)
                elif name in resolving:
                    resolving[name] = True
                else:
                    resolving[name] = False
                    nursery.start_soon(resolve, name)
    finally:
        send.close()
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT) as timeout:
            await trio.to_thread.run_sync(_close_zeroconf, zc, browser, registered, abandon_on_cancel=True)
        if timeout.cancelled_caught:
            log_event(log, "mdns.close_timeout", level=logging.WARNING, seconds=_CLOSE_TIMEOUT)
        else:
            log_event(log, "mdns.stopped", goodbye=registered is not None)
