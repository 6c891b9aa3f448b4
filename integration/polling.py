"""Waiting, in integration tests, for what only another process can tell (a replica catching up, a file a
worker writes): poll with a growing delay, fail the test with what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

WAIT_S = 30.0


def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
