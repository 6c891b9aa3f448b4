"""Two runs of one identity (a copied data directory) on one relay, over real secure streams in memory:
the relay serves both links, logs and counts it, and tells both; the later run stops signing; what both
wrote meets on every daemon (the fork is flagged everywhere). And the owner's own check: a head of its
queue it did not sign, sent back by a peer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import trio
import trio.testing
from support.gossip_hosts import MemoryReplicaHost
from support.memory_links import cuttable_pair

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net import gossip as gossip_module
from latticed.net import leasing, transport
from latticed.net.gossip import GONE_WAIT_S, HELLO_WAIT_S, STALE_AFTER_S, Gossip, PeerLink
from latticed.net.leasing import LeaseLinks
from latticed.net.transport import SecureStream, secure_accept, secure_connect
from latticed.net.twin_link import TwinRequests
from latticed.protocol.identity_runs import IDENTITY_FEATURE, IDENTITY_OP, Notice, RunSeen
from latticed.protocol.lease_forwarding import LeasingSession, Refusal, Request
from latticed.protocol.link_gone import LINK_GONE_FEATURE, LostLinks, gone_message
from latticed.protocol.replication import PROTOCOL_VERSION, QueueKey, ReplicationSession
from latticed.protocol.replication_messages import Digest, Hello, encode_message
from latticed.protocol.versions import UNSTATED, VERSIONS_OP, Agreement, LinkVersions, ours

OWNER = Identity.from_seed(b"o" * 32)
RELAY = Identity.from_seed(b"r" * 32)
KEY: QueueKey = (OWNER.public_key, "q", 0)


Host = MemoryReplicaHost


@dataclasses.dataclass
class Daemon:
    identity: Identity
    host: Host
    gossip: Gossip

    def write(self, count: int, now_ms: int) -> None:
        state = self.host.states.get(KEY) or core.empty_state(OWNER.public_key, "q")
        records = [Record(value=b"%d-%d" % (now_ms, i)) for i in range(count)]
        state = core.commit(state, self.identity, now_ms=now_ms, records=records)
        self.host.states[KEY] = state
        self.gossip.local_change(KEY, state.summary())

    @property
    def state(self) -> QueueState:
        return self.host.states[KEY]


def daemon(identity: Identity, states: Mapping[QueueKey, QueueState] | None = None) -> Daemon:
    host = Host(states)
    gossip = Gossip(host, identity.public_key, extension=LeaseLinks(dial=lambda peer: False))
    gossip.own_head = host.head
    gossip.started_ms = 0  # every head signed in the test is "after the start"
    return Daemon(identity, host, gossip)


def copied_owner() -> tuple[Daemon, Daemon, Daemon]:
    """The owner's run, a copy of its data directory started on a second machine (the two share 10
    records, then the first writes 5 more and the copy 3 of its own) and a relay for both to dial."""
    first = daemon(OWNER)
    first.write(10, now_ms=1_000)
    copy = daemon(OWNER, first.host.states)
    first.write(5, now_ms=2_000)
    copy.write(3, now_ms=3_000)
    return first, copy, daemon(RELAY)


async def connect(
    nursery: trio.Nursery,
    dialler: Daemon,
    relay: Daemon,
    address: str,
    at: str = "relay:7000",
    pair: tuple[trio.abc.Stream, trio.abc.Stream] | None = None,
) -> trio.Event:
    """``dialler`` dials ``relay`` (from ``address``, to the relay's address ``at``; over ``pair``, else a
    memory stream pair); the event is set when the dialler's link ends."""
    left, right = pair or trio.testing.memory_stream_pair()
    ended = trio.Event()

    async def dial() -> None:
        stream = await secure_connect(left, seed=dialler.identity.seed, network_key=DEFAULT_NETWORK_KEY)
        try:
            await dialler.gossip.run_peer(stream, at, "static")
        finally:
            ended.set()

    async def accept() -> None:
        stream = await secure_accept(right, seed=relay.identity.seed, network_key=DEFAULT_NETWORK_KEY)
        await relay.gossip.run_peer(stream, address, "incoming")

    nursery.start_soon(dial)
    nursery.start_soon(accept)
    return ended


async def silent_owner(
    nursery: trio.Nursery, relay: Daemon, incarnation: bytes, address: str, *, relay_dials: bool = False
) -> SecureStream:
    """The owner's end of a link to ``relay`` on which a run of ``incarnation`` said hello and what it
    held, then nothing: no gossip runs on it, so the test decides when it goes. The relay accepts it from
    ``address``, or (``relay_dials``) dialled it itself, at ``address``."""
    left, right = trio.testing.memory_stream_pair()

    async def relay_end() -> None:
        if relay_dials:
            stream = await secure_connect(left, seed=RELAY.seed, network_key=DEFAULT_NETWORK_KEY)
        else:
            stream = await secure_accept(right, seed=RELAY.seed, network_key=DEFAULT_NETWORK_KEY)
        await relay.gossip.run_peer(stream, address, "static" if relay_dials else "incoming")

    nursery.start_soon(relay_end)
    if relay_dials:
        owner_end = await secure_accept(right, seed=OWNER.seed, network_key=DEFAULT_NETWORK_KEY)
    else:
        owner_end = await secure_connect(left, seed=OWNER.seed, network_key=DEFAULT_NETWORK_KEY)
    hello = Hello(PROTOCOL_VERSION, None, incarnation)
    await owner_end.send_many([encode_message(hello), encode_message(Digest(()))])
    return owner_end


async def settle(done: Callable[[], bool]) -> None:
    """Let every task run until ``done`` holds (memory streams: nothing waits on the outside world)."""
    with trio.fail_after(10):
        while not done():
            await trio.testing.wait_all_tasks_blocked(cushion=0.001)


async def served(nursery: trio.Nursery, run: Daemon, relay: Daemon, address: str, held_end: int) -> None:
    """``run`` dials ``relay`` (from ``address``) and is served: the relay holds the queue up to
    ``held_end``."""
    await connect(nursery, run, relay, address)
    await settle(lambda: KEY in relay.host.states and relay.state.held_end == held_end)


def _forked(d: Daemon) -> bool:
    return KEY in d.host.states and d.state.forked


async def test_a_relay_serves_both_runs_of_an_identity_tells_both_and_their_histories_meet() -> None:
    first, copy, relay = copied_owner()
    async with trio.open_nursery() as nursery:
        await served(nursery, first, relay, "10.0.0.1:5001", 15)
        await connect(nursery, copy, relay, "10.0.0.2:5002")
        await settle(
            lambda: (
                copy.gossip.identity.refusal() is not None
                and bool(first.gossip.identity.others)
                and _forked(relay)
                and _forked(first)
                and _forked(copy)
            )
        )
        # The relay: both links up, the duplicate logged and counted, the first run seen first.
        assert OWNER.public_key in relay.gossip.links and OWNER.public_key in relay.gossip.twins
        assert relay.gossip.counters["duplicate_identities"] == 1
        (sighting,) = relay.gossip.duplicates.recent()
        assert sighting.earlier.incarnation == first.gossip.incarnation
        assert (sighting.earlier.address, sighting.later.address) == ("10.0.0.1:5001", "10.0.0.2:5002")
        # The later run refuses its own writes, naming where the other runs and what to do.
        refusal = copy.gossip.identity.refusal()
        assert refusal is not None and "10.0.0.1:5001" in refusal and "identity claim" in refusal
        # The earlier run was told too, and keeps writing.
        (other,) = first.gossip.identity.others.values()
        assert (other.incarnation, other.later) == (copy.gossip.incarnation, False)
        assert first.gossip.identity.refusal() is None
        # The copy also saw it itself: another head at the version it signed came back.
        assert copy.gossip.counters["foreign_heads"] >= 1
        # Each daemon sees the copy's run as a fork of the queue.
        for d in (relay, first, copy):
            assert d.state.forked
        nursery.cancel_scope.cancel()


async def test_the_same_run_connecting_twice_is_not_a_duplicate() -> None:
    owner, relay = daemon(OWNER), daemon(RELAY)
    owner.write(2, now_ms=1_000)
    async with trio.open_nursery() as nursery:
        await served(nursery, owner, relay, "10.0.0.1:5001", 2)
        # The owner dials again (a second address of the relay): its HELLO names the same run.
        await connect(nursery, owner, relay, "10.0.0.1:5003", at="relay:7001")
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        assert not relay.gossip.twins
        assert relay.gossip.counters["duplicate_identities"] == 0
        assert owner.gossip.identity.refusal() is None
        nursery.cancel_scope.cancel()


async def test_an_owner_that_gets_back_a_head_of_its_own_it_did_not_sign_stops_signing() -> None:
    shared = daemon(OWNER)
    shared.write(4, now_ms=1_000)
    owner = daemon(OWNER, shared.host.states)
    owner.gossip.started_ms = 1_500  # started after the shared records were signed
    relay = daemon(RELAY, shared.host.states)
    other = daemon(OWNER, shared.host.states)
    other.write(2, now_ms=2_000)  # another run, after this owner started; the relay got it
    relay.host.states = dict(other.host.states)
    async with trio.open_nursery() as nursery:
        await connect(nursery, owner, relay, "10.0.0.1:5001")
        await settle(lambda: owner.gossip.identity.refusal() is not None)
        refusal = owner.gossip.identity.refusal()
        assert refusal is not None and "came back from peer" in refusal and "version 2" in refusal
        assert owner.gossip.counters["foreign_heads"] == 1
        assert owner.gossip.identity.claim(0.0)
        assert owner.gossip.identity.refusal() is None
        nursery.cancel_scope.cancel()


async def test_a_restored_store_catching_up_on_its_earlier_run_is_no_duplicate() -> None:
    earlier = daemon(OWNER)
    earlier.write(4, now_ms=1_000)
    restored = daemon(OWNER, earlier.host.states)
    earlier.write(3, now_ms=2_000)
    restored.gossip.started_ms = 5_000  # the restore started after everything the earlier run signed
    relay = daemon(RELAY, earlier.host.states)
    async with trio.open_nursery() as nursery:
        await connect(nursery, restored, relay, "10.0.0.1:5001")
        await settle(lambda: restored.state.held_end == 7)
        assert restored.gossip.identity.refusal() is None
        assert restored.gossip.counters["foreign_heads"] == 0
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("features", [frozenset(), None])
async def test_a_peer_that_does_not_speak_the_notice_is_not_sent_it(features: frozenset[str] | None) -> None:
    """A 0.2.0 peer (no features) gets nothing; one that has not said what it speaks gets it only once it
    names the feature."""
    links = LeaseLinks(dial=lambda peer: False)
    link = PeerLink(OWNER.public_key, "mem", "incoming", ReplicationSession())
    links.link_up(link)
    link.extra_out.clear()
    if features is not None:
        link.agreement = Agreement(1, features, UNSTATED)
    body: dict[str, Any] = {"yours": "00" * 16}
    links.notify(link, IDENTITY_OP, body)
    assert link.extra_out == []


async def test_a_second_runs_link_answers_versions_and_notices_and_refuses_lease_requests() -> None:
    """Lease forwarding runs on an identity's first link only; the second one's requests are answered
    for what only that link can say, and refused otherwise (the link stays up)."""
    link = PeerLink(OWNER.public_key, "mem", "incoming", ReplicationSession())
    heard: list[dict[str, Any]] = []
    notice = Notice(b"\x02" * 16, b"\x01" * 16, "10.0.0.1:5001", later=True)
    twin = TwinRequests(link, notice, heard.append, 1 << 20)
    peer = LeasingSession()
    for message in link.extra_out:  # our versions request
        peer.receive(message)
    link.extra_out.clear()
    asked = peer.next_event()
    assert isinstance(asked, Request) and asked.op == VERSIONS_OP
    peer.answer(asked.rid, ours().to_body())  # it speaks the notice: it is sent
    versions = peer.request(VERSIONS_OP, ours().to_body(), now=0.0, timeout=5.0)
    take = peer.request("take", {}, now=0.0, timeout=5.0)
    told = peer.request(IDENTITY_OP, notice.to_body(), now=0.0, timeout=5.0)
    for message in peer.messages_to_send():
        twin.receive(message)
    assert link.agreement is not None and IDENTITY_FEATURE in link.agreement.features
    assert heard == [notice.to_body()]
    for message in link.extra_out:
        peer.receive(message)
    events = {}
    while (event := peer.next_event()) is not None:
        events[(type(event).__name__, event.rid)] = event
    assert ("Answer", versions) in events and ("Answer", told) in events
    refused = events[("Refusal", take)]
    assert isinstance(refused, Refusal) and "second link" in str(refused.error)
    sent = [e for e in events.values() if isinstance(e, Request)]
    assert [Notice.from_body(e.body) for e in sent if e.op == IDENTITY_OP] == [notice]


async def test_a_run_that_reconnects_while_its_old_link_is_half_open_is_not_a_duplicate() -> None:
    """A daemon restarted while its old link looks alive (it was silent for less than two ticks) comes
    back as another incarnation: served at once, but a duplicate only if the old link answers a PING.
    This one never does; when it is closed the new run's link goes too, to come back as the first."""
    relay = daemon(RELAY)
    restarted = daemon(OWNER)
    restarted.write(1, now_ms=1_000)
    async with trio.open_nursery() as nursery:
        # The old run said hello and what it held, then went silent (its host froze).
        old = await silent_owner(nursery, relay, b"\x09" * 16, "10.0.0.1:5001")
        await settle(lambda: OWNER.public_key in relay.gossip.links)
        await served(nursery, restarted, relay, "10.0.0.1:5002", 1)
        assert OWNER.public_key in relay.gossip.twins  # served at once
        assert relay.gossip.counters["duplicate_identities"] == 0
        assert restarted.gossip.identity.refusal() is None and not restarted.gossip.identity.others
        await old.aclose()
        await settle(lambda: OWNER.public_key not in relay.gossip.twins)
        assert relay.gossip.counters["duplicate_identities"] == 0
        nursery.cancel_scope.cancel()


async def test_the_first_runs_link_replaced_by_its_own_newer_link_keeps_the_second_runs_link() -> None:
    """The first run of a copied identity dials the relay again while its old link looks dead (both ends
    heard nothing for two ping intervals): the newer link takes the old one's place. The identity's first
    run is still connected, so the other run's link stays; closing it (as when the first run goes away)
    left the relay listing one of the two runs until the other redialled."""
    first, copy, relay = copied_owner()
    async with trio.open_nursery() as nursery:
        await served(nursery, first, relay, "10.0.0.1:5001", 15)
        await connect(nursery, copy, relay, "10.0.0.2:5002")
        await settle(lambda: _forked(relay) and _forked(copy) and _forked(first))
        second = relay.gossip.twins[OWNER.public_key]
        old = relay.gossip.links[OWNER.public_key]
        for link in (old, first.gossip.links[RELAY.public_key]):
            link.last_heard -= STALE_AFTER_S + 1  # silent for longer than two ping intervals
        await connect(nursery, first, relay, "10.0.0.1:5003")
        await settle(lambda: old.ended and relay.gossip.links.get(OWNER.public_key) not in (None, old))
        assert relay.gossip.links[OWNER.public_key].address == "10.0.0.1:5003"
        assert relay.gossip.twins.get(OWNER.public_key) is second and not second.ended
        nursery.cancel_scope.cancel()


async def half_open(nursery: trio.Nursery, relay: Daemon, run: Daemon, address: str) -> PeerLink:
    """A link of ``run`` on the relay that said hello and what it held, then went silent (its host froze,
    or the path broke one way): the relay's end looks alive until it is stale."""
    await silent_owner(nursery, relay, run.gossip.incarnation, address)

    def up() -> PeerLink | None:
        for link in (relay.gossip.links.get(OWNER.public_key), relay.gossip.twins.get(OWNER.public_key)):
            if link is not None and link.address == address and link.session.peer_incarnation is not None:
                return link
        return None

    await settle(lambda: up() is not None)
    link = up()
    assert link is not None
    return link


async def test_a_first_runs_link_replaced_before_it_answers_the_ping_is_asked_again() -> None:
    """The second run connects; the relay PINGs the first run's link to confirm it is alive, but that link
    is half-open and is replaced (once stale) by the first run's new link before any PONG. The PING is
    asked again on the new link: the duplicate is logged, counted and told to both (before, the pending
    confirmation went with the old link, and both runs were served with nobody told)."""
    first, copy, relay = copied_owner()
    async with trio.open_nursery() as nursery:
        old = await half_open(nursery, relay, first, "10.0.0.1:5001")
        await served(nursery, copy, relay, "10.0.0.2:5002", 13)
        assert old.pending_twin is not None and relay.gossip.counters["duplicate_identities"] == 0
        old.last_heard -= STALE_AFTER_S + 1
        await connect(nursery, first, relay, "10.0.0.1:5003")
        await settle(
            lambda: (
                relay.gossip.counters["duplicate_identities"] == 1
                and copy.gossip.identity.refusal() is not None
                and bool(first.gossip.identity.others)
            )
        )
        assert old.ended and relay.gossip.links[OWNER.public_key].address == "10.0.0.1:5003"
        (sighting,) = relay.gossip.duplicates.recent()
        assert sighting.earlier.incarnation == first.gossip.incarnation
        assert sighting.later == RunSeen(copy.gossip.incarnation, "10.0.0.2:5002")
        assert first.gossip.identity.refusal() is None
        nursery.cancel_scope.cancel()


async def test_the_second_run_reconnecting_while_its_old_link_is_half_open_is_that_run() -> None:
    """The second run's link goes half-open and the run dials again: the same incarnation is that run
    reconnecting, not a third run. Its new link takes the old one's place once that is stale (as the first
    run's would; before, it was refused as a third run until the old link timed out, the run in the dark
    meanwhile), and the duplicate is confirmed on it. A run of a third incarnation is still refused."""
    first, copy, relay = copied_owner()
    async with trio.open_nursery() as nursery:
        await served(nursery, first, relay, "10.0.0.1:5001", 15)
        old = await half_open(nursery, relay, copy, "10.0.0.2:5002")
        await settle(lambda: relay.gossip.counters["duplicate_identities"] == 1)
        assert relay.gossip.twins[OWNER.public_key] is old
        third = daemon(OWNER, first.host.states)
        await connect(nursery, third, relay, "10.0.0.3:5003")
        await settle(lambda: not third.gossip.links)
        assert relay.gossip.twins[OWNER.public_key] is old  # a third run: refused, as before
        old.last_heard -= STALE_AFTER_S + 1
        await connect(nursery, copy, relay, "10.0.0.2:5004")
        await settle(lambda: old.ended and copy.gossip.identity.refusal() is not None and _forked(relay))
        new = relay.gossip.twins[OWNER.public_key]
        assert new.address == "10.0.0.2:5004" and not new.ended
        assert relay.gossip.links[OWNER.public_key].address == "10.0.0.1:5001"
        assert relay.gossip.counters["duplicate_identities"] == 2  # seen again, on the new link
        (sighting,) = relay.gossip.duplicates.recent()
        assert sighting.earlier.incarnation == first.gossip.incarnation and sighting.count == 2
        nursery.cancel_scope.cancel()


async def test_a_stale_first_link_replaced_by_the_second_run_itself_is_no_duplicate_of_that_run() -> None:
    """The first run's link is stale with a check pending when the second run redials: its new link takes
    the first link's place (a stale link's successor is not asked which run it is), and the check asked
    again there is answered by the second run itself. One run answering for both is no duplicate."""
    relay, copy = daemon(RELAY), daemon(OWNER)
    first = daemon(OWNER)  # its run only said hello on a link that went half-open
    async with trio.open_nursery() as nursery:
        old = await half_open(nursery, relay, first, "10.0.0.1:5001")
        await half_open(nursery, relay, copy, "10.0.0.2:5002")
        assert old.pending_twin is not None
        old.last_heard -= STALE_AFTER_S + 1
        await connect(nursery, copy, relay, "10.0.0.2:5003")

        def asked_and_answered() -> bool:
            live = relay.gossip.links.get(OWNER.public_key)
            return live is not None and live is not old and live.pending_twin is None and not old.pending_twin

        await settle(asked_and_answered)
        assert relay.gossip.links[OWNER.public_key].session.peer_incarnation == copy.gossip.incarnation
        assert relay.gossip.counters["duplicate_identities"] == 0 and not relay.gossip.duplicates.recent()
        nursery.cancel_scope.cancel()


@pytest.fixture
def handshake_clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The wall clock every handshake reads (msg1's time, the freshness check): a second later at each
    read unless a test sets it, so each dial's opening is newer than the one before."""
    now = [1_800_000_000_000]

    def clock() -> int:
        now[0] += 1_000
        return now[0]

    monkeypatch.setattr(transport, "_wall_clock_ms", clock)
    return now


async def test_a_run_that_redials_while_its_old_link_looks_alive_takes_its_place_at_once(
    handshake_clock: list[int],
) -> None:
    """The owner's link went half-open (the owner saw it end, the relay did not) and the owner dials
    again. Both links were dialled by the same run, the new one later (its handshake's time): the new one
    takes the old one's place at once whatever the key order (before, the relay kept the old one, and
    refused each redial, until it was stale: 20 s with the owner in the dark)."""
    assert RELAY.public_key < OWNER.public_key  # the key order keeps the relay's old incoming link
    first, relay = daemon(OWNER), daemon(RELAY)
    first.write(2, now_ms=1_000)
    async with trio.open_nursery() as nursery:
        old = await half_open(nursery, relay, first, "10.0.0.1:5001")
        await connect(nursery, first, relay, "10.0.0.1:5002")
        await settle(lambda: old.ended and KEY in relay.host.states and relay.state.held_end == 2)
        assert relay.gossip.links[OWNER.public_key].address == "10.0.0.1:5002"
        assert not relay.gossip.twins and relay.gossip.counters["duplicate_identities"] == 0
        nursery.cancel_scope.cancel()


async def test_the_second_run_redialling_while_its_old_link_looks_alive_takes_its_place_at_once(
    handshake_clock: list[int],
) -> None:
    """The same for the second run of a copied identity: its newer link replaces its half-open one at once
    (it is that run), and the duplicate is confirmed again on it."""
    first, copy, relay = copied_owner()
    async with trio.open_nursery() as nursery:
        await served(nursery, first, relay, "10.0.0.1:5001", 15)
        old = await half_open(nursery, relay, copy, "10.0.0.2:5002")
        await settle(lambda: relay.gossip.counters["duplicate_identities"] == 1)
        await connect(nursery, copy, relay, "10.0.0.2:5003")
        await settle(lambda: old.ended and copy.gossip.identity.refusal() is not None and _forked(relay))
        assert relay.gossip.twins[OWNER.public_key].address == "10.0.0.2:5003"
        assert relay.gossip.links[OWNER.public_key].address == "10.0.0.1:5001"
        assert relay.gossip.counters["duplicate_identities"] == 2
        nursery.cancel_scope.cancel()


async def test_a_link_of_the_same_run_opened_before_the_live_one_does_not_replace_it(
    handshake_clock: list[int],
) -> None:
    """A link whose handshake is older than the live link's (held back on the way, or its packets
    replayed by someone on the path: a recorded handshake itself cannot complete again) loses to it:
    the handshake's freshness decides, not the order the relay finished them in."""
    first, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        live = await half_open(nursery, relay, first, "10.0.0.1:5001")
        handshake_clock[0] -= 30_000  # the next opening is dated before the live link's
        refused = await connect(nursery, first, relay, "10.0.0.1:5002")
        with trio.fail_after(10):
            await refused.wait()  # the relay closed it
        assert relay.gossip.links[OWNER.public_key] is live and not live.ended
        nursery.cancel_scope.cancel()


async def test_a_link_each_side_dialled_is_decided_by_the_key_order(handshake_clock: list[int]) -> None:
    """One link dialled by each side is a simultaneous dial, not a redial: the owner said hello on both
    (it may have taken either, its own dial first), so only the key order makes both ends pick the same
    one, and the handshakes' times (two clocks) do not decide. Here it keeps the relay's own link."""
    first, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        await silent_owner(nursery, relay, first.gossip.incarnation, "10.0.0.1:7000", relay_dials=True)
        await settle(
            lambda: (
                (ours := relay.gossip.links.get(OWNER.public_key)) is not None
                and ours.session.peer_incarnation is not None
            )
        )
        ours = relay.gossip.links[OWNER.public_key]
        refused = await connect(nursery, first, relay, "10.0.0.1:5002")  # newer, a hello of the same run
        with trio.fail_after(10):
            await refused.wait()  # the relay closed it
        assert relay.gossip.links[OWNER.public_key] is ours and not ours.ended
        nursery.cancel_scope.cancel()


def agreed(a: Daemon, b: Daemon) -> bool:
    """Whether ``a`` and ``b`` are linked and each end settled what the link speaks."""
    ab, ba = a.gossip.links.get(b.identity.public_key), b.gossip.links.get(a.identity.public_key)
    return ab is not None and ba is not None and ab.agreement is not None and ba.agreement is not None


async def relay_link_gone_on_the_owners_side(nursery: trio.Nursery, owner: Daemon, relay: Daemon) -> PeerLink:
    """The relay dials the owner; both settle what the link speaks; then the owner's end of it dies alone:
    the relay's end (returned) looks alive, the owner has no link."""
    relays_end, owners_end, cut = cuttable_pair()
    await connect(nursery, relay, owner, "10.0.0.9:7000", at="10.0.0.1:5001", pair=(relays_end, owners_end))
    await settle(lambda: agreed(owner, relay))
    old = relay.gossip.links[OWNER.public_key]
    cut(False)
    await settle(lambda: RELAY.public_key not in owner.gossip.links)
    assert relay.gossip.links.get(OWNER.public_key) is old and not old.ended
    return old


async def test_a_redial_while_the_link_we_dialled_is_half_open_takes_its_place_at_once(
    handshake_clock: list[int],
) -> None:
    """The relay dialled the owner; the owner's end of that link died, the relay's did not (half-open);
    the owner dials again. The key order keeps the relay's own link, and two links dialled by different
    ends look like a simultaneous dial, so the relay refused each redial until its link was stale (20 s,
    the owner in the dark). The owner's redial now names the link it lost (``link-gone``): the relay
    drops it and keeps the redial at once, and the two ends agree on it."""
    assert RELAY.public_key < OWNER.public_key  # the key order keeps the relay's own link
    owner, relay = daemon(OWNER), daemon(RELAY)
    owner.write(2, now_ms=1_000)
    async with trio.open_nursery() as nursery:
        old = await relay_link_gone_on_the_owners_side(nursery, owner, relay)
        assert old.agreement is not None and LINK_GONE_FEATURE in old.agreement.features
        owner.write(3, now_ms=2_000)  # while it has no link
        await connect(nursery, owner, relay, "10.0.0.1:5002")
        await settle(lambda: old.ended and relay.state.held_end == 5)
        new = relay.gossip.links[OWNER.public_key]
        assert new.address == "10.0.0.1:5002" and new.via == "incoming" and not new.ended
        ours = owner.gossip.links[RELAY.public_key]
        assert ours.stream is not None and new.stream is not None
        assert ours.stream.handshake.session_id == new.stream.handshake.session_id  # one link, both ends
        assert not relay.gossip.twins and relay.gossip.counters["duplicate_identities"] == 0
        nursery.cancel_scope.cancel()


async def test_a_redial_without_the_feature_waits_for_the_half_open_link_as_before(
    handshake_clock: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemons of the previous feature set (or 0.2.0, which states none): the lost link did not agree on
    ``link-gone``, so the owner names nothing and the relay reads nothing past the HELLO: the redial is
    refused while the relay's own link looks alive, as before."""
    older = LinkVersions(ours().release, ours().protocols, ours().features - {LINK_GONE_FEATURE})
    monkeypatch.setattr(leasing, "ours", lambda: older)
    owner, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        old = await relay_link_gone_on_the_owners_side(nursery, owner, relay)
        assert old.agreement is not None and LINK_GONE_FEATURE not in old.agreement.features
        assert (
            owner.gossip.lost_links.word_for(RELAY.public_key, b"\x01" * 32, now=trio.current_time()) is None
        )
        refused = await connect(nursery, owner, relay, "10.0.0.1:5002")
        with trio.fail_after(10):
            await refused.wait()  # the relay closed it
        assert relay.gossip.links[OWNER.public_key] is old and not old.ended
        nursery.cancel_scope.cancel()


async def secure_pair(
    dialler: Identity, acceptor: Identity, pair: tuple[trio.abc.Stream, trio.abc.Stream] | None = None
) -> tuple[SecureStream, SecureStream]:
    """A completed handshake over memory streams (``pair``, else a new pair): (the dialler's end, the
    acceptor's end)."""
    left, right = pair or trio.testing.memory_stream_pair()
    ends: dict[str, SecureStream] = {}

    async def accept() -> None:
        ends["acceptor"] = await secure_accept(right, seed=acceptor.seed, network_key=DEFAULT_NETWORK_KEY)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        ends["dialler"] = await secure_connect(left, seed=dialler.seed, network_key=DEFAULT_NETWORK_KEY)
    return ends["dialler"], ends["acceptor"]


async def test_a_simultaneous_dial_after_a_lost_link_is_still_decided_by_the_key_order_on_both_ends(
    handshake_clock: list[int],
) -> None:
    """Both ends lost their link (each names it on its next links), then each dials the other at once.
    Each registers its own dial first; the owner then takes the relay's dial by the key order (before the
    relay said hello on the owner's); the relay, holding its own dial with the owner's hello on it, gets
    the owner's dial with its word. The word names the lost link, not the relay's live one: the key order
    decides, and both ends keep the same link (a word taken as "any redial wins" would have the relay drop
    the link the owner kept, for the one the owner dropped)."""
    owner, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        relays_end, owners_end, cut = cuttable_pair()
        await connect(
            nursery, relay, owner, "10.0.0.9:7000", at="10.0.0.1:5001", pair=(relays_end, owners_end)
        )
        await settle(lambda: agreed(owner, relay))
        cut(True)
        await settle(lambda: not owner.gossip.links and not relay.gossip.links)
        relay_dial, owner_accepts = await secure_pair(RELAY, OWNER)
        owner_dial, relay_accepts = await secure_pair(OWNER, RELAY)
        nursery.start_soon(relay.gossip.run_peer, relay_dial, "10.0.0.1:5001", "static")
        nursery.start_soon(owner.gossip.run_peer, owner_dial, "10.0.0.9:7000", "static")
        await settle(
            lambda: OWNER.public_key in relay.gossip.links and RELAY.public_key in owner.gossip.links
        )
        # Each end names the lost link on its own dial (its word went out after its HELLO).
        assert (
            owner.gossip.lost_links.word_for(RELAY.public_key, b"\x01" * 32, now=trio.current_time())
            is not None
        )
        assert (
            relay.gossip.lost_links.word_for(OWNER.public_key, b"\x01" * 32, now=trio.current_time())
            is not None
        )
        nursery.start_soon(owner.gossip.run_peer, owner_accepts, "10.0.0.9:7001", "incoming")
        kept = relay.gossip.links[OWNER.public_key]
        await settle(lambda: agreed(owner, relay) and owner.gossip.links[RELAY.public_key].via == "incoming")
        assert relay.gossip.links[OWNER.public_key] is kept  # the owner said hello on the relay's dial
        refused = trio.Event()

        async def relay_takes_the_owners_dial() -> None:
            await relay.gossip.run_peer(relay_accepts, "10.0.0.1:5002", "incoming")
            refused.set()

        nursery.start_soon(relay_takes_the_owners_dial)
        with trio.fail_after(10):
            await refused.wait()
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        assert relay.gossip.links[OWNER.public_key] is kept and not kept.ended
        theirs = owner.gossip.links[RELAY.public_key]
        assert theirs.stream is not None and kept.stream is not None and not theirs.ended
        assert theirs.stream.handshake.session_id == kept.stream.handshake.session_id
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("word", ["named", "replayed", "of_a_gone_link"])
async def test_only_the_word_naming_the_live_link_for_this_very_link_replaces_it(
    handshake_clock: list[int], word: str
) -> None:
    """A dialler with the owner's key (a copied identity, or the owner itself) says hello on a new link and
    then a word. Only the word naming the relay's live link, bound to this very link, replaces it: that
    takes the live link's session id, which only its other end knows. A word recorded on another link
    (replayed), or naming a link already gone, evicts nothing: the key order refuses the dial as before."""
    owner, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        await connect(nursery, relay, owner, "10.0.0.9:7000", at="10.0.0.1:5001")
        await settle(lambda: agreed(owner, relay))
        live = relay.gossip.links[OWNER.public_key]
        assert live.stream is not None
        live_id = live.stream.handshake.session_id
        dialler, relays_end = await secure_pair(OWNER, RELAY)
        new_id = dialler.handshake.session_id
        message = {
            "named": gone_message(live_id, new_id),
            "replayed": gone_message(live_id, b"\x07" * 32),  # what was sent on another link
            "of_a_gone_link": gone_message(b"\x05" * 32, new_id),
        }[word]
        ended = trio.Event()

        async def relay_end() -> None:
            await relay.gossip.run_peer(relays_end, "10.0.0.1:5002", "incoming")
            ended.set()

        nursery.start_soon(relay_end)
        hello = Hello(PROTOCOL_VERSION, None, owner.gossip.incarnation)
        await dialler.send_many([encode_message(hello), message, encode_message(Digest(()))])
        if word == "named":
            await settle(
                lambda: live.ended and relay.gossip.links[OWNER.public_key].address == "10.0.0.1:5002"
            )
        else:
            with trio.fail_after(10):
                await ended.wait()  # the relay closed it
            assert relay.gossip.links[OWNER.public_key] is live and not live.ended
        nursery.cancel_scope.cancel()


async def test_a_redial_with_nothing_to_name_is_refused_without_waiting_out_the_hello_wait(
    handshake_clock: list[int],
) -> None:
    """Both ends speak ``link-gone`` but the owner has nothing to name (its record of the lost link was
    forgotten: more peers lost than it keeps). It says hello and then waits for the relay's, so no second
    message comes: the relay, which reads one after the HELLO where it would refuse, must give up on it
    as soon as the word would have come with the HELLO, not hold the refused link for the whole
    ``HELLO_WAIT_S`` (the word goes in the HELLO's own write). A daemon's lease links happen to send
    a request right after the HELLO, which ends the wait early; a bare :class:`Gossip` sends nothing."""
    owner, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        old = await relay_link_gone_on_the_owners_side(nursery, owner, relay)
        assert old.agreement is not None and LINK_GONE_FEATURE in old.agreement.features
        owner.gossip.lost_links = LostLinks()  # nothing to name
        owner.gossip.extension = None  # nor anything else to say before the relay's HELLO (a bare Gossip)
        start = trio.current_time()
        refused = await connect(nursery, owner, relay, "10.0.0.1:5002")
        with trio.fail_after(HELLO_WAIT_S):
            await refused.wait()  # the relay closed it
        assert trio.current_time() - start < HELLO_WAIT_S / 2
        assert relay.gossip.links[OWNER.public_key] is old and not old.ended
        nursery.cancel_scope.cancel()


async def test_a_link_lost_longer_ago_than_the_peer_could_think_it_alive_is_not_named(
    handshake_clock: list[int],
) -> None:
    """The owner names its lost link only while the relay's end of it may still look alive (twice the
    stale bound): later the word does nothing but reach a peer that may have restarted on a build without
    the feature, which drops a link on an unknown message. Here the bound is cut to nothing: the redial
    carries no word and is refused by the key order."""
    owner, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        old = await relay_link_gone_on_the_owners_side(nursery, owner, relay)
        owner.gossip.lost_links.ttl = 0.0  # every lost link is "long ago" by the redial
        refused = await connect(nursery, owner, relay, "10.0.0.1:5002")
        with trio.fail_after(HELLO_WAIT_S):
            await refused.wait()  # the relay closed it
        assert relay.gossip.links[OWNER.public_key] is old and not old.ended
        assert (
            owner.gossip.lost_links.word_for(RELAY.public_key, b"\x01" * 32, now=trio.current_time()) is None
        )
        nursery.cancel_scope.cancel()


def no_word(word_for: Callable[..., bytes | None], peer: bytes) -> bool:
    """Whether a daemon whose ``lost_links.word_for`` this is names nothing to ``peer`` now."""
    return word_for(peer, b"\x01" * 32, now=trio.current_time()) is None


@pytest.mark.parametrize("ending", ["closed", "lost"])
async def test_only_a_link_that_died_is_named_not_one_an_end_closed_on_purpose(
    handshake_clock: list[int], ending: str
) -> None:
    """A link the owner closed on purpose (its daemon stopping: the final frame goes out) is known ended on
    both ends: neither names it on its next dial. Naming it would only cost a link if the owner came back
    on a build without the feature (a rollback within ``LOST_LINK_TTL_S``). A link that died (each end
    read the end of the stream without that frame) is named by both."""
    owner, relay = daemon(OWNER), daemon(RELAY)
    async with trio.open_nursery() as nursery:
        relays_end, owners_end, cut = cuttable_pair()
        relay_dial, owner_accepts = await secure_pair(RELAY, OWNER, (relays_end, owners_end))
        stopping = trio.CancelScope()

        async def owner_daemon() -> None:
            with stopping:
                await owner.gossip.run_peer(owner_accepts, "10.0.0.9:7000", "incoming")

        nursery.start_soon(relay.gossip.run_peer, relay_dial, "10.0.0.1:5001", "static")
        nursery.start_soon(owner_daemon)
        await settle(lambda: agreed(owner, relay))
        assert no_word(owner.gossip.lost_links.word_for, RELAY.public_key)
        if ending == "closed":
            stopping.cancel()
        else:
            cut(True)
        await settle(lambda: not owner.gossip.links and not relay.gossip.links)
        named = ending == "lost"
        assert no_word(owner.gossip.lost_links.word_for, RELAY.public_key) is not named
        assert no_word(relay.gossip.lost_links.word_for, OWNER.public_key) is not named
        nursery.cancel_scope.cancel()


class JammableSend(trio.abc.SendStream):
    """A send stream that takes nothing once ``jammed`` (a send waits, as to a peer that stopped reading)."""

    def __init__(self, inner: trio.abc.SendStream) -> None:
        self.inner = inner
        self.jammed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.jammed:
            await trio.sleep_forever()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


def kept(deciding: Daemon, other: Daemon, address: str) -> bool:
    """Whether ``deciding``'s link to ``other`` now is the one from (or to) ``address``."""
    link = deciding.gossip.links.get(other.identity.public_key)
    return link is not None and link.address == address


@pytest.mark.parametrize("old_link", ["alive", "silent", "writer_blocked", "ended"])
@pytest.mark.parametrize("decider", ["the_peer_redials", "we_redial"])
async def test_a_dial_with_no_word_takes_the_place_of_a_link_that_died_during_the_wait_for_it(
    handshake_clock: list[int], monkeypatch: pytest.MonkeyPatch, decider: str, old_link: str
) -> None:
    """The relay dialled the owner; one end of that link died alone, and a new link comes from that end
    (the owner redials, and the relay decides: the peer redials; or the relay dials again, and the owner
    decides: we redial). The key order keeps the old link, and the new one carries no word (its sender
    forgot the lost link, or never settled it), so the decider waits ``GONE_WAIT_S`` for one in vain.
    If the old link died meanwhile (silent for ``STALE_AFTER_S``, or its send waiting on a peer that takes
    nothing, or it ended: its end of the stream came without the final frame), the new link takes its
    place then, not at the peer's next dial; a live one is kept."""
    monkeypatch.setattr(gossip_module, "WRITER_BLOCKED_S", GONE_WAIT_S / 2)
    owner, relay = daemon(OWNER), daemon(RELAY)
    first_end, second_end, cut = cuttable_pair()
    jam = JammableSend(first_end.send_stream)
    # The decider's end of the old link is the first (it can jam), the other the second (it dies alone).
    deciders_end = trio.StapledStream(jam, first_end.receive_stream)
    we_redial = decider == "we_redial"
    deciding, other = (owner, relay) if we_redial else (relay, owner)
    async with trio.open_nursery() as nursery:
        pair = (second_end, deciders_end) if we_redial else (deciders_end, second_end)
        await connect(nursery, relay, owner, "10.0.0.9:7000", at="10.0.0.1:5001", pair=pair)
        await settle(lambda: agreed(owner, relay))
        old = deciding.gossip.links[other.identity.public_key]
        cut(False)
        await settle(lambda: deciding.identity.public_key not in other.gossip.links)
        assert deciding.gossip.links.get(other.identity.public_key) is old and not old.ended
        assert old.agreement is not None and LINK_GONE_FEATURE in old.agreement.features
        if old_link == "silent":  # stale halfway through the wait for the word
            old.last_heard = trio.current_time() - STALE_AFTER_S + GONE_WAIT_S / 2
        elif old_link == "writer_blocked":  # its send waits from now on: blocked halfway through the wait
            jam.jammed = True
            old.session.ping(1)
            old.kick()
            await settle(lambda: old.stream is not None and old.stream.blocked_since is not None)
        # The new link: the other end says hello (the same run) and nothing more.
        if we_redial:
            deciders_dial, others_end = await secure_pair(OWNER, RELAY)
            deciders_stream, new_address, via = deciders_dial, "10.0.0.1:5002", "static"
        else:
            others_end, deciders_accepts = await secure_pair(OWNER, RELAY)
            deciders_stream, new_address, via = deciders_accepts, "10.0.0.9:7001", "incoming"
        refused = trio.Event()

        async def decide() -> None:
            await deciding.gossip.run_peer(deciders_stream, new_address, via)
            refused.set()

        start = trio.current_time()
        nursery.start_soon(decide)
        await others_end.send(encode_message(Hello(PROTOCOL_VERSION, None, other.gossip.incarnation)))
        if old_link == "ended":  # the decider read the HELLO and waits for the word: the old link ends now
            await trio.testing.wait_all_tasks_blocked(cushion=0.01)
            cut(True)
            await settle(lambda: old.ended and other.identity.public_key not in deciding.gossip.links)
            assert not refused.is_set() and trio.current_time() - start < GONE_WAIT_S
        if old_link == "alive":
            with trio.fail_after(HELLO_WAIT_S):
                await refused.wait()  # closed after the wait
            assert deciding.gossip.links[other.identity.public_key] is old and not old.ended
        else:
            await settle(lambda: refused.is_set() or kept(deciding, other, new_address))
            assert old.ended and kept(deciding, other, new_address) and not refused.is_set()
        assert trio.current_time() - start >= GONE_WAIT_S  # the wait for the word, in vain
        nursery.cancel_scope.cancel()
