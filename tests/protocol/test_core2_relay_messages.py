"""What a relayed live record costs a relay's two links in messages (issue 28, branch relay27b): the
relay B passes each push from its upstream A on to its downstream D as one DELTA2, acknowledges a
commit's pushes to A in one message, and its commit's announcement (the daemon's ``local_change2`` at the
store's change hook, to every link) queues nothing on either link: A sent the records, D was passed them
before the commit. So a relayed record costs the relay one message in and one out, and an ACK each way a
commit; any HAVE2, second DELTA2 or per-push ACK2 here would be a message (and a write) a record more.

The links run as the daemon drives them (net/gossip.py): ``local_update`` with the summary ahead of the
commit for D, then at each commit ``local_update`` on both links with the committed summary (the change
hook runs before the commit's ACKs: storage/bridge.py ``_complete``), then the ACKs of its pushes."""

from __future__ import annotations

import sys

import pytest
from support.paths import ROOT

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.net.core2_ahead import AheadPushes
from latticed.protocol.core2_compact import REPEAT_HEADERS
from latticed.protocol.core2_session import Core2Link, Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import CACKS2, CDELTA2, CORE2_NAMES, DELTA2, Summary2, link_summary
from latticed.protocol.replication_messages import QueueKey, unpack_message
from latticed.protocol.versions import HEADS_V2, WINDOW2
from latticed.storage.jobs import Job

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import bench_relay_turn

OWNER = Identity.from_seed(b"r" * 32)
KEY: QueueKey = (OWNER.public_key, "relayed", 0)
MAX_BYTES = 1 << 20
PUSHES = 12
COMPACT = frozenset({HEADS_V2, "compact", REPEAT_HEADERS, WINDOW2})


def _states() -> list[QueueState2]:
    state = queue2.empty_state(OWNER.public_key, KEY[1])
    states = [queue2.commit(state, OWNER, now_ms=1_700_000_000_000, records=[Record(bytes(50), key=b"k")])]
    for n in range(1, PUSHES + 1):
        record = Record(n.to_bytes(4, "big") * 25, timestamp=1_700_000_001_000 + n)
        states.append(queue2.commit(states[-1], OWNER, now_ms=1_700_000_001_000 + n, records=[record]))
    return states


def _kinds(messages: list[bytes]) -> list[str]:
    return [CORE2_NAMES[unpack_message(m)[0]] for m in messages]


def _quiet(link: Core2Link) -> bool:
    """No event for the host and no message queued: a driver woken now would find nothing to do."""
    return not link.has_work() and link.next_event() is None and not link.messages_to_send()


def relay(features: frozenset[str], per_commit: int) -> dict[str, list[str]]:
    """The messages of a relay's links as A's pushes come in and B commits every ``per_commit`` of them
    (D commits as often): by link and direction, each message's kind, and ``noise``: a kind queued by a
    commit's announcement (none expected)."""
    states = _states()
    a, b_up = bench_relay_turn.linked_pair(states[0], features, KEY)
    b_down, d = bench_relay_turn.linked_pair(states[0], features, KEY)
    ahead, loaded, q = AheadPushes(), states[0], 1
    seen: dict[str, list[str]] = {"up_out": [], "down_out": [], "down_in": [], "noise": []}
    held: list[int] = []  # B's pushes waiting for B's commit (their seqs on the upstream link)
    jobs: list[Job] = []
    at_d: list[int] = []  # D's merges waiting for D's commit

    def pass_on() -> None:
        while (ask := b_down.next_event()) is not None:
            assert isinstance(ask, NeedDelta2)
            out = ahead.relay(q, ask.since, ask.max_records, MAX_BYTES, loaded)
            if out is None:
                out = outgoing(ahead.value(q, loaded) or loaded, ask.since, ask.max_records, MAX_BYTES)
            b_down.provide_delta(KEY, out)
        sent = b_down.messages_to_send()
        seen["down_out"] += _kinds(sent)
        for m in sent:
            d.receive(unpack_message(m))
            while (got := d.next_event()) is not None:
                assert isinstance(got, Delta2Received)
                at_d.append(got.seq)

    for i in range(1, len(states)):
        a.local_update(KEY, link_summary(states[i]))
        need = a.next_event()
        assert isinstance(need, NeedDelta2)
        a.provide_delta(KEY, outgoing(states[i], need.since, need.max_records, MAX_BYTES))
        (pushed,) = a.messages_to_send()
        b_up.receive(unpack_message(pushed), size=len(pushed))
        got = b_up.next_event()
        assert isinstance(got, Delta2Received)
        push = ahead.check(q, loaded, got.delta, got.steps)  # verified before it goes on
        assert push is not None
        job = bench_relay_turn.waitable_job()
        jobs.append(job)
        held.append(got.seq)
        b_down.local_update(KEY, ahead.note_push(q, push, job, got.delta, got.steps))
        pass_on()
        if i % per_commit == 0 or i == len(states) - 1:
            for j in jobs:  # B's commit: the value ahead is the loaded one now
                assert j.done is not None
                j.done.set()
            jobs.clear()
            loaded = states[i]
            committed = link_summary(loaded)
            for link in (b_up, b_down):  # the change hook's announcement, to every link
                link.local_update(KEY, committed)
                if not _quiet(link):
                    seen["noise"].append("commit")
            seen["up_out"] += _acked(b_up, a, held, committed)  # the commit's ACKs upstream, once durable
            seen["down_in"] += _acked(d, b_down, at_d, committed)  # D's commit of them, its ACKs back to B
            pass_on()
            seen["noise"] += _kinds(b_up.messages_to_send())
    return seen


def _acked(sender: Core2Link, receiver: Core2Link, seqs: list[int], committed: Summary2) -> list[str]:
    """``sender`` acknowledges the deltas ``seqs`` as durable at ``committed`` (emptying ``seqs``),
    ``receiver`` takes its messages; their kinds."""
    for seq in seqs:
        sender.delta_applied(seq, committed, True)
    seqs.clear()
    out = sender.messages_to_send()
    for m in out:
        receiver.receive(unpack_message(m))
    return _kinds(out)


@pytest.mark.parametrize("per_commit", [1, 3, 4])
def test_a_relayed_record_costs_one_delta2_out_and_an_ack_each_way_a_commit(per_commit: int) -> None:
    seen = relay(COMPACT, per_commit)
    commits = -(-PUSHES // per_commit)
    assert seen["down_out"] == ["delta2"] * PUSHES  # each push passed on once, as it came, nothing else
    assert seen["up_out"] == ["ack2"] * commits  # one ACK (an AckRun2) a commit upstream
    assert seen["down_in"] == ["ack2"] * commits  # and one back from D a commit of D's
    assert seen["noise"] == []  # the commit's announcement queues nothing on either link


def test_the_commits_acks_upstream_are_one_run_message() -> None:
    """The ACK a commit of several pushes costs is one AckRun2, not an ACK2 a push."""
    states = _states()
    a, b_up = bench_relay_turn.linked_pair(states[0], COMPACT, KEY)
    seqs = []
    for i in (1, 2, 3):
        a.local_update(KEY, link_summary(states[i]))
        need = a.next_event()
        assert isinstance(need, NeedDelta2)
        a.provide_delta(KEY, outgoing(states[i], need.since, need.max_records, MAX_BYTES))
        (pushed,) = a.messages_to_send()
        assert unpack_message(pushed)[0] in (DELTA2, CDELTA2)
        b_up.receive(unpack_message(pushed), size=len(pushed))
        got = b_up.next_event()
        assert isinstance(got, Delta2Received)
        seqs.append(got.seq)
    for seq in seqs:
        b_up.delta_applied(seq, link_summary(states[3]), True)
    acks = b_up.messages_to_send()
    assert [unpack_message(m)[0] for m in acks] == [CACKS2]


def test_without_compact_each_push_is_acknowledged_on_its_own() -> None:
    """A 0.2-era link (heads-v2, no compact codec) has no AckRun2: its ACK2s stay one a push (the
    count above is the compact links'), and the commit's announcement still queues nothing."""
    seen = relay(frozenset({HEADS_V2}), 3)
    assert seen["down_out"] == ["delta2"] * PUSHES
    assert seen["up_out"] == ["ack2"] * PUSHES
    assert seen["noise"] == []
