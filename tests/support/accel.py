"""The tests of an optional compiled pass need it built: where it is not (no C compiler at install) they
skip, unless ``LATTICED_REQUIRE_ACCEL=1`` (set by .ci/run: CI installs with a compiler) makes them fail,
so that CI never passes by skipping what it built."""

from __future__ import annotations

import os
from typing import NoReturn, TypeVar

import pytest

T = TypeVar("T")


def not_built(what: str) -> NoReturn:
    """Skip (or, where the pass is required, fail) the test: ``what`` was not built."""
    message = f"{what} is not built (no C compiler at install?)"
    if os.environ.get("LATTICED_REQUIRE_ACCEL") == "1":
        pytest.fail(message)
    pytest.skip(message)


def required(found: T | None, what: str) -> T:
    """``found``, a compiled pass as its loader gives it; None (``what`` not built) skips or fails."""
    if found is None:
        not_built(what)
    return found
