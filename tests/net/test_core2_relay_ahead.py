"""A core-2 relay on the daemon's store (A → B → C over loopback TCP, B a real :class:`Engine`): a live
push is verified on B's event loop and passed on to C before B's commit, whose ACK alone waits for it;
a forged push is passed on to nobody and ends its link; the storage thread takes the event loop's
verification and join as they are, and such merges may share a commit."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.core2_sim import AsyncCore2Host, MemoryCore2Host
from support.gossip_hosts import MemoryReplicaHost
from support.gossip_tcp import link_gossips_tcp

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import IntegrityError
from latticed.net import core2_ahead
from latticed.net.core2_ahead import AHEAD_QUEUES, AheadPushes
from latticed.net.core2_engine_host import EngineCore2Host, MergeSteps2
from latticed.net.gossip import Gossip
from latticed.protocol.core2_steps import Outgoing2, outgoing
from latticed.protocol.core2_wire import link_summary
from latticed.protocol.replication import QueueKey
from latticed.storage.batch import Batch
from latticed.storage.engine import Engine
from latticed.storage.jobs import Job, WriterView

ALICE, BOB, CAROL = (Identity.from_seed(s * 32) for s in (b"1", b"2", b"3"))
KEY: QueueKey = (ALICE.public_key, "two", 0)


class Memory2(AsyncCore2Host):
    """An in-memory core-2 host telling its gossip of each change; ``forge`` swaps a push's records."""

    def __init__(self) -> None:
        super().__init__(MemoryCore2Host())
        self.gossip: Gossip | None = None
        self.changed = trio.Event()
        self.forge = False

    def submit_merge2(self, delta: queue2.Delta, steps: Any, peer: bytes) -> Any:
        pending = super().submit_merge2(delta, steps, peer)
        state = self.memory.states2.get(KEY)
        if state is not None and self.gossip is not None:
            self.gossip.local_change2(KEY, link_summary(state))
        self.changed.set()
        self.changed = trio.Event()
        return pending

    async def delta2_for(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        out = await super().delta2_for(key, since, max_records, max_bytes)
        if self.forge and out is not None and out.delta.records:
            forged = tuple(Record(value=b"forged") for _ in out.delta.records)
            out = dataclasses.replace(out, delta=dataclasses.replace(out.delta, records=forged))
        return out

    def put(self, records: list[Record]) -> None:
        before = self.memory.states2.get(KEY) or queue2.empty_state(*KEY)
        self.memory.states2[KEY] = queue2.commit(before, ALICE, now_ms=1, records=records)
        assert self.gossip is not None
        self.gossip.local_change2(KEY, link_summary(self.memory.states2[KEY]))


async def held(host: Memory2, end: int) -> QueueState2:
    with trio.fail_after(10):
        while (state := host.memory.states2.get(KEY)) is None or state.held[1] < end:
            await host.changed.wait()
    return state


@contextmanager
def storage_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """B's storage thread waits in each merge until the event is set (its commit is held back)."""
    gate = threading.Event()
    gate.set()
    apply = MergeSteps2.apply

    def gated(self: MergeSteps2, batch: Batch, writer: WriterView) -> None:
        assert gate.wait(10)
        apply(self, batch, writer)

    monkeypatch.setattr(MergeSteps2, "apply", gated)
    try:
        yield gate
    finally:
        gate.set()


async def acks_sent(gossip: Gossip, count: int) -> None:
    peer = gossip.links[ALICE.public_key]
    with trio.fail_after(10):
        while gossip.traffic.get("sent_ack2", 0) < count:
            peer.drained = trio.Event()
            await peer.drained.wait()


async def test_a_live_push_is_relayed_before_its_commit_and_a_forged_one_to_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B passes A's live push on to C while its own commit of it is held back, and ACKs it to A only
    once that commit is done; a forged push reaches nobody, stores nothing and ends A's link."""
    a2, c2 = Memory2(), Memory2()
    a, c = (
        (ALICE, Gossip(MemoryReplicaHost(), ALICE.public_key, host2=a2)),
        (
            CAROL,
            Gossip(MemoryReplicaHost(), CAROL.public_key, host2=c2),
        ),
    )
    a2.gossip, c2.gossip = a[1], c[1]
    a2.put([Record(value=b"x-0")])
    with storage_gate(monkeypatch) as gate:
        async with Engine.open(tmp_path, BOB) as engine, trio.open_nursery() as nursery:
            b2 = EngineCore2Host(engine)
            b = (BOB, Gossip(MemoryReplicaHost(), BOB.public_key, host2=b2))

            def on_change2(q: int, state: QueueState2 | None) -> None:
                if state is not None:
                    b[1].local_change2((state.owner, state.name, state.kind), link_summary(state))

            with engine.core2.subscribed(on_change2):
                await link_gossips_tcp(nursery, a, b)
                await link_gossips_tcp(nursery, b, c)
                await held(c2, 1)
                await acks_sent(b[1], 1)
                for i in range(2, 5):  # live pushes: at C while B's commit of them waits
                    gate.clear()
                    acks = b[1].traffic["sent_ack2"]
                    a2.put([Record(value=b"y-%d" % i)])
                    assert (await held(c2, i)).records()[-1].value == b"y-%d" % i
                    await trio.testing.wait_all_tasks_blocked()
                    assert b[1].traffic["sent_ack2"] == acks  # not durable yet: no ACK
                    gate.set()
                    await acks_sent(b[1], acks + 1)
                q = engine.core2.lookup(*KEY)
                assert q is not None and (await engine.core2.value(q)).held[1] == 4

                # A forged push: B's event loop does not pass it on, its storage refuses it.
                gate.clear()
                received = c[1].traffic.get("received_delta2", 0)
                a2.forge = True
                a2.put([Record(value=b"z-5")])
                await trio.testing.wait_all_tasks_blocked()
                assert c[1].traffic.get("received_delta2", 0) == received
                gate.set()
                with trio.fail_after(10):
                    while ALICE.public_key in b[1].links:
                        changed = trio.Event()
                        b[1].on_peer_change = changed.set
                        await changed.wait()
                await trio.testing.wait_all_tasks_blocked()
                assert c[1].traffic.get("received_delta2", 0) == received
                assert c2.memory.states2[KEY].held[1] == 4
                assert (await engine.core2.value(q)).held[1] == 4
                error = b[1].queue_errors.last(ALICE.public_key, KEY)
                assert error is not None and "hash" in error[1]
                nursery.cancel_scope.cancel()


async def test_the_storage_thread_takes_the_event_loops_verification_and_pushes_share_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live pushes submitted back to back are verified against the value ahead of their commit (not
    again on the storage thread), may wait for company (a tail here is shown them ahead), and are
    served to the next link at once (the newest as it came, to a peer holding what it was checked
    against)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    verified_on: list[str] = []
    verify = queue2.verify_delta

    def counted(state: QueueState2, d: queue2.Delta) -> queue2.Verified:
        verified_on.append(threading.current_thread().name)
        return verify(state, d)

    monkeypatch.setattr(queue2, "verify_delta", counted)
    joined_on: list[str] = []
    join = queue2.join_verified

    def counted_join(state: QueueState2, v: queue2.Verified) -> queue2.Merged:
        joined_on.append(threading.current_thread().name)
        return join(state, v)

    monkeypatch.setattr(queue2, "join_verified", counted_join)
    one_pass = core2_ahead.next_push

    def counted_pass(state: QueueState2, d: queue2.Delta, steps: Any) -> object:
        done = one_pass(state, d, steps)
        if done is not None:  # verified and joined in one pass (core2_live)
            verified_on.append(threading.current_thread().name)
            joined_on.append(threading.current_thread().name)
        return done

    monkeypatch.setattr(core2_ahead, "next_push", counted_pass)
    main = threading.current_thread().name
    async with Engine.open(tmp_path / "a", ALICE) as a, Engine.open(tmp_path / "b", BOB) as b:
        owner, relay = EngineCore2Host(a), EngineCore2Host(b)
        q = await a.core2.create("two")
        await a.core2.commit(q, [Record(value=b"v-0")])
        first = await owner.delta2_for(KEY, None, 100, 1 << 20)
        assert first is not None
        summary, _ = await relay.submit_merge2(first.delta, first.steps, b"p" * 32).result()
        assert summary is not None
        since, pushes, befores = summary, [], []
        for i in range(1, 4):  # each its own head: a live push apiece
            befores.append(since.core)
            await a.core2.commit(q, [Record(value=b"v-%d" % i)])
            push = await owner.delta2_for(KEY, since.core, 100, 1 << 20)
            assert push is not None
            pushes.append(push)
            since = owner.summaries2()[KEY]
        verified_on.clear()
        joined_on.clear()
        pending = [relay.submit_merge2(p.delta, p.steps, b"p" * 32) for p in pushes]
        aheads = [getattr(p, "ahead", None) for p in pending]
        assert None not in aheads and aheads[-1] == owner.summaries2()[KEY]
        assert verified_on == [main] * 3  # all on the event loop
        assert all(p._job.may_linger for p in pending)  # type: ignore[attr-defined]
        # The next link is served the three records before any commit, from memory.
        out = relay.delta2_now(KEY, summary.core, 100, 1 << 20)
        assert out is not None and [r.value for r in out.delta.records] == [b"v-1", b"v-2", b"v-3"]
        # A link whose peer holds what the newest push was checked against is passed it as it came.
        newest = relay.delta2_now(KEY, befores[-1], 100, 1 << 20)
        assert newest is not None and newest.delta is pushes[-1].delta and newest.steps is pushes[-1].steps
        assert newest.implied == aheads[-1]
        for p in pending:
            assert (await p.result())[1]
        assert verified_on == [main] * 3  # the storage thread took them as verified
        assert joined_on == [main] * 3  # and as joined: written without a second join
        rq = b.core2.lookup(*KEY)
        assert rq is not None and link_summary(await b.core2.value(rq)) == owner.summaries2()[KEY]
        # Committed, the newest push is still passed on as it came to a link that asks only now.
        late = relay.delta2_now(KEY, befores[-1], 100, 1 << 20)
        assert late is not None and late.delta is pushes[-1].delta and late.steps is pushes[-1].steps
        assert relay.ahead.relay(rq, befores[-1], 100, 1 << 20) is None  # (not without the loaded value)
        assert relay.ahead.value(rq) is None  # committed: the loaded value is the one
        assert relay.ahead.relay(rq, befores[-1], 100, 1 << 20, b.core2.loaded(rq)) is None  # nor is it kept

        # A forged push is not taken ahead: the storage thread refuses it as before.
        await a.core2.commit(q, [Record(value=b"v-4")])
        push = await owner.delta2_for(KEY, since.core, 100, 1 << 20)
        assert push is not None
        forged = dataclasses.replace(push.delta, records=(Record(value=b"forged"),))
        bad = relay.submit_merge2(forged, push.steps, b"p" * 32)
        assert getattr(bad, "ahead", None) is None and relay.ahead.value(rq) is None
        with pytest.raises(IntegrityError):
            await bad.result()
        # A tail here follows the queue: it is woken for the push ahead of the commit (it shows it), so
        # the commit may still wait for company.
        following = b.core2.changed(rq)
        good = relay.submit_merge2(push.delta, push.steps, b"p" * 32)
        assert getattr(good, "ahead", None) is not None and good._job.may_linger  # type: ignore[attr-defined]
        assert following.is_set()
        assert (await good.result())[1]


def test_values_ahead_are_kept_while_their_merge_is_pending_and_for_a_bounded_number_of_queues() -> None:
    class Started(Job):
        def __init__(self) -> None:
            super().__init__()
            self.done = threading.Event()

    ahead, state = AheadPushes(), queue2.empty_state(*KEY)
    jobs = [Started() for _ in range(AHEAD_QUEUES + 1)]
    for q, job in enumerate(jobs):
        ahead.note(q, state, job)
    assert ahead.value(0) is None and ahead.value(AHEAD_QUEUES) is state  # the oldest queue went
    assert ahead.value(AHEAD_QUEUES, state) is None  # the loaded value is as far: it serves
    jobs[1].done.set()  # committed (or failed): the loaded value decides again
    assert ahead.value(1) is None and ahead.value(2) is state


def test_a_committed_push_is_passed_on_as_it_came_only_while_the_loaded_value_is_the_one_it_brought() -> None:
    """After its commit, the newest push checked here still goes out as it came to a peer holding what
    it was checked against, if the loaded value is the one it brought; not if that value moved on or
    the merge failed (then a delta is built from the value, as before)."""

    class Started(Job):
        def __init__(self) -> None:
            super().__init__()
            self.done = threading.Event()

    owner = queue2.commit(queue2.empty_state(*KEY), ALICE, now_ms=1, records=[Record(value=b"a")])
    before = owner
    owner = queue2.commit(owner, ALICE, now_ms=2, records=[Record(value=b"b")])
    later = queue2.commit(owner, ALICE, now_ms=3, records=[Record(value=b"c")])
    since = queue2.summary(before)
    push = outgoing(owner, since, 100)
    for failed in (False, True):
        ahead, job = AheadPushes(), Started()
        checked = ahead.check(7, before, push.delta, push.steps)
        assert checked is not None and checked.value == owner
        ahead.note_push(7, checked, job, push.delta, push.steps)
        pending = ahead.relay(7, since, 100, 1 << 20)
        assert pending is not None and pending.delta is push.delta
        job.done.set()
        if failed:
            job.error = IntegrityError("the merge failed")
        late = ahead.relay(7, since, 100, 1 << 20, owner)
        assert (late is None) is failed
        if not failed:
            assert late is not None and late.delta is push.delta and late.steps is push.steps
        assert ahead.relay(7, since, 100, 1 << 20, later) is None  # the loaded value moved on
        assert ahead.relay(7, since, 100, 1 << 20, before) is None  # or is not the push's
        assert ahead.relay(7, queue2.summary(owner), 100, 1 << 20, owner) is None  # the peer has it
