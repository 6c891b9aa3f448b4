"""The lease-forwarding sub-protocol (latticed/protocol/lease_forwarding.py) without sockets or clocks:
requests matched to their answers, timeouts and lost links as events, cancels and late answers, malformed
input refused with a typed error, bounds."""

from __future__ import annotations

import msgpack
import pytest

from latticed.crdt.wire import pack
from latticed.errors import CapacityError, LeaseError, LocalProtocolError, NotAllowedError
from latticed.protocol.lease_forwarding import (
    ANSWER,
    CANCEL,
    REFUSAL,
    REQUEST,
    Answer,
    Cancelled,
    LateAnswer,
    LeasingProtocolError,
    LeasingSession,
    LinkLost,
    Refusal,
    Request,
    TimedOut,
    is_leasing_message,
)
from latticed.protocol.replication import HELLO, PING


def pair() -> tuple[LeasingSession, LeasingSession]:
    return LeasingSession(), LeasingSession()


def deliver(src: LeasingSession, dst: LeasingSession) -> None:
    for message in src.messages_to_send():
        assert is_leasing_message(message)
        dst.receive(message)


def events(session: LeasingSession) -> list[object]:
    out = []
    while (event := session.next_event()) is not None:
        out.append(event)
    return out


def test_answers_are_matched_to_their_requests_in_any_order() -> None:
    worker, owner = pair()
    first = worker.request("take", {"group": "g", "n": 2}, now=0.0, timeout=5)
    second = worker.request("ack", {"group": "g", "leases": ["t.1"]}, now=0.0, timeout=5)
    deliver(worker, owner)
    assert events(owner) == [
        Request(first, "take", {"group": "g", "n": 2}),
        Request(second, "ack", {"group": "g", "leases": ["t.1"]}),
    ]
    owner.answer(second, {"results": [{"ok": True}]})
    owner.refuse(first, NotAllowedError("not on the allow-list"))
    deliver(owner, worker)
    got = events(worker)
    assert got[0] == Answer(second, "ack", {"results": [{"ok": True}]})
    refusal = got[1]
    assert isinstance(refusal, Refusal) and refusal.rid == first and refusal.op == "take"
    assert type(refusal.error) is NotAllowedError and str(refusal.error) == "not on the allow-list"
    assert worker.pending == 0 and owner.incoming == 0


def test_refusals_keep_their_error_type_and_unknown_codes_survive() -> None:
    worker, owner = pair()
    rid = worker.request("ack", {}, now=0, timeout=1)
    other = worker.request("ack", {}, now=0, timeout=1)
    deliver(worker, owner)
    events(owner)
    owner.refuse(rid, LeaseError("stale lease"))
    error = LeaseError("x")
    error.code = "from_the_future"
    owner.refuse(other, error)
    deliver(owner, worker)
    first, second = events(worker)
    assert isinstance(first, Refusal) and type(first.error) is LeaseError
    assert isinstance(second, Refusal) and second.error.code == "from_the_future"


def test_a_deadline_is_an_event_and_cancels_at_the_peer_and_a_late_answer_is_handed_back() -> None:
    worker, owner = pair()
    rid = worker.request("take", {"n": 1}, now=10.0, timeout=2.0)
    deliver(worker, owner)
    events(owner)
    assert worker.next_deadline() == 12.0
    worker.expire(11.9)
    assert events(worker) == []
    worker.expire(12.0)
    assert events(worker) == [TimedOut(rid, "take")]
    assert worker.pending == 0 and worker.next_deadline() is None
    deliver(worker, owner)  # the CANCEL
    assert events(owner) == [Cancelled(rid)]
    owner.answer(rid, {"leases": [{"lease": "t.9"}]})  # it had granted one just before
    deliver(owner, worker)
    assert events(worker) == [LateAnswer(rid, "take", {"leases": [{"lease": "t.9"}]})]


def test_an_answered_request_never_times_out_and_a_cancel_after_the_answer_is_ignored() -> None:
    worker, owner = pair()
    rid = worker.request("ack", {}, now=0.0, timeout=1.0)
    deliver(worker, owner)
    events(owner)
    owner.answer(rid, {})
    deliver(owner, worker)
    assert events(worker) == [Answer(rid, "ack", {})]
    worker.expire(100.0)
    assert events(worker) == []
    worker.cancel(rid)  # nothing pending: no CANCEL goes out
    assert worker.messages_to_send() == []
    owner.receive(pack([CANCEL, rid]))  # a CANCEL that crossed the answer
    assert events(owner) == []


def test_a_lost_link_fails_every_pending_request_and_sends_nothing_more() -> None:
    worker = LeasingSession()
    a = worker.request("take", {}, now=0, timeout=5)
    b = worker.request("ack", {}, now=0, timeout=5)
    worker.close()
    assert events(worker) == [LinkLost(a, "take"), LinkLost(b, "ack")]
    assert worker.messages_to_send() == [] and worker.next_deadline() is None
    with pytest.raises(LocalProtocolError):
        worker.request("take", {}, now=0, timeout=5)


def test_refusing_a_cancelled_request_answers_nothing_extra() -> None:
    worker, owner = pair()
    rid = worker.request("take", {}, now=0, timeout=5)
    worker.cancel(rid)
    deliver(worker, owner)
    assert events(owner) == [Request(rid, "take", {}), Cancelled(rid)]
    owner.refuse(rid, CapacityError("cancelled"))
    deliver(owner, worker)
    assert events(worker) == []  # nothing was granted, nothing to give back


@pytest.mark.parametrize(
    "message",
    [
        pack([REQUEST, 1, "take"]),  # too short
        pack([REQUEST, 0, "take", {}]),  # request ids are positive
        pack([REQUEST, 1, "", {}]),  # an empty op
        pack([REQUEST, 1, "x" * 65, {}]),  # too long an op
        pack([REQUEST, 1, "take", [1, 2]]),  # the body is a map
        pack([REQUEST, True, "take", {}]),  # a bool is not an id
        pack([ANSWER, 1, {}]),  # an answer to a request never sent
        pack([REFUSAL, 1, 7, "why"]),  # the code is text
        pack([CANCEL, 5]),  # a cancel of a request never received
        pack([99, 1]),  # not ours
        b"\x91\x40",  # [64] alone
        b"\x94\x40\x01\xa4take\xc1",  # 0xc1 is never valid msgpack
        msgpack.packb([REQUEST, 1, "take", {1: 2}]),  # keys are text
    ],
)
def test_malformed_input_is_a_typed_protocol_error(message: bytes) -> None:
    with pytest.raises(LeasingProtocolError):
        LeasingSession().receive(message)


def test_request_ids_must_increase() -> None:
    owner = LeasingSession()
    owner.receive(pack([REQUEST, 5, "take", {}]))
    with pytest.raises(LeasingProtocolError, match="increase"):
        owner.receive(pack([REQUEST, 5, "take", {}]))  # a replay


def test_too_many_requests_at_once_are_refused_not_queued() -> None:
    owner = LeasingSession(max_incoming=2)
    for rid in (1, 2, 3):
        owner.receive(pack([REQUEST, rid, "take", {}]))
    assert [e.rid for e in events(owner) if isinstance(e, Request)] == [1, 2]
    [refusal] = owner.messages_to_send()
    assert msgpack.unpackb(refusal)[:3] == [REFUSAL, 3, "capacity"]
    worker = LeasingSession(max_outgoing=1)
    worker.request("take", {}, now=0, timeout=1)
    with pytest.raises(CapacityError):
        worker.request("take", {}, now=0, timeout=1)


def test_answering_twice_or_out_of_nowhere_is_our_bug() -> None:
    owner = LeasingSession()
    owner.receive(pack([REQUEST, 1, "take", {}]))
    owner.answer(1, {})
    with pytest.raises(LocalProtocolError):
        owner.answer(1, {})
    with pytest.raises(LocalProtocolError):
        owner.refuse(2, LeaseError("x"))


def test_only_leasing_messages_are_claimed_from_the_replication_link() -> None:
    assert not is_leasing_message(pack([HELLO, 1, None, b"\0" * 16]))
    assert not is_leasing_message(pack([PING, 3]))
    assert not is_leasing_message(b"")
    assert is_leasing_message(pack([REQUEST, 1, "take", {}]))
    assert is_leasing_message(pack([CANCEL, 1]))
