"""A catch-up's bodies as one decode rebuilt them (:class:`latticed.crdt.leaf_bodies.Decoded`, or its
compiled form not built as bodies, :class:`latticed.crdt.lazy_bodies.LazyDecoded`): what
``queue2.verify_delta`` accepts from their claims is what its walk over the bodies accepts, and a run
whose claims do not hold here (another base, other records, leaves the log does not have) is walked,
so a changed body or record is still refused. Both chunk shapes: the first (its first body carried
whole) and the next ones (steps after the body the replica holds)."""

from __future__ import annotations

import dataclasses

import pytest
from support.single_offers import chunk, single_offers

from latticed.crdt import leaf_compiled, queue2
from latticed.crdt.core_errors import TamperedError
from latticed.crdt.lazy_bodies import LazyDecoded
from latticed.crdt.leaf_bodies import Decoded
from latticed.crdt.queue2 import replica_deltas
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.protocol import core2_steps

OWNER = Identity.from_seed(b"o" * 32)


def walked(state: queue2.QueueState2, d: queue2.Delta) -> queue2.Verified:
    """``verify_delta`` of ``d`` with its bodies as a plain tuple: the walk."""
    plain = dataclasses.replace(d, bodies=tuple(d.bodies))
    assert type(plain.bodies) is tuple
    return queue2.verify_delta(state, plain)


#: The decode's forms: compiled and not built as bodies, compiled and built, Python.
FORMS = {"lazy": LazyDecoded, "built": Decoded, "python": Decoded}


def use(form: str, monkeypatch: pytest.MonkeyPatch) -> type:
    """Make ``unpack_steps`` give runs of ``form``; the run type it gives then."""
    if form == "built":
        monkeypatch.setattr(core2_steps, "_lazy", lambda *a, **k: None)
    elif form == "python":
        monkeypatch.setattr(leaf_compiled, "load", lambda: None)
    return FORMS[form]


@pytest.fixture(params=["lazy", "built"])
def compiled_chunk(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> tuple[queue2.QueueState2, queue2.Delta, Decoded | LazyDecoded]:
    """A fresh replica, the owner's 40 single offers in one chunk to it, and the chunk's run as each
    compiled form of the decode gives it (checked to be of that form)."""
    kind = use(request.param, monkeypatch)
    replica = queue2.empty_state(OWNER.public_key, "q")
    d = chunk(single_offers(OWNER, range(10, 50)), replica, 4096)
    run = d.bodies
    assert isinstance(run, kind)
    assert isinstance(run, Decoded | LazyDecoded)
    return replica, d, run


def decoded(run: object, leaves: object, first: int, base: bytes, records: object) -> Decoded:
    return Decoded(run, leaves, first, base, records)  # type: ignore[arg-type]


@pytest.mark.parametrize("form", list(FORMS))
def test_each_chunk_is_a_decoded_run_verified_as_the_walk_verifies_it(
    monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    kind = use(form, monkeypatch)
    owner = single_offers(OWNER, range(10, 80))
    replica = queue2.empty_state(OWNER.public_key, "q")
    held = []
    spy = replica_deltas._holds
    monkeypatch.setattr(replica_deltas, "_holds", lambda *a, **k: held.append(spy(*a, **k)) or held[-1])
    for _ in range(3):
        d = chunk(owner, replica, 30)
        assert type(d.bodies) is kind and len(d.bodies.leaves) == len(d.bodies)
        assert [b.leaf() for b in d.bodies] == list(d.bodies.leaves)
        versions = [b.version for b in d.bodies]
        assert versions == list(range(versions[0], versions[0] + len(versions)))
        fast = queue2.verify_delta(replica, d)
        assert held[-1] is True and fast.bodies is d.bodies
        assert fast == walked(replica, d)
        replica = queue2.join_verified(replica, fast).state
    assert replica.held == owner.held and replica.records() == owner.records()


def test_a_run_whose_claims_do_not_hold_here_is_walked(
    compiled_chunk: tuple[queue2.QueueState2, queue2.Delta, Decoded | LazyDecoded],
) -> None:
    replica, d, run = compiled_chunk
    odd: list[Decoded | LazyDecoded] = [
        decoded(run, run.leaves, run.first, bytes(32), run.records),  # another base
        decoded(run, run.leaves, run.first, run.base, tuple(d.records)),  # other records (equal)
        decoded(run, (*run.leaves[:5], (bytes(32), 6), *run.leaves[6:]), run.first, run.base, run.records),
        decoded(run[:-1], run.leaves[:-1], run.first, run.base, run.records),  # not up to the end
        decoded(run[1:], run.leaves[1:], run.first, run.base, run.records),  # a body ending inside left out
    ]
    if isinstance(run, LazyDecoded):  # the same claims on the run not built
        head, lazy = run.head, run.run
        odd[:3] = [
            LazyDecoded(head, lazy, run.leaves, first=run.first, base=bytes(32), records=run.records),
            LazyDecoded(head, lazy, run.leaves, first=run.first, base=run.base, records=tuple(d.records)),
            LazyDecoded(head, lazy, odd[2].leaves, first=run.first, base=run.base, records=run.records),
        ]
    want = walked(replica, d)
    first, end = want.from_offset, want.from_offset + len(want.records)
    assert replica_deltas._holds(run, want.chains, d, first=first, base=run.base, end=end)
    for other in odd[:3]:
        assert not replica_deltas._holds(
            other, want.chains, dataclasses.replace(d, bodies=other), first=first, base=run.base, end=end
        )
        assert queue2.verify_delta(replica, dataclasses.replace(d, bodies=other)) == want
    for other in odd[3:]:
        with pytest.raises(TamperedError):
            queue2.verify_delta(replica, dataclasses.replace(d, bodies=other))


def test_a_changed_body_or_record_in_a_decoded_run_is_refused(
    compiled_chunk: tuple[queue2.QueueState2, queue2.Delta, Decoded | LazyDecoded],
) -> None:
    replica, d, run = compiled_chunk
    for at in (0, 9, len(run) - 1):
        bodies = list(run)
        bodies[at] = dataclasses.replace(bodies[at], head_hash=bytes(32))
        leaves = tuple(b.leaf() for b in bodies)  # claims consistent with the changed body
        changed = Decoded(bodies, leaves, run.first, run.base, run.records)
        with pytest.raises(TamperedError):
            queue2.verify_delta(replica, dataclasses.replace(d, bodies=changed))
    records = list(d.records)
    records[5] = make_record(b"another", timestamp=5)
    with pytest.raises(TamperedError):
        queue2.verify_delta(replica, dataclasses.replace(d, records=tuple(records)))
