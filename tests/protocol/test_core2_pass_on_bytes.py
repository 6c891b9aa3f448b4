"""A relay's pass-on to its downstream peer D (the downstream link's ``local_update``, its ``NeedDelta2``
answered from the push as it came or built from the value ahead, ``provide_delta``, the encoded message)
sends D the very bytes it sent before the pass-on was restructured (branch relay26): every message the
relay's downstream link sends, for each negotiated feature set, is hashed and the hashes pinned (taken on
main's tree at ``c7d9c72``). The pushes carry one, two and three records, and D acknowledges some of them
late, so pushes go out both as they came and rebuilt from the value ahead."""

from __future__ import annotations

import hashlib
import sys

import pytest
from support.paths import ROOT

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.net.core2_ahead import AheadPushes
from latticed.protocol.core2_compact import REPEAT_HEADERS
from latticed.protocol.core2_session import Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import link_summary
from latticed.protocol.replication_messages import QueueKey, unpack_message
from latticed.protocol.versions import HEADS_V2, WINDOW2
from latticed.storage.jobs import Job

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import bench_relay_turn

OWNER = Identity.from_seed(b"p" * 32)
KEY: QueueKey = (OWNER.public_key, "pass-on", 0)
MAX_BYTES = 1 << 20
#: Records a commit, in the owner's order (the relay's usual one, and the 2-3 of a linger).
SIZES = (1, 1, 2, 1, 3, 1, 1, 2, 2, 1, 3, 3, 1, 1, 1, 2, 1, 1, 3, 1)
#: Which of D's ACKs come late (held until the next push went out).
LATE = {2, 3, 7, 11, 12, 16}

FEATURE_SETS = {
    "0.2.0": frozenset(),
    "heads-v2": frozenset({HEADS_V2}),
    "compact": frozenset({HEADS_V2, "compact"}),
    "repeat-headers": frozenset({HEADS_V2, "compact", REPEAT_HEADERS}),
    "window2": frozenset({HEADS_V2, "compact", REPEAT_HEADERS, WINDOW2}),
}

#: sha256 of every message the relay's downstream link sent, in order, per feature set and depth (main,
#: c7d9c72; 17 messages at depth 1, 14 of them as they came; 20 at depth 4, all as they came).
PINNED = {
    ("0.2.0", 4): "",  # core 2 is not agreed: nothing goes
    ("0.2.0", 1): "",
    ("heads-v2", 4): "da3b1ae7121fd0564cb3d2e3fff175067f74d62caad232790d89acdd6b60fa2f",
    ("heads-v2", 1): "529fc0fc33bb5177e2ff9c75fa7280764c99c9d122f8c446c1b1167785bd4aa5",
    ("compact", 4): "f5b17a8bd3c4e48d97139272d3f7fa33f992465154a8a37ae4062353e64e991c",
    ("compact", 1): "d35f2c874e2057123fd5d45d6ebd68c8af16f58006e6eaef1285b70dd804a969",
    ("repeat-headers", 4): "f5b17a8bd3c4e48d97139272d3f7fa33f992465154a8a37ae4062353e64e991c",
    ("repeat-headers", 1): "d35f2c874e2057123fd5d45d6ebd68c8af16f58006e6eaef1285b70dd804a969",
    ("window2", 4): "f5b17a8bd3c4e48d97139272d3f7fa33f992465154a8a37ae4062353e64e991c",
    ("window2", 1): "d35f2c874e2057123fd5d45d6ebd68c8af16f58006e6eaef1285b70dd804a969",
}


def _states() -> list[QueueState2]:
    state = queue2.empty_state(OWNER.public_key, KEY[1])
    states = [queue2.commit(state, OWNER, now_ms=1_700_000_000_000, records=[Record(bytes(50), key=b"k")])]
    n = 0
    for i, size in enumerate(SIZES):
        records = []
        for j in range(size):
            n += 1
            now = 1_700_000_001_000 + 7 * n
            key = None if n % 3 else b"key-%d" % n
            headers = (("h", b"v"),) if n % 2 else ()  # repeated headers: the repeat-headers form
            records.append(Record(n.to_bytes(4, "big") * (10 + j), key=key, timestamp=now, headers=headers))
        states.append(queue2.commit(states[-1], OWNER, now_ms=1_700_000_001_000 + 7 * n + i, records=records))
    return states


def passed_on(features: frozenset[str], depth: int = 4) -> tuple[list[bytes], int]:
    """Every message the relay's downstream link sends D as the owner's pushes come in (the relay's
    pass-on as ``bench_relay_turn`` and the daemon run it), commits every third push; and how many went
    as they came. ``depth``: the downstream link's chunks in flight (1: a late ACK holds the next push
    back, which then goes rebuilt from the value ahead)."""
    states = _states()
    up_features = frozenset({HEADS_V2, "compact", REPEAT_HEADERS, WINDOW2})
    a, b_up = bench_relay_turn.linked_pair(states[0], up_features, KEY)
    b_down, d = bench_relay_turn.linked_pair(states[0], features, KEY)
    b_down.depth = depth
    relayed = 0
    ahead, loaded, q = AheadPushes(), states[0], 1
    sent: list[bytes] = []
    late: list[bytes] = []
    jobs: list[Job] = []

    def drain() -> None:
        nonlocal relayed
        while (ask := b_down.next_event()) is not None:
            assert isinstance(ask, NeedDelta2)
            out = ahead.relay(q, ask.since, ask.max_records, MAX_BYTES, loaded)
            relayed += out is not None
            if out is None:
                value = ahead.value(q, loaded) or loaded
                out = outgoing(value, ask.since, ask.max_records, MAX_BYTES)
            b_down.provide_delta(KEY, out)
        for m in b_down.messages_to_send():
            sent.append(m)
            d.receive(unpack_message(m))
            while (got := d.next_event()) is not None:
                if isinstance(got, Delta2Received):
                    value = ahead.value(q, loaded) or loaded
                    d.delta_applied(got.seq, link_summary(value), True)

    for i in range(1, len(states)):
        after = states[i]
        a.local_update(KEY, link_summary(after))
        need = a.next_event()
        assert isinstance(need, NeedDelta2)
        a.provide_delta(KEY, outgoing(after, need.since, need.max_records, MAX_BYTES))
        (pushed,) = a.messages_to_send()
        b_up.receive(unpack_message(pushed), size=len(pushed))
        got = b_up.next_event()
        assert isinstance(got, Delta2Received)
        push = ahead.check(q, loaded, got.delta, got.steps)
        assert push is not None
        b_up.delta_applied(got.seq, link_summary(after), True)  # (upstream's ACK: not what D gets)
        for m in b_up.messages_to_send():
            a.receive(unpack_message(m))
        job = bench_relay_turn.waitable_job()
        jobs.append(job)
        summary = ahead.note_push(q, push, job, got.delta, got.steps)
        b_down.local_update(KEY, summary)
        drain()
        for m in late:
            b_down.receive(unpack_message(m))
        late.clear()
        acks = d.messages_to_send()
        if i in LATE:
            late.extend(acks)
        else:
            for m in acks:
                b_down.receive(unpack_message(m))
        drain()
        if i % 3 == 0 or i == len(states) - 1:  # a commit: the value ahead is the loaded one now
            for j in jobs:
                assert j.done is not None
                j.done.set()
            jobs.clear()
            loaded = after
            b_down.local_update(KEY, link_summary(loaded))
            drain()
    return sent, relayed


def digest(messages: list[bytes]) -> str:
    h = hashlib.sha256()
    for m in messages:
        h.update(len(m).to_bytes(4, "big") + m)
    return h.hexdigest() if messages else ""


@pytest.mark.parametrize("depth", [4, 1])
@pytest.mark.parametrize("name", sorted(FEATURE_SETS))
def test_the_relay_passes_d_the_same_bytes_as_before(name: str, depth: int) -> None:
    messages, relayed = passed_on(FEATURE_SETS[name], depth)
    if FEATURE_SETS[name]:  # every push reached D, as it came or (held back by a late ACK) rebuilt
        assert relayed >= len(SIZES) - 2 * len(LATE) and (relayed == len(SIZES)) == (depth > 1)
    assert digest(messages) == PINNED[name, depth]
