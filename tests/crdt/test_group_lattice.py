"""The consumer-group progress lattice: laws, the out-of-order ack floor against a model, the op codec,
the group definition, dead-letter records, and the group log signed and replicated as a queue."""

from __future__ import annotations

import contextlib
import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue as core
from latticed.crdt.attempts import (
    CORRELATION_HEADER,
    DLQ_HEADER,
    AttemptRecord,
    DeadLetterInfo,
    correlation_id,
    dead_letter_record,
    parse_dead_letter,
)
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.group import (
    EMPTY,
    GroupProgress,
    ProgressOp,
    apply_progress_ops,
    coalesce_ops,
    decode_progress_op,
    dlq_name,
    encode_progress_op,
    join,
    parse_source_id,
    progress_record,
    snapshot_ops,
    source_id,
)
from latticed.crdt.group_spec import GroupSpec, create_group, read_group, spec_from_meta, spec_to_meta
from latticed.crdt.head import KIND_GROUP
from latticed.crdt.records import MAX_HEADERS, Record
from latticed.crdt.signing import Identity

SETTINGS = settings(max_examples=150, deadline=None)
DAEMON = Identity.from_seed(bytes(range(32)))
PRODUCER = Identity.from_seed(bytes(range(1, 33)))
SRC = source_id(PRODUCER.public_key, "jobs")
SRC2 = source_id(PRODUCER.public_key, "other")

offsets = st.integers(0, 24)
progresses = st.builds(
    GroupProgress.make,
    ack_floor=st.integers(0, 12),
    acked=st.sets(offsets, max_size=10),
    dead=st.sets(offsets, max_size=4),
    released=st.sets(offsets, max_size=4),
    attempts=st.dictionaries(offsets, st.integers(0, 6), max_size=6),
)


def is_normal(p: GroupProgress) -> bool:
    return p == GroupProgress.make(p.ack_floor, p.acked, p.dead, p.released, p.attempts)


# ------------------------------------------------------------------------------------------------ laws


@SETTINGS
@given(progresses, progresses)
def test_join_is_commutative(a: GroupProgress, b: GroupProgress) -> None:
    assert join(a, b) == join(b, a)


@SETTINGS
@given(progresses, progresses, progresses)
def test_join_is_associative(a: GroupProgress, b: GroupProgress, c: GroupProgress) -> None:
    assert join(join(a, b), c) == join(a, join(b, c))


@SETTINGS
@given(progresses)
def test_join_is_idempotent_with_empty_as_identity(a: GroupProgress) -> None:
    assert join(a, a) == a
    assert join(a, EMPTY) == a == join(EMPTY, a)


@SETTINGS
@given(progresses, progresses)
def test_join_is_an_upper_bound_in_normal_form(a: GroupProgress, b: GroupProgress) -> None:
    j = join(a, b)
    assert join(j, a) == j and join(j, b) == j
    assert is_normal(j)
    assert j.ack_floor >= max(a.ack_floor, b.ack_floor)
    for o in range(30):
        if a.is_settled(o) or b.is_settled(o):
            assert j.is_settled(o)
        if not j.is_settled(o):
            assert j.attempts_map().get(o, 0) == max(a.attempts_map().get(o, 0), b.attempts_map().get(o, 0))


@SETTINGS
@given(progresses)
def test_normal_form_invariants(p: GroupProgress) -> None:
    assert p.ack_floor not in p.acked | p.dead
    assert not p.acked & p.dead
    assert all(o > p.ack_floor for o in p.acked | p.dead)
    assert all(o >= p.ack_floor and not p.is_settled(o) for o in p.released)
    assert all(n > 0 and not p.is_settled(o) for o, n in p.attempts)
    assert [o for o, _ in p.attempts] == sorted({o for o, _ in p.attempts})


# -------------------------------------------------------------------- the ack floor against a set model

floor_steps = st.lists(
    st.one_of(
        st.tuples(st.just("ack"), st.integers(0, 40)),
        st.tuples(st.just("dead"), st.integers(0, 40)),
        st.tuples(st.just("ack_up_to"), st.integers(0, 30)),
    ),
    max_size=60,
)


@SETTINGS
@given(floor_steps)
def test_out_of_order_acks_against_a_set_model(steps: list[tuple[str, int]]) -> None:
    progress = EMPTY
    settled: set[int] = set()
    for kind, n in steps:
        if kind == "ack":
            progress = progress.ack(n)
            settled.add(n)
        elif kind == "dead":
            progress = join(progress, GroupProgress.make(dead=[n]))
            settled.add(n)
        else:
            progress = progress.ack_up_to(n)
            settled.update(range(n))
        floor = 0
        while floor in settled:
            floor += 1
        assert progress.ack_floor == floor  # the smallest offset not settled
        assert progress.acked | progress.dead == {o for o in settled if o > floor}
        assert all(progress.is_settled(o) == (o in settled) for o in range(45))


@SETTINGS
@given(st.lists(st.integers(0, 30), max_size=40), st.randoms(use_true_random=False))
def test_acks_in_any_order_reach_the_same_floor(acks: list[int], rnd: random.Random) -> None:
    ops = [ProgressOp(SRC, GroupProgress.make(acked=[o])) for o in acks]
    shuffled = list(ops)
    rnd.shuffle(shuffled)
    forward = apply_progress_ops({}, ops)
    assert forward == apply_progress_ops({}, shuffled)
    assert forward == apply_progress_ops(forward, ops)  # replay is harmless
    expected = 0
    while expected in set(acks):
        expected += 1
    assert forward.get(SRC, EMPTY).ack_floor == expected


# ------------------------------------------------------------------------------------------------- ops

ops_strategy = st.lists(st.builds(ProgressOp, st.sampled_from([SRC, SRC2]), progresses), max_size=12)


@SETTINGS
@given(ops_strategy)
def test_ops_fold_as_joins_and_coalesce(ops: list[ProgressOp]) -> None:
    folded = apply_progress_ops({}, ops)
    expected: dict[str, GroupProgress] = {}
    for op in ops:
        expected[op.source] = join(expected.get(op.source, EMPTY), op.progress)
    assert folded == expected
    assert apply_progress_ops({}, coalesce_ops(ops)) == folded
    assert apply_progress_ops({}, snapshot_ops(folded)) == {s: p for s, p in folded.items() if not p.is_empty}


@SETTINGS
@given(st.builds(ProgressOp, st.sampled_from([SRC, SRC2]), progresses))
def test_op_codec_round_trips(op: ProgressOp) -> None:
    raw = encode_progress_op(op)
    assert decode_progress_op(raw) == op
    assert encode_progress_op(decode_progress_op(raw)) == raw


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_op_decoder_raises_only_malformed_on_junk(raw: bytes) -> None:
    with contextlib.suppress(MalformedError):
        decode_progress_op(raw)


junk_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**64 - 1) | st.text(max_size=4) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=8),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(junk_values, min_size=7, max_size=7))
def test_op_decoder_raises_only_malformed_on_structured_junk(items: list[object]) -> None:
    items[0] = 1
    items[1] = SRC
    with contextlib.suppress(MalformedError):
        decode_progress_op(msgpack.packb(items))


@pytest.mark.parametrize(
    "body",
    [
        [2, SRC, 0, [], [], [], []],  # unknown version
        [1, "nope", 0, [], [], [], []],  # bad source
        [1, SRC, -1, [], [], [], []],  # negative floor
        [1, SRC, 0, [3, 1], [], [], []],  # unsorted
        [1, SRC, 0, [1, 1], [], [], []],  # duplicate
        [1, SRC, 0, [True], [], [], []],  # bool is not an offset
        [1, SRC, 0, [], [], [], [4]],  # odd attempts list
        [1, SRC, 0, [], [], [], [4, 0]],  # zero count
        [1, SRC, 0, [], [], []],  # too short
        {"v": 1},
    ],
)
def test_op_decoder_rejects_bad_shapes(body: object) -> None:
    with pytest.raises(MalformedError):
        decode_progress_op(msgpack.packb(body))
    with pytest.raises(MalformedError):
        decode_progress_op("text")  # type: ignore[arg-type]


def test_source_ids() -> None:
    assert parse_source_id(SRC) == (PRODUCER.public_key, "jobs")
    for bad in ("jobs", "ab/jobs", SRC.upper(), SRC + "/x", 7):
        with pytest.raises(MalformedError):
            parse_source_id(bad)
    with pytest.raises(MalformedError):
        source_id(b"short", "jobs")
    assert dlq_name("orders") == "orders.dlq"


# ------------------------------------------------------------------------------------------ definition


def test_spec_round_trips_through_metadata() -> None:
    spec = GroupSpec("workers", (SRC, SRC2), filter="header.type=order", max_attempts=3, visibility_s=2.5)
    meta = spec_to_meta(spec)
    assert spec_from_meta(meta) == spec
    assert spec_to_meta(spec_from_meta(meta)) == meta  # canonical


@pytest.mark.parametrize(
    "change",
    [
        {"sources": ()},
        {"sources": (SRC, SRC)},
        {"sources": ("x/y",)},
        {"name": "a/b"},
        {"name": "x" * 252},
        {"max_attempts": -1},
        {"max_attempts": True},
        {"visibility_s": 0},
        {"backoff_base_s": float("nan")},
        {"retention_s": -1.0},
        {"filter": 5},
    ],
)
def test_bad_specs_are_malformed(change: dict[str, object]) -> None:
    fields: dict[str, object] = {"name": "g", "sources": (SRC,), **change}
    with pytest.raises(MalformedError):
        GroupSpec(**fields).check()  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "[]", '{"v":1}', "nope", '{"v":2,"name":"g"}'])
def test_bad_spec_metadata_is_malformed(text: str) -> None:
    with pytest.raises(MalformedError):
        spec_from_meta({"group": text} if text else {})


def test_backoff_doubles_up_to_the_cap() -> None:
    spec = GroupSpec("g", (SRC,), backoff_base_s=1.5, backoff_cap_s=10)
    assert [spec.backoff(n) for n in range(6)] == [0.0, 1.5, 3.0, 6.0, 10.0, 10.0]
    assert spec.backoff(10_000) == 10.0


# ------------------------------------------------------------------------------- signed and replicated


def test_group_log_is_signed_replicated_and_compacted() -> None:
    spec = GroupSpec("workers", (SRC,))
    state = create_group(DAEMON, spec, now_ms=1)
    assert state.kind == KIND_GROUP
    ops = [
        ProgressOp(SRC, GroupProgress.make(acked=[1, 2])),
        ProgressOp(SRC, GroupProgress.make(attempts={0: 2})),
        ProgressOp(SRC, GroupProgress.make(ack_floor=1)),
    ]
    state = core.commit(state, DAEMON, now_ms=2, records=[progress_record(op, 2) for op in ops])
    replica = core.merge(core.empty_state(DAEMON.public_key, "workers", KIND_GROUP), core.delta(state))
    spec_r, progress = read_group(replica)
    assert spec_r == spec
    assert progress == {SRC: GroupProgress(ack_floor=3)}
    # Compaction: a snapshot, then truncation below it; a fresh replica reads the same progress.
    snapshot = [progress_record(op, 3) for op in snapshot_ops(progress)]
    end = state.held_end
    state = core.commit(state, DAEMON, now_ms=3, records=snapshot)
    state = core.commit(state, DAEMON, now_ms=4, new_start=end)
    fresh = core.merge(core.empty_state(DAEMON.public_key, "workers", KIND_GROUP), core.delta(state))
    assert read_group(fresh) == (spec, progress)
    with pytest.raises(MalformedError):
        read_group(core.empty_state(DAEMON.public_key, "workers"))


# ---------------------------------------------------------------------------------------- dead letters


def test_dead_letter_record_round_trips_and_keeps_payload_and_correlation() -> None:
    original = Record(value=b"payload", key=b"k", timestamp=5, headers=(("type", b"order"),))
    corr = correlation_id(original, SRC, 7)
    assert corr == correlation_id(original, SRC, 7) != correlation_id(original, SRC, 8)
    history = (AttemptRecord(1, "c1", 1000, 2000, "nack"), AttemptRecord(2, "c2", 3000, 4000, "expired"))
    info = DeadLetterInfo(SRC, 7, 2, corr, "expired", 4000, history)
    dead = dead_letter_record(original, info)
    assert (dead.value, dead.key, dead.timestamp) == (b"payload", b"k", 5)
    assert dead.header("type") == b"order"
    assert dead.header(CORRELATION_HEADER) == corr.encode()
    assert parse_dead_letter(dead) == info
    assert correlation_id(dead, "elsewhere", 0) == corr  # travels with the record
    # A dead letter of a dead letter replaces the x-dlq header instead of stacking it.
    again = dead_letter_record(dead, DeadLetterInfo(SRC, 7, 3, corr, "nack", 5000, (*history, *history)))
    assert [k for k, _ in again.headers].count(DLQ_HEADER) == 1
    assert parse_dead_letter(again).attempts == 3


def test_correlation_header_is_used_when_printable_text() -> None:
    assert correlation_id(Record(b"", headers=((CORRELATION_HEADER, b"req-42"),)), SRC, 0) == "req-42"
    derived = correlation_id(Record(b""), SRC, 0)
    assert correlation_id(Record(b"", headers=((CORRELATION_HEADER, b"\xff"),)), SRC, 0) == derived
    assert correlation_id(Record(b"", headers=((CORRELATION_HEADER, b""),)), SRC, 0) == derived


def test_dead_letter_of_a_record_with_maximal_headers_still_fits() -> None:
    headers = tuple((f"h{i}", b"v") for i in range(MAX_HEADERS))
    dead = dead_letter_record(Record(b"v", headers=headers), DeadLetterInfo(SRC, 0, 1, "c", "nack", 0))
    assert len(dead.headers) == MAX_HEADERS
    assert parse_dead_letter(dead).offset == 0


@pytest.mark.parametrize(
    "header",
    [
        b"junk",
        msgpack.packb([1, SRC, 0, 1, "c", "boom", 0, []]),  # unknown reason
        msgpack.packb([1, SRC, -1, 1, "c", "nack", 0, []]),
        msgpack.packb([1, SRC, 0, 1, "", "nack", 0, []]),  # empty correlation id
        msgpack.packb([1, SRC, 0, 1, "c", "nack", 0, [[1, "c", 0, 0]]]),
        msgpack.packb([1, SRC, 0, 1, "c", "nack", 0, [[0, "c", 0, 0, "nack"]]]),
    ],
)
def test_malformed_dead_letters_are_refused(header: bytes) -> None:
    with pytest.raises(MalformedError):
        parse_dead_letter(Record(b"", headers=((DLQ_HEADER, header),)))
    with pytest.raises(MalformedError):
        parse_dead_letter(Record(b""))
