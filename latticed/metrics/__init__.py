"""Prometheus/OpenMetrics metrics of a daemon (off unless ``metrics_listen`` is set).

* :mod:`~latticed.metrics.hooks`: the small interfaces storage and replication report through (no
  dependency on ``prometheus_client``, so those layers import nothing of it).
* :mod:`~latticed.metrics.live`: what must be counted as it happens, because no state keeps it (commit
  and fsync latency, bytes, per-peer replication, failures by reason).
* :mod:`~latticed.metrics.collector`: everything else, read from the daemon's existing state at scrape
  time, so the write path pays nothing for it.
* :mod:`~latticed.metrics.server`: the HTTP endpoint, a small trio server in the daemon's nursery.
"""
