"""Fixtures for the Spark tests: one SparkSession for the whole run, and real ``latticed`` daemons.

Load it with ``pytest_plugins = ["integration.spark_fixtures"]`` (or ``from integration.spark_fixtures
import *``): it lives in its own module so other engineers' conftest files cannot clobber it, and so the
JVM starts at most once per pytest run, however many Spark test files there are.

The session is tuned for a 2-core box (facts.md): ``local[2]``, no UI, 2 shuffle partitions, a 1 GB
driver, C1-only JIT and the serial GC. Python workers run the venv's interpreter (``PYSPARK_PYTHON``),
which has latticed installed, so executors can import the source.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from latticed.api.client.blocking_client import Client

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass
class Daemon:
    """A running ``latticed run`` process and a client of it."""

    socket: Path
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path
    listen: tuple[str, int] | None = None
    _client: Client | None = field(default=None, repr=False)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.socket, timeout=30.0)
        return self._client

    def identity(self) -> str:
        return self.client.identity()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        with Client(path, timeout=2.0) as probe:
            probe.call("hello")
        return True
    except Exception:
        return False


def start_daemon(root: Path, name: str, *extra: str, listen: tuple[str, int] | None = None) -> Daemon:
    """Start a daemon with its own data dir; return once its socket answers (bounded)."""
    # Socket paths are limited to 107 bytes: keep them under a short temp dir, not pytest's tmp_path.
    data_dir = root / name
    data_dir.mkdir(parents=True)
    sock = data_dir / "s.sock"
    log = data_dir / "daemon.log"
    if listen is not None or extra:
        # The full CLI knows --listen/--peer; `python -m latticed` is the minimal entry point.
        argv = [str(BIN / "latticed"), "run"]
        if listen is not None:
            argv += ["--listen", f"{listen[0]}:{listen[1]}"]
    else:
        argv = [sys.executable, "-m", "latticed", "run"]
    argv += ["--data-dir", str(data_dir / "data"), "--socket", str(sock), "--no-mdns", *extra]
    env = {k: v for k, v in os.environ.items() if k != "LATTICED_SOCKET"}
    with log.open("wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    daemon = Daemon(sock, data_dir, proc, log, listen)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _ready(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            daemon.stop()
            pytest.fail(f"latticed {name} did not start ({' '.join(argv)}):\n{daemon.log_tail()}")
        time.sleep(0.05)
    return daemon


@pytest.fixture(scope="session")
def lattice_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="lsp-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def lattice_daemon(lattice_root: Path) -> Iterator[Daemon]:
    """One daemon for the whole run; tests keep apart by using their own queue names."""
    daemon = start_daemon(lattice_root, "main")
    yield daemon
    daemon.stop()


_EXTRA_DAEMONS = itertools.count()


@pytest.fixture
def daemon_factory(lattice_root: Path) -> Iterator[Callable[..., Daemon]]:
    """Extra daemons for one test (replication), stopped when it ends."""
    started: list[Daemon] = []

    def make(*extra: str, listen: tuple[str, int] | None = None) -> Daemon:
        # One counter for the whole session: every test's daemons share lattice_root.
        name = f"extra{next(_EXTRA_DAEMONS)}-{os.getpid()}"
        daemon = start_daemon(lattice_root, name, *extra, listen=listen)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test run, with ``format("lattice")`` registered."""
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs a JDK (17): java is not on PATH and JAVA_HOME is unset")
    from pyspark.sql import SparkSession  # noqa: PLC0415 - keeps collection fast without Spark

    from latticed.spark import (  # noqa: PLC0415
        register,
        start_prefork,
        use_local_checkpoint_manager,
        worker_python,
    )

    os.environ["PYSPARK_PYTHON"] = worker_python()
    assert start_prefork() is not None  # the tests' queries run through it
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    session = (
        SparkSession.builder.master("local[2]")
        .appName("latticed-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    use_local_checkpoint_manager(session)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


__all__ = ["Daemon", "daemon_factory", "free_port", "lattice_daemon", "lattice_root", "spark", "start_daemon"]
