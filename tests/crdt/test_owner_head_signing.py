"""The owner's head a batch (``queue2.commit``) signed with fewer Python calls (wake26): libsodium's
``crypto_sign`` called directly, the head and the state built by their constructors. The same bytes are
signed and the same values come out as through PyNaCl's ``SigningKey.sign`` and ``dataclasses.replace``."""

from __future__ import annotations

import dataclasses

import nacl.signing
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity, verify

_RECORDS = st.lists(
    st.builds(
        Record,
        st.binary(max_size=300),
        st.none() | st.binary(max_size=40),
        st.integers(min_value=0, max_value=2**62),
        st.just(()),
    ),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=400))
def test_sign_gives_pynacls_signature(seed: bytes, message: bytes) -> None:
    identity = Identity.from_seed(seed)
    signature = identity.sign(message)
    assert signature == nacl.signing.SigningKey(seed).sign(message).signature
    verify(identity.public_key, message, signature)
    assert identity.sign(_Bytes(message)) == signature  # not plain bytes: PyNaCl's path, the same


class _Bytes(bytes):
    """A bytes subclass: ``Identity.sign`` hands it to PyNaCl, as before."""


@settings(max_examples=100, deadline=None)
@given(
    seed=st.binary(min_size=32, max_size=32),
    batches=st.lists(_RECORDS, min_size=1, max_size=4),
    meta=st.none() | st.dictionaries(st.sampled_from(["a", "b"]), st.none() | st.text(max_size=5)),
    now=st.integers(min_value=0, max_value=2**40),
)
def test_commit_signs_the_body_as_pynacl_and_replace_did(
    seed: bytes, batches: list[list[Record]], meta: dict[str, str | None] | None, now: int
) -> None:
    identity = Identity.from_seed(seed)
    key = nacl.signing.SigningKey(seed)
    state = queue2.empty_state(identity.public_key, "q", 1)
    for n, records in enumerate(batches):
        before = state
        state = queue2.commit(
            state, identity, now_ms=now + n, records=records, meta_updates=meta if n == 0 else None
        )
        head = state.chains.tips[0].head
        unsigned = dataclasses.replace(head, signature=b"")
        assert head == dataclasses.replace(unsigned, signature=key.sign(unsigned.body()).signature)
        assert head.to_bytes() == unsigned.body() + key.sign(unsigned.body()).signature
        # The constructor's state is the one ``replace`` made (every field; ``memo`` afresh).
        again = dataclasses.replace(
            before, chains=state.chains, meta=state.meta, entries=state.entries, bodies=state.bodies
        )
        assert [getattr(again, f.name) for f in dataclasses.fields(again)] == [
            getattr(state, f.name) for f in dataclasses.fields(state)
        ]
        assert state.held[1] == before.held[1] + len(records)
