"""The replication fast paths: columnar records on the wire, byte-bounded chunk reads, pipelined chunks
per queue, and the engine's pipelined merge and in-memory live push. Each must give exactly what the
plain path gives, and must keep rejecting what it rejects."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from support.sim import SimNetwork

from latticed.crdt import queue as core
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.records import Record, RecordRun
from latticed.crdt.signing import Identity
from latticed.crdt.wire import (
    decode_delta,
    delta_to_wire,
    encode_delta,
    pack,
    records_from_wire,
    records_to_wire,
    unpack,
)
from latticed.errors import TamperedError
from latticed.net.gossip import Gossip, PeerLink
from latticed.protocol.replication import ACK, DELTA, DeltaReceived, NeedDelta, ReplicationSession
from latticed.protocol.replication_messages import Pong
from latticed.storage import segments
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
KEY = (ALICE.public_key, "q", 0)


def run(n: int, tag: str = "r", size: int = 0) -> RecordRun:
    return RecordRun(
        [f"{tag}{i}".encode().ljust(size, b".") for i in range(n)],
        [None if i % 3 else b"k%d" % i for i in range(n)],
        [1000 + i for i in range(n)],
        [(("h", b"%d" % i),) if i % 5 == 0 else () for i in range(n)],
    )


def owner_state(batches: int, per: int, size: int = 0) -> core.QueueState:
    state = core.empty_state(ALICE.public_key, "q")
    for b in range(batches):
        state = core.commit(state, ALICE, now_ms=b + 1, records=run(per, f"b{b}-", size))
    return state


# ------------------------------------------------------------------ wire


def test_records_cross_the_wire_as_a_run_and_equal_the_rows() -> None:
    records = run(50)
    rows = msgpack.unpackb(msgpack.packb(records_to_wire(records), use_bin_type=True), raw=False)
    assert rows == [[r.key, r.value, r.timestamp, [[k, v] for k, v in r.headers]] for r in records]
    decoded = records_from_wire(rows)
    assert type(decoded) is RecordRun and decoded == records and list(decoded) == list(records)
    assert records_from_wire(unpack(msgpack.packb(records_to_wire(tuple(records))))) == records


def test_records_sharing_their_headers_cross_the_wire_and_are_stored_as_each_would_be() -> None:
    """A producer's stamp on every record is converted once per run: the rows, the decoded run, the
    stored header column and its size are what converting each record would give."""
    stamp = (("lattice.producer", b"ab" * 32),)
    shared = RecordRun(
        [b"v%d" % i for i in range(30)], [None] * 30, [1000 + i for i in range(30)], [stamp] * 30
    )
    rows = msgpack.unpackb(msgpack.packb(records_to_wire(shared), use_bin_type=True), raw=False)
    assert rows == [[None, r.value, r.timestamp, [["lattice.producer", b"ab" * 32]]] for r in shared]
    decoded = records_from_wire(rows)
    assert decoded == shared and decoded.headers == (stamp,) * 30
    segment = segments.Segment.from_records(0, shared, [bytes(32)] * 30)
    assert segment.headers == [[["lattice.producer", b"ab" * 32]]] * 30
    each = sum(len(v) + 16 for v in shared.values) + 30 * (len("lattice.producer") + 64)
    assert segment.nbytes() == each
    rows[7][3] = [["lattice.producer", "text"]]  # one record differs, and is bad: still refused
    with pytest.raises(MalformedError):
        records_from_wire(rows)


@pytest.mark.parametrize(
    "rows",
    [
        [[None, b"v", 1]],  # three fields
        [[None, b"v", 1, [], 5]],  # five
        [[None, b"v", 1, []], [None, b"v", 1]],  # ragged
        [[None, "v", 1, []]],  # text value
        [[None, b"v", True, []]],  # bool timestamp
        [[None, b"v", 1.5, []]],
        [["k", b"v", 1, []]],  # text key
        [[None, b"v", 1, {}]],
        [[None, b"v", 1, [["h"]]]],
        [[None, b"v", 1, [[b"h", b"x"]]]],
        [b"abcd"],
        ["abcd"],
        [None],
        "rows",
    ],
)
def test_malformed_rows_are_malformed_errors(rows: Any) -> None:
    with pytest.raises(MalformedError):
        records_from_wire(rows)


def test_a_decoded_delta_verifies_and_merges_like_the_original() -> None:
    source = owner_state(3, 40)
    d = core.delta(source)
    wire = decode_delta(encode_delta(d))
    assert type(wire.records) is RecordRun
    replica = core.merge(core.empty_state(ALICE.public_key, "q"), wire)
    assert replica == core.merge(core.empty_state(ALICE.public_key, "q"), d) == source
    # Joining a second chunk onto the first keeps it columnar all the way into the entries.
    first = core.merge(core.empty_state(ALICE.public_key, "q"), core.delta(source, None, 40))
    assert first.held_end == 40
    rest = decode_delta(encode_delta(core.delta(source, first.summary())))
    assert rest.from_offset == 40 and type(rest.records) is RecordRun
    assert core.merge(first, rest) == source
    forged = dataclasses.replace(wire, records=RecordRun.of([Record(b"x"), *wire.records[1:]]))
    with pytest.raises(TamperedError):
        core.verify_delta(core.empty_state(ALICE.public_key, "q"), forged)
    with pytest.raises(MalformedError):
        core.verify_delta(core.empty_state(ALICE.public_key, "q"), dataclasses.replace(wire, records=[]))


# ------------------------------------------------------------------ byte-bounded chunks


def test_a_byte_bounded_chunk_reads_about_one_chunk_not_the_backlog() -> None:
    state = owner_state(40, 10, size=1000)  # a checkpoint every 10 records of ~1 kB
    reads: list[tuple[int, int]] = []
    entries = state.entries

    def read(lo: int, hi: int) -> list[Record]:
        reads.append((lo, hi))
        return entries.records(lo, hi)

    d = core.delta(state, None, None, 35_000, read=read)
    assert d.tip is not None and d.end_offset == d.tip.end == 30  # the last checkpoint that fits
    assert sum(len(r.value) + len(r.key or b"") for r in d.records) <= 35_000
    assert sum(hi - lo for lo, hi in reads) <= 40  # at most one piece more than it sends
    assert d == core.delta(state, None, None, 35_000)  # the default reader gives the same chunk
    replica = core.merge(core.empty_state(ALICE.public_key, "q"), d)
    assert replica.held_end == 30
    # Not even the first checkpoint fits: the chunk ends at it anyway (a frame-sized piece, not all).
    tiny = core.delta(state, None, None, 100)
    assert tiny.end_offset == 10 and core.merge(core.empty_state(ALICE.public_key, "q"), tiny).held_end == 10
    # Everything fits: up to the end, vouched by the newest head.
    whole = core.delta(state, replica.summary(), None, 10**9)
    assert whole.end_offset == 400 and whole.tip == state.head


# ------------------------------------------------------------------ pipelined chunks of one queue


def test_a_backlog_streams_several_chunks_ahead_of_the_acks() -> None:
    state = owner_state(20, 100)
    sender = ReplicationSession(window=8, depth=3, max_records=100)
    receiver = ReplicationSession()
    sender.start({KEY: state.summary()})
    receiver.start({})
    for message in receiver.messages_to_send():
        sender.receive_message(message)
    sent: list[core.QueueDelta] = []
    while (event := sender.next_event()) is not None:
        if isinstance(event, NeedDelta):
            d = core.delta(state, event.since, event.max_records)
            sent.append(d)
            sender.provide_delta(KEY, d)
    assert len(sent) == 3 and sender.inflight == 3  # no ACK yet, three chunks out
    assert [d.from_offset for d in sent] == [0, 100, 200]  # each starts where the previous ends
    replica = core.empty_state(ALICE.public_key, "q")
    for d in sent:
        replica = core.merge(replica, d)
    assert replica.held_end == 300
    deltas = [m for m in sender.messages_to_send() if unpack(m)[0] == DELTA]
    assert len(deltas) == 3


def test_pipelined_chunks_reach_the_same_state_in_the_simulator() -> None:
    net = SimNetwork(window=4, max_records=50)
    a, b = net.add(0), net.add(1)
    for batch in range(20):
        a.write(ALICE, "q", list(run(50, f"b{batch}-")), batch)
    net.connect(0, 1)
    peak = net.peak_until_quiet(lambda: a.sessions[1].inflight)
    assert b.states[KEY] == a.states[KEY]
    assert 1 < peak <= 4  # several chunks in flight, never more than the window


# ------------------------------------------------------------------ the engine


async def test_pipelined_merges_report_what_each_changed(tmp_path: Path) -> None:
    source = owner_state(5, 100)
    chunks = []
    since = None
    replica = core.empty_state(ALICE.public_key, "q")
    while True:
        d = core.delta(source, since, 100)
        if not d.records:
            break
        chunks.append(d)
        replica = core.merge(replica, d)
        since = replica.summary()
    async with Engine.open(tmp_path, Identity.from_seed(b"b" * 32)) as engine:
        # Submitted back to back, verified first: joined in order, in as few transactions as it takes.
        jobs = [engine.submit_merge(await engine.verify_delta(d)) for d in chunks]
        done = [await engine.merged(job) for job in jobs]
        assert [job.summary.held_end for job in done if job.summary] == [100, 200, 300, 400, 500]
        assert all(job.changed for job in done)
        again = await engine.merged(engine.submit_merge(await engine.verify_delta(chunks[2])))
        assert not again.changed and again.summary == replica.summary()
        q = engine.find(ALICE.public_key, "q")
        assert q is not None and engine.state(q).summary() == source.summary()


async def test_a_live_push_is_served_from_memory_and_equals_the_stored_answer(tmp_path: Path) -> None:
    async with Engine.open(tmp_path, ALICE) as engine:
        q = await engine.create_queue("q")
        await engine.append(q, run(30))
        first = await engine.delta_for(ALICE.public_key, "q", None)  # from the store
        peer = core.merge(core.empty_state(ALICE.public_key, "q"), first).summary()
        await engine.append(q, run(5, "live"))
        state = engine.state(q)
        pushed = engine.live.pushed_delta(q, state, peer, 4096, 1 << 20)
        assert pushed is not None and pushed.from_offset == 30 and len(pushed.records) == 5
        stored = await _stored_delta(engine, q, peer)
        assert pushed == stored
        # A since we cannot vouch for (not our chain value), or one the last commit does not cover:
        # the store answers.
        bogus = dataclasses.replace(peer, held_hash=b"\x00" * 32)
        assert engine.live.pushed_delta(q, state, bogus, 4096, 1 << 20) is None
        assert engine.live.pushed_delta(q, state, core.Summary(), 4096, 1 << 20) is None
        assert engine.live.pushed_delta(q, state, peer, 2, 1 << 20) is None  # over max_records
        # Caught up on records: only the head (nothing to read either way).
        caught_up = core.merge(core.empty_state(ALICE.public_key, "q"), first)
        caught_up = core.merge(caught_up, pushed)
        assert engine.live.pushed_delta(q, state, caught_up.summary(), 4096, 1 << 20) is not None
        replica = core.merge(core.merge(core.empty_state(ALICE.public_key, "q"), first), pushed)
        assert replica.summary() == state.summary()


async def _stored_delta(engine: Engine, q: int, since: core.Summary) -> core.QueueDelta:
    engine.live.forget(q)  # force the read from the store
    return await engine.delta_for(ALICE.public_key, "q", since, 4096, max_bytes=1 << 20)


# ------------------------------------------------------------------ the gossip ingest pipeline


class _SlowHost:
    """Merges finish only when the test says so; records the order of submissions."""

    def __init__(self) -> None:
        self.submitted: list[int] = []
        self.release: dict[int, trio.Event] = {}

    async def verify_delta(self, delta: core.QueueDelta) -> core.VerifiedDelta:
        return core.verify_delta(core.empty_state(ALICE.public_key, "q"), delta)

    def submit_merge(self, verified: core.VerifiedDelta, peer: bytes) -> _Slow:
        offset = verified.delta.from_offset
        self.submitted.append(offset)
        self.release[offset] = trio.Event()
        return _Slow(self.release[offset], verified)


class _Slow:
    ahead: core.Summary | None = None

    def __init__(self, event: trio.Event, verified: core.VerifiedDelta) -> None:
        self.event = event
        self.verified = verified

    async def result(self) -> tuple[core.Summary, bool]:
        await self.event.wait()
        return core.join_verified(core.empty_state(ALICE.public_key, "q"), self.verified).summary(), True

    def settled(self) -> tuple[core.Summary, bool] | None:
        return None


@pytest.mark.parametrize(("per_chunk", "at_once"), [(1, 1), (100, 3)])
async def test_live_pushes_are_stored_one_at_a_time_and_chunks_back_to_back(
    per_chunk: int, at_once: int
) -> None:
    state = owner_state(3, per_chunk)
    since = None
    replica = core.empty_state(ALICE.public_key, "q")
    chunks = []
    for _ in range(3):
        d = core.delta(state, since, per_chunk)
        chunks.append(d)
        replica = core.merge(replica, d)
        since = replica.summary()
    host = _SlowHost()
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    link = PeerLink(b"\x02" * 32, "mem", "static", ReplicationSession())
    to_verify, deltas = trio.open_memory_channel[DeltaReceived](10)
    to_ack, acks = trio.open_memory_channel[tuple[DeltaReceived, Any]](10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip._verifier, link, deltas, to_ack)
        for seq, d in enumerate(chunks, 1):
            to_verify.send_nowait(DeltaReceived(KEY, seq, d))
        await trio.testing.wait_all_tasks_blocked()
        # Backlog chunks all reach the store before any is stored; live pushes wait for each other.
        assert len(host.submitted) == at_once
        for _ in range(3):
            host.release[host.submitted[-1]].set()
            await trio.testing.wait_all_tasks_blocked()
        assert host.submitted == [d.from_offset for d in chunks]
        assert [acks.receive_nowait()[0].seq for _ in range(3)] == [1, 2, 3]
        nursery.cancel_scope.cancel()


async def test_a_relay_announces_a_push_before_it_is_stored_but_acks_it_after() -> None:
    """The host serves a verified live push ahead of its commit (``ahead``): the other peers hear of it
    at once; the sender's ACK still waits until it is durable."""
    state = owner_state(2, 3)
    replica = core.merge(core.empty_state(ALICE.public_key, "q"), core.delta(state, None, 3))
    push = core.delta(state, replica.summary(), 3)
    ahead = core.merge(replica, push).summary()
    stored = trio.Event()

    class Pending:
        def __init__(self) -> None:
            self.ahead = ahead

        async def result(self) -> tuple[core.Summary, bool]:
            await stored.wait()
            return ahead, True

        def settled(self) -> tuple[core.Summary, bool] | None:
            return (ahead, True) if stored.is_set() else None

    class Host(_SlowHost):
        def submit_merge(self, verified: core.VerifiedDelta, peer: bytes) -> Pending:  # type: ignore[override]
            return Pending()

    gossip = Gossip(Host(), b"\x01" * 32)  # type: ignore[arg-type]
    source = PeerLink(b"\x02" * 32, "mem", "static", _open_session())
    other = PeerLink(b"\x03" * 32, "mem", "static", _open_session())
    gossip.links = {source.public_key: source, other.public_key: other}
    to_verify, deltas = trio.open_memory_channel[DeltaReceived](10)
    to_ack, acks = trio.open_memory_channel[tuple[DeltaReceived, Any]](10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip._verifier, source, deltas, to_ack)
        to_verify.send_nowait(DeltaReceived(KEY, 1, push))
        await trio.testing.wait_all_tasks_blocked()
        assert other.wakeup.is_set() and not source.wakeup.is_set()  # told the other peer, not the sender
        assert other.session._local[KEY] == ahead
        # The ACK is the acker's, and it waits on the store: here the merge is still pending.
        event, pending = acks.receive_nowait()
        assert event.seq == 1 and pending.ahead == ahead and not stored.is_set()
        nursery.cancel_scope.cancel()


def _open_session() -> ReplicationSession:
    """A session past the peer's HELLO and digest, its opening messages and events taken (no work)."""
    ours, theirs = ReplicationSession(), ReplicationSession()
    ours.start({})
    theirs.start({})
    for message in theirs.messages_to_send():
        ours.receive_message(message)
    ours.messages_to_send()
    list(iter(ours.next_event, None))  # the peer's HELLO
    assert not ours.has_work()
    return ours


async def test_a_change_wakes_a_links_driver_only_when_it_gives_the_driver_work() -> None:
    """A relay hears of each push twice (served ahead of its commit, then stored): the second gives the
    other links nothing to send, so their drivers are not woken for it (a scheduler pass per record)."""
    state = owner_state(1, 3)
    gossip = Gossip(_SlowHost(), b"\x01" * 32)  # type: ignore[arg-type]
    link = PeerLink(b"\x02" * 32, "mem", "static", _open_session())
    gossip.links = {link.public_key: link}
    gossip.local_change(KEY, state.summary())
    assert link.wakeup.is_set()  # a push to send: the driver asks for it
    event = link.session.next_event()
    assert isinstance(event, NeedDelta)
    link.session.provide_delta(KEY, core.delta(state, event.since, event.max_records))
    link.session.messages_to_send()
    link.wakeup = trio.Event()
    link.sleeping_until = float("inf")
    gossip.local_change(KEY, state.summary())  # the same records, now stored: in flight already
    assert not link.wakeup.is_set() and not link.session.has_work()


async def test_kicks_while_the_driver_works_cost_no_extra_pass() -> None:
    """The driver looks at the session again before it sleeps, so kicks that arrived while it sent (the
    reader, the verifier and the acker each kick) do not wake it once more for nothing."""
    session = _open_session()
    link = PeerLink(b"\x02" * 32, "mem", "static", session)
    gossip = Gossip(_SlowHost(), b"\x01" * 32)  # type: ignore[arg-type]
    gossip.links = {link.public_key: link}
    passes = 0  # each pass of the driver ends with one flush (no event came in between here)
    flush = gossip._flush

    async def counted(stream: Any, link: PeerLink) -> None:
        nonlocal passes
        passes += 1
        await flush(stream, link)

    gossip._flush = counted  # type: ignore[method-assign]

    class Kicking(_Writes):
        async def send_many(self, messages: list[bytes]) -> None:
            link.kick()  # others kick while the driver is in its write
            await trio.lowlevel.checkpoint()
            await super().send_many(messages)

    stream = Kicking()
    to_verify, _ = trio.open_memory_channel[DeltaReceived](10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip._driver, stream, link, nursery.cancel_scope, to_verify)
        await trio.testing.wait_all_tasks_blocked()
        assert passes == 1
        session.ping(1)
        link.kick()
        await trio.testing.wait_all_tasks_blocked()
        assert passes == 2 and len(stream.writes) == 1  # the ping went out; the kick in its write: no pass
        nursery.cancel_scope.cancel()


def _sender_and_receiver(**receiver_kw: Any) -> tuple[ReplicationSession, ReplicationSession]:
    sender, receiver = ReplicationSession(), ReplicationSession(**receiver_kw)
    sender.start({})
    receiver.start({})
    for message in sender.messages_to_send():
        receiver.receive_message(message)
    for message in receiver.messages_to_send():
        sender.receive_message(message)
    list(iter(receiver.next_event, None))
    list(iter(sender.next_event, None))
    return sender, receiver


def test_a_session_without_notices_asks_nothing_of_its_host_for_an_ack_but_hands_it_a_pong() -> None:
    """The daemon ignores the events that only report what the peer holds; with ``notices`` off they
    are not queued, so an ACK that asks for no next chunk leaves the session without work (no pass of
    the driver for it). A PONG still reaches the host: it matches it to its PING (the duplicate-identity
    check waits for one)."""
    state = owner_state(1, 2)
    for notices in (True, False):
        receiver, sender = _sender_and_receiver(notices=notices)
        sender.local_update(KEY, state.summary())
        event = sender.next_event()
        assert isinstance(event, NeedDelta)
        sender.provide_delta(KEY, core.delta(state, event.since, event.max_records))
        for message in sender.messages_to_send():
            receiver.receive_message(message)
        (received,) = iter(receiver.next_event, None)
        assert isinstance(received, DeltaReceived)
        receiver.delta_applied(received.seq, state.summary(), True)
        for message in receiver.messages_to_send():
            sender.receive_message(message)  # the ACK
        assert sender.has_work() is notices
        assert len(list(iter(sender.next_event, None))) == (1 if notices else 0)
        sender.ping(7)
        for message in sender.messages_to_send():
            receiver.receive_message(message)  # the PING
        for message in receiver.messages_to_send():
            sender.receive_message(message)  # the PONG
        assert sender.has_work()
        assert list(iter(sender.next_event, None)) == [Pong(7)]


def test_received_deltas_wait_apart_for_the_reader() -> None:
    state = owner_state(1, 2)
    sender, receiver = _sender_and_receiver(received_apart=True)
    sender.local_update(KEY, state.summary())
    event = sender.next_event()
    assert isinstance(event, NeedDelta)
    sender.provide_delta(KEY, core.delta(state, event.since, event.max_records))
    for message in sender.messages_to_send():
        receiver.receive_message(message)
    assert receiver.next_event() is None and not receiver.has_work()
    received = receiver.next_received()
    assert isinstance(received, DeltaReceived) and received.key == KEY
    assert receiver.next_received() is None


class _Messages:
    """A peer stream that yields the given messages, then waits."""

    def __init__(self, messages: list[bytes]) -> None:
        self.messages = messages

    async def receive(self) -> bytes | None:
        if self.messages:
            return self.messages.pop(0)
        await trio.sleep_forever()
        return None


async def test_the_reader_hands_a_received_delta_to_the_verifier_itself() -> None:
    """No pass of the link's driver between a delta's arrival and its verification."""
    state = owner_state(1, 2)
    sender, _ = _sender_and_receiver()
    receiver = _open_session()
    receiver.received_apart = True
    sender.local_update(KEY, state.summary())
    event = sender.next_event()
    assert isinstance(event, NeedDelta)
    sent = core.delta(state, event.since, event.max_records)
    sender.provide_delta(KEY, sent)
    link = PeerLink(b"\x02" * 32, "mem", "static", receiver)
    gossip = Gossip(_SlowHost(), b"\x01" * 32)  # type: ignore[arg-type]
    gossip.links = {link.public_key: link}
    to_verify, deltas = trio.open_memory_channel[DeltaReceived](10)
    async with trio.open_nursery() as nursery:
        stream = _Messages(sender.messages_to_send())
        nursery.start_soon(gossip._reader, stream, link, nursery.cancel_scope, to_verify)
        await trio.testing.wait_all_tasks_blocked()
        received = deltas.receive_nowait()
        assert received.key == KEY and received.delta.head == sent.head
        assert not link.wakeup.is_set()  # and nothing for the driver to do
        nursery.cancel_scope.cancel()


class _Writes:
    """A peer stream that records each write (its frames) and never blocks."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []

    async def send_many(self, messages: list[bytes]) -> None:
        self.writes.append(list(messages))


class _Stored:
    """A merge already durable (its commit has landed)."""

    ahead: core.Summary | None = None

    def __init__(self, summary: core.Summary) -> None:
        self.summary = summary

    async def result(self) -> tuple[core.Summary, bool]:
        return self.summary, True

    def settled(self) -> tuple[core.Summary, bool] | None:
        return self.summary, True


async def test_deltas_stored_by_one_commit_are_acknowledged_in_one_write() -> None:
    """A replica's commit often stores several pushes of one link (their commits wait for company): their
    ACKs leave together, one write and one wake-up of the sender, not one each, and without waiting for
    the next commit."""
    sender, receiver = ReplicationSession(), ReplicationSession()
    sender.start({})
    receiver.start({})
    for message in sender.messages_to_send():
        receiver.receive_message(message)
    receiver.messages_to_send()
    list(iter(receiver.next_event, None))
    states = [owner_state(n, 1) for n in (1, 2, 3)]
    since: core.Summary | None = None
    for seq, state in enumerate(states, 1):
        receiver.receive_message(pack([DELTA, seq, delta_to_wire(core.delta(state, since))]))
        since = state.summary()
    received = [e for e in iter(receiver.next_event, None) if isinstance(e, DeltaReceived)]
    assert [e.seq for e in received] == [1, 2, 3]

    gossip = Gossip(_SlowHost(), b"\x01" * 32)  # type: ignore[arg-type]
    link = PeerLink(b"\x02" * 32, "mem", "static", receiver)
    gossip.links = {link.public_key: link}
    stream = _Writes()
    to_verify, _ = trio.open_memory_channel[DeltaReceived](10)
    to_ack, acks = trio.open_memory_channel[tuple[DeltaReceived, Any]](10)
    for event, state in zip(received, states, strict=True):
        to_ack.send_nowait((event, _Stored(state.summary())))
    later = DeltaReceived(received[-1].key, 4, received[-1].delta)  # a delta of the next commit, pending
    to_ack.send_nowait(
        (later, _Slow(trio.Event(), core.verify_delta(core.empty_state(ALICE.public_key, "q"), later.delta)))
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip._acker, link, acks)
        nursery.start_soon(gossip._driver, stream, link, nursery.cancel_scope, to_verify)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    acked = [[unpack(m)[1] for m in write if unpack(m)[0] == ACK] for write in stream.writes]
    assert [seqs for seqs in acked if seqs] == [[1, 2, 3]]


class _DriverSteps(trio.abc.Instrument):
    """Counts the scheduler passes (task steps) of link drivers."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("._driver"):
            self.steps += 1


class _Deltas:
    """A host serving one delta, from its store (``delta_for``) or, with ``relaying``, as a push on its
    way to the store (``relayed_delta``)."""

    def __init__(self, delta: core.QueueDelta, *, relaying: bool) -> None:
        self.delta, self.stored, self.relayed = delta, 0, 0
        if relaying:
            self.relayed_delta = self._relayed

    def _relayed(self, key: Any, since: core.Summary | None) -> core.QueueDelta:
        self.relayed += 1
        return self.delta

    async def delta_for(self, key: Any, since: Any, max_records: int, max_bytes: int) -> core.QueueDelta:
        self.stored += 1
        return self.delta


@pytest.mark.parametrize("relaying", [False, True], ids=["a commit's delta", "a relayed push"])
async def test_a_relayed_push_goes_out_without_the_pass_a_commits_delta_takes(relaying: bool) -> None:
    """The driver yields once before building a delta from a commit (an owner's answer woken by that
    commit goes out first); a push relayed as it came is no commit's, so a relay pays no pass for it."""
    state = owner_state(1, 3)
    session = _open_session()
    link = PeerLink(b"\x02" * 32, "mem", "static", session)
    session.local_update(KEY, state.summary())
    host = _Deltas(core.delta(state, None, 100), relaying=relaying)
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    gossip.links = {link.public_key: link}
    stream = _Writes()
    steps = _DriverSteps()
    to_verify, _ = trio.open_memory_channel[DeltaReceived](10)
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gossip._driver, stream, link, nursery.cancel_scope, to_verify)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert [msgpack.unpackb(frames[0])[0] for frames in stream.writes] == [DELTA]
    assert (host.relayed, host.stored) == ((1, 0) if relaying else (0, 1))
    assert steps.steps == (2 if relaying else 3)  # start, (the yield,) and the cancel at its wait
