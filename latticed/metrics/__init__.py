"""Prometheus/OpenMetrics metrics of a daemon (off unless ``metrics_listen`` is set).

* The interfaces storage and replication report through are declared by those layers
  (:class:`latticed.storage.writer.StorageMetrics`, :mod:`latticed.net.reports`): they import nothing
  of metrics or of ``prometheus_client``.
* :mod:`~latticed.metrics.live`: what must be counted as it happens, because no state keeps it (commit
  and fsync latency, bytes, per-peer replication, failures by reason).
* :mod:`~latticed.metrics.collector`: everything else, read from the daemon's existing state at scrape
  time, so the write path pays nothing for it.
* :mod:`~latticed.metrics.server`: the HTTP endpoint, a small trio server in the daemon's nursery.
"""
