"""The daemon's long-running services other than storage and the network: membership, health, retention,
and the Prometheus/OpenMetrics metrics.

* :mod:`.membership`: which network this daemon is in, and changing it while it runs.
* :mod:`.health`: faults an operator must hear about without asking (a forked queue, a filling disk).
* :mod:`.retention_service`: enforces owners' retention policies, replica caps and KV expiry.
* Metrics (off unless ``metrics_listen`` is set). The interfaces storage and replication report through are
  declared by those layers (:class:`latticed.storage.writer.StorageMetrics`, :mod:`latticed.net.reports`):
  they import nothing of metrics or of ``prometheus_client``. :mod:`.daemon_metrics` counts what no state
  keeps (commit and fsync latency, bytes, per-peer replication, failures by reason);
  :mod:`.metrics_collector` reads everything else from the daemon's state at scrape time, so the write path
  pays nothing for it; :mod:`.metrics_http` is the HTTP endpoint, a small trio server in the daemon's nursery.

May import: the pure packages, ``process``, ``host``, ``storage`` (its ports and change fan-out, not the
engine class), ``net`` and ``groups``. Never the local API, the composition root or the CLI (they import
services, not the other way round).
"""
