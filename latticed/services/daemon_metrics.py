"""Metrics counted as things happen: only what no existing state keeps (commit and fsync latency, bytes,
per-peer replication, failures by reason). Everything else is read at scrape time
(:mod:`latticed.services.metrics_collector`).

Cost on the write path: per group commit, three ``perf_counter`` calls and two histogram observations on
the storage thread, and on the event loop one pass over the commit's changed queues and jobs (the bytes of
a batch are a C-level sum over its value column). The tallies are plain integers updated and exported on
the event loop (the scrape runs there too), so they need no locks; only the histograms, observed on the
storage thread, are ``prometheus_client`` instruments (thread-safe).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, Metric

from latticed.crdt.head import KIND_GROUP, KIND_KV, KIND_QUEUE
from latticed.crdt.queue import payload_bytes
from latticed.crdt.records import Record
from latticed.errors import ConnectionClosedError, HandshakeError, LatticedError
from latticed.net.reports import Direction
from latticed.process.logs import get_logger, log_event
from latticed.storage.core2_jobs import Commit2, Merge2
from latticed.storage.jobs import Job, Merge
from latticed.storage.writer import Change

log = get_logger(__name__)

#: Seconds. A durable group commit takes ~0.3-3 ms on an SSD; a slow or failing disk far longer.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

KIND_NAMES: dict[int, str] = {KIND_QUEUE: "queue", KIND_KV: "kv", KIND_GROUP: "group"}


def kind_name(kind: int) -> str:
    return KIND_NAMES.get(kind, str(kind))


def handshake_reason(error: LatticedError) -> str:
    """A small, fixed set of reasons for a failed connection (a label value must not carry free text)."""
    text = str(error)
    if isinstance(error, HandshakeError):
        if "network key" in text and "hung up" not in text:
            return "network_key"
        if "allow-list" in text:
            return "not_allowed"
        if "signature" in text:
            return "bad_signature"
        if "hung up" in text:
            return "hung_up"
        return "handshake"
    if isinstance(error, ConnectionClosedError):
        if text.startswith("cannot connect"):
            return "unreachable"
        if "not completed within" in text:
            return "timeout"
        return "connection_lost"
    return error.code


class DaemonMetrics:
    """The live instruments of one daemon and the registry every metric of it is served from.

    Per daemon, never ``prometheus_client``'s global registry: several daemons may share a process
    (tests), and a global registry would mix their numbers."""

    def __init__(self, own_key: bytes, registry: CollectorRegistry | None = None) -> None:
        self.own_key = own_key
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds, start time (Linux).
        ProcessCollector(registry=self.registry)
        self.commit_seconds = Histogram(
            "latticed_storage_commit_seconds",
            "Group commits: applying, signing and writing a batch of jobs until it is durable.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.fsync_seconds = Histogram(
            "latticed_storage_fsync_seconds",
            "SQLite's COMMIT of a group commit, where the WAL frames are written and fsynced.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.offered_records: Counter[str] = Counter(dict.fromkeys(KIND_NAMES.values(), 0))
        self.offered_bytes: Counter[str] = Counter(dict.fromkeys(KIND_NAMES.values(), 0))
        self.replicated_records: Counter[str] = Counter()
        self.replicated_bytes: Counter[str] = Counter()
        self.verification_failures: Counter[str] = Counter()
        self.connections: Counter[str] = Counter({"incoming": 0, "outgoing": 0})
        self.handshake_failures: Counter[tuple[str, str]] = Counter()
        self.dial_failures = 0
        self._reported_bug = False
        self.registry.register(self)

    # Every hook runs inside something that must not fail because of a metric (the storage thread right
    # after a commit, the engine's completion callback, a peer's handshake): a bug in one costs that
    # metric and one log line, never the daemon.

    # ------------------------------------------------------------------ StorageMetrics
    def observe_commit(self, commit_s: float, fsync_s: float) -> None:
        try:
            self.commit_seconds.observe(commit_s)
            self.fsync_seconds.observe(fsync_s)
        except Exception as exc:
            self._bug(exc)

    def committed(self, jobs: Sequence[Job], changes: Sequence[Change]) -> None:
        try:
            own = self.own_key
            for change in changes:
                if change.appended and change.state.owner == own:
                    kind = kind_name(change.state.kind)
                    self.offered_records[kind] += len(change.appended)
                    self.offered_bytes[kind] += payload_bytes(change.appended)
            for job in jobs:
                offered = _core2_offered(job)
                if offered:
                    self.offered_records["queue"] += len(offered)
                    self.offered_bytes["queue"] += payload_bytes(offered)
                if (
                    isinstance(job, Merge2)
                    and job.error is None
                    and job.added
                    and isinstance(job.origin, bytes)
                ):
                    self.replicated_records[job.origin.hex()] += len(job.added)
                    self.replicated_bytes[job.origin.hex()] += payload_bytes(job.added)
                if type(job) is Merge and job.error is None and job.added and isinstance(job.origin, bytes):
                    peer = job.origin.hex()
                    self.replicated_records[peer] += job.added
                    self.replicated_bytes[peer] += _added_bytes(job)
        except Exception as exc:
            self._bug(exc)

    def verification_failed(self, error: LatticedError) -> None:
        try:
            self.verification_failures[error.code] += 1
        except Exception as exc:
            self._bug(exc)

    # ------------------------------------------------------------------ PeerMetrics
    def connected(self, direction: Direction) -> None:
        try:
            self.connections[direction] += 1
        except Exception as exc:
            self._bug(exc)

    def handshake_failed(self, direction: Direction, error: LatticedError) -> None:
        try:
            reason = handshake_reason(error)
            if reason == "unreachable":
                self.dial_failures += 1  # no connection at all: not a handshake that failed
            else:
                self.handshake_failures[direction, reason] += 1
        except Exception as exc:
            self._bug(exc)

    def _bug(self, exc: Exception) -> None:
        if not self._reported_bug:  # once: a hook runs per commit
            self._reported_bug = True
            log_event(log, "metrics.count_failed", level=logging.ERROR, exc_info=exc)

    # ------------------------------------------------------------------ export
    def collect(self) -> Iterator[Metric]:
        counted = CounterMetricFamily(
            "latticed_offered_records",
            "Records appended to this daemon's own queues, by kind, since start.",
            labels=["kind"],
        )
        for kind, value in sorted(self.offered_records.items()):
            counted.add_metric([kind], value)
        yield counted
        offered = CounterMetricFamily(
            "latticed_offered_bytes",
            "Payload bytes (values and keys) appended to this daemon's own queues, by kind, since start.",
            labels=["kind"],
        )
        for kind, value in sorted(self.offered_bytes.items()):
            offered.add_metric([kind], value)
        yield offered
        records = CounterMetricFamily(
            "latticed_replicated_records",
            "Records merged from a peer (new to this daemon), by peer identity, since start.",
            labels=["peer"],
        )
        size = CounterMetricFamily(
            "latticed_replicated_bytes",
            "Payload bytes of the records merged from a peer, by peer identity, since start.",
            labels=["peer"],
        )
        for peer, value in sorted(self.replicated_records.items()):
            records.add_metric([peer], value)
            size.add_metric([peer], self.replicated_bytes[peer])
        yield records
        yield size
        failures = CounterMetricFamily(
            "latticed_verification_failures",
            "Deltas (or stored queues) that failed verification, by reason.",
            labels=["reason"],
        )
        for reason, value in sorted(self.verification_failures.items()):
            failures.add_metric([reason], value)
        yield failures
        connections = CounterMetricFamily(
            "latticed_peer_connections",
            "Peer connections that completed the handshake, by direction.",
            labels=["direction"],
        )
        for direction, value in sorted(self.connections.items()):
            connections.add_metric([direction], value)
        yield connections
        handshakes = CounterMetricFamily(
            "latticed_peer_handshake_failures",
            "Peer connections that failed before or during the handshake, by direction and reason.",
            labels=["direction", "reason"],
        )
        for (direction, reason), value in sorted(self.handshake_failures.items()):
            handshakes.add_metric([direction, reason], value)
        yield handshakes
        yield CounterMetricFamily(
            "latticed_peer_dial_failures",
            "Dials that found no peer listening (refused, unreachable or timed out).",
            value=self.dial_failures,
        )


def _core2_offered(job: Job) -> Sequence[Record]:
    """The records a committed job appended to one of our core-2 queues (a commit of core 2 is no core-1
    change): a Commit2, or one inside a producer's idempotent append that wrote (a retry writes nothing)."""
    inner = getattr(job, "inner", job)
    if job.error is None and isinstance(inner, Commit2) and inner.result is not None:
        return inner.records
    return ()


def _added_bytes(job: Merge) -> int:
    """Payload bytes of the records ``job`` added (the end of its delta, usually all of it)."""
    delta = job.verified.delta
    assert job.summary is not None
    end = job.summary.held_end - delta.from_offset
    lo, hi = max(0, end - job.added), min(end, len(delta.records))
    if hi <= lo:
        return 0
    records = delta.records
    return payload_bytes(records if lo == 0 and hi == len(records) else records[lo:hi])


__all__ = ["LATENCY_BUCKETS", "DaemonMetrics", "handshake_reason", "kind_name"]
