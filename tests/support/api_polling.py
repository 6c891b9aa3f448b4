"""Waiting, from a test's thread, for what only a daemon running in another thread can tell (its API)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds, failing with ``what`` after ``timeout`` seconds: for a fact only
    the daemon's API tells (no event to wait on across the thread)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
