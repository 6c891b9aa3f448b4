"""Core-2 queues through the trio gossip shell over real secure streams (in memory): with a core-2 host
each link carries a :class:`~latticed.protocol.core2_session.Core2Link`, core 1 going on beside it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core2_sim import AsyncCore2Host, MemoryCore2Host
from support.gossip_hosts import MemoryReplicaHost
from support.gossip_tcp import link_gossips_tcp

from latticed.crdt import queue as core
from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import GapError, IntegrityError, NotFoundError
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net import gossip as gossip_module
from latticed.net.core2_host import PendingMerge2
from latticed.net.gossip import READ_TRIES, Gossip, PeerLink
from latticed.net.transport import secure_accept, secure_connect
from latticed.protocol.core2_steps import Outgoing2
from latticed.protocol.core2_wire import CORE2_NAMES, Steps, Summary2, link_summary
from latticed.protocol.replication import QueueKey
from latticed.protocol.replication_messages import message_type_name
from latticed.protocol.versions import ours

ALICE = Identity.from_seed(b"a" * 32)
KEY2: QueueKey = (ALICE.public_key, "two", 0)
KEY1: QueueKey = (ALICE.public_key, "one", 0)


class Host1(MemoryReplicaHost):
    def __init__(self) -> None:
        super().__init__()
        self.changed = trio.Event()

    def merged(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class Host2(AsyncCore2Host):
    """The in-memory core-2 host, telling the gossip of each change as the store's hook does."""

    def __init__(self) -> None:
        super().__init__(MemoryCore2Host())
        self.gossip: Gossip | None = None
        self.changed = trio.Event()
        #: Reads left that lose their rows or queue to a commit of ours meanwhile, as the store's can.
        self.races = 0
        self.race: type[GapError | NotFoundError] = GapError

    async def delta2_for(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        if self.races:
            self.races -= 1
            raise self.race("the rows of queue #1 left the store meanwhile (a commit of ours); retry")
        return await super().delta2_for(key, since, max_records, max_bytes)

    def submit_merge2(self, delta: queue2.Delta, steps: Steps | None, peer: bytes) -> PendingMerge2:
        pending = super().submit_merge2(delta, steps, peer)
        key = (delta.owner, delta.name, delta.kind)
        state = self.memory.states2.get(key)
        if state is not None and self.gossip is not None:
            self.gossip.local_change2(key, link_summary(state))
        self.changed.set()
        self.changed = trio.Event()
        return pending

    def put(self, state: QueueState2) -> None:
        key = (state.owner, state.name, state.kind)
        before = self.memory.states2.get(key)
        self.memory.states2[key] = state if before is None else queue2.join(before, state)
        assert self.gossip is not None
        self.gossip.local_change2(key, link_summary(self.memory.states2[key]))


Daemon = tuple[Identity, Host1, Host2, Gossip]


def make(seed: bytes, core2: bool = True) -> Daemon:
    identity = Identity.from_seed(seed)
    host, host2 = Host1(), Host2()
    gossip = Gossip(host, identity.public_key, host2=host2 if core2 else None)
    host2.gossip = gossip
    return identity, host, host2, gossip


async def link(nursery: trio.Nursery, a: Daemon, b: Daemon) -> None:
    left, right = trio.testing.memory_stream_pair()

    async def dial() -> None:
        stream = await secure_connect(left, seed=a[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await a[3].run_peer(stream, "mem", "static")

    async def accept() -> None:
        stream = await secure_accept(right, seed=b[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await b[3].run_peer(stream, "mem", "incoming")

    nursery.start_soon(dial)
    nursery.start_soon(accept)
    # Both sides state their versions (the daemon's lease-forwarding extension carries that exchange).
    await trio.testing.wait_all_tasks_blocked()
    for daemon in (a, b):
        for peer in daemon[3].links.values():
            peer.session.agree_features(ours().features)
            peer.kick()


def records(tag: bytes, n: int) -> list[Record]:
    return [Record(value=b"%s-%d" % (tag, i)) for i in range(n)]


async def held2(daemon: Daemon, end: int) -> QueueState2:
    with trio.fail_after(10):
        while (state := daemon[2].memory.states2.get(KEY2)) is None or state.held[1] < end:
            await daemon[2].changed.wait()
    return state


async def held1(daemon: Daemon, end: int) -> None:
    with trio.fail_after(10):
        while KEY1 not in daemon[1].states or daemon[1].states[KEY1].held_end < end:
            await daemon[1].changed.wait()


async def test_core2_and_core1_queues_replicate_side_by_side_and_live() -> None:
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[2].memory.states2[KEY2] = queue2.commit(
        queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 3)
    )
    one = core.commit(core.empty_state(ALICE.public_key, "one"), ALICE, now_ms=1, records=records(b"y", 2))
    a[1].states[KEY1] = one
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        await held2(b, 3)
        await held1(b, 2)
        a[2].put(queue2.commit(a[2].memory.states2[KEY2], ALICE, now_ms=2, records=records(b"z", 2)))
        state = await held2(b, 5)  # a live change after the first exchange
        nursery.cancel_scope.cancel()
    assert state == a[2].memory.states2[KEY2]
    sent, received = a[3].stats(), b[3].stats()
    assert received["received_digest2"] == sent["sent_digest2"] == 1
    assert received["received_delta2"] == sent["sent_delta2"] >= 2
    assert sent["received_ack2"] >= 1 and "received_other" not in sent


async def test_a_core2_read_that_raced_a_commit_of_ours_is_read_again_and_the_link_kept() -> None:
    """Core 2 shares core 1's retry (``Gossip._read_again``): our own race is no fault of the peer's."""
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[2].races = READ_TRIES - 1
    a[2].memory.states2[KEY2] = queue2.commit(
        queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 3)
    )
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        state = await held2(b, 3)
        assert a[2].races == 0 and a[3].counters["delta_reads_raced"] == READ_TRIES - 1
        assert b[0].public_key in a[3].links and a[0].public_key in b[3].links
        nursery.cancel_scope.cancel()
    assert state == a[2].memory.states2[KEY2]


async def test_a_core2_read_that_keeps_racing_sends_nothing_now_and_the_next_change_sends_it() -> None:
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[2].races, a[2].race = 1_000, NotFoundError
    a[2].memory.states2[KEY2] = queue2.commit(
        queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 3)
    )
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        with trio.fail_after(10):
            while a[2].races > 1_000 - READ_TRIES:
                await trio.testing.wait_all_tasks_blocked(cushion=0.001)
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        assert KEY2 not in b[2].memory.states2 and b[3].stats().get("received_delta2", 0) == 0
        assert a[3].counters["delta_reads_raced"] == 1_000 - a[2].races >= READ_TRIES
        assert b[0].public_key in a[3].links and a[0].public_key in b[3].links  # the link stays
        a[2].races = 0
        a[2].put(queue2.commit(a[2].memory.states2[KEY2], ALICE, now_ms=2, records=records(b"y", 2)))
        state = await held2(b, 5)
        nursery.cancel_scope.cancel()
    assert state == a[2].memory.states2[KEY2]


async def test_a_fork_of_a_core2_queue_meets_and_freezes_on_both_sides() -> None:
    base = queue2.commit(queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"s", 10))
    mine = queue2.commit(base, ALICE, now_ms=2, records=records(b"a", 5))
    copy = queue2.commit(base, ALICE, now_ms=3, records=records(b"b", 3))
    a, b = make(b"1" * 32), make(b"2" * 32)
    a[2].memory.states2[KEY2] = mine
    b[2].memory.states2[KEY2] = copy
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)
        for daemon in (a, b):
            with trio.fail_after(10):
                while not daemon[2].memory.states2[KEY2].forked:
                    await daemon[2].changed.wait()
        nursery.cancel_scope.cancel()
    left, right = a[2].memory.states2[KEY2], b[2].memory.states2[KEY2]
    assert left.held == right.held == (0, 10)
    assert link_summary(left) == link_summary(right)


@dataclasses.dataclass
class Claims2:
    """Stands in for a link's core-2 part: what the peer says it holds of each core-2 queue."""

    held: dict[QueueKey, Summary2]

    def peer_summary(self, key: QueueKey) -> Summary2 | None:
        return self.held.get(key)


@dataclasses.dataclass
class Session2:
    """Stands in for a link's session whose peer holds no core-1 queue of ours."""

    core2: Claims2

    def peer_summary(self, key: QueueKey) -> None:
        return None

    def peer_summaries(self) -> dict[QueueKey, core.Summary]:
        return {}


async def test_writes_to_our_own_core2_queue_wait_while_a_peer_holds_more_of_it() -> None:
    """A store restored from an older copy catches up before it signs, on core 2 as on core 1."""
    held = queue2.commit(queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 10))
    gossip = Gossip(Host1(), ALICE.public_key, host2=Host2())
    session = Session2(Claims2({KEY2: link_summary(held)}))
    gossip.links[b"p" * 32] = PeerLink(b"p" * 32, "peer", "static", session)  # type: ignore[arg-type]
    reason = gossip.behind_reason(KEY2, held_end=4)
    assert reason is not None and "holds 6 more record(s)" in reason and "latticectl peers" in reason
    assert gossip.behind_reason(KEY2, held_end=10) is None
    assert gossip.behind_reason(KEY1, held_end=0) is None


async def test_a_peer_behind_on_a_core2_queue_shows_its_lag_per_queue() -> None:
    """`latticectl peers` counts core-2 queues (its in_sync is no lag anywhere): the peer's held end of
    each one we hold; one we do not hold is not counted."""
    held = queue2.commit(queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 10))
    behind = queue2.commit(queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 4))
    other: QueueKey = (ALICE.public_key, "not-held-here", 0)
    host2 = Host2()
    host2.memory.states2[KEY2] = held
    gossip = Gossip(Host1(), ALICE.public_key, host2=host2)
    session = Session2(Claims2({KEY2: link_summary(behind), other: link_summary(behind)}))
    peer = b"p" * 32
    gossip.links[peer] = PeerLink(peer, "peer", "static", session)  # type: ignore[arg-type]
    assert gossip.peer_lag() == {peer.hex(): {f"{ALICE.public_key.hex()}/two": 6}}
    assert gossip.link_lag(gossip.links[peer]) == {f"{ALICE.public_key.hex()}/two": 6}
    session.core2.held[KEY2] = link_summary(held)
    assert gossip.peer_lag() == {peer.hex(): {f"{ALICE.public_key.hex()}/two": 0}}


async def link_tcp(nursery: trio.Nursery, a: Daemon, b: Daemon) -> None:
    """:func:`link` over loopback TCP."""
    await link_gossips_tcp(nursery, (a[0], a[3]), (b[0], b[3]))


class RelayHost2(Host2):
    """A core-2 host that builds a push's delta without waiting when it can (``delta2_now``)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.waited = 0

    def delta2_now(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        self.now += 1
        return self.memory.delta2_for(key, since, max_records, max_bytes)

    async def delta2_for(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        self.waited += 1
        return await super().delta2_for(key, since, max_records, max_bytes)


async def test_a_relay_passes_core2_pushes_on_from_the_task_that_took_them() -> None:
    """A → B → C: B submits each live push as its reader takes it and sends the next link's delta from
    the task its store's change reached (``delta2_now``), not from a woken driver's ``delta2_for``."""
    a, c = make(b"1" * 32), make(b"3" * 32)
    identity, host2 = Identity.from_seed(b"2" * 32), RelayHost2()
    b: Daemon = (identity, Host1(), host2, Gossip(Host1(), identity.public_key, host2=host2))
    host2.gossip = b[3]
    a[2].memory.states2[KEY2] = queue2.commit(
        queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 1)
    )
    async with trio.open_nursery() as nursery:
        await link_tcp(nursery, a, b)  # (a direct write needs a socket that takes it at once)
        await link_tcp(nursery, b, c)
        await held2(c, 1)
        await trio.testing.wait_all_tasks_blocked()
        waited, now = host2.waited, host2.now
        for i in range(2, 6):  # live pushes, one record each
            a[2].put(
                queue2.commit(a[2].memory.states2[KEY2], ALICE, now_ms=i, records=records(b"y%d" % i, 1))
            )
            await held2(c, i)
        nursery.cancel_scope.cancel()
    assert host2.waited == waited and host2.now > now
    assert c[2].memory.states2[KEY2] == b[2].memory.states2[KEY2] == a[2].memory.states2[KEY2]


class _Later:
    """A merge stored at once whose commit the test settles (as the store's callback on the event loop)."""

    def __init__(self, outcome: tuple[Summary2 | None, bool], error: Exception | None = None) -> None:
        self.outcome, self.error = outcome, error
        self.done = False
        self.callback: Callable[[], None] | None = None

    def when_settled(self, callback: Callable[[], None]) -> bool:
        if self.callback is not None:
            return False
        self.callback = callback
        return True

    def settled(self) -> tuple[Summary2 | None, bool] | None:
        return self.outcome if self.done and self.error is None else None

    async def result(self) -> tuple[Summary2 | None, bool]:
        if self.error is not None:
            raise self.error
        return self.outcome

    def fire(self) -> None:
        self.done = True
        assert self.callback is not None
        self.callback()


class CallbackHost2(Host2):
    def __init__(self) -> None:
        super().__init__()
        self.later: list[_Later] = []
        self.forge = False

    def submit_merge2(self, delta: queue2.Delta, steps: Steps | None, peer: bytes) -> PendingMerge2:
        stored = super().submit_merge2(delta, steps, peer)
        outcome = stored.outcome  # type: ignore[attr-defined]
        pending = _Later((None, False), IntegrityError("forged")) if self.forge else _Later(outcome)
        self.later.append(pending)
        return pending


async def test_core2_acks_go_out_from_the_commits_callback_and_a_failed_merge_ends_the_link() -> None:
    """A host whose merges call back once stored: each ACK2 is written by that callback (no acker or
    driver pass), none before it; a merge that failed ends the link, its error kept for ``queue why``."""
    a = make(b"1" * 32)
    identity, host2 = Identity.from_seed(b"2" * 32), CallbackHost2()
    b: Daemon = (identity, Host1(), host2, Gossip(Host1(), identity.public_key, host2=host2))
    host2.gossip = b[3]
    a[2].memory.states2[KEY2] = queue2.commit(
        queue2.empty_state(*KEY2), ALICE, now_ms=1, records=records(b"x", 1)
    )
    async with trio.open_nursery() as nursery:
        await link_tcp(nursery, a, b)
        await held2(b, 1)
        [peer] = b[3].links.values()
        await trio.testing.wait_all_tasks_blocked()
        for pending in host2.later:
            pending.fire()
        a[2].put(queue2.commit(a[2].memory.states2[KEY2], ALICE, now_ms=2, records=records(b"y", 1)))
        await held2(b, 2)
        await trio.testing.wait_all_tasks_blocked()
        acks, applied = b[3].traffic.get("sent_ack2", 0), b[3].counters["deltas_in"]
        assert len(peer.acks2) == 1  # stored, not yet durable: no ACK
        host2.later[-1].fire()
        assert b[3].traffic["sent_ack2"] == acks + 1 and b[3].counters["deltas_in"] == applied + 1
        assert not peer.acks2 and not peer.wakeup.is_set()

        host2.forge = True
        a[2].put(queue2.commit(a[2].memory.states2[KEY2], ALICE, now_ms=3, records=records(b"z", 1)))
        await held2(b, 3)
        await trio.testing.wait_all_tasks_blocked()
        host2.later[-1].fire()
        with trio.fail_after(10):
            while a[0].public_key in b[3].links:
                changed = trio.Event()
                b[3].on_peer_change = changed.set
                await changed.wait()
        nursery.cancel_scope.cancel()
    assert b[3].traffic["sent_ack2"] == acks + 1
    error = b[3].queue_errors.last(a[0].public_key, KEY2)
    assert error is not None and "forged" in error[1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=4) | st.sampled_from([b"\x94\x10", b"\x9a\x61xx", b"\x93\x01", b"\x80"])))
def test_traffic_counters_are_named_by_the_messages_type_as_before_the_names_were_kept(
    messages: list[bytes],
) -> None:
    """``Gossip._count`` keeps the counters' names by a message's first two bytes: each message counts
    under the name its type gives (``message_type_name``, then the core-2 codes), as it did, and only
    short arrays' prefixes are kept (a peer's garbage is counted, not remembered)."""
    counted: dict[str, int] = {}
    expected: dict[str, int] = {}
    holder = type("Holder", (), {"traffic": counted})()
    for direction in ("sent", "received"):
        for message in messages:
            Gossip._count(holder, direction, message)  # type: ignore[arg-type]
            kind = message_type_name(message)
            if kind == "other" and len(message) >= 2 and message[1] in CORE2_NAMES:
                kind = CORE2_NAMES[message[1]]
            expected[f"{direction}_{kind}"] = expected.get(f"{direction}_{kind}", 0) + 1
            expected[f"{direction}_{kind}_bytes"] = expected.get(f"{direction}_{kind}_bytes", 0) + len(
                message
            )
    assert counted == expected
    assert all(len(first) == 2 and 0x91 <= first[0] <= 0x9F for _, first in gossip_module._NAMES_BY_BYTES)
