"""Merging foreign queue state verifies first: forged, tampered, wrong-owner, malformed and replayed input,
and owner equivocation with its fork proofs.

Every rejection must leave the receiving replica exactly as it was: equal state and the same reads.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed import (
    BadSignatureError,
    EquivocationError,
    ForkProof,
    GapError,
    Identity,
    IntegrityError,
    LatticedError,
    LatticeQueue,
    MalformedError,
    QueueDelta,
    QueueState,
    Record,
    TamperedError,
    WrongOwnerError,
)
from latticed.crdt import queue as core
from latticed.crdt.forks import Bridge
from latticed.crdt.head import KIND_QUEUE, SignedHead
from latticed.crdt.records import MAX_OFFSET, record_digest
from latticed.crdt.wire import decode_delta, encode_delta, pack, summary_from_wire, summary_to_wire, unpack

OWNER = Identity.from_seed(bytes(range(32)))
OTHER = Identity.from_seed(bytes([9]) * 32)
NAME = "events"


def ticking(start: int = 1_000) -> Callable[[], int]:
    return itertools.count(start).__next__


def source() -> LatticeQueue:
    """An owner queue with keys, headers, metadata, a truncation and several signed commits."""
    q = LatticeQueue.create(OWNER, NAME, clock=ticking())
    q.set_meta("name", "orders")
    for i in range(6):
        q.offer(f"v{i}", key=None if i % 2 else f"k{i}", headers={"n": str(i)} if i % 3 == 0 else None)
        if i % 2:
            q.commit()
    q.truncate(1)
    return q


def holding(upto: int) -> LatticeQueue:
    """A replica that already holds an older honest copy of :func:`source` (offsets below ``upto``)."""
    r = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    old = LatticeQueue.create(OWNER, NAME, clock=ticking())
    old.set_meta("name", "orders")
    for i in range(upto):
        old.offer(f"v{i}", key=None if i % 2 else f"k{i}", headers={"n": str(i)} if i % 3 == 0 else None)
        if i % 2:
            old.commit()
    r.merge(old.state)
    return r


def reads(r: LatticeQueue) -> tuple[object, ...]:
    return (
        r.start_offset,
        r.end_offset,
        r.size,
        r.range_entries(-1, 100),
        r.peek_first_entry(),
        r.peek_last_entry(),
        r.get_meta("name"),
        r.forked,
    )


def replicas() -> list[LatticeQueue]:
    """Receivers to attack: one that holds nothing, one that holds an older honest copy, and the owner."""
    return [LatticeQueue.empty_replica(OWNER.public_key, NAME), holding(4), source()]


def assert_rejected(bad: object, error: type[LatticedError]) -> None:
    for r in replicas():
        before, seen = r.state, reads(r)
        with pytest.raises(error):
            r.merge(bad)  # type: ignore[arg-type]
        assert r.state == before
        assert reads(r) == seen
        assert not r.forked


def full_delta() -> QueueDelta:
    d = source().delta()
    assert len(d.records) == 5 and d.meta is not None
    return d


def with_record(d: QueueDelta, index: int, **changes: Any) -> QueueDelta:
    records = list(d.records)
    records[index] = replace(records[index], **changes)
    return replace(d, records=tuple(records))


# ------------------------------------------------------------------------------------- honest baseline


def test_the_honest_inputs_used_below_are_accepted() -> None:
    q = source()
    for r in replicas():
        r.merge(full_delta())
        assert r.state == q.state
        assert r.range(0, 10) == [b"v1", b"v2", b"v3", b"v4", b"v5"]
    for r in replicas():
        r.merge(q.state)
        assert r.state == q.state and not r.forked


# ---------------------------------------------------------------------------------- unsigned & forged


def test_unsigned_head_is_rejected() -> None:
    d = full_delta()
    assert d.head is not None
    assert_rejected(replace(d, head=replace(d.head, signature=b"")), BadSignatureError)
    assert_rejected(replace(d, head=replace(d.head, signature=bytes(64))), BadSignatureError)


def test_records_or_metadata_without_any_head_are_rejected() -> None:
    d = full_delta()
    assert_rejected(replace(d, head=None), MalformedError)
    assert_rejected(replace(d, head=None, tip=None, records=(), checkpoints=()), MalformedError)
    assert_rejected(QueueDelta(OWNER.public_key, NAME, 0, None, meta=(("name", "evil"),)), MalformedError)


def test_records_without_a_vouching_tip_are_rejected() -> None:
    d = full_delta()
    assert_rejected(replace(d, tip=None), MalformedError)


def resigned(head: SignedHead, identity: Identity, **changes: Any) -> SignedHead:
    fields: dict[str, Any] = {
        f.name: getattr(head, f.name) for f in dataclasses.fields(head) if f.name != "signature"
    }
    fields.update(changes)
    return SignedHead.sign(identity, **fields)


def test_a_head_signed_by_another_key_is_rejected() -> None:
    d = full_delta()
    assert d.head is not None and d.tip is not None
    forged = resigned(d.head, OTHER, end=d.head.end)
    assert_rejected(replace(d, head=forged, tip=forged), BadSignatureError)
    assert_rejected(replace(d, tip=resigned(d.tip, OTHER)), BadSignatureError)
    # The other key signing a head that moves the start: still not the owner's signature.
    assert_rejected(replace(d, head=resigned(d.head, OTHER, start=3)), BadSignatureError)


@pytest.mark.parametrize(
    "field", ["version", "start", "end", "meta_version", "timestamp", "base_hash", "head_hash", "meta_hash"]
)
def test_any_signed_head_field_altered_breaks_the_signature(field: str) -> None:
    d = full_delta()
    assert d.head is not None
    value = getattr(d.head, field)
    altered: Any = value + 1 if isinstance(value, int) else bytes([value[0] ^ 1]) + value[1:]
    changes: dict[str, Any] = {field: altered}
    head = replace(d.head, **changes)
    assert_rejected(replace(d, head=head, tip=head), BadSignatureError)
    # Through the state path as well.
    state = source().state
    assert state.head is not None
    assert_rejected(replace(state, head=replace(state.head, **changes)), BadSignatureError)


def test_a_tampered_checkpoint_is_rejected() -> None:
    q = source()
    for i in range(6, 12):
        q.offer(f"v{i}")
        q.commit()
    d = q.delta()
    assert len(d.checkpoints) >= 2
    first = d.checkpoints[0]
    bad_sig = replace(first, end=first.end + 1)
    assert_rejected(replace(d, checkpoints=(bad_sig, *d.checkpoints[1:])), BadSignatureError)
    # Validly signed, but for records other than these (a head of another history of the same queue).
    rogue = LatticeQueue.create(OWNER, NAME, clock=ticking())
    for i in range(3):
        rogue.offer(f"rogue{i}")
    rogue_head = rogue.state.head
    assert rogue_head is not None
    assert_rejected(replace(d, checkpoints=(*d.checkpoints, rogue_head)), TamperedError)
    # Validly signed and honest, but outside the records this delta carries.
    chunk = q.delta(max_records=3)
    outside = [c for c in d.checkpoints if c.end > chunk.end_offset]
    assert outside
    assert_rejected(replace(chunk, checkpoints=(*chunk.checkpoints, outside[0])), TamperedError)


# --------------------------------------------------------------------------------------- wrong owner


def test_another_keys_queue_of_the_same_name_is_rejected() -> None:
    theirs = LatticeQueue.create(OTHER, NAME, clock=ticking())
    theirs.offer("not yours")
    assert_rejected(theirs.state, WrongOwnerError)
    assert_rejected(theirs.delta(), WrongOwnerError)
    # Relabelled as ours: the heads still name the other key's queue.
    assert_rejected(replace(theirs.delta(), owner=OWNER.public_key), WrongOwnerError)


def test_the_same_keys_queue_of_another_name_is_rejected() -> None:
    sibling = LatticeQueue.create(OWNER, "other-queue", clock=ticking())
    sibling.offer("x")
    assert_rejected(sibling.state, WrongOwnerError)
    assert_rejected(replace(sibling.delta(), name=NAME), WrongOwnerError)


def test_a_verified_replica_refuses_to_become_another_queue() -> None:
    q = source()
    with pytest.raises(WrongOwnerError):
        core.merge(core.empty_state(OTHER.public_key, NAME), q.state)


# ---------------------------------------------------------------------------------------- tampering


@pytest.mark.parametrize(
    "change",
    [
        {"value": b"forged"},
        {"key": b"forged"},
        {"key": None},
        {"key": b""},
        {"timestamp": 1},
        {"headers": (("n", b"forged"),)},
        {"headers": ()},
        {"headers": (("n", b"3"), ("extra", b"1"))},
    ],
)
def test_any_record_field_altered_is_tampering(change: dict[str, Any]) -> None:
    d = full_delta()
    index = 2  # offset 3: no key, headers {"n": "3"}
    assert d.records[index].key is None and d.records[index].headers == (("n", b"3"),)
    if all(getattr(d.records[index], k) == v for k, v in change.items()):
        index = 1  # offset 2, key b"k2": so that "key=None" is a change too
    assert_rejected(with_record(d, index, **change), TamperedError)


def test_dropped_added_or_reordered_records_are_tampering() -> None:
    d = full_delta()
    assert_rejected(replace(d, records=d.records[:-1]), TamperedError)
    assert_rejected(replace(d, records=(*d.records, Record(value=b"extra"))), TamperedError)
    swapped = (d.records[1], d.records[0], *d.records[2:])
    assert_rejected(replace(d, records=swapped), TamperedError)


def test_moving_records_to_other_offsets_is_tampering() -> None:
    d = full_delta()
    assert_rejected(replace(d, from_offset=d.from_offset + 1), TamperedError)
    assert_rejected(replace(d, from_offset=0), TamperedError)
    assert_rejected(replace(d, from_hash=bytes(32)), TamperedError)


@pytest.mark.parametrize(
    "meta",
    [(("name", "evil"),), (), (("name", "orders"), ("zzz", "added")), (("aaa", "added"), ("name", "orders"))],
)
def test_altered_metadata_is_tampering(meta: tuple[tuple[str, str], ...]) -> None:
    assert_rejected(replace(full_delta(), meta=meta), TamperedError)
    assert_rejected(replace(source().state, meta=meta), TamperedError)


def test_tampered_state_entries_are_rejected() -> None:
    state = source().state
    entries = state.entries
    records = entries.records()
    chains = [entries.chain(i) for i in range(len(entries))]
    records[0] = replace(records[0], value=b"forged")
    forged = replace(state, entries=core.EntryView(records, chains))
    assert_rejected(forged, TamperedError)
    shorter = replace(state, entries=core.EntryView(records[1:], chains[1:]))
    assert_rejected(shorter, TamperedError)


def test_tampered_start_offset_is_rejected() -> None:
    state = source().state
    assert state.head is not None
    assert_rejected(replace(state, head=replace(state.head, start=0)), BadSignatureError)
    assert_rejected(replace(state, head=replace(state.head, start=3)), BadSignatureError)
    d = full_delta()
    assert_rejected(replace(d, from_offset=0, records=(Record(value=b"v0"), *d.records)), TamperedError)


def test_a_tampered_state_is_rejected_when_used_to_build_a_replica() -> None:
    state = source().state
    with pytest.raises(TamperedError):
        LatticeQueue.replica(replace(state, meta=(("name", "evil"),)))
    assert state.head is not None
    with pytest.raises(BadSignatureError):
        LatticeQueue.replica(replace(state, head=replace(state.head, end=99)))
    with pytest.raises(MalformedError):
        LatticeQueue.replica(None)  # type: ignore[arg-type]
    assert LatticeQueue.replica(state).state == state


# ---------------------------------------------------------------------------------------- malformed


@pytest.mark.parametrize("junk", [None, "state", b"\x00" * 32, {"owner": b""}, 42, [1, 2]])
def test_values_that_are_not_states_or_deltas_are_malformed(junk: object) -> None:
    assert_rejected(junk, MalformedError)


@pytest.mark.parametrize(
    "change",
    [
        {"value": "text, not bytes"},
        {"value": None},
        {"key": "text key"},
        {"key": 5},
        {"timestamp": "1"},
        {"timestamp": 2**63},
        {"headers": [("n", b"3")]},
        {"headers": (("n",),)},
        {"headers": (("n", "3"),)},
        {"headers": ((b"n", b"3"),)},
    ],
)
def test_malformed_records_are_rejected(change: dict[str, Any]) -> None:
    assert_rejected(with_record(full_delta(), 2, **change), MalformedError)


def test_a_record_that_is_not_a_record_is_rejected() -> None:
    d = full_delta()
    not_records: Any = ("v1", *d.records[1:])
    assert_rejected(replace(d, records=not_records), MalformedError)
    as_list: Any = list(d.records)
    assert_rejected(replace(d, records=as_list), MalformedError)


@pytest.mark.parametrize(
    "change",
    [
        {"version": -1},
        {"version": "7"},
        {"start": 2**64},
        {"end": 1.5},
        {"head_hash": b"\x00" * 31},
        {"base_hash": None},
        {"signature": "sig"},
        {"queue_id": b"short"},
    ],
)
def test_malformed_heads_are_rejected(change: dict[str, Any]) -> None:
    d = full_delta()
    assert d.head is not None
    head = replace(d.head, **change)
    assert_rejected(replace(d, head=head, tip=head), MalformedError)
    state = source().state
    assert state.head is not None
    assert_rejected(replace(state, head=replace(state.head, **change)), MalformedError)


PAST_THE_END = st.integers(MAX_OFFSET + 1, 2**64 - 1)


@settings(max_examples=25, deadline=None)
@given(start=PAST_THE_END, extra=st.integers(0, 10))
def test_an_owner_signed_head_past_the_last_offset_is_refused(start: int, extra: int) -> None:
    """The owner's own commit refuses offsets past MAX_OFFSET, so no replica may accept (and then store
    or serve) a head that has them, even under the owner's valid signature."""
    state = source().state
    assert state.head is not None
    end = min(start + extra, 2**64 - 1)
    head = resigned(state.head, OWNER, version=state.head.version + 1, start=start, end=end)
    bare = QueueDelta(OWNER.public_key, NAME, KIND_QUEUE, head, meta=state.meta)
    assert_rejected(bare, MalformedError)
    assert_rejected(replace(state, head=head), MalformedError)
    with pytest.raises(MalformedError):
        decode_delta(encode_delta(bare))


def test_a_checkpoint_or_tip_past_the_last_offset_is_refused() -> None:
    d = full_delta()
    assert d.tip is not None
    past = resigned(d.tip, OWNER, end=MAX_OFFSET + 1)
    assert_rejected(replace(d, checkpoints=(past,)), MalformedError)
    assert_rejected(replace(d, tip=past), MalformedError)
    with pytest.raises(MalformedError):
        decode_delta(encode_delta(replace(d, checkpoints=(past,))))


def test_offsets_past_the_last_one_are_refused_on_the_wire() -> None:
    d = full_delta()
    raw = unpack(encode_delta(d))
    raw[7] = MAX_OFFSET + 1
    with pytest.raises(MalformedError):
        decode_delta(pack(raw))
    assert_rejected(replace(d, from_offset=MAX_OFFSET + 1), MalformedError)
    summary = summary_to_wire(source().summary())
    for index in (1, 2):
        bad = list(summary)
        bad[index] = MAX_OFFSET + 1
        with pytest.raises(MalformedError):
            summary_from_wire(bad)


def test_a_queue_truncated_to_the_last_offset_still_replicates() -> None:
    q = source()
    q.truncate(MAX_OFFSET)
    r = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    r.merge(decode_delta(encode_delta(q.delta())))
    assert r.state == q.state and (r.start_offset, r.end_offset) == (MAX_OFFSET, MAX_OFFSET)


def test_a_head_hash_with_extra_bytes_is_not_accepted_under_a_valid_signature() -> None:
    """``struct`` cuts a 33-byte field to 32 when packing, so without a length check the owner's
    signature would "verify" over a head whose hash is not the one it signed."""
    q = LatticeQueue.create(OWNER, NAME, clock=ticking())
    q.set_meta("name", "orders")
    state = q.state
    assert state.head is not None
    padded = replace(state.head, head_hash=state.head.head_hash + b"!")
    assert padded.body() == state.head.body()  # the signed bytes really are the same
    assert_rejected(replace(state, head=padded), MalformedError)


@pytest.mark.parametrize(
    "meta",
    [
        {"name": "orders"},
        [("name", "orders")],
        (("name", b"orders"),),
        (("name",),),
        (("name", "orders"), ("name", "orders")),
        (("z", "1"), ("a", "2")),
    ],
)
def test_malformed_metadata_is_rejected(meta: Any) -> None:
    assert_rejected(replace(full_delta(), meta=meta), MalformedError)


@pytest.mark.parametrize(
    "change",
    [
        {"head": b"head"},
        {"tip": "tip"},
        {"checkpoints": None},
        {"checkpoints": ("x",)},
        {"fork": "proof"},
        {"from_offset": -1},
        {"from_offset": "1"},
        {"from_hash": "hash"},
        {"from_hash": b"\x00" * 33},
        {"records": None},
        {"owner": None},
        {"name": 5},
        {"kind": "0"},
    ],
)
def test_malformed_delta_fields_are_rejected(change: dict[str, Any]) -> None:
    assert_rejected(replace(full_delta(), **change), MalformedError)


def test_typed_errors_share_one_root() -> None:
    for integrity in (BadSignatureError, WrongOwnerError, TamperedError, EquivocationError):
        assert issubclass(integrity, IntegrityError)
    for error in (IntegrityError, MalformedError):
        assert issubclass(error, LatticedError)


# ---------------------------------------------------------------------------------- replay & old data


def test_an_older_valid_state_merges_as_a_no_op() -> None:
    q = LatticeQueue.create(OWNER, NAME, clock=ticking())
    q.set_meta("name", "v1")
    q.offer("a")
    old = q.state
    q.offer("b")
    q.set_meta("name", "v2")
    q.truncate(1)
    for r in (LatticeQueue.replica(q.state), q):
        before, seen = r.state, reads(r)
        r.merge(old)
        assert r.state == before
        assert reads(r) == seen
        assert r.get_meta("name") == "v2" and r.start_offset == 1
        assert not r.forked


def test_a_replayed_old_delta_is_a_no_op() -> None:
    q = LatticeQueue.create(OWNER, NAME, clock=ticking())
    r = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    q.offer("a")
    first = q.delta(r.summary())
    r.merge(first)
    q.offer("b")
    q.set_meta("name", "x")
    second = q.delta(r.summary())
    r.merge(second)
    q.truncate(2)
    q.offer("c")
    r.merge(q.delta(r.summary()))
    before, seen = r.state, reads(r)
    for replayed in (first, second, first):
        r.merge(replayed)
        assert r.state == before
        assert reads(r) == seen
    assert r.range(0, 10) == [b"c"] and not r.forked


# -------------------------------------------------------------------------------------- equivocation


def two_writers() -> tuple[LatticeQueue, LatticeQueue]:
    """Two instances holding the same key for the same queue: the owner equivocates if both write."""
    return (
        LatticeQueue.create(OWNER, NAME, clock=ticking()),
        LatticeQueue.create(OWNER, NAME, clock=ticking()),
    )


def assert_forked(*queues: LatticeQueue) -> list[ForkProof]:
    proofs = []
    for q in queues:
        assert q.forked
        proof = q.equivocation
        assert proof is not None
        proof.verify()
        assert (proof.owner, proof.name) == (OWNER.public_key, NAME)
        proofs.append(proof)
    return proofs


def test_two_writers_offering_different_records_is_an_equivocation() -> None:
    a, b = two_writers()
    a.offer("from a")
    b.offer("from b")
    state_a, state_b = a.state, b.state
    a.merge(state_b)
    b.merge(state_a)
    observer = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    observer.merge(state_a)
    observer.merge(state_b)
    proofs = assert_forked(a, b, observer)
    # Each stops where it stood (its own records), and all keep the same proof.
    assert a.state.entries == state_a.entries and b.state.entries == state_b.entries
    assert proofs[0] == proofs[1] == proofs[2]


def test_divergence_after_a_common_prefix_is_an_equivocation() -> None:
    a, b = two_writers()
    a.offer("shared")
    b.merge(a.state)
    a.offer("a1")
    a.commit()
    a.offer("a2")
    b.offer("b1")
    observer = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    observer.merge(a.state)
    observer.merge(b.state)
    (proof,) = assert_forked(observer)
    # Here no two heads contradict each other on their own: the proof has to show the chains differ.
    assert proof.offset == 2
    assert proof.bridge_a is not None or proof.bridge_b is not None


def test_diverging_truncations_are_an_equivocation() -> None:
    a, b = two_writers()
    for v in "xyz":
        a.offer(v)
    b.merge(a.state)
    a.truncate(1)
    b.truncate(2)
    a.merge(b.state)
    assert_forked(a)


def test_equivocation_is_caught_through_deltas_and_spreads_with_its_proof() -> None:
    a, b = two_writers()
    a.offer("shared")
    b.merge(a.state)
    a.offer("a")
    b.offer("b")
    r = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    r.merge(a.delta(r.summary()))
    r.merge(b.delta(r.summary()))
    assert_forked(r)
    # A replica that never saw the other history learns of the fork from the proof alone.
    bystander = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    bystander.merge(a.state)
    assert not bystander.forked
    bystander.merge(r.state)
    assert_forked(bystander)


def test_honest_histories_are_never_flagged() -> None:
    q = LatticeQueue.create(OWNER, NAME, clock=ticking())
    r = LatticeQueue.empty_replica(OWNER.public_key, NAME)
    states: list[QueueState] = []
    for i in range(12):
        q.offer(f"v{i}")
        if i % 3 == 2:
            q.commit()
        if i % 5 == 4:
            q.truncate(i - 1)
        if i % 4 == 0:
            q.set_meta("step", str(i))
        states.append(q.state)
    random.Random(7).shuffle(states)
    for state in states:
        r.merge(state)
    assert not r.forked and r.equivocation is None
    assert r.state == q.state


# ------------------------------------------------------------------------------------- doctored proofs


def a_proof() -> ForkProof:
    a, b = two_writers()
    a.offer("from a")
    b.offer("from b")
    a.merge(b.state)
    proof = a.equivocation
    assert proof is not None
    proof.verify()
    return proof


def a_bridged_proof() -> tuple[LatticeQueue, ForkProof]:
    a, b = two_writers()
    a.offer("shared")
    b.merge(a.state)
    a.offer("a1")
    a.commit()
    a.offer("a2")
    b.offer("b1")
    a.merge(b.state)
    proof = a.equivocation
    assert proof is not None and proof.offset >= 0
    proof.verify()
    return a, proof


def test_a_proof_with_a_swapped_signature_fails() -> None:
    proof = a_proof()
    doctored = replace(proof, a=replace(proof.a, signature=proof.b.signature))
    with pytest.raises(EquivocationError):
        doctored.verify()


def test_a_proof_with_an_altered_bridge_fails() -> None:
    _, proof = a_bridged_proof()
    side = "bridge_a" if proof.bridge_a is not None else "bridge_b"
    bridge: Bridge | None = getattr(proof, side)
    assert bridge is not None and bridge.digests
    flipped = bytes([bridge.digests[0][0] ^ 1]) + bridge.digests[0][1:]
    altered = Bridge(bridge.start_hash, (flipped, *bridge.digests[1:]))
    moved = Bridge(bytes(32), bridge.digests)
    shortened = Bridge(bridge.start_hash, ())
    for doctored in (altered, moved, shortened):
        changes: dict[str, Any] = {side: doctored}
        with pytest.raises(EquivocationError):
            replace(proof, **changes).verify()


def test_a_proof_with_heads_of_two_different_queues_fails() -> None:
    proof = a_proof()
    sibling = LatticeQueue.create(OWNER, "other-queue", clock=ticking())
    sibling.offer("x")
    head = sibling.state.head
    assert head is not None
    with pytest.raises(EquivocationError):
        replace(proof, b=head).verify()
    # Nor does relabelling the proof with another queue's key or name make it about that queue.
    with pytest.raises(EquivocationError):
        replace(proof, owner=OTHER.public_key).verify()
    with pytest.raises(EquivocationError):
        replace(proof, name="other-queue").verify()


def test_a_proof_naming_one_head_twice_fails() -> None:
    proof = a_proof()
    with pytest.raises(EquivocationError):
        replace(proof, b=proof.a).verify()


def test_a_proof_of_two_consistent_heads_fails() -> None:
    q = LatticeQueue.create(OWNER, NAME, clock=ticking())
    q.offer("a")
    first = q.state
    q.offer("b")
    second = q.state
    assert first.head is not None and second.head is not None
    with pytest.raises(EquivocationError):
        ForkProof(OWNER.public_key, NAME, 0, first.head, second.head).verify()
    # Nor at an offset both sign identically.
    with pytest.raises(EquivocationError):
        ForkProof(OWNER.public_key, NAME, 0, first.head, second.head, offset=0).verify()


def test_a_proof_cannot_be_forged_by_re_splitting_an_honest_chain() -> None:
    """Chain steps hash ``c || d``; if a bridge's pieces could be any length, the 64 bytes of an honest
    step could be re-split into a different "chain value" at the same offset, framing an honest owner."""
    q = LatticeQueue.create(OWNER, NAME, clock=ticking())
    for i in range(5):
        q.offer(f"v{i}")
    first = q.state
    q.offer("v5")
    second = q.state
    assert first.head is not None and second.head is not None
    c4 = second.chain_at(4)
    assert c4 is not None
    d4 = record_digest(second.entries.record(4), 4)
    d5 = record_digest(second.entries.record(5), 5)
    honest = Bridge(c4, (d4, d5))
    resplit = Bridge(c4[:16], (c4[16:] + d4,))
    proof = ForkProof(OWNER.public_key, NAME, 0, first.head, second.head, 4, resplit, honest)
    with pytest.raises(EquivocationError):
        proof.verify()
    framed = replace(q.delta(), fork=proof)
    assert_rejected(framed, EquivocationError)


def test_a_proof_with_malformed_parts_fails_with_an_equivocation_error() -> None:
    proof = a_proof()
    for change in (
        {"a": "head"},
        {"owner": b"short"},
        {"name": ""},
        {"kind": 300},
        {"offset": "0"},
        {"bridge_a": "bridge"},
        {"a": replace(proof.a, version=-1)},
    ):
        with pytest.raises(EquivocationError):
            replace(proof, **change).verify()


def test_merging_a_state_carrying_a_doctored_proof_is_rejected() -> None:
    a, proof = a_bridged_proof()
    doctored = replace(proof, a=replace(proof.a, signature=proof.b.signature))
    assert_rejected(replace(a.state, fork=doctored), EquivocationError)
    assert_rejected(replace(a.delta(), fork=doctored), EquivocationError)
    # A genuine proof about another queue is not evidence against this one.
    c, d = LatticeQueue.create(OWNER, "other-queue"), LatticeQueue.create(OWNER, "other-queue")
    c.offer("1")
    d.offer("2")
    c.merge(d.state)
    elsewhere = c.equivocation
    assert elsewhere is not None
    elsewhere.verify()
    assert_rejected(replace(source().delta(), fork=elsewhere), WrongOwnerError)


def test_a_genuine_proof_alone_flags_the_receiver() -> None:
    _, proof = a_bridged_proof()
    target = holding(4)
    assert not target.forked
    target.merge(QueueDelta(OWNER.public_key, NAME, 0, None, fork=proof))
    assert_forked(target)


# --------------------------------------------------------------------------- randomised equivocation


@pytest.mark.parametrize("seed", range(40))
def test_random_equivocations_always_yield_proofs_that_verify(seed: int) -> None:
    rnd = random.Random(seed)
    clock = ticking()
    writers = [LatticeQueue.create(OWNER, NAME, clock=clock) for _ in range(2)]
    readers = [LatticeQueue.empty_replica(OWNER.public_key, NAME) for _ in range(2)]
    everyone = writers + readers
    for _ in range(10):
        roll = rnd.random()
        w = rnd.choice(writers)
        try:
            if roll < 0.4:
                for _ in range(rnd.randint(1, 3)):
                    w.offer(str(rnd.randint(0, 2)))
                w.commit()
            elif roll < 0.5:
                w.truncate(w.start_offset + rnd.randint(0, 3))
            elif roll < 0.55:
                w.set_meta("k", str(rnd.randint(0, 2)))
            else:
                src, dst = rnd.choice(everyone), rnd.choice(everyone)
                if rnd.random() < 0.5:
                    dst.merge(core.delta(src.state, dst.summary(), max_records=rnd.randint(1, 4)))
                else:
                    dst.merge(src.state)
        except LatticedError as exc:
            # Only an owner that received a newer head of the other history without its records may
            # refuse to sign; verification itself never rejects honest-but-forked evidence.
            assert isinstance(exc, GapError) and "owner state is missing records" in str(exc)
        for q in everyone:
            if q.equivocation is not None:
                q.equivocation.verify()
                assert q.forked
    left, right = (LatticeQueue.empty_replica(OWNER.public_key, NAME) for _ in range(2))
    for q in everyone:
        left.merge(q.state)
    for q in reversed(everyone):
        right.merge(q.state)
    left.merge(right.state)
    right.merge(left.state)
    assert left.forked == right.forked
    if not left.forked:
        assert left.state == right.state
    else:  # each stops where it stood; the proof with the lowest fork point is what both keep
        assert left.equivocation == right.equivocation
