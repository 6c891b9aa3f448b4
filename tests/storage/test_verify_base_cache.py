"""The empty state a peer's delta is verified against is cached per queue: the same state as
``empty_state`` builds, and the same refusals for anything it refuses (nothing refused is cached)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue as core
from latticed.errors import LatticedError
from latticed.storage.replica import _empty_state


def _outcome(build: Any, owner: Any, name: Any, kind: Any) -> object:
    try:
        return build(owner, name, kind)
    except LatticedError as error:
        return type(error), str(error)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.binary(min_size=32, max_size=32), st.binary(max_size=40), st.none()),
    st.one_of(st.text(max_size=12), st.sampled_from(["a/b", "", "x" * 300, "live"]), st.none()),
    st.one_of(st.integers(min_value=0, max_value=255), st.booleans()),
)
def test_cached_base_equals_empty_state(owner: Any, name: Any, kind: Any) -> None:
    first = _outcome(_empty_state, owner, name, kind)
    assert first == _outcome(core.empty_state, owner, name, kind)
    assert _outcome(_empty_state, owner, name, kind) == first  # a second ask (the cached one) too


def test_refused_names_are_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(LatticedError):
            _empty_state(b"o" * 32, "a/b", 1)
