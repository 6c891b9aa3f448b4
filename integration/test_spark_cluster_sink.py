"""The lattice sink on a Spark standalone cluster (a master and two one-core workers on loopback, real
daemons): exactly once through the failures a cluster has.

* A worker dies mid-task (killed -9 with its executor, after its task's first chunks were committed):
  Spark runs the task again on the other worker, which sends the same producer id and sequences; the
  owner answers the chunks it has and writes the rest. Every row once.
* The driver of a streaming query dies mid-batch (killed -9 with its JVM, after part of the batch was
  committed): a new driver restarted from the checkpoint runs that batch again and goes on. Exactly N
  records, each once.

The whole cluster is one fixture (JVM starts dominate: ~1 min on a busy 2-core box); sizes are small.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("spark_fixtures")
from polling import wait_until  # noqa: E402
from spark_cluster import Cluster, kill_tree_of, standalone_cluster  # noqa: E402
from spark_fixtures import Daemon  # noqa: E402

pytest_plugins = ["spark_fixtures"]

pytestmark = pytest.mark.timeout(600)

DRIVER = Path(__file__).resolve().parent / "spark_cluster_driver.py"
DRIVER_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def cluster(lattice_root: Path) -> Iterator[Cluster]:
    with standalone_cluster(lattice_root / f"cluster-{os.getpid()}", workers=2) as running:
        yield running


def row(i: int) -> bytes:
    """Row ``i``'s value, as the driver makes it (~1 KB, see spark_cluster_driver.py)."""
    return b"row-%d-" % i + b"x" * 1000


def values_of(daemon: Daemon, queue: str) -> list[bytes]:
    return [e.value for e in daemon.client.range(queue, 0, 1_000_000)]


def end_of(daemon: Daemon, queue: str) -> int:
    return int(daemon.client.queue_info(queue)["end_offset"])


def finish(driver: subprocess.Popen[bytes], log: Path) -> None:
    try:
        code = driver.wait(DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        code = None
    out = log.read_text(errors="replace")
    assert code == 0 and "DRIVER DONE" in out, out[-4000:]


def test_a_worker_killed_mid_task_leaves_every_row_written_once(
    cluster: Cluster, lattice_daemon: Daemon, tmp_path: Path
) -> None:
    while sum(w.alive() for w in cluster.workers) < 2:  # a worker killed before: a new one
        cluster.add_worker()
    n = 1000
    name = f"cluster-batch-{secrets.token_hex(3)}"
    queue = lattice_daemon.client.queue_create(name)
    markers = tmp_path / "markers"
    markers.mkdir()
    log = tmp_path / "driver.log"
    driver = cluster.driver(DRIVER, "batch", str(lattice_daemon.socket), queue, str(n), str(markers), log=log)
    blocked = markers / "blocked"
    wait_until(lambda: blocked.exists() or driver.poll() is not None, "the task to stop half-way", 240)
    assert blocked.exists(), log.read_text(errors="replace")[-4000:]
    # Partition 0 is rows 0-249: its first chunks are committed, the task is mid-way. Kill its machine.
    first_rows = {row(i) for i in range(250)}
    wait_until(
        lambda: len(first_rows.intersection(values_of(lattice_daemon, queue))) >= 100,
        "the first chunks of the task that stopped",
        60,
    )
    live = [w for w in cluster.workers if w.alive()]
    killed = kill_tree_of(int(blocked.read_text()), live)
    finish(driver, log)
    assert not killed.alive()
    values = values_of(lattice_daemon, queue)
    assert len(values) == n  # the retried task's first chunks were not written again
    assert sorted(values) == sorted(row(i) for i in range(n))


def test_a_driver_killed_mid_batch_restarts_from_its_checkpoint_and_writes_each_row_once(
    cluster: Cluster, lattice_daemon: Daemon, tmp_path: Path
) -> None:
    while sum(w.alive() for w in cluster.workers) < 2:
        cluster.add_worker()
    n = 1500  # 5 micro-batches of 300
    source, sink = (f"cluster-{p}-{secrets.token_hex(3)}" for p in ("in", "out"))
    lattice_daemon.client.queue_create(source)
    out = lattice_daemon.client.queue_create(sink)
    lattice_daemon.client.offer_batch(source, [(row(i), b"k%d" % i, []) for i in range(n)])
    markers = tmp_path / "markers"
    markers.mkdir()
    checkpoint = tmp_path / "checkpoint"
    args = [str(lattice_daemon.socket), source, sink, str(checkpoint), str(markers)]

    log = tmp_path / "driver1.log"
    driver = cluster.driver(DRIVER, "stream", *args, "1", log=log)
    blocked = markers / "blocked"
    wait_until(lambda: blocked.exists() or driver.poll() is not None, "micro-batch 2 to stop half-way", 240)
    assert blocked.exists(), log.read_text(errors="replace")[-4000:]
    wait_until(lambda: end_of(lattice_daemon, out) >= 650, "batches 0-1 and a chunk of batch 2", 60)
    written_before = end_of(lattice_daemon, out)
    assert written_before < n
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and its JVM, at once
    driver.wait()
    assert not (checkpoint / "commits" / "2").exists()  # batch 2 was not committed: it runs again

    log = tmp_path / "driver2.log"
    finish(cluster.driver(DRIVER, "stream", *args, "0", log=log), log)
    values = values_of(lattice_daemon, out)
    assert len(values) == n, (len(values), written_before)
    assert sorted(values) == sorted(row(i) for i in range(n))


if __name__ == "__main__":  # pragma: no cover - for running the driver by hand
    sys.exit(pytest.main([__file__, "-q"]))
