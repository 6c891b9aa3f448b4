"""Waiting, in integration tests, for what only another process can tell (a replica catching up, a file a
worker writes): poll with a growing delay, fail the test with what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

WAIT_S = 30.0


def wait_until(
    check: Callable[[], bool],
    what: str,
    timeout: float = WAIT_S,
    diagnose: Callable[[], str] | None = None,
) -> None:
    """``diagnose`` adds what the processes said (their logs' tails) to the failure, so a rare timeout in a
    loaded CI run can be explained from its report alone."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not check():
        if time.monotonic() > deadline:
            detail = f"\n{diagnose()}" if diagnose is not None else ""
            pytest.fail(f"timed out waiting for {what}{detail}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
