"""The composition root: the only module that knows every component and wires them together.

Start-up order (each step fails early with a clear LatticedError): no other daemon serves the socket and
the network key is fit for the listen address (the public default key is refused beyond loopback), both
checked before anything is created; directories, the data directory's lock, the identity key, the store
(migrated), replication (owned by :mod:`latticed.services.membership`, which restarts it under a new key on
``latticectl join``), work queues, retention (it reads the groups' ack floors), the API socket; then
READY=1 to systemd. One root nursery holds every service, each started with ``nursery.start`` so
"ready" means ready. SIGTERM or SIGINT
cancels that nursery: connections close, the storage thread finishes the jobs it has, the socket file is
removed, and ``run`` returns 0.

Wiring happens here and only here, through constructor arguments: a
:class:`~latticed.storage.wiring.ChangeFanout` (each commit, to the services listening) and an
:class:`~latticed.storage.wiring.OwnerFence` (held by replication while it runs) are made first and given
to the engine and to the services; the services are built before they start, so the API's ``Context`` is
complete when it is made (the replication service it shows is whichever the membership runs now).
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from latticed.api.server.api_ports import SelfCheck
from latticed.api.server.api_server import serve_api
from latticed.api.server.context import Context, package_version
from latticed.api.server.listener import refuse_if_served
from latticed.api.server.op_table import build_op_table
from latticed.crdt.signing import Identity
from latticed.groups.lease_server import RemoteLeaseServer
from latticed.groups.remote import RemoteGroups
from latticed.groups.service import GroupService
from latticed.host.checklist import daemon_checks
from latticed.host.config import DaemonConfig
from latticed.host.data_dir_lock import DataDirLock
from latticed.host.diskspace import DiskUsage
from latticed.host.identity_key import load_or_create_identity
from latticed.host.netkey import check_listen_key, load_network_key
from latticed.host.paths import ensure_data_dir, ensure_socket_dir
from latticed.host.retention_policy import ReplicaCaps
from latticed.net.leasing import LeaseLinks
from latticed.process.logs import get_logger, log_event
from latticed.process.malloc import keep_large_buffers
from latticed.process.sdnotify import Notifier, watchdog_interval
from latticed.process.ticks import shared_period, sleep_until_tick
from latticed.produce.expiry import IdleProducers
from latticed.produce.forward import RemoteOffers
from latticed.produce.owner import OfferServer, WithOffers
from latticed.protocol.addresses import HostPort
from latticed.protocol.peerstate import format_host_port
from latticed.services.daemon_metrics import DaemonMetrics
from latticed.services.health import Health
from latticed.services.membership import Membership, advertised_addresses
from latticed.services.metrics_collector import StateCollector
from latticed.services.metrics_http import serve_metrics
from latticed.services.retention_service import run_retention
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer
from latticed.storage.wiring import ChangeFanout, OwnerFence

log = get_logger(__name__)

#: The event loop and the storage thread share the GIL; with CPython's default 5 ms switch interval a
#: busy storage thread can hold a ready event loop back that long, which is the whole latency budget.
GIL_SWITCH_INTERVAL_S = 0.0005
#: First-generation threshold of the cyclic garbage collector (CPython's default is 700). A batch offer
#: decodes a few thousand lists that live until it is answered; at 700 every such request ran several
#: collections (and every tenth of those a second-generation one) although it leaves no cycles behind.
#: Reference counting frees almost everything here, so the count of live new containers rarely gets this
#: high, and the garbage it can hold back is a few MB at most.
GC_GEN0_THRESHOLD = 20_000


@dataclass(slots=True)
class RunningDaemon:
    """Handed to ``task_status.started``: what an embedding caller (tests) may look at or stop."""

    config: DaemonConfig
    identity: Identity
    engine: Engine
    #: The one sealer over ``engine`` (sealed queues' keys and epochs).
    sealer: Sealer
    #: Every commit, to whoever subscribes (tests wait on commits through it).
    changes: ChangeFanout
    _scope: trio.CancelScope
    #: The replication service's owner (tests look at the gossip state through it).
    membership: Membership | None = None

    def stop(self) -> None:
        """Begin a clean shutdown (call from the daemon's trio thread)."""
        self._scope.cancel()


async def run_daemon(
    config: DaemonConfig,
    *,
    task_status: trio.TaskStatus[RunningDaemon] = trio.TASK_STATUS_IGNORED,
    handle_signals: bool | None = None,
    tune_gc: bool | None = None,
    env: Mapping[str, str] = os.environ,
) -> None:
    """Run until SIGTERM/SIGINT (or cancellation). ``handle_signals`` defaults to "on the main thread", and
    so does ``tune_gc`` (raise the collector's first threshold, freeze what start-up built, keep large
    freed buffers for reuse: latticed/process/malloc.py): both are process-wide, so they are for a daemon that
    owns its process."""
    # First, before anything is created or tuned: a socket another daemon serves means we would only
    # refuse later, after making a data directory and an identity nobody asked for.
    refuse_if_served(config.socket_path)
    on_main_thread = threading.current_thread() is threading.main_thread()
    if handle_signals is None:
        handle_signals = on_main_thread
    if tune_gc is None:
        tune_gc = on_main_thread
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
    if tune_gc:
        _tune_gc_threshold()
        keep_large_buffers()
    notifier = Notifier.from_env(env)
    # Before anything is created: a refused key or a missing key file leaves no trace.
    network_key = load_network_key(config)
    check_listen_key(config.listen, network_key, insecure_ok=config.insecure_public_network_key)
    ensure_data_dir(config.data_dir)
    ensure_socket_dir(config.socket_path)
    with DataDirLock(config.data_dir):
        identity = load_or_create_identity(config.identity_key_path)
        # Off unless asked for: then storage and replication get nothing to report to, and pay nothing.
        metrics = DaemonMetrics(identity.public_key) if config.metrics_listen is not None else None
        # The seams between the store and the services, made first so each gets them at construction.
        changes, fence = ChangeFanout(), OwnerFence()
        async with Engine.open(
            config.data_dir,
            identity,
            group_commit_ms=config.group_commit_ms,
            changes=changes,
            fence=fence,
            metrics=metrics,
        ) as engine:
            sealer = Sealer(engine)  # the one sealer: everything that seals or opens records gets it
            sealer.install()  # sealed KV ops open for folding before any peer sends some
            health = Health(engine, config.data_dir)
            health.scan_forks()
            await health.scan_forks2()
            engine.on_storage_error = health.disk_suspect  # a failed write: sample the disk now
            # Lease forwarding rides on the replication links (whichever key they run under).
            links = LeaseLinks(
                dial=lambda peer: _dial_owner(membership, peer), max_message_bytes=config.max_frame_bytes
            )
            membership = Membership(
                engine,
                identity,
                config,
                network_key,
                changes=changes,
                fence=fence,
                metrics=metrics,
                extension=links,
            )
            groups = GroupService(engine, changes, sealer)
            remote_groups = RemoteGroups(engine, links, sealer)
            offers = OfferServer(engine, sealer)
            producers = RemoteOffers(links, offers)
            context = Context(
                engine,
                config.data_dir,
                config.socket_path,
                config.max_frame_bytes,
                sealer=sealer,
                ops=build_op_table(),
                self_check=_self_check(membership),
                groups=groups,
                remote_groups=remote_groups,
                producers=producers,
                membership=membership,
                health=health,
                default_queue_core=config.default_queue_core,
            )
            with (
                changes.subscribed(health.on_change),  # health hears of forks as they commit
                engine.core2.subscribed(context.listing.changed),  # queue list: core 2's changes
                context.listing.following(),
            ):
                try:
                    async with trio.open_nursery() as nursery:
                        if handle_signals:
                            await nursery.start(_stop_on_signal, nursery.cancel_scope, notifier)
                        await nursery.start(health.run)
                        await nursery.start(membership.run)
                        await nursery.start(groups.run)
                        await nursery.start(remote_groups.run)
                        await nursery.start(producers.run)
                        await nursery.start(links.run, WithOffers(RemoteLeaseServer(groups), offers))
                        if metrics is not None and config.metrics_listen is not None:
                            metrics.registry.register(
                                StateCollector(
                                    engine,
                                    config.data_dir,
                                    version=package_version(),
                                    replication=lambda: membership.service,
                                    groups=groups,
                                    retention=lambda: context.retention,
                                )
                            )
                            endpoint = await nursery.start(
                                serve_metrics, config.metrics_listen, metrics.registry
                            )
                            context.metrics_listen = str(endpoint)
                        context.retention = await nursery.start(
                            functools.partial(
                                run_retention,
                                expire_producers=IdleProducers(engine, config.producer_expiry_s).step,
                            ),
                            engine,
                            changes,
                            ReplicaCaps(config.replica_max_bytes, config.replica_queue_caps),
                            config.retention_interval_s,
                            groups.unsettled_floor,
                        )
                        await nursery.start(serve_api, context)
                        interval = watchdog_interval(env)
                        if interval is not None:
                            nursery.start_soon(_watchdog, notifier, interval)
                        if tune_gc:
                            # Everything built at start-up lives as long as the daemon: take it out of the
                            # collector's full passes, which then cost what the working set costs.
                            gc.freeze()
                        notifier.ready(f"serving {config.socket_path}")
                        log_event(
                            log,
                            "daemon.ready",
                            identity=identity.public_hex,
                            socket=str(config.socket_path),
                            data_dir=str(config.data_dir),
                            queues=len(engine.queues()),
                        )
                        task_status.started(
                            RunningDaemon(
                                config, identity, engine, sealer, changes, nursery.cancel_scope, membership
                            )
                        )
                finally:
                    notifier.stopping()
                    log_event(log, "daemon.stopping")
    notifier.close()
    log_event(log, "daemon.stopped")


def _self_check(membership: Membership) -> SelfCheck:
    """``doctor``'s checklist of this daemon, on the config replication runs under."""

    def check(
        facts: dict[str, Any],
        *,
        listen_address: HostPort | None,
        disk: DiskUsage | None,
        disk_error: str | None,
    ) -> list[dict[str, Any]]:
        advertised = (
            [format_host_port(a) for a in advertised_addresses(listen_address)] if listen_address else []
        )
        config = membership.config
        checks = daemon_checks(config, advertised=advertised, disk=disk, disk_error=disk_error, **facts)
        return [check.to_wire() for check in checks]

    return check


def _dial_owner(membership: Membership, peer: bytes) -> bool:
    """Dial a group's owner now (lease forwarding); False if no address of it is known."""
    service = membership.service
    return service.dial_now(peer) if service is not None else False


def _tune_gc_threshold() -> None:
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gc.get_threshold()[0], GC_GEN0_THRESHOLD), gen1, gen2)


async def _stop_on_signal(
    scope: trio.CancelScope,
    notifier: Notifier,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            log_event(log, "daemon.signal", signal=signal.Signals(signum).name)
            notifier.stopping()
            scope.cancel()
            return


async def _watchdog(notifier: Notifier, interval: float) -> None:
    """Ping systemd while the event loop runs; a wedged loop stops the pings and gets us restarted. At
    least every ``interval`` seconds, on the shared tick where it allows (``WatchdogSec=30``: every 10 s),
    so the pings cost no wake-up of their own."""
    period = shared_period(interval)
    while True:
        notifier.watchdog()
        await sleep_until_tick(period)


__all__ = ["RunningDaemon", "run_daemon"]
