"""A relay's work without a task hop of its own: a push relayed as it came and the ACKs of a commit go
out by a direct write from the task (or the storage's callback) that made them, while the link's driver
sleeps; whatever needs waiting is still the driver's. Over loopback TCP, as between daemons."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from support.gossip_hosts import MemoryReplicaHost
from support.secure_pair import K, tcp_pair

from latticed.crdt import queue as core
from latticed.crdt.records import RecordRun
from latticed.crdt.signing import Identity
from latticed.crdt.wire import delta_to_wire, pack, unpack
from latticed.errors import IntegrityError, LatticedError
from latticed.net.gossip import Gossip, PeerLink
from latticed.net.transport import SecureStream, open_peer, secure_accept
from latticed.protocol.replication import ACK, DELTA, DeltaReceived, NeedDelta, ReplicationSession
from latticed.storage.bridge import StorageBridge
from latticed.storage.jobs import Job

ALICE = Identity.from_seed(b"a" * 32)
KEY = (ALICE.public_key, "q", 0)


async def _close(*resources: trio.abc.AsyncResource) -> None:
    for resource in resources:
        await resource.aclose()


def owner_state(batches: int) -> core.QueueState:
    state = core.empty_state(ALICE.public_key, "q")
    for b in range(batches):
        state = core.commit(
            state, ALICE, now_ms=b + 1, records=RecordRun([b"r%d" % b], [None], [1000 + b], [()])
        )
    return state


def _open_session() -> ReplicationSession:
    """A session past its opening with a peer that holds nothing."""
    ours, theirs = ReplicationSession(), ReplicationSession()
    ours.start({})
    theirs.start({})
    for message in theirs.messages_to_send():
        ours.receive_message(message)
    ours.messages_to_send()
    list(iter(ours.next_event, None))
    return ours


def _sleeping_link(session: ReplicationSession, stream: SecureStream) -> PeerLink:
    """A link whose driver has gone to sleep with nothing to do (as :meth:`Gossip._driver` leaves it)."""
    link = PeerLink(b"\x02" * 32, "tcp", "static", session, stream=stream, opened=True)
    link.sleeping_until = float("inf")
    return link


class _Host:
    """A host serving one delta, as a push on its way to the store (``relayed``) or from its store."""

    def __init__(self, delta: core.QueueDelta, *, relaying: bool) -> None:
        self.delta, self.stored = delta, 0
        if relaying:
            self.relayed_delta = lambda key, since: self.delta

    async def delta_for(self, key: Any, since: Any, max_records: int, max_bytes: int) -> core.QueueDelta:
        self.stored += 1
        return self.delta


async def _received(stream: SecureStream, count: int) -> list[Any]:
    with trio.fail_after(5):
        return [unpack(await stream.receive()) for _ in range(count)]


# ------------------------------------------------------------------ the stream's direct send


async def test_send_now_writes_at_once_and_what_the_socket_left_goes_before_the_next_send() -> None:
    client, server, listener = await tcp_pair()
    assert client.send_now([b"a", b"b"]) and not client.has_unsent
    assert [await server.receive(), await server.receive()] == [b"a", b"b"]
    bigs = [bytes([i]) * 1_000_000 for i in range(8)]  # more than loopback buffers take at once
    assert client.send_now(bigs) and client.has_unsent
    assert not client.can_send_now() and not client.send_now([b"refused"])  # the rest is not written yet
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send_many, [b"after"])
        assert [await server.receive() for _ in bigs] == bigs
        assert await server.receive() == b"after"
    assert not client.has_unsent and client.can_send_now()
    await client.send_many([])
    await _close(client, server, listener)


async def test_send_now_leaves_a_send_under_way_alone() -> None:
    client, server, listener = await tcp_pair()
    release = trio.Event()

    async def holding() -> None:  # another task in the middle of a send
        async with client._send_lock:
            await release.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holding)
        await trio.testing.wait_all_tasks_blocked()
        assert not client.can_send_now() and not client.send_now([b"m"])
        release.set()
    assert client.send_now([b"m"]) and await server.receive() == b"m"
    await _close(client, server, listener)


# ------------------------------------------------------------------ a relayed push


async def test_a_relayed_push_goes_out_from_the_relaying_task_with_no_pass_of_the_driver() -> None:
    state = owner_state(1)
    client, server, listener = await tcp_pair()
    link = _sleeping_link(_open_session(), client)
    host = _Host(core.delta(state, None, 100), relaying=True)
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    gossip.links = {link.public_key: link}
    gossip.local_change(KEY, state.summary())
    assert not link.wakeup.is_set() and link.held is None
    [message] = await _received(server, 1)
    assert message[0] == DELTA and host.stored == 0 and gossip.counters["deltas_out"] == 1
    assert gossip.traffic["sent_delta"] == 1
    await _close(client, server, listener)


async def test_a_commits_delta_is_left_to_the_driver_which_sends_it() -> None:
    """What needs the store (and the driver's yield first) is not done by the relaying task: the event
    waits for the woken driver, which takes it before anything the session queues later."""
    state = owner_state(1)
    client, server, listener = await tcp_pair()
    link = _sleeping_link(_open_session(), client)
    host = _Host(core.delta(state, None, 100), relaying=False)
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    gossip.links = {link.public_key: link}
    gossip.local_change(KEY, state.summary())
    assert link.wakeup.is_set() and isinstance(link.held, NeedDelta) and host.stored == 0
    link.sleeping_until = -float("inf")
    to_verify, _ = trio.open_memory_channel[DeltaReceived](10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip._driver, client, link, nursery.cancel_scope, to_verify)
        [message] = await _received(server, 1)
        nursery.cancel_scope.cancel()
    assert message[0] == DELTA and host.stored == 1 and link.held is None
    await _close(client, server, listener)


async def test_a_relay_to_a_broken_link_ends_that_link_not_the_relaying_task() -> None:
    state = owner_state(1)
    client, server, listener = await tcp_pair()
    link = _sleeping_link(_open_session(), client)
    host = _Host(core.delta(state, None, 100), relaying=True)
    host.relayed_delta = _raises
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    gossip.links = {link.public_key: link}
    gossip.local_change(KEY, state.summary())  # raises nothing here
    assert link.wakeup.is_set() and isinstance(link.failure, RuntimeError)
    to_verify, _ = trio.open_memory_channel[DeltaReceived](10)
    with pytest.raises(RuntimeError, match="bug"):
        await gossip._driver(client, link, trio.CancelScope(), to_verify)
    await _close(client, server, listener)


def _raises(*args: Any) -> None:
    raise RuntimeError("a bug")


# ------------------------------------------------------------------ ACKs from the commit's callback


class _Merge:
    """A merge that calls back once stored, as the engine's does (``when_settled``)."""

    ahead: core.Summary | None = None

    def __init__(self, summary: core.Summary | None) -> None:
        self.summary, self.stored, self.callback = summary, False, None
        self.error = IntegrityError("the join failed")

    def when_settled(self, callback: Callable[[], None]) -> bool:
        self.callback = callback
        return True

    async def result(self) -> tuple[core.Summary, bool]:
        if self.summary is None:
            raise self.error
        return self.summary, True

    def settled(self) -> tuple[core.Summary, bool] | None:
        return (self.summary, True) if self.stored and self.summary is not None else None


def _receiving(count: int) -> tuple[ReplicationSession, list[DeltaReceived], list[core.QueueState]]:
    session = _open_session()
    session.received_apart = True
    states = [owner_state(n) for n in range(1, count + 1)]
    since: core.Summary | None = None
    for seq, state in enumerate(states, 1):
        session.receive_message(pack([DELTA, seq, delta_to_wire(core.delta(state, since))]))
        since = state.summary()
    return session, list(iter(session.next_received, None)), states


async def test_the_acks_of_a_commit_go_out_from_its_callback_in_one_write_with_no_task_woken() -> None:
    session, received, states = _receiving(3)
    client, server, listener = await tcp_pair()
    link = _sleeping_link(session, client)
    gossip = Gossip(_Host(core.delta(states[0], None), relaying=True), b"\x01" * 32)  # type: ignore[arg-type]
    gossip.links = {link.public_key: link}
    merges = [_Merge(state.summary()) for state in states]
    for event, merge in zip(received, merges, strict=True):
        assert merge.when_settled(lambda: None)
        link.acks.append((event, merge))
    merges[0].stored = merges[1].stored = True  # one commit stored the first two; the third is later's
    gossip._settled(link, merges[0])
    gossip._settled(link, merges[1])  # (every job of the commit called back: nothing more to do)
    assert [m[1] for m in await _received(server, 2)] == [1, 2]
    assert not link.wakeup.is_set() and len(link.acks) == 1
    merges[2].stored = True
    gossip._settled(link, merges[2])
    assert [m[:2] for m in await _received(server, 1)] == [[ACK, 3]]
    assert gossip.counters["deltas_in"] == 3
    await _close(client, server, listener)


async def test_a_failed_merge_goes_to_the_acker_which_ends_the_link_and_nothing_after_it_is_acked() -> None:
    session, received, states = _receiving(3)
    client, server, listener = await tcp_pair()
    link = _sleeping_link(session, client)
    gossip = Gossip(_Host(core.delta(states[0], None), relaying=True), b"\x01" * 32)  # type: ignore[arg-type]
    to_ack, acks = trio.open_memory_channel[tuple[DeltaReceived, Any]](10)
    link.to_acker = to_ack
    merges = [_Merge(states[0].summary()), _Merge(None), _Merge(states[2].summary())]
    link.acks = deque(zip(received, merges, strict=True))
    for merge in merges:
        merge.stored = True
    for merge in merges:
        gossip._settled(link, merge)
    assert [m[:2] for m in await _received(server, 1)] == [[ACK, 1]]
    assert link.ended and not link.acks
    with pytest.raises(IntegrityError, match="the join failed"):
        await gossip._acker(link, acks)
    await _close(client, server, listener)


def test_a_commits_callbacks_run_once_every_job_of_it_is_done() -> None:
    """So the first callback of a commit sees all of it: one ACK message for the link's pushes in it."""
    bridge = StorageBridge.__new__(StorageBridge)
    bridge._on_commit = lambda jobs, changes, changes2: None
    bridge._preparing = deque()  # no batch told before its COMMIT
    jobs = [Job(), Job()]
    seen: list[list[bool]] = []

    class _Done:
        def __init__(self) -> None:
            self.value = False

        def set(self) -> None:
            self.value = True

    for job in jobs:
        job.done = _Done()
        job.notify = lambda: seen.append([j.done.value for j in jobs])
    bridge._complete(jobs, [], [])
    assert seen == [[True, True], [True, True]]


# ------------------------------------------------------------------ the reader verifies a live push itself


class _VerifyingHost(MemoryReplicaHost):
    """A host that checks small deltas on the event loop (``verify_now``), as the engine does."""

    def __init__(self) -> None:
        super().__init__()
        self.verified_now = 0
        self.changed = trio.Event()

    def verify_now(self, delta: core.QueueDelta) -> core.VerifiedDelta | None:
        if len(delta.records) > 2:
            return None
        self.verified_now += 1
        return core.verify_delta(core.empty_state(delta.owner, delta.name, delta.kind), delta)

    def merged(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


def _reading_link(session: ReplicationSession) -> tuple[PeerLink, trio.MemorySendChannel[DeltaReceived], Any]:
    link = PeerLink(b"\x02" * 32, "tcp", "static", session)
    to_verify, deltas = trio.open_memory_channel[DeltaReceived](10)
    link.to_acker, acks = trio.open_memory_channel[tuple[DeltaReceived, Any]](10)
    return link, to_verify, (deltas, acks)


async def test_a_live_push_is_verified_and_stored_by_its_reader_while_the_verifier_holds_nothing() -> None:
    session, received, states = _receiving(2)
    host = _VerifyingHost()
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    link, to_verify, (_, acks) = _reading_link(session)
    assert gossip._verify_here(link, received[0], to_verify)
    assert host.verified_now == 1 and host.states[KEY].summary() == states[0].summary()
    assert acks.receive_nowait()[0] is received[0]  # (a host without callbacks: the acker's)
    link.verifier_busy = True  # the verifier has one in hand: the next waits behind it
    assert not gossip._verify_here(link, received[1], to_verify) and host.verified_now == 1


async def test_the_reader_leaves_a_big_delta_and_every_one_behind_it_to_the_verifier() -> None:
    """A delta too big to check on the event loop goes to the verifier, and so does each one after it
    until the verifier has checked them all (they are stored in the order they came)."""
    big, small = owner_state(3), owner_state(4)
    session = _open_session()
    session.received_apart = True
    host = _VerifyingHost()
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    link, to_verify, (deltas, _) = _reading_link(session)
    stream = _Messages(
        [
            pack([DELTA, 1, delta_to_wire(core.delta(big, None))]),
            pack([DELTA, 2, delta_to_wire(core.delta(small, big.summary()))]),
        ]
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip._reader, stream, link, nursery.cancel_scope, to_verify)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert [deltas.receive_nowait().seq for _ in range(2)] == [1, 2] and host.verified_now == 0


class _Messages:
    """A peer stream that yields the given messages, then waits."""

    def __init__(self, messages: list[bytes]) -> None:
        self.messages = messages

    async def receive(self) -> bytes | None:
        if self.messages:
            return self.messages.pop(0)
        await trio.sleep_forever()
        return None


async def test_a_forged_push_verified_by_the_reader_ends_the_link_and_is_noted() -> None:
    session, received, _ = _receiving(1)
    event = received[0]
    head = event.delta.head
    assert head is not None
    forged = dataclasses.replace(event.delta, records=RecordRun([b"forged"], [None], [1000], [()]))
    host = _VerifyingHost()
    gossip = Gossip(host, b"\x01" * 32)  # type: ignore[arg-type]
    link, to_verify, _ = _reading_link(session)
    with pytest.raises(IntegrityError):
        gossip._verify_here(link, DeltaReceived(event.key, event.seq, forged), to_verify)
    assert KEY not in host.states and gossip.queue_errors.last(link.public_key, KEY) is not None


async def test_a_chain_of_three_over_tcp_relays_every_push_verified() -> None:
    """End to end over loopback TCP: pushes verified by the readers, relayed and acknowledged."""
    hosts = [_VerifyingHost() for _ in range(3)]
    gossips = [
        Gossip(host, Identity.from_seed(bytes([i + 1]) * 32).public_key) for i, host in enumerate(hosts)
    ]
    seeds = [bytes([i + 1]) * 32 for i in range(3)]
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    state = core.empty_state(ALICE.public_key, "q")
    async with trio.open_nursery() as nursery:

        async def pair(i: int) -> None:  # i dials i + 1
            async def accept() -> None:
                stream = await secure_accept(await listeners[0].accept(), seed=seeds[i + 1], network_key=K)
                nursery.start_soon(gossips[i + 1].run_peer, stream, "tcp", "incoming")

            async with trio.open_nursery() as both:
                both.start_soon(accept)
                stream = await open_peer("127.0.0.1", port, seed=seeds[i], network_key=K)
                nursery.start_soon(gossips[i].run_peer, stream, "tcp", "static")

        await pair(0)
        await pair(1)
        for n in range(1, 6):
            state = core.commit(state, ALICE, now_ms=n, records=RecordRun([b"%d" % n], [None], [n], [()]))
            hosts[0].states[KEY] = state
            gossips[0].local_change(KEY, state.summary())
            with trio.fail_after(10):
                while KEY not in hosts[2].states or hosts[2].states[KEY].held_end < n:
                    await hosts[2].changed.wait()
        nursery.cancel_scope.cancel()
    await listeners[0].aclose()
    assert hosts[2].states[KEY] == hosts[1].states[KEY] == state
    assert hosts[1].verified_now >= 1 and hosts[2].verified_now >= 1
    assert gossips[1].counters["deltas_in"] == gossips[2].counters["deltas_in"] >= 1


async def test_a_failed_merge_ends_the_link_even_when_the_acker_is_gone() -> None:
    session, received, _ = _receiving(1)
    client, server, listener = await tcp_pair()
    link = _sleeping_link(session, client)
    gossip = Gossip(_VerifyingHost(), b"\x01" * 32)  # type: ignore[arg-type]
    to_ack, acks = trio.open_memory_channel[tuple[DeltaReceived, Any]](10)
    link.to_acker = to_ack
    await acks.aclose()
    failed = _Merge(None)
    failed.stored = True
    link.acks.append((received[0], failed))
    gossip._settled(link, failed)
    assert link.ended and link.wakeup.is_set() and link.failure is not None
    to_verify, _ = trio.open_memory_channel[DeltaReceived](10)
    with pytest.raises(LatticedError, match="merge"):
        await gossip._driver(client, link, trio.CancelScope(), to_verify)
    await _close(client, server, listener)
