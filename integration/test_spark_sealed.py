"""The Spark source on a sealed queue: it reads through the local daemon's socket, so a reader's daemon
gives it plaintext and a daemon that is not a reader makes the query fail with the daemon's error."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

pytest.register_assert_rewrite("spark_fixtures")
from spark_fixtures import Daemon, free_port  # noqa: E402

pytest_plugins = ["spark_fixtures"]

pytestmark = pytest.mark.timeout(180)


def holds(daemon: Daemon, queue: str, end: int) -> bool:
    return any(q["queue"] == queue and q["end_offset"] == end for q in daemon.client.queue_list())


def test_a_readers_spark_source_reads_plaintext_and_a_non_readers_fails(
    spark: Any, daemon_factory: Any
) -> None:
    port = free_port()
    origin = daemon_factory(listen=("127.0.0.1", port))
    reader = daemon_factory("--peer", f"127.0.0.1:{port}")
    other = daemon_factory("--peer", f"127.0.0.1:{port}")
    name = f"sealed-{secrets.token_hex(3)}"
    queue = origin.client.queue_create(name, readers=[reader.identity()])
    origin.client.offer_batch(name, [(b"plain-%d" % i, b"k%d" % i, [("h", b"v")]) for i in range(10)])
    deadline = time.monotonic() + 30
    while not (holds(reader, queue, 10) and holds(other, queue, 10)):
        assert time.monotonic() < deadline, "the sealed queue did not replicate"
        time.sleep(0.1)

    def load(daemon: Daemon) -> Any:
        reads = spark.read.format("lattice").option("socket", str(daemon.socket)).option("queues", queue)
        return reads.option("includeHeaders", "true").load()

    rows = sorted(load(reader).collect(), key=lambda r: r.offset)
    assert [(r.offset, bytes(r.key), bytes(r.value)) for r in rows] == [
        (i, b"k%d" % i, b"plain-%d" % i) for i in range(10)
    ]
    assert [(h.key, bytes(h.value)) for h in rows[0].headers] == [("h", b"v")]
    with pytest.raises(Exception, match="is not a reader of its key epoch 0"):
        load(other).collect()
