"""The trio gossip shell over real secure streams (in memory), with in-memory replica hosts."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from support.gossip_hosts import MemoryReplicaHost

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueDelta, Summary
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack, summary_to_wire, unpack
from latticed.errors import GapError, LatticedError
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.gossip import MEMORY_TTL_S, OWN_CATCH_UP_S, READ_TRIES, Gossip, PeerLink
from latticed.net.transport import secure_accept, secure_connect
from latticed.protocol.replication import DIGEST, HELLO, PING, PONG, PROTOCOL_VERSION, QueueKey

ALICE = Identity.from_seed(b"a" * 32)


class MemoryHost(MemoryReplicaHost):
    def __init__(self) -> None:
        super().__init__()
        self.changed = trio.Event()
        self.gossip: Gossip | None = None
        self.forge = False
        #: Reads left that lose their rows to a commit of ours meanwhile (GapError), as the store's can.
        self.races = 0

    async def delta_for(
        self, key: QueueKey, since: Summary | None, max_records: int, max_bytes: int
    ) -> QueueDelta | None:
        if self.races:
            self.races -= 1
            raise GapError("offset 0 of queue #1 is no longer stored (truncated meanwhile); retry")
        delta = await super().delta_for(key, since, max_records, max_bytes)
        if self.forge and delta is not None and delta.records:
            delta = dataclasses.replace(delta, records=(Record(value=b"forged"), *delta.records[1:]))
        return delta

    def merged(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def write(self, n: int) -> None:
        key = (ALICE.public_key, "q", 0)
        state = self.states.get(key) or core.empty_state(ALICE.public_key, "q")
        state = core.commit(state, ALICE, now_ms=1, records=[Record(value=b"%d" % i) for i in range(n)])
        self.states[key] = state
        assert self.gossip is not None
        self.gossip.local_change(key, state.summary())


def make(seed: bytes) -> tuple[Identity, MemoryHost, Gossip]:
    identity = Identity.from_seed(seed)
    host = MemoryHost()
    gossip = Gossip(host, identity.public_key)
    host.gossip = gossip
    return identity, host, gossip


async def link(
    nursery: trio.Nursery, a: tuple[Identity, MemoryHost, Gossip], b: tuple[Identity, MemoryHost, Gossip]
) -> None:
    left, right = trio.testing.memory_stream_pair()

    async def dial() -> None:
        stream = await secure_connect(left, seed=a[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await a[2].run_peer(stream, "mem", "static")

    async def accept() -> None:
        stream = await secure_accept(right, seed=b[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await b[2].run_peer(stream, "mem", "incoming")

    nursery.start_soon(dial)
    nursery.start_soon(accept)


async def wait_for(host: MemoryHost, end: int) -> None:
    key = (ALICE.public_key, "q", 0)
    with trio.fail_after(10):
        while key not in host.states or host.states[key].held_end < end:
            await host.changed.wait()


async def test_two_daemons_converge_over_secure_streams() -> None:
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[1].write(3)
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        await wait_for(b[1], 3)
        a[1].write(2)  # live push after the initial sync
        await wait_for(b[1], 5)
        nursery.cancel_scope.cancel()
    key = (ALICE.public_key, "q", 0)
    assert b[1].states[key] == a[1].states[key]


async def test_messages_and_bytes_are_counted_per_direction_and_type() -> None:
    """Operators (and bench_mesh) see where the copies and bytes of replication come from."""
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[1].write(3)
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        await wait_for(b[1], 3)
        nursery.cancel_scope.cancel()
    sent, received = a[2].stats(), b[2].stats()
    assert received["received_delta"] == sent["sent_delta"] >= 1
    assert received["received_delta_bytes"] == sent["sent_delta_bytes"] > 3 * 1
    assert received["received_hello"] == 1 and sent["received_hello"] == 1


async def test_three_hops_relay_verified_records() -> None:
    a, b, c = make(b"1" * 32), make(b"2" * 32), make(b"3" * 32)
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        await link(nursery, b, c)
        a[1].write(4)
        await wait_for(c[1], 4)
        nursery.cancel_scope.cancel()
    key = (ALICE.public_key, "q", 0)
    # The same state at every hop, verified and relayed as it came: records, heads, metadata, no fork.
    assert b[1].states[key] == a[1].states[key]
    assert c[1].states[key] == a[1].states[key]
    assert [r.value for r in c[1].states[key].entries.records()] == [b"0", b"1", b"2", b"3"]
    assert not c[1].states[key].forked


async def test_a_read_that_raced_a_commit_of_ours_is_read_again_and_the_link_kept() -> None:
    """Our store lost a delta's rows to our own commit between the value's load and the read: no fault of
    the peer's (the link used to end on it, and the peer lacked the records until a redial)."""
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[1].races = READ_TRIES - 1
    a[1].write(3)
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        await wait_for(b[1], 3)
        assert a[1].races == 0 and a[2].counters["delta_reads_raced"] == READ_TRIES - 1
        assert b[0].public_key in a[2].links and a[0].public_key in b[2].links
        nursery.cancel_scope.cancel()


async def test_a_read_that_keeps_racing_sends_nothing_now_and_the_next_change_sends_it() -> None:
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[1].races = 1_000
    a[1].write(3)
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        with trio.fail_after(10):
            while a[1].races > 1_000 - READ_TRIES:
                await trio.testing.wait_all_tasks_blocked(cushion=0.001)
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        assert (ALICE.public_key, "q", 0) not in b[1].states
        assert a[2].counters["delta_reads_raced"] == 1_000 - a[1].races >= READ_TRIES
        assert b[0].public_key in a[2].links and a[0].public_key in b[2].links  # the link stays
        a[1].races = 0
        a[1].write(2)
        await wait_for(b[1], 5)
        nursery.cancel_scope.cancel()


async def test_forging_peer_is_disconnected_and_nothing_is_stored() -> None:
    """A peer's fault, unlike a read of ours racing a commit: the link ends."""
    honest, liar = make(b"1" * 32), make(b"6" * 32)
    liar[1].write(3)
    liar[1].forge = True
    dropped = trio.Event()
    honest[2].on_peer_change = lambda: None if honest[2].links else dropped.set()
    async with trio.open_nursery() as nursery:
        await link(nursery, liar, honest)
        with trio.fail_after(10):
            await dropped.wait()
        nursery.cancel_scope.cancel()
    assert honest[2].counters["rejected_deltas"] == 1
    assert (ALICE.public_key, "q", 0) not in honest[1].states
    assert liar[0].public_key not in honest[2].links


# ------------------------------------------------------------------ the own-queue fence (restored stores)


@dataclasses.dataclass
class ClaimingSession:
    """Stands in for a link's session: what the peer says it holds of each queue."""

    held: dict[QueueKey, Summary]
    core2: None = None  #: carries no core-2 queues

    def peer_summary(self, key: QueueKey) -> Summary | None:
        return self.held.get(key)


def _claiming_gossip(held_end: int) -> tuple[Gossip, QueueKey]:
    state = core.empty_state(ALICE.public_key, "mine")
    for i in range(held_end):
        state = core.commit(state, ALICE, now_ms=1, records=[Record(b"%d" % i)])
    key = (ALICE.public_key, "mine", state.kind)
    gossip = Gossip(MemoryHost(), ALICE.public_key)
    session = ClaimingSession({key: state.summary()})
    gossip.links[b"p" * 32] = PeerLink(b"p" * 32, "peer", "static", session)  # type: ignore[arg-type]
    return gossip, key


async def test_writes_to_our_own_queue_wait_while_a_peer_holds_more_of_it() -> None:
    gossip, key = _claiming_gossip(held_end=10)
    reason = gossip.behind_reason(key, held_end=5)  # our store is older than what we once signed
    assert reason is not None and "5 more record(s)" in reason and "latticectl peers" in reason
    assert gossip.behind_reason(key, held_end=10) is None  # caught up
    assert gossip.behind_reason(key, held_end=12) is None  # the peer is behind us: the normal case
    assert gossip.behind_reason((ALICE.public_key, "other", key[2]), held_end=0) is None


async def test_the_fence_counts_only_the_records_the_peer_holds_past_our_end() -> None:
    """A peer that dropped the older records (truncated, or capped as a replica) holds fewer than its end."""
    gossip, key = _claiming_gossip(held_end=0)
    gossip.links[b"p" * 32].session.held[key] = Summary(version=3, start=905, held_end=1000)  # type: ignore[attr-defined]
    reason = gossip.behind_reason(key, held_end=0)
    assert reason is not None and "holds 95 more record(s)" in reason and "to offset 1000" in reason
    assert "holds 5 more record(s)" in (gossip.behind_reason(key, held_end=995) or "")
    gossip.links[b"p" * 32].session.held[key] = Summary(version=3, start=1000, held_end=1000)  # type: ignore[attr-defined]
    assert "head of it at offset 1000, past this daemon's 0" in (gossip.behind_reason(key, held_end=0) or "")


async def test_a_peer_that_claims_records_it_never_sends_stops_fencing_after_a_while(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gossip, key = _claiming_gossip(held_end=10)
    assert gossip.behind_reason(key, held_end=5) is not None
    await trio.sleep(OWN_CATCH_UP_S * 0.8)
    assert gossip.behind_reason(key, held_end=7) is not None  # records arrive: the wait starts over
    await trio.sleep(OWN_CATCH_UP_S * 0.8)
    assert gossip.behind_reason(key, held_end=7) is not None  # still within its time since progress
    await trio.sleep(OWN_CATCH_UP_S * 0.3)
    assert gossip.behind_reason(key, held_end=7) is None  # nothing for too long: ignored from now on
    await trio.sleep(1)
    assert gossip.behind_reason(key, held_end=7) is None


# ---------------------------------------------------------------- a peer that never reads


async def test_a_peer_that_never_reads_is_throttled_then_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A key holder sends PINGs and never reads the PONGs: what waits for it stays under the bound (the
    daemon stops reading it), and the link is dropped once a send makes no progress for the timeout,
    although the peer keeps sending."""
    identity, _, daemon = make(b"1" * 32)
    daemon.max_outbox_bytes = 4096
    daemon.send_timeout = 7.0
    attacker = Identity.from_seed(b"9" * 32)
    ours, theirs = trio.testing.lockstep_stream_pair()  # a send waits until the other side reads
    burst = 5000
    sent = 0
    flooding = trio.Event()

    async def flood() -> None:
        nonlocal sent
        stream = await secure_connect(theirs, seed=attacker.seed, network_key=DEFAULT_NETWORK_KEY)
        with contextlib.suppress(LatticedError):
            await stream.send(pack([HELLO, PROTOCOL_VERSION, None]))
            flooding.set()
            for nonce in range(burst):
                await stream.send(pack([PING, nonce]))
                sent += 1
            while True:  # then one message a second: enough to look alive
                await trio.sleep(1)
                await stream.send(pack([PING, 0]))

    async def serve() -> None:
        stream = await secure_accept(ours, seed=identity.seed, network_key=DEFAULT_NETWORK_KEY)
        await daemon.run_peer(stream, "mem", "incoming")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        nursery.start_soon(serve)
        await flooding.wait()
        await trio.testing.wait_all_tasks_blocked()  # the flood has gone as far as it can
        link = daemon.links[attacker.public_key]
        assert link.session.outbox_bytes <= daemon.max_outbox_bytes + 8  # the bound, plus one PONG
        assert sent < burst  # the daemon stopped reading it
        with trio.fail_after(60):
            while daemon.links:
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert trio.current_time() - start == pytest.approx(daemon.send_timeout, abs=1)
    assert daemon.counters["stalled_peers"] == 1
    assert daemon.counters["protocol_errors"] == 0


# -------------------------------------------------------------- digests of made-up queues


async def _visit(daemon: tuple[Identity, MemoryHost, Gossip], seed: bytes, made_up: int) -> dict[str, int]:
    """A key holder connects, names ``made_up`` queues that do not exist, waits until the daemon has taken
    them in (its PONG comes after), and leaves; returns the daemon's stats while it was connected."""
    identity, _, gossip = daemon
    left, right = trio.testing.memory_stream_pair()
    gone = trio.Event()
    gossip.on_peer_change = lambda: None if gossip.links else gone.set()
    while_connected: dict[str, int] = {}

    async def peer() -> None:
        stream = await secure_connect(left, seed=seed, network_key=DEFAULT_NETWORK_KEY)
        entries = [
            [seed, f"fake{i}", 0, summary_to_wire(Summary(version=1, held_end=1))] for i in range(made_up)
        ]
        await stream.send(pack([HELLO, PROTOCOL_VERSION, None, seed[:16]]))
        await stream.send(pack([DIGEST, entries]))
        await stream.send(pack([PING, 42]))
        while (message := await stream.receive()) is not None and unpack(message) != [PONG, 42]:
            pass
        while_connected.update(gossip.stats())
        await stream.aclose()

    async def serve() -> None:
        stream = await secure_accept(right, seed=identity.seed, network_key=DEFAULT_NETWORK_KEY)
        await gossip.run_peer(stream, "mem", "incoming")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer)
        nursery.start_soon(serve)
        with trio.fail_after(10):
            await gone.wait()
    return while_connected


async def test_made_up_queues_are_bounded_and_forgotten_when_the_peer_leaves() -> None:
    daemon = make(b"1" * 32)
    gossip = daemon[2]
    gossip.max_peer_keys = 1000
    gossip.max_memories = 2
    daemon[1].write(3)  # one queue of our own, which memories may keep
    seen = await _visit(daemon, b"m" * 32, made_up=5000)
    assert seen["peer_keys"] == 1000 and seen["peer_keys_refused"] == 4000
    after = gossip.stats()
    assert after["peer_keys"] == 0  # forgotten on disconnect
    (remembered,) = (memory for _, memory in gossip.memories.values())
    assert set(remembered.held) <= {(ALICE.public_key, "q", 0)}  # nothing made up is kept
    for n in range(4):  # fresh identities do not stack up
        await _visit(daemon, bytes([n]) * 32, made_up=2000)
    stats = gossip.stats()
    assert stats["peer_keys"] == 0 and stats["peer_memories"] == 2
    assert stats["peer_memory_entries"] <= 2 * 2  # two memories of at most our one queue, twice


async def test_memories_are_forgotten_by_age(autojump_clock: trio.testing.MockClock) -> None:
    daemon = make(b"1" * 32)
    daemon[1].write(1)
    await _visit(daemon, b"m" * 32, made_up=0)
    assert daemon[2].stats()["peer_memories"] == 1
    await trio.sleep(MEMORY_TTL_S + 1)
    await _visit(daemon, b"n" * 32, made_up=0)  # the next connection ages the old one out
    assert set(daemon[2].memories) == {Identity.from_seed(b"n" * 32).public_key}


class Answers:
    """A link extension: the owner side queues an answer on the link (as lease forwarding answers a
    remote offer once its commit lands); the other side notes when it arrives."""

    MESSAGE = b"extension-answer"

    def __init__(self, host: MemoryHost | None = None) -> None:
        self.host = host
        self.links: list[PeerLink] = []
        self.arrived = trio.Event()
        self.records_held_then = -1

    def accepts(self, message: bytes) -> bool:
        return message == self.MESSAGE

    def link_up(self, link: PeerLink) -> None:
        self.links.append(link)

    def receive(self, link: PeerLink, message: bytes) -> None:
        assert self.host is not None
        state = self.host.states.get((ALICE.public_key, "q", 0))
        self.records_held_then = 0 if state is None else state.held_end
        self.arrived.set()

    def link_down(self, link: PeerLink) -> None:
        pass

    def notify(self, link: PeerLink, op: str, body: dict[str, Any]) -> None:
        pass

    def hear_notices(self, handler: Callable[[PeerLink, dict[str, Any]], None]) -> None:
        pass

    def answer(self) -> None:
        for link in self.links:
            link.extra_out.append(self.MESSAGE)
            link.kick()


@pytest.mark.parametrize("woken", [False, True], ids=["queued with the commit", "by a task woken with it"])
async def test_an_extension_answer_goes_out_before_the_delta_of_the_same_commit(woken: bool) -> None:
    """A remote offer's producer waits for the owner's answer, not for the records to replicate back:
    when the commit lands, its answer is sent before the delta of that commit (which may be large)."""
    a_id, a_host, _ = make(b"1" * 32)
    b_id, b_host, _ = make(b"2" * 32)
    owner, producer = Answers(), Answers(b_host)
    a = (a_id, a_host, Gossip(a_host, a_id.public_key, extension=owner))
    b = (b_id, b_host, Gossip(b_host, b_id.public_key, extension=producer))
    a_host.gossip, b_host.gossip = a[2], b[2]
    a_host.write(1)
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        await wait_for(b_host, 1)
        committed = trio.Event()

        async def answer_once_committed() -> None:
            await committed.wait()
            owner.answer()

        nursery.start_soon(answer_once_committed)
        await trio.testing.wait_all_tasks_blocked()
        a_host.write(500)  # the commit: its delta is due...
        if woken:
            committed.set()  # ...and the task answering is woken with it
        else:
            owner.answer()  # ...and the answer is queued at once
        with trio.fail_after(10):
            await producer.arrived.wait()
        await wait_for(b_host, 501)
        nursery.cancel_scope.cancel()
    assert producer.records_held_then == 1
