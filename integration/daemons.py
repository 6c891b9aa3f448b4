"""A real daemon process for integration tests: ``python -m latticed run --data-dir D --socket S``.

Its own module (not conftest) so tests import it by a name no other conftest on the path shadows.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
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
            delay = min(delay * 2, 0.05)  # a connect attempt is cheap; a long step only delays every test

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
