"""The decisions about two runs of one identity (latticed/protocol/identity_runs.py) and the catch-up after
a start (latticed/protocol/start_gate.py), without I/O."""

from __future__ import annotations

import pytest

from latticed.crdt import queue as core
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import RemoteProtocolError
from latticed.host.checklist import check_identity
from latticed.protocol.identity_runs import (
    DuplicateIdentities,
    ForeignHead,
    IdentityGuard,
    Notice,
    RunSeen,
    foreign_head,
    notices_for,
)
from latticed.protocol.start_gate import StartGate

OWNER = Identity.from_seed(b"o" * 32)
KEY = OWNER.public_key
FIRST, SECOND, THIRD = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16


def _state(records: int, now_ms: int, base: core.QueueState | None = None) -> core.QueueState:
    state = base or core.empty_state(KEY, "q")
    return core.commit(state, OWNER, now_ms=now_ms, records=[Record(value=b"%d" % i) for i in range(records)])


# --- a peer that sees one identity on two links ----------------------------------------------------------


def test_the_run_seen_first_is_the_earlier_one_even_when_it_reconnects_later() -> None:
    seen = DuplicateIdentities()
    first = seen.observe(KEY, RunSeen(FIRST, "10.0.0.1:1"), 1.0, RunSeen(SECOND, "10.0.0.2:2"), 5.0)
    assert (first.earlier.incarnation, first.later.incarnation) == (FIRST, SECOND)
    # The first run's link dropped and it came back: now it is the newcomer, still the earlier run.
    again = seen.observe(KEY, RunSeen(SECOND, "10.0.0.2:2"), 5.0, RunSeen(FIRST, "10.0.0.1:3"), 9.0)
    assert (again.earlier.incarnation, again.later.incarnation) == (FIRST, SECOND)
    assert again.earlier.address == "10.0.0.1:3"
    assert (again.count, again.first_at, again.last_at, seen.total) == (2, 5.0, 9.0, 2)
    assert seen.recent() == [again]


def test_what_a_peer_remembers_of_identities_running_twice_is_bounded() -> None:
    seen = DuplicateIdentities(capacity=2, memory=4)
    for i in range(5):
        identity = bytes([i]) * 32
        seen.observe(identity, RunSeen(FIRST, "a"), 0.0, RunSeen(SECOND, "b"), 1.0)
    assert [s.identity[0] for s in seen.recent()] == [3, 4]
    assert len(seen._first_seen) == 4


def test_each_run_is_told_which_it_is_and_where_the_other_runs() -> None:
    sighting = DuplicateIdentities().observe(KEY, RunSeen(FIRST, "a:1"), 0.0, RunSeen(SECOND, "b:2"), 1.0)
    to_earlier, to_later = notices_for(sighting)
    assert to_earlier == Notice(FIRST, SECOND, "b:2", later=False)
    assert to_later == Notice(SECOND, FIRST, "a:1", later=True)
    assert Notice.from_body(to_later.to_body()) == to_later


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"yours": "zz", "other": FIRST.hex(), "other_address": "a", "you_are": "later"},
        {"yours": FIRST.hex(), "other": SECOND.hex()[:-2], "other_address": "a", "you_are": "later"},
        {"yours": FIRST.hex(), "other": SECOND.hex(), "other_address": 5, "you_are": "later"},
        {"yours": FIRST.hex(), "other": SECOND.hex(), "other_address": "a", "you_are": "first"},
        {"yours": 1, "other": SECOND.hex(), "other_address": "a", "you_are": "later"},
    ],
)
def test_a_malformed_notice_is_the_peers_protocol_error(body: dict[str, object]) -> None:
    with pytest.raises(RemoteProtocolError):
        Notice.from_body(body)


# --- the owner: a head of its own queue it did not sign -------------------------------------------------


def test_a_head_of_ours_at_a_version_we_hold_is_foreign_only_if_it_differs() -> None:
    shared = _state(10, now_ms=1_000)
    ours = _state(5, now_ms=2_000, base=shared)
    theirs = _state(5, now_ms=2_001, base=shared)  # the copy signed another batch at the same version
    assert ours.head is not None and theirs.head is not None
    assert foreign_head(ours.head, ours.head, started_ms=0) is None
    why = foreign_head(ours.head, theirs.head, started_ms=0)
    assert why is not None and "another head at version" in why


def test_a_newer_head_of_ours_is_foreign_only_if_signed_after_this_run_started() -> None:
    restored = _state(10, now_ms=1_000)
    later = _state(5, now_ms=3_000, base=restored)
    assert restored.head is not None and later.head is not None
    # A store restored from a copy catches up on what an earlier run signed: not foreign.
    assert foreign_head(restored.head, later.head, started_ms=5_000) is None
    assert foreign_head(None, later.head, started_ms=5_000) is None
    why = foreign_head(restored.head, later.head, started_ms=2_000)
    assert why is not None and "signed 1.0 s after this daemon started" in why
    assert foreign_head(restored.head, None, started_ms=0) is None
    # An older head is the queue's past (a fork there is the fork check's business).
    assert foreign_head(later.head, restored.head, started_ms=0) is None


# --- whether this run may sign ------------------------------------------------------------------------


def test_the_later_run_refuses_writes_naming_the_other_and_the_way_out() -> None:
    guard = IdentityGuard(SECOND)
    assert guard.refusal() is None
    run = guard.notice(Notice(SECOND, FIRST, "10.0.0.1:7000", later=True), b"r" * 32, 100.0)
    assert run is not None and run.later
    refusal = guard.refusal()
    assert refusal is not None
    assert "10.0.0.1:7000" in refusal and "latticectl identity claim" in refusal
    assert guard.status()["other_runs"][0]["this_daemon_is"] == "later"
    # A later notice calling it the earlier run does not undo that.
    guard.notice(Notice(SECOND, FIRST, "10.0.0.1:7000", later=False), b"r" * 32, 101.0)
    assert guard.refusal() is not None


def test_the_earlier_run_keeps_writing_and_notices_for_another_run_are_ignored() -> None:
    guard = IdentityGuard(FIRST)
    assert guard.notice(Notice(THIRD, SECOND, "x", later=True), b"r" * 32, 1.0) is None  # an old run's
    assert guard.notice(Notice(FIRST, FIRST, "x", later=True), b"r" * 32, 1.0) is None  # itself
    assert guard.notice(Notice(FIRST, SECOND, "10.0.0.2:7000", later=False), b"r" * 32, 1.0) is not None
    assert guard.refusal() is None
    # Told it is the earlier run, a foreign head (the later run's write) does not stop it.
    guard.foreign_head(ForeignHead("o/q", b"r" * 32, "another head at version 3", 2.0))
    assert guard.refusal() is None
    assert len(guard.status()["foreign_heads"]) == 1


def test_a_run_that_saw_a_foreign_head_then_is_told_it_is_the_earlier_one_signs_again() -> None:
    """The other run's head may come back before a peer's notice does (it did on a relay whose link to
    this run was replaced before the duplicate was confirmed): the notice decides, in either order."""
    guard = IdentityGuard(FIRST)
    guard.foreign_head(ForeignHead("o/q", b"r" * 32, "another head at version 3", 2.0))
    assert guard.refusal() is not None
    guard.notice(Notice(FIRST, SECOND, "10.0.0.2:7000", later=False), b"r" * 32, 3.0)
    assert guard.refusal() is None
    guard.foreign_head(ForeignHead("o/q", b"r" * 32, "again", 4.0))
    assert guard.refusal() is None


def test_a_foreign_head_alone_stops_signing_until_the_operator_claims() -> None:
    guard = IdentityGuard(FIRST)
    guard.foreign_head(ForeignHead("o/q", b"r" * 32, "another head at version 3", 2.0))
    refusal = guard.refusal()
    assert refusal is not None and "o/q came back from peer" in refusal
    assert guard.claim(3.0) is True
    assert guard.refusal() is None
    # The claim holds for the rest of the run.
    guard.notice(Notice(FIRST, SECOND, "b", later=True), b"r" * 32, 4.0)
    guard.foreign_head(ForeignHead("o/q", b"r" * 32, "again", 5.0))
    assert guard.refusal() is None
    assert guard.claim(6.0) is False
    assert guard.status()["claimed_at"] == 6.0


# --- the catch-up after a start -------------------------------------------------------------------------


def test_the_start_gate_waits_for_the_first_dials_then_for_the_peers_digests() -> None:
    gate = StartGate(100.0, timeout=12.0)
    reason = gate.reason(100.5, 0)
    assert reason is not None and "the first dials" in reason  # the dialer has not named its round yet
    gate.expect([("10.0.0.1", 1), ("10.0.0.2", 2)])
    gate.expect([("10.0.0.3", 3)])  # only the first round counts
    reason = gate.reason(101.0, 0)
    assert reason is not None and "2 to reach" in reason and "before it signs anything" in reason
    gate.dial_ended(("10.0.0.1", 1))  # connected: its digest is awaited on the link
    gate.dial_ended(("10.0.0.2", 2))  # unreachable
    reason = gate.reason(101.5, 1)
    assert reason is not None and "1 to hear from" in reason
    assert gate.reason(102.0, 0) is None
    assert (gate.opened_at, gate.timed_out, gate.expected) == (102.0, False, 2)
    assert gate.reason(102.5, 5) is None  # open for good


def test_the_start_gate_opens_at_once_without_peers_and_by_itself_when_the_time_is_up() -> None:
    alone = StartGate(0.0)
    alone.expect([])
    assert alone.reason(0.0, 0) is None
    stuck = StartGate(0.0, [("10.0.0.1", 1)], timeout=12.0)
    assert stuck.reason(11.9, 0) is not None
    assert stuck.reason(12.0, 0) is None
    assert stuck.timed_out and stuck.waits_for == 1


# --- what doctor says ------------------------------------------------------------------------------------


def test_doctor_says_which_daemon_refuses_which_runs_twice_and_when_it_is_only_catching_up() -> None:
    assert check_identity(None) == []
    [fine] = check_identity({"refusing": None, "other_runs": [], "seen_twice": [], "catching_up": None})
    assert fine.ok is True
    guard = IdentityGuard(SECOND)
    guard.notice(Notice(SECOND, FIRST, "10.0.0.1:7000", later=True), b"r" * 32, 1.0)
    [refusing] = check_identity(guard.status())
    assert refusing.ok is False and "writes refused" in refusing.detail
    assert refusing.fix is not None and "latticectl identity claim" in refusing.fix
    earlier = IdentityGuard(FIRST)
    earlier.notice(Notice(FIRST, SECOND, "10.0.0.2:7000", later=False), b"r" * 32, 1.0)
    [told] = check_identity(earlier.status())
    assert told.ok is False and "10.0.0.2:7000" in told.detail and "keeps writing" in told.detail
    sighting = DuplicateIdentities().observe(KEY, RunSeen(FIRST, "a:1"), 0.0, RunSeen(SECOND, "b:2"), 1.0)
    facts = {"seen_twice": [sighting.to_wire()], "catching_up": "this daemon started 1.0 s ago ..."}
    twice, catching_up = check_identity(facts)
    assert twice.check == "duplicate identity" and twice.ok is False and "a:1 (earlier)" in twice.detail
    assert catching_up.ok is None and catching_up.detail.startswith("this daemon started")
