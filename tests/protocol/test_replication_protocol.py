"""The sans-IO replication session, driven pairwise and in small networks, with no sockets or clocks."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.sim import SimNetwork

from latticed.crdt import queue as core
from latticed.crdt.queue import Summary
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import delta_to_wire, pack, summary_from_wire, summary_to_wire, unpack
from latticed.errors import IntegrityError, RemoteProtocolError
from latticed.protocol.replication import (
    DELTA,
    DIGEST,
    HAVE,
    HELLO,
    PING,
    PROTOCOL_VERSION,
    DeltaReceived,
    KeyBudget,
    NeedDelta,
    PeerMemory,
    PeerSummary,
    ReplicationSession,
)

ALICE = Identity.from_seed(b"a" * 32)
MALLORY = Identity.from_seed(b"m" * 32)
KEY = (ALICE.public_key, "q", 0)


def records(n: int, tag: str = "r") -> list[Record]:
    return [Record(value=f"{tag}{i}".encode()) for i in range(n)]


def chain(n: int) -> SimNetwork:
    net = SimNetwork()
    for i in range(n):
        net.add(i)
    for i in range(n - 1):
        net.connect(i, i + 1)
    net.run_until_quiet()
    return net


def test_pair_converges_both_directions() -> None:
    net = chain(2)
    net.nodes[0].write(ALICE, "q", records(5), 1)
    bob = Identity.from_seed(b"b" * 32)
    net.nodes[1].write(bob, "p", records(3), 1)
    net.run_until_quiet()
    assert net.nodes[1].states[KEY] == net.nodes[0].states[KEY]
    bob_key = (bob.public_key, "p", 0)
    assert net.nodes[0].states[bob_key].held_end == 3


def test_multi_hop_reaches_the_far_end_verified_at_every_hop() -> None:
    net = chain(4)  # 0 - 1 - 2 - 3: 0 and 3 never meet
    net.nodes[0].write(ALICE, "q", records(10), 1)
    net.run_until_quiet()
    assert all(net.nodes[i].states[KEY] == net.nodes[0].states[KEY] for i in range(4))


def test_backlog_streams_in_chunks_within_the_window() -> None:
    net = SimNetwork(window=2, max_records=100)
    a, b = net.add(0), net.add(1)
    for batch in range(30):
        a.write(ALICE, "q", records(50, f"b{batch}-"), batch)
    net.connect(0, 1)
    max_inflight = net.peak_until_quiet(lambda: a.sessions[1].inflight)
    assert b.states[KEY] == a.states[KEY]
    assert max_inflight <= 2
    assert a.sessions[1].stats["deltas_sent"] >= 15  # 1500 records in chunks of <= 100
    assert a.sessions[1].stats["deltas_acked"] == a.sessions[1].stats["deltas_sent"]  # quiet: all answered


def test_interrupted_transfer_resumes_where_it_stopped() -> None:
    net = SimNetwork(window=1, max_records=100)
    a, b = net.add(0), net.add(1)
    for batch in range(10):
        a.write(ALICE, "q", records(100, f"b{batch}-"), batch)
    net.connect(0, 1)
    for _ in range(6):
        net.round()
    partial = b.states[KEY].held_end
    assert 0 < partial < 1000
    net.disconnect(0, 1)
    net.connect(0, 1)
    sent_before = a.sessions[1].stats["deltas_sent"]
    net.run_until_quiet()
    assert b.states[KEY] == a.states[KEY]
    # Resumed: only the missing chunks crossed the new link.
    assert a.sessions[1].stats["deltas_sent"] - sent_before <= (1000 - partial) // 100 + 1


def test_offline_node_catches_up_both_ways_on_reconnect() -> None:
    net = chain(3)
    net.disconnect(1, 2)  # node 2 is a laptop that went offline
    net.nodes[0].write(ALICE, "q", records(20), 1)
    bob = Identity.from_seed(b"b" * 32)
    net.nodes[2].write(bob, "laptop", records(7), 2)
    net.run_until_quiet()
    assert KEY not in net.nodes[2].states
    net.connect(1, 2)
    net.run_until_quiet()
    assert net.nodes[2].states[KEY].held_end == 20
    assert net.nodes[0].states[(bob.public_key, "laptop", 0)].held_end == 7


def test_duplicates_prune_redundant_links_to_lazy() -> None:
    net = SimNetwork()
    for i in range(3):
        net.add(i)
    for a, b in ((0, 1), (1, 2), (0, 2)):  # a triangle: one link is redundant
        net.connect(a, b)
    net.run_until_quiet()
    for n in range(5):
        net.nodes[0].write(ALICE, "q", records(10, f"w{n}-"), n)
        net.run_until_quiet()
    lazy = [
        (x, y)
        for x, node in net.nodes.items()
        for y, session in node.sessions.items()
        if KEY in session._links and not session._links[KEY].eager
    ]
    assert lazy, "some link should have been pruned to lazy"
    assert all(node.states[KEY] == net.nodes[0].states[KEY] for node in net.nodes.values())


def test_lazy_link_repairs_when_the_eager_parent_leaves() -> None:
    net = SimNetwork()
    for i in range(3):
        net.add(i)
    for a, b in ((0, 1), (1, 2), (0, 2)):
        net.connect(a, b)
    net.run_until_quiet()
    for n in range(3):
        net.nodes[0].write(ALICE, "q", records(5, f"w{n}-"), n)
        net.run_until_quiet()
    net.disconnect(0, 1)
    net.disconnect(0, 2)
    net.connect(0, 2)
    net.nodes[0].write(ALICE, "q", records(5, "late"), 9)
    net.run_until_quiet()
    assert all(node.states[KEY] == net.nodes[0].states[KEY] for node in net.nodes.values())


def _started_pair() -> tuple[ReplicationSession, ReplicationSession]:
    a, b = ReplicationSession(), ReplicationSession()
    a.start({})
    b.start({})
    for message in a.messages_to_send():
        b.receive_message(message)
    for message in b.messages_to_send():
        a.receive_message(message)
    return a, b


def test_forged_delta_is_surfaced_for_verification_and_rejected() -> None:
    state = core.commit(core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=1, records=records(3))
    forged = dataclasses.replace(core.delta(state), records=tuple(records(3, "evil")))
    _, b = _started_pair()
    b.receive_message(pack([DELTA, 1, delta_to_wire(forged)]))
    events = [e for e in iter(b.next_event, None) if isinstance(e, DeltaReceived)]
    assert len(events) == 1
    with pytest.raises(IntegrityError):
        core.merge(core.empty_state(ALICE.public_key, "q"), events[0].delta)


def test_impersonating_an_owner_fails_verification() -> None:
    fake = core.commit(core.empty_state(MALLORY.public_key, "q"), MALLORY, now_ms=1, records=records(1))
    stolen_name = dataclasses.replace(core.delta(fake), owner=ALICE.public_key)
    with pytest.raises(IntegrityError):
        core.merge(core.empty_state(ALICE.public_key, "q"), stolen_name)


@pytest.mark.parametrize(
    "message",
    [
        pack([HELLO, PROTOCOL_VERSION + 1, None]),
        pack([DELTA, 1, [1, 2, 3]]),
        pack(["x"]),
        pack([99]),
        pack([HELLO, PROTOCOL_VERSION, None]),  # a second HELLO
        b"\xc1garbage",
        pack([3, 1, b"o" * 32, "q", 0, [0, 0, 0, b"", -1, False]]),  # ACK for nothing sent
    ],
)
def test_protocol_violations_raise_remote_protocol_error(message: bytes) -> None:
    _, b = _started_pair()
    with pytest.raises(RemoteProtocolError):
        b.receive_message(message)


def test_first_message_must_be_hello() -> None:
    session = ReplicationSession()
    session.start({})
    with pytest.raises(RemoteProtocolError):
        session.receive_message(pack([7, 1]))


def test_window_is_enforced_on_the_receiver() -> None:
    state = core.commit(core.empty_state(ALICE.public_key, "q"), ALICE, now_ms=1, records=records(1))
    _, b = _started_pair()
    wire = delta_to_wire(core.delta(state))
    for seq in range(b.window):
        b.receive_message(pack([DELTA, seq + 1, wire]))
    with pytest.raises(RemoteProtocolError):
        b.receive_message(pack([DELTA, 999, wire]))


def test_subscription_limits_what_is_pushed() -> None:
    a, b = ReplicationSession(), ReplicationSession(subscription=("*/wanted",))
    state = core.commit(core.empty_state(ALICE.public_key, "other"), ALICE, now_ms=1, records=records(1))
    a.start({(ALICE.public_key, "other", 0): state.summary()})
    b.start({})
    for message in b.messages_to_send():
        a.receive_message(message)
    assert not [e for e in iter(a.next_event, None) if isinstance(e, NeedDelta)]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_fuzz_only_protocol_errors(data: bytes) -> None:
    _, b = _started_pair()
    with contextlib.suppress(RemoteProtocolError):
        b.receive_message(data)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(-(2**63), 2**64 - 1),
            st.binary(max_size=40),
            st.text(max_size=5),
            st.none(),
            st.booleans(),
        ),
        max_size=7,
    )
)
def test_structured_fuzz_only_protocol_errors(items: list[object]) -> None:
    _, b = _started_pair()
    for kind in range(9):
        with contextlib.suppress(RemoteProtocolError):
            b.receive_message(pack([kind, *items]))


def test_a_fork_seen_anywhere_is_flagged_everywhere_with_a_valid_proof() -> None:
    """The owner signs two histories and hands them to opposite ends of a chain of daemons: the proof
    travels with the deltas, and every node ends up flagging the queue."""
    net = chain(5)
    net.nodes[0].write(ALICE, "q", records(3, "honest"), 1)
    net.nodes[4].write(ALICE, "q", records(3, "twin"), 1)  # same key, same offsets, other records
    net.run_until_quiet()
    for node in net.nodes.values():
        state = node.states[KEY]
        assert state.forked
        assert state.fork is not None
        state.fork.verify()


# ------------------------------------------------------------------ reconnecting: digests of changes only


def _summary(end: int) -> Summary:
    return Summary(version=end, start=0, held_end=end, held_hash=bytes([end]) * 32, meta_version=0)


def _keys(n: int) -> list[tuple[bytes, str, int]]:
    return [(ALICE.public_key, f"q{i}", 0) for i in range(n)]


def _connect(
    a: ReplicationSession,
    b: ReplicationSession,
    local_a: dict[tuple[bytes, str, int], Summary],
    local_b: dict[tuple[bytes, str, int], Summary],
    memory_a: PeerMemory | None = None,
    memory_b: PeerMemory | None = None,
) -> tuple[set[str], set[str]]:
    """Start both sessions and trade messages until quiet; returns the queue names each put in DIGESTs."""
    a.start(local_a, memory=memory_a)
    b.start(local_b, memory=memory_b)
    digested: tuple[set[str], set[str]] = (set(), set())
    for _ in range(4):
        for sender, receiver, names in ((a, b, digested[0]), (b, a, digested[1])):
            for payload in sender.messages_to_send():
                message = unpack(payload)
                if message[0] == DIGEST:
                    names.update(entry[1] for entry in message[1])
                receiver.receive_message(payload)
    return digested


def _asked(session: ReplicationSession) -> list[tuple[tuple[bytes, str, int], Summary | None]]:
    """Every (queue, since) the session asks its host for, answering each with "nothing to send"."""
    asked = []
    while (event := session.next_event()) is not None:
        if isinstance(event, NeedDelta):
            asked.append((event.key, event.since))
            session.provide_delta(event.key, None)
    return asked


def test_a_reconnect_digest_lists_only_what_changed_since_the_last_exchange() -> None:
    keys = _keys(50)
    local = {key: _summary(5) for key in keys}
    a1, b1 = ReplicationSession(incarnation=b"A" * 16), ReplicationSession(incarnation=b"B" * 16)
    first = _connect(a1, b1, local, {})
    assert first[0] == {name for _, name, _ in keys}  # the first time: everything
    memory_a, memory_b = a1.memory(), b1.memory()
    assert memory_a is not None and memory_a.incarnation == b"B" * 16
    assert memory_b is not None and memory_b.incarnation == b"A" * 16
    local[keys[7]] = _summary(9)  # one queue moved while the link was down
    a2, b2 = ReplicationSession(incarnation=b"A" * 16), ReplicationSession(incarnation=b"B" * 16)
    second = _connect(a2, b2, local, {}, memory_a, memory_b)
    assert second == ({"q7"}, set())


def test_a_restarted_peer_gets_everything_again() -> None:
    keys = _keys(20)
    local = {key: _summary(3) for key in keys}
    a1, b1 = ReplicationSession(incarnation=b"A" * 16), ReplicationSession(incarnation=b"B" * 16)
    _connect(a1, b1, local, {})
    memory_a = a1.memory()
    # B restarted (new incarnation, and it may have lost what it held): A must not trust its memory of B.
    a2, b2 = ReplicationSession(incarnation=b"A" * 16), ReplicationSession(incarnation=b"C" * 16)
    digested, _ = _connect(a2, b2, local, {}, memory_a, None)
    assert digested == {name for _, name, _ in keys}
    assert {key for key, _ in _asked(a2)} == set(keys)  # and it offers every queue to the restarted peer


def test_remembered_holdings_keep_unchanged_queues_from_being_resent() -> None:
    keys = _keys(10)
    local = {key: _summary(4) for key in keys}
    a1, b1 = ReplicationSession(incarnation=b"A" * 16), ReplicationSession(incarnation=b"B" * 16)
    _connect(a1, b1, local, dict(local))  # B already holds the same
    memory_a = a1.memory()
    assert memory_a is not None and dict(memory_a.held) == local
    local[keys[3]] = _summary(8)
    a2, b2 = ReplicationSession(incarnation=b"A" * 16), ReplicationSession(incarnation=b"B" * 16)
    _connect(a2, b2, local, dict(memory_a.held), memory_a, b1.memory())
    asked = _asked(a2)
    # Only the queue that moved is offered, from what B is known to hold; the rest B already has.
    assert asked == [(keys[3], _summary(4))]


def test_hello_without_incarnation_is_still_understood() -> None:
    a, b = ReplicationSession(incarnation=b"A" * 16), ReplicationSession()  # b: an older peer
    digested = _connect(a, b, {KEY: _summary(2)}, {})
    assert digested[0] == {"q"}
    assert a.memory() is None and b.memory() is not None  # nothing to remember of a peer with none
    bad = ReplicationSession()
    bad.start({})
    with pytest.raises(RemoteProtocolError):
        bad.receive_message(pack([HELLO, PROTOCOL_VERSION, None, b"short"]))


def test_a_lazy_link_hears_each_summary_once() -> None:
    """A relay reports a push ahead of its commit and again once it is durable, with the same summary:
    a lazy link gets one HAVE for it, and one for each later change."""
    a, b = ReplicationSession(), ReplicationSession()
    a.start({})
    b.start({})
    for message in b.messages_to_send():
        a.receive_message(message)
    a.messages_to_send()
    a._link(KEY).eager = False
    summary = Summary(version=1, start=0, held_end=3, held_hash=b"\x01" * 32, meta_version=0)
    a.local_update(KEY, summary)
    a.local_update(KEY, summary)
    assert [unpack(m)[0] for m in a.messages_to_send()] == [HAVE]
    a.local_update(KEY, dataclasses.replace(summary, version=2, held_end=4))
    assert [unpack(m)[0] for m in a.messages_to_send()] == [HAVE]


# ------------------------------------------------------------------ bounded queues


def test_a_peer_whose_answers_pile_up_is_no_longer_read() -> None:
    """PONGs for a peer that does not read them: past ``max_outbox_bytes`` the host is told to stop
    reading it, and may go on once its driver took the messages."""
    _, b = _started_pair()
    b.max_outbox_bytes = 64
    b.messages_to_send()
    pings = 0
    while b.accepts_input():
        b.receive_message(pack([PING, pings]))
        pings += 1
    assert pings < 64 and 64 <= b.outbox_bytes <= 64 + 3
    assert len(b.messages_to_send()) == pings
    assert b.accepts_input() and b.outbox_bytes == 0


def test_events_waiting_for_the_host_stop_reading_too() -> None:
    _, b = _started_pair()
    b.max_events = 10
    while b.next_event() is not None:
        pass
    entries = [[ALICE.public_key, f"q{i}", 0, summary_to_wire(_summary(1))] for i in range(20)]
    b.receive_message(pack([DIGEST, entries[:9]]))
    assert b.accepts_input()
    b.receive_message(pack([DIGEST, entries[9:]]))
    assert not b.accepts_input()
    while b.next_event() is not None:
        pass
    assert b.accepts_input()


def test_haves_for_a_stalled_lazy_link_are_coalesced() -> None:
    """While nothing is taken from a lazy link, a queue changing 250 times leaves one HAVE (the latest
    summary), not 250."""
    a, _ = _started_pair()
    a.messages_to_send()
    while a.next_event() is not None:
        pass
    a._link(KEY).eager = False
    for end in range(1, 251):
        a.local_update(KEY, _summary(end))
    assert a.has_work()
    (message,) = a.messages_to_send()
    assert unpack(message)[0] == HAVE and summary_from_wire(unpack(message)[4]) == _summary(250)
    assert not a.has_work()


def _greeted(**kwargs: object) -> ReplicationSession:
    """A session that holds KEY and got the HELLO of a peer with an incarnation."""
    session = ReplicationSession(**kwargs)  # type: ignore[arg-type]
    session.start({KEY: _summary(3)})
    session.receive_message(pack([HELLO, PROTOCOL_VERSION, None, b"M" * 16]))
    session.messages_to_send()
    return session


def _made_up(n: int, tag: str) -> list[list[object]]:
    return [[MALLORY.public_key, f"{tag}{i}", 0, summary_to_wire(_summary(1))] for i in range(n)]


def test_queues_a_peer_makes_up_are_bounded_per_peer_and_in_total_and_forgotten_when_it_leaves() -> None:
    budget = KeyBudget(limit=150)
    first = _greeted(max_peer_keys=100, key_budget=budget)
    first.receive_message(pack([DIGEST, [*_made_up(1000, "fake"), [*KEY, summary_to_wire(_summary(2))]]]))
    assert first.peer_keys == 100 and budget.used == 100
    assert first.stats["peer_keys_refused"] == 900
    assert first.peer_summary(KEY) == _summary(2)  # a queue we hold is always tracked
    summaries = [e for e in iter(first.next_event, None) if isinstance(e, PeerSummary)]
    assert len(summaries) == 101  # events only for what is tracked
    second = _greeted(max_peer_keys=100, key_budget=budget)  # another identity: the total still holds
    second.receive_message(pack([DIGEST, _made_up(1000, "other")]))
    assert second.peer_keys == 50 and budget.used == 150 and budget.refused == 900 + 950
    memory = first.memory()
    assert memory is not None and set(memory.held) == {KEY}  # nothing made up outlives the link
    first.release()
    assert budget.used == 50 and first.peer_keys == 0
    assert first.peer_summary((MALLORY.public_key, "fake0", 0)) is None
    second.release()
    assert budget.used == 0


def test_a_queue_we_do_not_subscribe_to_is_not_remembered() -> None:
    session = _greeted(subscription=("*/wanted",), key_budget=KeyBudget(limit=10))
    session.receive_message(pack([DIGEST, _made_up(50, "x")]))
    assert session.peer_keys == 0 and session.stats["peer_keys_refused"] == 0


def test_a_queue_the_peer_sends_is_tracked_until_stored_then_ours() -> None:
    budget = KeyBudget(limit=1)
    session = _greeted(max_peer_keys=1, key_budget=budget)
    session.receive_message(pack([DIGEST, _made_up(1, "fake")]))  # the budget is full
    state = core.commit(core.empty_state(MALLORY.public_key, "real"), MALLORY, now_ms=1, records=records(2))
    session.receive_message(pack([DELTA, 1, delta_to_wire(core.delta(state))]))
    assert session.peer_keys == 2 and budget.used == 2  # tracked whatever the bound: the window limits it
    session.delta_applied(1, state.summary(), True)
    assert session.peer_keys == 1 and budget.used == 1  # stored: ours, no longer counted


# ------------------------------------------------------------------ an owner that signs two histories


def _history(*batches: int, tag: str, base: core.QueueState | None = None) -> core.QueueState:
    state = base or core.empty_state(ALICE.public_key, "q")
    for n, size in enumerate(batches):
        state = core.commit(state, ALICE, now_ms=n, records=records(size, f"{tag}{n}-"))
    return state


def _pair(a_state: core.QueueState, b_state: core.QueueState, **kwargs: int) -> SimNetwork:
    net = SimNetwork(**kwargs)
    net.add(0).states[KEY] = a_state
    net.add(1).states[KEY] = b_state
    net.connect(0, 1)
    return net


def _greeted_pair(
    a_state: core.QueueState, b_state: core.QueueState
) -> tuple[ReplicationSession, ReplicationSession]:
    """Two sessions past HELLO and DIGEST, each knowing what the other holds, nothing sent yet."""
    a, b = ReplicationSession(), ReplicationSession()
    a.start({KEY: a_state.summary()})
    b.start({KEY: b_state.summary()})
    for message in a.messages_to_send():
        b.receive_message(message)
    for message in b.messages_to_send():
        a.receive_message(message)
    return a, b


def _needs(session: ReplicationSession) -> list[NeedDelta]:
    return [e for e in iter(session.next_event, None) if isinstance(e, NeedDelta)]


def test_a_fork_the_receiver_finds_goes_back_to_the_sender() -> None:
    """The sender is ahead; the receiver holds a shorter other history, so only the receiver's join shows
    the fork. It used to tell only its other peers: the sender, not ahead of anyone, never learnt it."""
    x, y = _history(3, tag="x"), _history(1, tag="y")
    a, b = _greeted_pair(x, y)
    assert [need.since for need in _needs(b)] == [None]  # asked on the HELLO; b has nothing for a
    b.provide_delta(KEY, None)
    assert not _needs(b)
    (need,) = _needs(a)
    a.provide_delta(KEY, core.delta(x, need.since, need.max_records))
    for message in a.messages_to_send():
        b.receive_message(message)
    received = [e for e in iter(b.next_event, None) if isinstance(e, DeltaReceived)]
    joined = core.merge(y, received[0].delta)
    assert joined.forked
    b.delta_applied(received[0].seq, joined.summary(), True)
    assert [need.key for need in _needs(b)] == [KEY]


def test_two_histories_of_the_same_length_are_offered() -> None:
    """Same version, same end, another chain value there: neither summary is ahead of the other, so once
    each side knew what the other held, neither sent anything and the fork went unnoticed."""
    x, y = _history(2, tag="x"), _history(2, tag="y")
    a, _ = _greeted_pair(x, y)
    first = _needs(a)  # asked on the HELLO, before the digest said what the peer holds
    assert [need.since for need in first] == [None]
    a.provide_delta(KEY, None)  # (the host had nothing to send after all)
    assert [need.since for need in _needs(a)] == [y.summary()]


def test_another_history_longer_than_a_chunk_stops_both_sides_and_the_link_goes_quiet() -> None:
    """The sender's history (signed heads at 1 and 4) is longer than the receiver's other one (2), and its
    chunks (up to 3 records) are shorter: the first that meets the receiver's records shows the fork.
    Both stop where they stand (each keeps its own records), only the proof crosses, and the link is
    quiet (the same chunk used to go out for ever)."""
    x, y = _history(1, 3, tag="x"), _history(2, tag="y")
    net = _pair(x, y, window=3, max_records=3)
    rounds = net.run_until_quiet(max_rounds=100)
    assert net.quiet() and rounds < 20
    a, b = net.nodes[0].states[KEY], net.nodes[1].states[KEY]
    assert a.forked and b.forked and a.fork == b.fork
    assert (a.entries, b.entries) == (x.entries, y.entries)
    assert net.nodes[0].sessions[1].stats["deltas_sent"] < 10
