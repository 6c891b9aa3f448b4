"""The metrics read from the daemon's own state at scrape time: queues, records, forks, lag, storage,
peers and consumer groups. Nothing on the write path is instrumented for them.

A scrape runs on the daemon's event loop (:mod:`latticed.services.metrics_http`), where that state is only
ever changed, so it sees a consistent snapshot and needs no locks. Its cost is a pass over the queues'
in-memory
heads, the peer table and the groups' counters (what ``latticectl status`` and ``group stats`` cost).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from latticed.groups.service import GroupService
from latticed.host.core2_reach import core2_blind_peers
from latticed.services.daemon_metrics import KIND_NAMES
from latticed.services.lag_metrics import lag_histogram
from latticed.services.service_ports import MetricsStore

#: What ``Replication.counters()`` calls them -> (metric name, help).
_GOSSIP_COUNTERS = {
    "deltas_in": ("latticed_deltas_received", "Deltas received from peers and stored."),
    "deltas_out": ("latticed_deltas_sent", "Deltas sent to peers."),
    "rejected_deltas": ("latticed_deltas_rejected", "Peer links closed because a delta failed verification."),
    "protocol_errors": ("latticed_peer_protocol_errors", "Peer links closed for breaking the protocol."),
    "duplicate_identities": (
        "latticed_duplicate_identities",
        "Times a peer's identity connected again from another run while its first link was live.",
    ),
    "identity_notices": (
        "latticed_identity_notices",
        "Notices from peers that another daemon runs this daemon's identity.",
    ),
    "foreign_heads": (
        "latticed_foreign_heads",
        "Heads of this daemon's own queues that came back signed by another run of its identity.",
    ),
    "delta_reads_raced": (
        "latticed_delta_reads_raced",
        "Reads of a delta for a peer that lost their rows or queue to a commit of this daemon's meanwhile "
        "(read again; after the last try the delta waits for the queue's next change, logged as "
        "peer.delta_read_raced). Not a peer's fault: its link is kept.",
    ),
}
#: Consumer-group counts exported, as :class:`~latticed.leases.outcomes.GroupStats` names them.
_GROUP_STATES = ("available", "leased", "failed", "dead")


class ReplicationSource(Protocol):
    """What the collector reads of the replication service
    (:class:`latticed.net.replication_service.Replication`)."""

    def counters(self) -> dict[str, int]: ...

    def peers(self) -> list[dict[str, Any]]: ...


class RetentionSource(Protocol):
    """What the collector reads of retention
    (:class:`latticed.services.retention_service.RetentionService`)."""

    def counters_dict(self) -> dict[str, int]: ...


#: Retention's counters exported, by role (owner: our truncations; replica: drops under a replica cap).
_RETENTION_DROPS = {
    "latticed_retention_truncated_records": (
        "Records retention removed, by role: owner (truncations this daemon signed on its own queues) and "
        "replica (dropped here only, under a replica cap), since start.",
        {"owner": "records_truncated", "replica": "records_dropped_locally"},
    ),
    "latticed_retention_truncated_bytes": (
        "Bytes those records took in the store (values, keys, headers, timestamps, chain values; not "
        "SQLite's page overhead), by role, since start.",
        {"owner": "bytes_truncated", "replica": "bytes_dropped_locally"},
    ),
}
_RETENTION_COUNTS = {
    "failures": ("latticed_retention_failures", "Retention steps that failed (logged as retention.failed)."),
    "kv_keys_purged": ("latticed_retention_kv_keys_purged", "Expired KV keys deleted, since start."),
    "kv_ops_compacted": (
        "latticed_retention_kv_ops_compacted",
        "Ops of this daemon's KV log dropped because they no longer decide any key, since start.",
    ),
    "producers_expired": (
        "latticed_retention_producers_expired",
        "Idle producers whose remembered sequences this owner dropped (producer_expiry_s), since start.",
    ),
}


class StateCollector:
    """A ``prometheus_client`` collector over one daemon's engine, replication and groups."""

    def __init__(
        self,
        engine: MetricsStore,
        data_dir: Path,
        *,
        version: str,
        replication: Callable[[], ReplicationSource | None] = lambda: None,
        groups: GroupService | None = None,
        retention: Callable[[], RetentionSource | None] = lambda: None,
    ) -> None:
        """``replication`` is asked at each scrape: the service is restarted under a new network key on a
        join, and may not run at all. ``retention`` too: it starts after the metrics endpoint."""
        self.engine = engine
        self.data_dir = data_dir
        self.version = version
        self.replication = replication
        self.groups = groups
        self.retention = retention

    def collect(self) -> Iterator[Metric]:
        yield InfoMetricFamily(
            "latticed",
            "This daemon's identity (public key) and version.",
            value={"identity": self.engine.public_key.hex(), "version": self.version},
        )
        yield from self._queues()
        yield from self._storage()
        replication = self.replication()
        if replication is not None:
            yield from self._replication(replication)
        if self.groups is not None:
            yield from self._groups(self.groups)
        retention = self.retention()
        if retention is not None:
            yield from _retention(retention.counters_dict())

    def _queues(self) -> Iterator[Metric]:
        engine = self.engine
        own = engine.public_key
        queues: Counter[tuple[str, str]] = Counter()
        stored: Counter[tuple[str, str]] = Counter()
        forked = 0
        behind = 0
        lags: list[int] = []
        for kind, kind_label in KIND_NAMES.items():
            for q in engine.queues(kind):
                state = engine.state(q)
                owned = state.owner == own
                labels = (kind_label, "owner" if owned else "replica")
                queues[labels] += 1
                stored[labels] += state.held_end - state.start
                forked += state.forked
                behind += max(0, state.known_end - state.held_end)
                lags.append(state.known_end - state.held_end)
        core2 = engine.core2
        for kind, kind_label in KIND_NAMES.items():
            for q in core2.queues(kind):
                labels = (kind_label, "owner" if core2.owned(q) else "replica")
                queues[labels] += 1
                value = core2.loaded(q)  # every one loaded at start (Core2View.load_all)
                if value is not None:
                    stored[labels] += value.held[1] - value.held[0]
        forked += len(core2.forked_entries())  # frozen core-2 queues: the list status shows
        yield _by_labels(
            GaugeMetricFamily("latticed_queues", "Queues held, by kind and role.", labels=["kind", "role"]),
            queues,
        )
        yield _by_labels(
            GaugeMetricFamily(
                "latticed_stored_records",
                "Records held (after truncation), by kind and role.",
                labels=["kind", "role"],
            ),
            stored,
        )
        yield GaugeMetricFamily(
            "latticed_forked_queues",
            "Queues whose owner was caught signing two histories (core 1: permanent, see the logs for the "
            "proof; core 2: frozen until the owner recovers it).",
            value=forked,
        )
        yield GaugeMetricFamily(
            "latticed_replica_lag_records",
            "Records their owners have signed that this daemon does not hold yet, summed over queues.",
            value=behind,
        )
        yield lag_histogram(lags)

    def _storage(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "latticed_storage_bytes",
            "Size of the store: the SQLite database, its WAL and shared-memory files.",
            value=self.engine.storage_bytes(),
        )
        try:
            fs = os.statvfs(self.data_dir)
        except OSError:
            return
        yield GaugeMetricFamily(
            "latticed_filesystem_avail_bytes",
            "Bytes available to the daemon on the data directory's filesystem.",
            value=fs.f_bavail * fs.f_frsize,
        )
        yield GaugeMetricFamily(
            "latticed_filesystem_size_bytes",
            "Size of the data directory's filesystem.",
            value=fs.f_blocks * fs.f_frsize,
        )

    def _replication(self, replication: ReplicationSource) -> Iterator[Metric]:
        counters = replication.counters()
        for counter, (name, help_text) in _GOSSIP_COUNTERS.items():
            if counter in counters:
                yield CounterMetricFamily(name, help_text, value=counters[counter])
        yield from _traffic(counters)
        if "identity_refusing_writes" in counters:
            yield GaugeMetricFamily(
                "latticed_identity_refusing_writes",
                "1 while this daemon refuses its own writes: another daemon runs its identity "
                "(`latticectl identity`).",
                value=counters["identity_refusing_writes"],
            )
        rows = replication.peers()
        core2 = sum(len(self.engine.core2.queues(kind)) for kind in KIND_NAMES)
        yield GaugeMetricFamily(
            "latticed_peers_without_core2",
            "Connected peers that receive none of this daemon's core-2 queues (no heads-v2: 0.2.x).",
            value=len(core2_blind_peers(rows, core2)),
        )
        if "queues_cut_off" in counters:
            yield GaugeMetricFamily(
                "latticed_queues_cut_off",
                "Queues of other owners that every link carrying them pruned: no peer pushes them to this "
                "daemon, each record waits for a HAVE and a graft timer (off the eager tree).",
                value=counters["queues_cut_off"],
            )
        yield from _trees(rows)
        addresses: Counter[str] = Counter(str(row.get("state", "unknown")) for row in rows)
        connected: dict[str, int] = {}
        lag: dict[str, int] = {}
        for row in rows:
            key = row.get("public_key")
            if not isinstance(key, str) or not key:
                continue
            connected[key] = max(connected.get(key, 0), int(bool(row.get("connected"))))
            behind = sum(max(0, int(v)) for v in (row.get("lag") or {}).values())
            if row.get("connected"):
                lag[key] = max(lag.get(key, 0), behind)
        yield GaugeMetricFamily(
            "latticed_peers_connected",
            "Peers connected now.",
            value=counters.get("connected", sum(connected.values())),
        )
        yield _by_labels(
            GaugeMetricFamily(
                "latticed_peer_addresses",
                "Known peer addresses, by state (idle, dialing, connected, self).",
                labels=["state"],
            ),
            {(state,): n for state, n in addresses.items()},
        )
        yield _by_labels(
            GaugeMetricFamily(
                "latticed_peer_connected",
                "1 while this known peer (by identity) is connected, else 0.",
                labels=["peer"],
            ),
            {(key,): value for key, value in connected.items()},
        )
        yield _by_labels(
            GaugeMetricFamily(
                "latticed_peer_lag_records",
                "Records this daemon holds that a connected peer lacks, summed over the queues both hold.",
                labels=["peer"],
            ),
            {(key,): value for key, value in lag.items()},
        )

    def _groups(self, groups: GroupService) -> Iterator[Metric]:
        records = GaugeMetricFamily(
            "latticed_group_records",
            "Records of the consumer groups this daemon runs, by state: available, leased, failed "
            "(waiting for a retry), dead (in the dead-letter queue).",
            labels=["group", "state"],
        )
        consumers = GaugeMetricFamily(
            "latticed_group_consumers", "Consumers attached to a group.", labels=["group"]
        )
        oldest = GaugeMetricFamily(
            "latticed_group_oldest_unsettled_seconds",
            "Age of the oldest record a group has not settled (by its producer timestamp).",
            labels=["group"],
        )
        now = groups.now()
        for rt in groups.running():
            stats = rt.dispatcher.stats(now)
            for state in _GROUP_STATES:
                records.add_metric([rt.name, state], getattr(stats, state))
            consumers.add_metric([rt.name], stats.consumers)
            if stats.oldest_age_s is not None:
                oldest.add_metric([rt.name], stats.oldest_age_s)
        yield records
        yield consumers
        yield oldest


def _trees(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    """Per connected peer, its link's place in the queues' eager trees (Plumtree): the queues it pushes
    to us, those we pruned (it announces them), those it pruned (we announce them to it)."""
    families = {
        "queues_eager_in": GaugeMetricFamily(
            "latticed_peer_queues_eager_in",
            "Queues this connected peer pushes to us (eager).",
            labels=["peer"],
        ),
        "queues_pruned_in": GaugeMetricFamily(
            "latticed_peer_queues_pruned_in",
            "Queues we pruned on this peer's link: it announces them (HAVE) until we graft.",
            labels=["peer"],
        ),
        "queues_lazy_out": GaugeMetricFamily(
            "latticed_peer_queues_lazy_out",
            "Queues this peer pruned on its link: we announce them to it rather than push.",
            labels=["peer"],
        ),
    }
    seen: set[str] = set()
    for row in rows:
        key = row.get("public_key")
        if not isinstance(key, str) or key in seen or row.get("queues_eager_in") is None:
            continue
        seen.add(key)  # a twin's row repeats the identity: its first link stands for it
        for field_name, family in families.items():
            family.add_metric([key], int(row[field_name]))
    yield from families.values()


def _retention(counters: dict[str, int]) -> Iterator[Metric]:
    for name, (help_text, by_role) in _RETENTION_DROPS.items():
        family = CounterMetricFamily(name, help_text, labels=["role"])
        for role, counter in by_role.items():
            family.add_metric([role], counters.get(counter, 0))
        yield family
    for counter, (name, help_text) in _RETENTION_COUNTS.items():
        yield CounterMetricFamily(name, help_text, value=counters.get(counter, 0))


def _traffic(counters: dict[str, int]) -> Iterator[Metric]:
    """Replication messages and their bytes, by direction and message type (``received_delta``,
    ``received_delta_bytes``... in the counters): where the copies and bytes of a record come from."""
    messages = CounterMetricFamily(
        "latticed_peer_messages",
        "Replication messages exchanged with peers, by direction (sent, received) and type (delta, ack, "
        "have, want, prune, digest...).",
        labels=["direction", "type"],
    )
    sizes = CounterMetricFamily(
        "latticed_peer_message_bytes",
        "Bytes of replication messages (decrypted, before framing) exchanged with peers, by direction "
        "and type.",
        labels=["direction", "type"],
    )
    for name, value in sorted(counters.items()):
        direction, _, rest = name.partition("_")
        if direction not in ("sent", "received") or not rest:
            continue
        if rest.endswith("_bytes"):
            sizes.add_metric([direction, rest.removesuffix("_bytes")], value)
        else:
            messages.add_metric([direction, rest], value)
    yield messages
    yield sizes


def _by_labels(
    family: GaugeMetricFamily, values: Counter[tuple[str, str]] | dict[tuple[str], int]
) -> GaugeMetricFamily:
    for labels, value in sorted(values.items()):
        family.add_metric(list(labels), value)
    return family


__all__ = ["ReplicationSource", "RetentionSource", "StateCollector"]
