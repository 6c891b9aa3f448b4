"""The compiled passes' tests skip where a pass was not built, and fail instead where CI says it must be
(``LATTICED_REQUIRE_ACCEL=1``): :mod:`support.accel`, which every such test's ``built`` fixture uses."""

from __future__ import annotations

import pytest
from support.accel import required


def test_a_pass_not_built_fails_where_it_is_required_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LATTICED_REQUIRE_ACCEL", "1")
    with pytest.raises(pytest.fail.Exception, match="the pass is not built"):
        required(None, "the pass")
    monkeypatch.delenv("LATTICED_REQUIRE_ACCEL")
    with pytest.raises(pytest.skip.Exception, match="the pass is not built"):
        required(None, "the pass")
    built = object()
    assert required(built, "the pass") is built
