"""fix23: metadata pairs as they travel (docs/protocol.md, "Metadata"). A core-1 delta's pairs must be
the owner's form, sorted and each key once, as 0.2.0 requires (core 2's pairs:
tests/crdt/test_next_version_adversary.py); ``canonical_meta`` gives that form: the pairs of the map
``meta_hash`` hashes."""

from __future__ import annotations

import dataclasses

import pytest

from latticed.crdt import queue as core
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.head import canonical_meta, meta_hash
from latticed.crdt.signing import Identity

OWNER = Identity.from_seed(b"m" * 32)


def test_canonical_meta_is_the_map_the_hash_covers() -> None:
    pairs = (("b", "2"), ("a", "x"), ("a", "1"))
    assert canonical_meta(pairs) == (("a", "1"), ("b", "2"))
    assert meta_hash(dict(canonical_meta(pairs))) == meta_hash(dict(pairs))


def test_a_core1_delta_whose_pairs_repeat_a_key_is_refused() -> None:
    state = core.commit(
        core.empty_state(OWNER.public_key, "q"), OWNER, now_ms=1, meta_updates={"a": "1", "b": "2"}
    )
    d = core.delta(state, None)
    assert d.meta == (("a", "1"), ("b", "2"))
    base = core.empty_state(OWNER.public_key, "q")
    assert core.verify_delta(base, d) is not None
    for pairs in ((("a", "1"), ("a", "1"), ("b", "2")), (("b", "2"), ("a", "1"))):
        with pytest.raises(MalformedError, match="each key once"):
            core.verify_delta(base, dataclasses.replace(d, meta=pairs))
