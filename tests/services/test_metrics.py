"""Metrics without a daemon process: the live counts the engine reports per commit, the collector over the
engine's state (read through ``prometheus_client``'s own text parser), failure reasons, and the HTTP
endpoint served from a trio nursery."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import (
    ConnectionClosedError,
    HandshakeError,
    IntegrityError,
    LatticedError,
    MalformedError,
)
from latticed.facades.lattice_queue import LatticeQueue
from latticed.groups.service import GroupService
from latticed.produce.owner import OfferServer
from latticed.services.daemon_metrics import DaemonMetrics, handshake_reason
from latticed.services.health import Health
from latticed.services.metrics_collector import StateCollector
from latticed.services.metrics_http import (
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    serve_metrics,
)
from latticed.storage.core2_jobs import Merge2
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer
from latticed.storage.wiring import ChangeFanout

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
PEER = Identity.from_seed(b"p" * 32).public_key
OTHER = Identity.from_seed(b"o" * 32).public_key

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


class FakeReplication:
    """What the collector reads of replication, as ``Replication.counters()/peers()`` shape it."""

    def counters(self) -> dict[str, int]:
        return {
            "rejected_deltas": 1,
            "protocol_errors": 2,
            "deltas_in": 30,
            "deltas_out": 40,
            "connected": 1,
            "received_delta": 31,
            "received_delta_bytes": 6200,
            "sent_have": 4,
            "sent_have_bytes": 280,
            "duplicate_identities": 2,
            "identity_notices": 1,
            "foreign_heads": 3,
            "identity_refusing_writes": 1,
            "delta_reads_raced": 4,
            "queues_cut_off": 2,
        }

    def peers(self) -> list[dict[str, Any]]:
        return [
            {
                "public_key": PEER.hex(),
                "state": "connected",
                "connected": True,
                "lag": {"x/a": 5, "x/b": -3},
                "queues_eager_in": 3,
                "queues_pruned_in": 1,
                "queues_lazy_out": 2,
            },
            {"public_key": OTHER.hex(), "state": "dialing", "connected": False, "lag": {}},
            {"public_key": None, "state": "idle", "connected": False, "lag": {}},
        ]


async def test_commits_merges_and_state_read_through_the_text_parser(tmp_path: Path) -> None:
    metrics = DaemonMetrics(ALICE.public_key)
    changes = ChangeFanout()
    async with (
        Engine.open(tmp_path, ALICE, metrics=metrics, changes=changes) as engine,
        trio.open_nursery() as nursery,
    ):
        q = await engine.create_queue("events")
        await engine.append(q, [Record(b"v%d" % i, b"k") for i in range(10)])  # 10 x (2 + 1) bytes
        await engine.append(q, [Record(b"hello")])
        feed = LatticeQueue.create(BOB, "feed")
        feed.offer(b"abc")
        feed.offer(b"defg", key=b"kk")
        await engine.merged(engine.submit_merge(await engine.verify_delta(feed.delta()), origin=PEER))
        # The same records again (from another peer): nothing new, so nothing counted for it.
        await engine.merged(engine.submit_merge(await engine.verify_delta(feed.delta()), origin=OTHER))
        d = feed.delta()
        with pytest.raises(IntegrityError):
            await engine.verify_delta(dataclasses.replace(d, records=(Record(b"forged"), *d.records[1:])))
        # BOB signs a second history of "feed": the replica detects the fork.
        fork = LatticeQueue.create(BOB, "feed")
        fork.offer(b"xyz")
        fork.offer(b"other")
        await engine.merged(engine.submit_merge(await engine.verify_delta(fork.delta()), origin=OTHER))
        groups = await nursery.start(GroupService(engine, changes, Sealer(engine)).run)
        rt = await groups.create("mailer", ["events"])
        groups.take(rt, "consumer-1", None, 2)
        metrics.registry.register(
            StateCollector(engine, tmp_path, version="9.9", replication=FakeReplication, groups=groups)
        )
        samples = parse(generate_latest(metrics.registry).decode())
        nursery.cancel_scope.cancel()

    assert value(samples, "latticed_offered_records_total", kind="queue") == 11
    assert value(samples, "latticed_offered_bytes_total", kind="queue") == 30 + 5
    assert value(samples, "latticed_offered_records_total", kind="kv") == 0
    assert value(samples, "latticed_replicated_records_total", peer=PEER.hex()) == 2
    assert value(samples, "latticed_replicated_bytes_total", peer=PEER.hex()) == 3 + 4 + 2
    assert ("latticed_replicated_records_total", frozenset({("peer", OTHER.hex())})) not in samples
    assert value(samples, "latticed_verification_failures_total", reason="tampered") == 1
    assert value(samples, "latticed_forked_queues") == 1
    # create, 2 appends, 3 merges, the group's queues and its first commits: every one timed.
    commits = value(samples, "latticed_storage_commit_seconds_count")
    assert commits >= 6 and value(samples, "latticed_storage_fsync_seconds_count") == commits
    assert value(samples, "latticed_storage_commit_seconds_sum") >= value(
        samples, "latticed_storage_fsync_seconds_sum"
    )
    assert value(samples, "latticed_storage_bytes") > 0
    assert value(samples, "latticed_filesystem_avail_bytes") > 0
    assert value(samples, "latticed_queues", kind="queue", role="owner") == 2  # events and mailer's DLQ
    assert value(samples, "latticed_queues", kind="queue", role="replica") == 1
    assert value(samples, "latticed_stored_records", kind="queue", role="owner") == 11
    assert value(samples, "latticed_info", identity=ALICE.public_hex, version="9.9") == 1
    assert value(samples, "latticed_group_records", group="mailer", state="available") == 9
    assert value(samples, "latticed_group_records", group="mailer", state="leased") == 2
    assert value(samples, "latticed_group_records", group="mailer", state="dead") == 0
    assert value(samples, "latticed_group_consumers", group="mailer") == 1
    # Replication, as its counters() and peers() report it.
    assert value(samples, "latticed_deltas_received_total") == 30
    assert value(samples, "latticed_deltas_rejected_total") == 1
    # Another daemon runs an identity: seen here twice, told of, seen in our heads; we refuse writes.
    assert value(samples, "latticed_duplicate_identities_total") == 2
    assert value(samples, "latticed_identity_notices_total") == 1
    assert value(samples, "latticed_foreign_heads_total") == 3
    assert value(samples, "latticed_identity_refusing_writes") == 1
    # Our reads of deltas that lost their rows to our own commits (the link kept, read again).
    assert value(samples, "latticed_delta_reads_raced_total") == 4
    assert value(samples, "latticed_peers_connected") == 1
    assert value(samples, "latticed_peer_lag_records", peer=PEER.hex()) == 5
    assert value(samples, "latticed_peer_connected", peer=PEER.hex()) == 1
    assert value(samples, "latticed_peer_connected", peer=OTHER.hex()) == 0
    assert ("latticed_peer_lag_records", frozenset({("peer", OTHER.hex())})) not in samples
    # Each connected link's place in the eager trees, and the queues no link pushes to us.
    assert value(samples, "latticed_peer_queues_eager_in", peer=PEER.hex()) == 3
    assert value(samples, "latticed_peer_queues_pruned_in", peer=PEER.hex()) == 1
    assert value(samples, "latticed_peer_queues_lazy_out", peer=PEER.hex()) == 2
    assert ("latticed_peer_queues_eager_in", frozenset({("peer", OTHER.hex())})) not in samples
    assert value(samples, "latticed_queues_cut_off") == 2
    assert value(samples, "latticed_peer_addresses", state="idle") == 1
    assert value(samples, "latticed_peer_messages_total", direction="received", type="delta") == 31
    assert value(samples, "latticed_peer_message_bytes_total", direction="received", type="delta") == 6200
    assert value(samples, "latticed_peer_messages_total", direction="sent", type="have") == 4


async def test_offered_records_and_bytes_both_count_since_the_daemon_started(tmp_path: Path) -> None:
    """Both are counters of this run (Prometheus' rate() expects that), not the queues' lifetimes."""
    async with Engine.open(tmp_path, ALICE, metrics=DaemonMetrics(ALICE.public_key)) as engine:
        q = await engine.create_queue("events")
        await engine.append(q, [Record(b"before") for _ in range(5)])
    metrics = DaemonMetrics(ALICE.public_key)  # the next start
    async with Engine.open(tmp_path, ALICE, metrics=metrics) as engine:
        await engine.append(engine.resolve("events"), [Record(b"v%d" % i) for i in range(2)])
        metrics.registry.register(StateCollector(engine, tmp_path, version="9.9"))
        samples = parse(generate_latest(metrics.registry).decode())
    assert value(samples, "latticed_offered_records_total", kind="queue") == 2
    assert value(samples, "latticed_offered_bytes_total", kind="queue") == 2 * 2


async def test_offers_into_a_core2_queue_are_counted(tmp_path: Path) -> None:
    """A core-2 commit is no core-1 change: plain offers and a producer's are counted, a retry is not."""
    metrics = DaemonMetrics(ALICE.public_key)
    async with Engine.open(tmp_path, ALICE, metrics=metrics) as engine:
        q = await engine.create_queue("events", core=2)
        await engine.append(q, [Record(b"v%d" % i) for i in range(3)])
        offers = OfferServer(engine, Sealer(engine))
        for _ in range(2):  # the second is a retry of the same sequence: nothing written
            await engine.outcome(offers.start(ALICE.public_key, q, "p", 0, [[b"pp", None, None]]))
        samples = parse(generate_latest(metrics.registry).decode())
    assert value(samples, "latticed_offered_records_total", kind="queue") == 4
    assert value(samples, "latticed_offered_bytes_total", kind="queue") == 3 * 2 + 2


async def test_records_merged_into_a_core2_replica_are_counted_by_peer(tmp_path: Path) -> None:
    for name in ("owner", "replica"):
        (tmp_path / name).mkdir()
    metrics = DaemonMetrics(BOB.public_key)
    async with (
        Engine.open(tmp_path / "owner", ALICE) as owner,
        Engine.open(tmp_path / "replica", BOB, metrics=metrics) as replica,
    ):
        q = await owner.create_queue("events", core=2)
        await owner.append(q, [Record(b"r%d" % i) for i in range(3)])
        for _ in range(2):  # the second merge adds nothing
            job = Merge2(await owner.core2.delta_for(q, None))
            job.origin = ALICE.public_key
            await replica.bridge.run(job)
        samples = parse(generate_latest(metrics.registry).decode())
    assert value(samples, "latticed_replicated_records_total", peer=ALICE.public_key.hex()) == 3
    assert value(samples, "latticed_replicated_bytes_total", peer=ALICE.public_key.hex()) == 3 * 2


class FakeRetention:
    def counters_dict(self) -> dict[str, int]:
        return {
            "records_truncated": 900,
            "bytes_truncated": 65_000,
            "records_dropped_locally": 7,
            "bytes_dropped_locally": 700,
            "failures": 1,
            "kv_keys_purged": 3,
            "kv_ops_compacted": 4,
        }


async def test_retention_counters_are_exported_by_role(tmp_path: Path) -> None:
    metrics = DaemonMetrics(ALICE.public_key)
    async with Engine.open(tmp_path, ALICE, metrics=metrics) as engine:
        metrics.registry.register(StateCollector(engine, tmp_path, version="9.9", retention=FakeRetention))
        samples = parse(generate_latest(metrics.registry).decode())
    assert value(samples, "latticed_retention_truncated_records_total", role="owner") == 900
    assert value(samples, "latticed_retention_truncated_records_total", role="replica") == 7
    assert value(samples, "latticed_retention_truncated_bytes_total", role="owner") == 65_000
    assert value(samples, "latticed_retention_truncated_bytes_total", role="replica") == 700
    assert value(samples, "latticed_retention_failures_total") == 1
    assert value(samples, "latticed_retention_kv_keys_purged_total") == 3
    assert value(samples, "latticed_retention_kv_ops_compacted_total") == 4


async def test_an_engine_without_metrics_reports_nothing(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        q = await engine.create_queue("events")
        assert await engine.append(q, [Record(b"x")]) == 0


def test_peer_metrics_count_connections_and_failures_by_reason() -> None:
    metrics = DaemonMetrics(ALICE.public_key)
    metrics.connected("incoming")
    metrics.handshake_failed("incoming", HandshakeError("msg1 failed authentication: another network key"))
    metrics.handshake_failed("outgoing", HandshakeError("peer 00ff is not in the allow-list"))
    metrics.handshake_failed("outgoing", ConnectionClosedError("cannot connect to 10.0.0.1:7464: refused"))
    samples = parse(generate_latest(metrics.registry).decode())
    assert value(samples, "latticed_peer_connections_total", direction="incoming") == 1
    assert value(samples, "latticed_peer_connections_total", direction="outgoing") == 0
    failures = "latticed_peer_handshake_failures_total"
    assert value(samples, failures, direction="incoming", reason="network_key") == 1
    assert value(samples, failures, direction="outgoing", reason="not_allowed") == 1
    assert value(samples, "latticed_peer_dial_failures_total") == 1  # no handshake ever started


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (HandshakeError("msg2 failed authentication: the peer has another network key"), "network_key"),
        (HandshakeError("msg3 failed decryption: tampered, ..., or another network key"), "network_key"),
        (HandshakeError("peer 3b6a is not in the allow-list"), "not_allowed"),
        (HandshakeError("the responder's signature over the handshake does not verify"), "bad_signature"),
        (HandshakeError("peer hung up during the handshake: it has another network key, or"), "hung_up"),
        (HandshakeError("the peer's ephemeral key is a low-order point"), "handshake"),
        (ConnectionClosedError("handshake not completed within 10 s"), "timeout"),
        (ConnectionClosedError("connection lost during the handshake: reset"), "connection_lost"),
        (ConnectionClosedError("cannot connect to h:1: timed out after 10 s"), "unreachable"),
        (MalformedError("bad frame"), "malformed"),
    ],
)
def test_handshake_reasons_are_a_closed_set(error: Exception, reason: str) -> None:
    assert handshake_reason(error) == reason  # type: ignore[arg-type]


def test_a_bug_in_counting_costs_the_metric_not_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    """The hooks run right after a commit on the storage thread, in the engine's completion callback and
    in a peer's handshake: none may raise into them."""
    metrics = DaemonMetrics(ALICE.public_key)
    metrics.committed([], [object()])  # type: ignore[list-item]
    metrics.committed([], [object()])  # type: ignore[list-item]
    metrics.observe_commit("slow", 0.1)  # type: ignore[arg-type]
    metrics.handshake_failed("incoming", object())  # type: ignore[arg-type]
    metrics.verification_failed(object())  # type: ignore[arg-type]
    assert sum("metrics.count_failed" in r.getMessage() for r in caplog.records) == 1  # logged once


# ---------------------------------------------------------------------------------------------- the endpoint


async def http(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body


async def test_the_endpoint_serves_both_formats_and_refuses_the_rest(tmp_path: Path) -> None:
    metrics = DaemonMetrics(ALICE.public_key)
    metrics.verification_failed(IntegrityError("x"))
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(serve_metrics, ("127.0.0.1", 0), metrics.registry)
        assert endpoint.port != 0 and str(endpoint) == f"127.0.0.1:{endpoint.port}"

        status, headers, body = await http(endpoint.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        assert int(headers["content-length"]) == len(body)
        assert value(parse(body.decode()), "latticed_verification_failures_total", reason="integrity") == 1

        accept = b"Accept: application/openmetrics-text; version=1.0.0\r\nAccept-Encoding: gzip\r\n"
        status, headers, body = await http(endpoint.port, b"GET /metrics HTTP/1.1\r\n" + accept + b"\r\n")
        assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
        assert headers["content-encoding"] == "gzip" and gzip.decompress(body).endswith(b"# EOF\n")

        status, _, body = await http(endpoint.port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert status == 200 and body == b""
        assert (await http(endpoint.port, b"GET /nope HTTP/1.1\r\n\r\n"))[0] == 404
        assert (await http(endpoint.port, b"POST /metrics HTTP/1.1\r\n\r\n"))[0] == 405
        assert (await http(endpoint.port, b"hello\r\n\r\n"))[0] == 400
        assert (await http(endpoint.port, b"GET /metrics HTTP/1.1\r\nX: " + b"y" * MAX_REQUEST_BYTES))[
            0
        ] == 400
        # A client that connects and says nothing holds one connection slot, not the endpoint.
        async with await trio.open_tcp_stream("127.0.0.1", endpoint.port):
            assert (await http(endpoint.port, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200
        nursery.cancel_scope.cancel()
    # It stopped with its nursery: nothing listens there any more.
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", endpoint.port)


async def test_a_busy_port_is_one_clear_error() -> None:
    metrics = DaemonMetrics(ALICE.public_key)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(serve_metrics, ("127.0.0.1", 0), metrics.registry)
        with pytest.raises(LatticedError, match=r"cannot serve metrics on 127\.0\.0\.1"):
            await serve_metrics(("127.0.0.1", endpoint.port), metrics.registry)
        nursery.cancel_scope.cancel()


async def test_slow_clients_cannot_keep_a_scraper_out() -> None:
    """More clients than there are slots connect and dribble half a request (what blocked 52 of 60
    scrapes): each scrape is still answered, the newest connection shedding the oldest, and a client that
    never finishes its request is cut after the read deadline."""
    metrics = DaemonMetrics(ALICE.public_key)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(serve_metrics, ("127.0.0.1", 0), metrics.registry)
        slow = []
        for _ in range(MAX_CONNECTIONS + 8):
            stream = await trio.open_tcp_stream("127.0.0.1", endpoint.port)
            await stream.send_all(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            slow.append(stream)
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        for _ in range(5):
            assert (await http(endpoint.port, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200
        with trio.fail_after(REQUEST_TIMEOUT_S + 2):
            assert await slow[-1].receive_some(1) == b""  # cut by the deadline, unanswered
        for stream in slow:
            await stream.aclose()
        nursery.cancel_scope.cancel()


def _forked_core2() -> queue2.Delta:
    """BOB's core-2 queue "c2" signed twice past its 10th record (a copied store): the whole frozen value."""
    base = queue2.commit(
        queue2.empty_state(BOB.public_key, "c2"),
        BOB,
        now_ms=1,
        records=[Record(b"s%d" % i) for i in range(10)],
    )
    mine = queue2.commit(base, BOB, now_ms=2, records=[Record(b"a%d" % i) for i in range(5)])
    copy = queue2.commit(base, BOB, now_ms=3, records=[Record(b"b%d" % i) for i in range(3)])
    joined = queue2.join(mine, copy)
    assert joined.forked
    return queue2.delta(joined, None)


async def test_a_frozen_core2_queue_is_a_forked_queue_in_metrics_and_health(tmp_path: Path) -> None:
    """One list of forks: the health service's (status, doctor) holds the frozen core-2 queue, and the
    scrape counts it, after a restart too (its value loaded at start)."""
    d = _forked_core2()
    async with Engine.open(tmp_path, ALICE) as engine:
        verified, against = await engine.core2.verify(d)
        await engine.core2.merge(d, verified, against)
    metrics = DaemonMetrics(ALICE.public_key)
    async with Engine.open(tmp_path, ALICE, metrics=metrics) as engine:
        health = Health(engine, tmp_path)
        await health.scan_forks2()
        metrics.registry.register(StateCollector(engine, tmp_path, version="9.9"))
        samples = parse(generate_latest(metrics.registry).decode())
        forks = health.forked_queues()
        assert await health.forks() == forks
    assert value(samples, "latticed_forked_queues") == 1
    assert [(f["queue"], f["core"], f["fork_point"], f["owned"]) for f in forks] == [
        (f"{BOB.public_key.hex()}/c2", 2, 10, False)
    ]
