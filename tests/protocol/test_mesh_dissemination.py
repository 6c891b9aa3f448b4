"""How often a record crosses a mesh: relays that do not re-send old records, eager links that settle,
link starts linear in the number of queues. Sans-IO: sessions driven by hand, no sockets or clocks."""

from __future__ import annotations

from latticed.crdt import queue as core
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.protocol.graft import Arrivals
from latticed.protocol.replication import (
    HAVE,
    PROTOCOL_VERSION,
    PRUNE,
    WANT,
    DeltaReceived,
    NeedDelta,
    ReplicationSession,
)
from latticed.protocol.replication_messages import (
    Ack,
    Delta,
    Digest,
    Have,
    Hello,
    Message,
    Prune,
    Want,
    encode_message,
)

ALICE = Identity.from_seed(b"a" * 32)
KEY = (ALICE.public_key, "q", 0)


def _grow(state: core.QueueState, n: int, tag: str) -> core.QueueState:
    records = [Record(value=f"{tag}{i}".encode()) for i in range(n)]
    return core.commit(state, ALICE, now_ms=state.held_end + 1, records=records)


def _histories() -> tuple[core.QueueState, core.QueueState, core.QueueState]:
    """One history at 8, 10 and 11 records."""
    h8 = _grow(core.empty_state(ALICE.public_key, "q"), 8, "a")
    h10 = _grow(h8, 2, "b")
    return h8, h10, _grow(h10, 1, "c")


def _feed(session: ReplicationSession, *messages: Message, now: float = 0.0) -> None:
    for message in messages:
        session.receive_message(encode_message(message), now)


def _needs(session: ReplicationSession) -> list[NeedDelta]:
    return [e for e in iter(session.next_event, None) if isinstance(e, NeedDelta)]


# ------------------------------------------------------------------ relays do not re-send old records


def test_a_delta_for_a_peer_holding_more_than_us_carries_no_records() -> None:
    """A relay whose commit is behind what it passed on is asked from past its end: it used to fall back
    to the queue's start and send its whole (old) run."""
    h8, h10, _ = _histories()
    delta = core.delta(h8, h10.summary(), max_records=4096)
    assert delta.records == ()
    assert delta.from_offset == h8.held_end


def test_a_duplicate_ack_is_no_reason_to_offer_the_whole_run() -> None:
    """The peer got our records from another link first, so its ACK changed nothing: that is the normal
    case in a mesh, not a fork. The next delta starts where the peer is, never at the queue's start."""
    h8, h10, h11 = _histories()
    a = ReplicationSession()
    a.start({KEY: h10.summary()})
    _feed(a, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h8.summary()),)))
    (need,) = _needs(a)
    a.provide_delta(KEY, core.delta(h10, need.since, need.max_records))
    assert not _needs(a)
    _feed(a, Have(KEY, h10.summary()))  # it holds them already, from another relay
    a.local_update(KEY, h11.summary())  # our next record, served ahead of our commit
    (need,) = _needs(a)
    assert need.since == h10.summary()
    a.provide_delta(KEY, None)  # the host waits for its commit
    _feed(a, Ack(1, KEY, h10.summary()))
    needs = _needs(a)
    assert [(n.since, n.max_records) for n in needs] == [(h10.summary(), a.max_records)]


def test_a_delta_with_nothing_the_peer_lacks_is_not_sent() -> None:
    """A relay serves a record ahead of its commit; asked again before the commit, its store (still
    behind the peer) has nothing the peer lacks: nothing goes out, the commit pushes again."""
    h8, h10, h11 = _histories()
    a = ReplicationSession()
    a.start({KEY: h8.summary()})
    _feed(a, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h10.summary()),)))
    for _ in _needs(a):
        a.provide_delta(KEY, None)
    a.messages_to_send()
    a.local_update(KEY, h11.summary())  # ahead of our commit; the store still holds h8
    (need,) = _needs(a)
    assert need.since == h10.summary()
    a.provide_delta(KEY, core.delta(h8, need.since, need.max_records))
    assert a.inflight == 0
    assert a.messages_to_send() == []


# ------------------------------------------------------------------ link start linear in the queues


class _CountedName(str):
    """A queue name that counts how often it is compared (a scan of the pending queues compares each)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_link_start_schedules_every_queue_without_scanning_the_others() -> None:
    """The peer's HELLO schedules every queue we hold: each scheduling used to scan those already
    scheduled (quadratic: seconds of CPU per link start at 10,000 queues)."""
    summary = _histories()[0].summary()
    local = {(ALICE.public_key, _CountedName(f"q{i}"), 0): summary for i in range(2000)}
    session = ReplicationSession()
    session.start(local)
    _CountedName.compared = 0
    _feed(session, Hello(PROTOCOL_VERSION, None, None))
    assert len(_needs(session)) == session.window
    assert _CountedName.compared < 10 * len(local)  # a scan per queue: about 2,000,000


# ------------------------------------------------------------------ eager and lazy links settle


def _wants(session: ReplicationSession) -> list[bytes]:
    return [m for m in session.messages_to_send() if m[1] == WANT]


def _lazy_receiver(timeout: float) -> tuple[ReplicationSession, core.QueueState, core.QueueState]:
    h8, h10, _ = _histories()
    b = ReplicationSession(graft_timeout=timeout)
    b.start({KEY: h8.summary()})
    _feed(b, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h8.summary()),)), now=0.0)
    for _ in _needs(b):
        b.provide_delta(KEY, None)
    b.messages_to_send()
    return b, h8, h10


def test_a_have_waits_for_the_eager_copy_and_grafts_only_if_it_does_not_come() -> None:
    b, _, h10 = _lazy_receiver(0.3)
    _feed(b, Have(KEY, h10.summary()), now=10.0)
    assert not _wants(b)  # it used to go out at once, making a second eager link
    assert b.next_deadline() == 10.3
    b.tick(10.2)
    assert not _wants(b)
    b.tick(10.3)  # the eager copy never came: graft
    assert len(_wants(b)) == 1
    assert b.next_deadline() is None


def test_a_have_whose_news_arrives_in_time_sends_no_want() -> None:
    b, _, h10 = _lazy_receiver(0.3)
    _feed(b, Have(KEY, h10.summary()), now=10.0)
    b.local_update(KEY, h10.summary())  # the eager copy, through another link
    b.tick(11.0)
    assert not _wants(b) and b.next_deadline() is None


def test_the_first_duplicate_prunes_the_link_whatever_our_own_direction() -> None:
    """The peer pruned our pushes to it; its own pushes that bring us nothing used to be kept eager for
    ever (the check looked at our direction of the link), so every record came twice."""
    h8, h10, _ = _histories()
    b = ReplicationSession()
    b.start({KEY: h10.summary()})
    _feed(b, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h8.summary()),)))
    b.next_event()
    _feed(b, Prune(KEY))  # it takes HAVEs from us now
    b.messages_to_send()
    for seq in (1, 2):  # two duplicates from it
        _feed(b, Delta(seq, core.delta(h10, h8.summary())))
        (received,) = [e for e in iter(b.next_event, None) if isinstance(e, DeltaReceived)]
        b.delta_applied(received.seq, h10.summary(), False)
    prunes = [m for m in b.messages_to_send() if m[1] == PRUNE]
    assert len(prunes) == 1  # once: the peer sends HAVEs from then on


# ------------------------------------------------------------------ a backlog over a mesh


def test_a_backlog_chunk_the_peer_had_from_another_link_is_no_reason_to_offer_the_whole_run() -> None:
    """A backlog streams in chunks; the peer gets the first one's records from another link first (it
    says so in a HAVE) and acknowledges ours with what it held already. That is a duplicate, yet it was
    judged against all we had in flight (past the peer), taken for a lost join, and the next delta was
    the whole queue from offset 0 (in a bulk over a mesh: again for every such chunk)."""
    h8, _, h11 = _histories()
    h13 = _grow(h11, 2, "d")
    a = ReplicationSession(max_records=2, depth=2)
    a.start({KEY: h13.summary()}, known_peer={KEY: h8.summary()})
    _feed(a, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h8.summary()),)))
    chunks = []
    for _ in range(2):  # two chunks in flight: [8, 10) and [10, 11)
        (need,) = _needs(a)
        chunks.append(core.delta(h13, need.since, need.max_records))
        a.provide_delta(KEY, chunks[-1])
    assert a.inflight == 2 and not _needs(a)
    peer = core.merge(h8, chunks[0]).summary()  # what it holds: the first chunk, from elsewhere
    assert peer.held_end == 10
    _feed(a, Have(KEY, peer), Ack(1, KEY, peer))
    needs = _needs(a)
    # on from our last chunk (it used to be None and the whole run: 13 records from offset 0)
    assert [(n.since and n.since.held_end, n.max_records) for n in needs] == [(11, 2)]


def test_a_have_whose_news_keeps_arriving_restarts_the_graft_timer() -> None:
    """A backlog streams in from another link, more slowly than the HAVEs of this one announce it: the
    timer used to fire on the first HAVE's deadline all the same, grafting a second link that then sent
    every chunk again. Progress restarts it; a graft comes only when nothing arrives for a whole timeout."""
    b, h8, h10 = _lazy_receiver(0.25)
    h9 = _grow(h8, 1, "b")  # the first record of h10
    h11 = _grow(h10, 1, "c")
    _feed(b, Have(KEY, h10.summary()), now=10.0)
    _feed(b, Have(KEY, h11.summary()), now=10.125)
    b.local_update(KEY, h9.summary(), now=10.25)  # part of it, from the other link
    b.tick(10.25)
    assert not _wants(b)
    assert b.next_deadline() == 10.5  # a whole timeout from the part that arrived
    b.tick(10.5)  # nothing more arrived within a whole timeout: graft
    assert len(_wants(b)) == 1
    assert b.next_deadline() is None


# ------------------------------------------------------------------ a graft timer learned per link


def test_a_relay_taking_a_backlog_under_the_newest_head_sends_no_records_to_a_peer_ahead() -> None:
    """A relay takes a backlog in chunks, each under the owner's newest head, so its head is newer than
    that of a peer which already holds more records: it used to answer that peer with the queue from its
    start (the peer's version being older), a whole run of duplicates per ask."""
    _, h10, h11 = _histories()
    relay = core.merge(core.empty_state(ALICE.public_key, "q"), core.delta(h11, None, max_records=8))
    assert relay.held_end == 8 and relay.version > h10.version
    delta = core.delta(relay, h10.summary(), max_records=4096)
    assert delta.records == ()
    assert delta.from_offset == relay.held_end


def _learning_receiver() -> tuple[ReplicationSession, list[core.QueueState]]:
    """A lazy link's session with a learned timer (floor 0.3 s, cap 2 s) and one history growing."""
    h8, _, _ = _histories()
    b = ReplicationSession(graft_timeout=0.3, graft_timeout_max=2.0)
    b.start({KEY: h8.summary()})
    _feed(b, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h8.summary()),)), now=0.0)
    b.messages_to_send()
    states = [h8]
    for i in range(12):
        states.append(_grow(states[-1], 1, f"g{i}"))
    return b, states


def test_a_link_whose_eager_copies_come_late_learns_to_wait_for_them() -> None:
    """On a busy host the eager copy of what a HAVE announced comes 0.6 s later, every time: a fixed
    0.3 s timer grafted each time (a second eager link sending every chunk again). The timer learns
    the lateness and stops grafting."""
    b, states = _learning_receiver()
    assert b.graft_delay == 0.3
    wants = 0
    now = 10.0
    for state in states[1:]:
        _feed(b, Have(KEY, state.summary()), now=now)
        deadline = b.next_deadline()
        assert deadline is not None
        if deadline < now + 0.6:
            b.tick(deadline)
            wants += len(_wants(b))
        b.local_update(KEY, state.summary(), now=now + 0.6)  # the eager copy
        b.tick(now + 0.6)
        now += 1.0
    assert b.graft_delay > 0.6
    assert wants <= 2  # only before it learned (it used to be one per HAVE: 12)
    assert b.graft_delay <= 2.0


def test_a_graft_whose_delta_was_a_duplicate_makes_the_link_wait_longer() -> None:
    """The WANT went out, then the eager copy came first after all: the graft was premature, and the
    next HAVE waits twice as long; a graft that brought news keeps the timer as it is."""
    b, states = _learning_receiver()
    _feed(b, Have(KEY, states[2].summary()), now=10.0)
    b.tick(10.3)
    assert len(_wants(b)) == 1
    b.local_update(KEY, states[2].summary(), now=10.5)  # the eager copy, late
    _feed(b, Delta(1, core.delta(states[2], states[0].summary())), now=10.6)  # the grafted link's
    (received,) = [e for e in iter(b.next_event, None) if isinstance(e, DeltaReceived)]
    b.delta_applied(received.seq, states[2].summary(), False, now=10.7)
    assert b.graft_delay >= 0.6


def test_no_graft_while_another_link_is_delivering_the_queue() -> None:
    """A backlog's chunk is on its way into the store through the eager link (received, not yet
    stored), as the lazy link's HAVE timer runs out: the host is taking it in, so no WANT; once that
    link goes quiet for good, the WANT goes out within the cap all the same."""
    h8, h10, _ = _histories()
    arrivals = Arrivals()
    lazy = ReplicationSession(graft_timeout=0.3, graft_timeout_max=2.0, arrivals=arrivals)
    eager = ReplicationSession(arrivals=arrivals)
    for session in (lazy, eager):
        session.start({KEY: h8.summary()})
        _feed(session, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h8.summary()),)))
        session.messages_to_send()
        list(iter(session.next_event, None))
    _feed(eager, Delta(1, core.delta(h10, h8.summary())), now=10.0)
    _feed(lazy, Have(KEY, h10.summary()), now=10.0)
    lazy.tick(10.3)
    assert not _wants(lazy)  # the eager link's delta is being verified and stored
    eager.release()  # its link died before the delta was stored: nothing is arriving any more
    deadline = lazy.next_deadline()
    assert deadline is not None and deadline <= 12.0
    lazy.tick(deadline)
    assert len(_wants(lazy)) == 1


def test_a_dead_eager_link_is_repaired_within_the_cap_however_late_copies_came() -> None:
    """However late eager copies came before, the timer stays under its cap: when the eager link is
    dead (nothing arrives, nothing is on its way), the WANT goes out by then."""
    b, states = _learning_receiver()
    for i, state in enumerate(states[1:6]):
        _feed(b, Have(KEY, state.summary()), now=10.0 * i)
        b.local_update(KEY, state.summary(), now=10.0 * i + 5.0)  # very late copies
        b.tick(10.0 * i + 5.0)
        _wants(b)
    assert b.graft_delay == 2.0
    _feed(b, Have(KEY, states[-1].summary()), now=100.0)
    b.tick(101.9)
    assert not _wants(b)
    b.tick(102.0)
    assert len(_wants(b)) == 1


def test_a_pruned_link_stops_streaming_a_backlog_and_announces_the_rest() -> None:
    """The peer pruned us mid-backlog (it takes the queue from its eager link): each of our ACKed chunks
    used to schedule the next one all the same, so the backlog crossed both links to the end. Now the
    stream stops; a HAVE of what we hold starts the peer's graft timer, should its eager link stall."""
    h8, _, h11 = _histories()
    h13 = _grow(h11, 2, "d")
    a = ReplicationSession(max_records=2, depth=1)
    a.start({KEY: h13.summary()})
    _feed(a, Hello(PROTOCOL_VERSION, None, None), Digest(((KEY, h8.summary()),)))
    (need,) = _needs(a)
    first = core.delta(h13, need.since, need.max_records)
    a.provide_delta(KEY, first)
    a.messages_to_send()
    _feed(a, Prune(KEY))  # the peer had it from another link
    _feed(a, Ack(1, KEY, core.merge(h8, first).summary()))
    assert not _needs(a)  # it used to be the next chunk, and so on to the end
    haves = [m for m in a.messages_to_send() if m[1] == HAVE]
    assert len(haves) == 1
    _feed(a, Want(KEY, core.merge(h8, first).summary()))  # its eager link stalled: it grafts us
    assert len(_needs(a)) == 1
