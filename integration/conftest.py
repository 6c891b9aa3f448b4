"""Real daemon processes for integration tests: ``python -m latticed run --data-dir D --socket S``.

``latticed_process`` is a factory: each call starts a daemon (or several on one data directory, one after
the other), waits until its socket accepts (polling with a short, bounded backoff), and every process is
killed when the test ends. Names are prefixed so other fixtures in this directory cannot clash.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemons import LatticedProcess


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
