"""Real daemon processes for integration tests: ``python -m latticed run --data-dir D --socket S``.

``latticed_process`` is a factory: each call starts a daemon (or several on one data directory, one after
the other), waits until its socket accepts (polling with a short, bounded backoff), and every process is
killed when the test ends. Names are prefixed so other fixtures in this directory cannot clash.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

START_TIMEOUT_S = 30.0


def socket_accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


@dataclass
class LatticedProcess:
    """One ``latticed`` daemon process (restartable on the same data directory and socket)."""

    data_dir: Path
    socket: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    history: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    #: Where the process runs (None: here). An earlier release runs from its own source tree, since
    #: ``python -m`` puts the working directory first on the path (integration/releases.py).
    cwd: Path | None = None

    def start(self, *, wait: bool = True) -> LatticedProcess:
        argv = [sys.executable, "-m", "latticed", "run"]
        argv += ["--data-dir", str(self.data_dir), "--socket", str(self.socket), *self.args]
        env = {**os.environ, **self.env}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=self.cwd
            )
        self.history.append(self.proc)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        delay = 0.01
        while not socket_accepts(self.socket):
            if self.proc.poll() is not None:
                pytest.fail(f"latticed exited with {self.proc.returncode} while starting:\n{self.log_text()}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"latticed did not accept on {self.socket} within {START_TIMEOUT_S}s:\n{self.log_text()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the daemon and wait for it; returns its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"


@pytest.fixture
def latticed_process() -> Iterator[Callable[..., LatticedProcess]]:
    """Factory: ``latticed_process()`` starts a daemon in a fresh directory; pass ``data_dir``/``socket``
    to share them. Sockets live under a short /tmp path (``sun_path`` holds 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="ld-it-"))
    made: list[LatticedProcess] = []
    counter = 0

    def factory(
        *,
        data_dir: Path | None = None,
        socket_path: Path | None = None,
        start: bool = True,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> LatticedProcess:
        nonlocal counter
        counter += 1
        daemon = LatticedProcess(
            data_dir=data_dir or root / f"data{counter}",
            socket=socket_path or root / f"d{counter}.sock",
            log=root / f"daemon{counter}.log",
            env=dict(env or {}),
            args=list(args or []),
        )
        made.append(daemon)
        if start:
            daemon.start()
        return daemon

    yield factory
    for daemon in made:
        for proc in daemon.history:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    shutil.rmtree(root, ignore_errors=True)
