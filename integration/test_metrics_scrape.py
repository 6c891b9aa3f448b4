"""The metrics endpoint of real daemon processes, scraped over HTTP and read with ``prometheus_client``'s
own parser: what one daemon counts of its writes, and what a replica counts of a peer's records."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

from daemon_calls import client
from daemons import LatticedProcess
from polling import wait_until
from prometheus_client.parser import text_string_to_metric_families

Factory = Callable[..., LatticedProcess]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

METRICS = ["--metrics-listen", "127.0.0.1:0"]


def status(daemon: LatticedProcess) -> dict[str, Any]:
    with client(daemon) as c:
        return c.status()


def scrape(daemon: LatticedProcess) -> Samples:
    address = status(daemon)["metrics"]
    assert address is not None and not address.endswith(":0")  # the bound port, not the one asked for
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_a_daemon_counts_its_offers_commits_and_storage(latticed_process: Factory) -> None:
    daemon = latticed_process(args=["--no-mdns", *METRICS])
    with client(daemon) as c:
        c.queue_create("events")
        c.offer_batch("events", [(b"x" * 100, None, ()) for _ in range(250)])
        for i in range(5):
            c.offer("events", b"single %d" % i, key=b"k")
    samples = scrape(daemon)
    assert value(samples, "latticed_offered_records_total", kind="queue") == 255
    assert value(samples, "latticed_offered_bytes_total", kind="queue") == 250 * 100 + 5 * (8 + 1)
    assert value(samples, "latticed_storage_commit_seconds_count") >= 2
    assert value(samples, "latticed_storage_fsync_seconds_count") >= 2
    assert value(samples, "latticed_storage_bytes") > 0
    assert value(samples, "latticed_forked_queues") == 0
    assert value(samples, "process_resident_memory_bytes") > 0  # the daemon's own process


def test_the_endpoint_is_off_unless_asked_for(latticed_process: Factory) -> None:
    daemon = latticed_process(args=["--no-mdns"])
    assert status(daemon)["metrics"] is None
    log = daemon.log_text()
    for module in ("daemon_metrics", "metrics_collector", "metrics_http"):
        assert f"latticed.services.{module}" not in log


def test_a_replica_counts_what_it_merged_from_each_peer(latticed_process: Factory) -> None:
    origin = latticed_process(args=["--listen", "127.0.0.1:0", "--no-mdns", *METRICS])
    port = int(status(origin)["listen"].rsplit(":", 1)[1])
    replica = latticed_process(
        args=["--listen", "127.0.0.1:0", "--no-mdns", "--peer", f"127.0.0.1:{port}", *METRICS]
    )
    with client(origin) as c:
        origin_id = c.identity()
        c.queue_create("events")
        c.offer_batch("events", [(b"r%03d" % i, None, ()) for i in range(300)])
    with client(replica) as c:
        replica_id = c.identity()

    def replicated() -> float:
        return value(scrape(replica), "latticed_replicated_records_total", peer=origin_id)

    wait_until(lambda: replicated() == 300, "300 records counted as replicated from the origin")
    samples = scrape(replica)
    assert value(samples, "latticed_replicated_bytes_total", peer=origin_id) == 300 * 4
    assert value(samples, "latticed_offered_records_total", kind="queue") == 0  # none of its own
    assert value(samples, "latticed_queues", kind="queue", role="replica") == 1
    assert value(samples, "latticed_peer_connected", peer=origin_id) == 1
    assert value(samples, "latticed_peers_connected") == 1
    assert value(samples, "latticed_peer_connections_total", direction="outgoing") >= 1
    assert value(samples, "latticed_verification_failures_total", reason="tampered") == 0
    # The origin sees the replica connect in, and merged nothing from it.
    origin_samples = scrape(origin)
    assert value(origin_samples, "latticed_peer_connections_total", direction="incoming") >= 1
    assert value(origin_samples, "latticed_replicated_records_total", peer=replica_id) == 0
    lag = ("latticed_peer_lag_records", frozenset({("peer", replica_id)}))
    wait_until(lambda: scrape(origin).get(lag) == 0, "the replica in sync as the origin sees it")
