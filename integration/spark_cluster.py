"""A Spark standalone cluster on loopback for tests: one master and workers of one core each, started
with pyspark's own ``spark-class`` (the launcher every Spark distribution has), so tests can kill a
worker the way a machine dies. Drivers are separate processes (``python driver.py``): a SparkContext is
one per process and the suite's ``local[2]`` session may already be up in the pytest process.

Tuned like the suite's session for a 2-core box: C1-only JIT, the serial GC, small heaps, no web UIs
doing work (their ports are picked free). Python workers run ``worker_python()`` with this checkout
first on the path, so executors import the code under test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from spark_fixtures import free_port

JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120.0


def spark_home() -> Path:
    pyspark = pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs a JDK (17): java is not on PATH and JAVA_HOME is unset")
    return Path(pyspark.__file__).parent


def cluster_env(work: Path) -> dict[str, str]:
    from latticed.spark import worker_python  # noqa: PLC0415 - needs pyspark

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.pop("LATTICED_SOCKET", None)
    env |= {
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS,
        "PYSPARK_PYTHON": worker_python(),
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    return env


def _wait_log(proc: subprocess.Popen[bytes], log: Path, text: str, what: str) -> None:
    """Spark daemons say when they are up only in their log: wait for the line (bounded)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"{what} did not start:\n{tail}")
        time.sleep(0.1)


def spark_class(work: Path, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``spark-class ARGS`` (it execs the JVM: the process is the Spark daemon), output to ``log``."""
    argv = [str(spark_home() / "bin" / "spark-class"), *args]
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work)


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Cluster:
    """A running master and its workers; ``url`` is what a driver's ``master`` is set to."""

    work: Path
    env: dict[str, str]
    url: str
    master: subprocess.Popen[bytes]
    workers: list[Worker] = field(default_factory=list)

    def add_worker(self) -> Worker:
        """One more worker of one core (registered with the master when this returns)."""
        n = len(self.workers)
        log = self.work / f"worker{n}.log"
        log.touch()
        proc = spark_class(
            self.work,
            self.env,
            log,
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--webui-port",
            str(free_port()),
            "--cores",
            "1",
            "--memory",
            "768m",
            "--work-dir",
            str(self.work / f"worker{n}"),
        )
        worker = Worker(proc, log)
        self.workers.append(worker)
        _wait_log(proc, log, "Successfully registered with master", f"spark worker {n}")
        return worker

    def driver(self, script: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
        """``python script ARGS`` as a driver of this cluster (its own session: kill it with its JVM)."""
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, str(script), self.url, *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.work,
                start_new_session=True,  # the driver and its JVM are one process group
            )

    def stop(self) -> None:
        for proc in [w.proc for w in self.workers] + [self.master]:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


@contextlib.contextmanager
def standalone_cluster(work: Path, workers: int) -> Iterator[Cluster]:
    """A master on loopback and ``workers`` workers, stopped (killed: nothing to flush) on the way out."""
    work.mkdir(parents=True, exist_ok=True)
    env = cluster_env(work)
    port = free_port()
    log = work / "master.log"
    log.touch()
    master = spark_class(
        work,
        env,
        log,
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--webui-port",
        str(free_port()),
    )
    cluster = Cluster(work, env, f"spark://127.0.0.1:{port}", master)
    try:
        _wait_log(master, log, "I have been elected leader", "spark master")
        for _ in range(workers):
            cluster.add_worker()
        yield cluster
    finally:
        cluster.stop()


def kill_tree_of(pid: int, among: list[Worker]) -> Worker:
    """Kill -9 the worker whose process tree holds ``pid`` (a task's Python worker), and the executor JVM
    between them: what a machine that dies does to its part of the job. Returns that worker."""
    chain = [pid]
    while chain[-1] > 1:
        stat = Path(f"/proc/{chain[-1]}/stat").read_text()
        chain.append(int(stat.rsplit(")", 1)[1].split()[1]))
    for worker in among:
        if worker.proc.pid in chain:
            executor = chain[chain.index(worker.proc.pid) - 1]
            for victim in (worker.proc.pid, executor):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, 9)
            worker.proc.wait()
            return worker
    raise AssertionError(f"process {pid} runs under none of the workers ({chain})")


__all__ = ["Cluster", "Worker", "kill_tree_of", "standalone_cluster"]
