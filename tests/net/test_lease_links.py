"""The trio shell of lease forwarding (latticed/net/leasing.py) between two daemons' link ends, wired
back to back in memory: answers, refusals, timeouts, a caller that leaves (CANCEL, and what was granted
meanwhile given back), a link that drops, and waiting for a link to come up. Time is trio's autojump
clock: no sleeps."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from latticed.errors import LeaseError, OwnerUnreachableError
from latticed.net.gossip import PeerLink
from latticed.net.leasing import LeaseLinks, LinkLostError
from latticed.protocol.replication import ReplicationSession

OWNER, WORKER = b"\x01" * 32, b"\x02" * 32


class Server:
    """An owner's answers: ``take`` grants at once or after ``gate``, ``slow`` never answers."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.cancelled = 0
        self.gone: list[bytes] = []

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        if op == "take":
            return {"leases": [{"lease": "t.1"}], "from": peer.hex()[:4]}
        if op == "gated":
            try:
                await self.gate.wait()
            except trio.Cancelled:
                self.cancelled += 1
                raise
            return {"leases": [{"lease": "t.late"}]}
        if op == "slow":
            await trio.sleep_forever()
        raise LeaseError(f"no such lease {body.get('lease')}")

    def peer_gone(self, peer: bytes) -> None:
        self.gone.append(peer)


class Wire:
    """Two link ends back to back: what one side queues in its link is delivered to the other."""

    def __init__(self, owner: LeaseLinks, worker: LeaseLinks) -> None:
        self.owner, self.worker = owner, worker
        self.owner_end = PeerLink(WORKER, "mem", "incoming", ReplicationSession())
        self.worker_end = PeerLink(OWNER, "mem", "static", ReplicationSession())

    def up(self) -> None:
        self.owner.link_up(self.owner_end)
        self.worker.link_up(self.worker_end)

    def down(self) -> None:
        self.worker.link_down(self.worker_end)
        self.owner.link_down(self.owner_end)

    async def pump(self, src: PeerLink, dst_links: LeaseLinks, dst: PeerLink) -> None:
        while True:
            await src.wakeup.wait()
            src.wakeup = trio.Event()
            messages, src.extra_out = src.extra_out, []
            for message in messages:
                dst_links.receive(dst, message)


async def setup(
    nursery: trio.Nursery, *, dial: bool = True
) -> tuple[LeaseLinks, LeaseLinks, Server, Wire, list[bytes]]:
    dialled: list[bytes] = []

    def dial_fn(peer: bytes) -> bool:
        dialled.append(peer)
        return dial

    owner, worker, server = LeaseLinks(dial=lambda _: False), LeaseLinks(dial=dial_fn), Server()
    await nursery.start(owner.run, server)
    await nursery.start(worker.run, Server())  # answers the owner's requests, if it sent any
    wire = Wire(owner, worker)
    nursery.start_soon(wire.pump, wire.worker_end, owner, wire.owner_end)
    nursery.start_soon(wire.pump, wire.owner_end, worker, wire.worker_end)
    return owner, worker, server, wire, dialled


async def test_answers_and_typed_refusals_come_back_to_the_caller() -> None:
    async with trio.open_nursery() as nursery:
        _, worker, _, wire, _ = await setup(nursery)
        wire.up()
        answer = await worker.call(OWNER, "take", {"n": 1}, timeout=5, connect_within=0)
        assert answer == {"leases": [{"lease": "t.1"}], "from": WORKER.hex()[:4]}  # the link's identity
        with pytest.raises(LeaseError, match="no such lease x"):
            await worker.call(OWNER, "ack", {"lease": "x"}, timeout=5, connect_within=0)
        nursery.cancel_scope.cancel()


async def test_no_answer_in_time_is_unreachable_and_the_owner_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        _, worker, server, wire, _ = await setup(nursery)
        wire.up()
        start = trio.current_time()
        with pytest.raises(OwnerUnreachableError, match="did not answer gated in time"):
            await worker.call(OWNER, "gated", {}, timeout=3, connect_within=0)
        assert trio.current_time() - start == pytest.approx(3, abs=0.01)
        await trio.testing.wait_all_tasks_blocked()
        assert server.cancelled == 1  # the CANCEL reached the owner: it stopped waiting for records
        nursery.cancel_scope.cancel()


async def test_a_caller_that_leaves_gets_what_was_granted_given_back() -> None:
    given_back: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        _, worker, server, wire, _ = await setup(nursery)
        wire.up()

        async def caller(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await worker.call(
                    OWNER, "gated", {}, timeout=60, connect_within=0, give_back=given_back.append
                )

        scope = await nursery.start(caller)
        await trio.testing.wait_all_tasks_blocked()
        # the owner grants just as the caller leaves: the answer crosses the CANCEL
        server.gate.set()
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert given_back == [{"leases": [{"lease": "t.late"}]}]  # once, whichever came first
        nursery.cancel_scope.cancel()


def start_slow_call(nursery: trio.Nursery, worker: LeaseLinks) -> list[BaseException]:
    """Start a call the owner never answers; the list gets the LinkLostError that ends it."""
    failure: list[BaseException] = []

    async def caller() -> None:
        try:
            await worker.call(OWNER, "slow", {}, timeout=60, connect_within=0)
        except LinkLostError as exc:
            failure.append(exc)

    nursery.start_soon(caller)
    return failure


async def test_a_dropped_link_fails_pending_calls_and_tells_the_owner() -> None:
    async with trio.open_nursery() as nursery:
        _, worker, server, wire, _ = await setup(nursery)
        wire.up()
        failure = start_slow_call(nursery, worker)
        await trio.testing.wait_all_tasks_blocked()
        wire.down()
        await trio.testing.wait_all_tasks_blocked()
        assert len(failure) == 1 and isinstance(failure[0], OwnerUnreachableError)
        assert server.gone == [WORKER]
        nursery.cancel_scope.cancel()


async def test_a_call_without_a_link_dials_and_waits_for_one(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        _, worker, _, wire, dialled = await setup(nursery)
        with pytest.raises(OwnerUnreachableError, match="no link"):
            await worker.call(OWNER, "take", {}, timeout=5, connect_within=0)  # 0: do not wait
        start = trio.current_time()
        with pytest.raises(OwnerUnreachableError, match="within 2s"):
            await worker.call(OWNER, "take", {}, timeout=5, connect_within=2)
        assert trio.current_time() - start == pytest.approx(2, abs=0.01) and dialled[0] == OWNER

        async def link_comes_up() -> None:
            await trio.sleep(1.5)
            wire.up()

        nursery.start_soon(link_comes_up)
        answer = await worker.call(OWNER, "take", {}, timeout=5, connect_within=10)
        assert answer["leases"] == [{"lease": "t.1"}] and 1.5 <= trio.current_time() - start - 2 < 2
        nursery.cancel_scope.cancel()


async def test_without_any_address_the_error_says_so(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        _, worker, _, _, _ = await setup(nursery, dial=False)
        with pytest.raises(OwnerUnreachableError, match="no address of it is known"):
            await worker.call(OWNER, "take", {}, timeout=5, connect_within=1)
        nursery.cancel_scope.cancel()


async def test_a_new_connection_to_the_same_peer_ends_the_calls_waiting_on_the_old_one() -> None:
    async with trio.open_nursery() as nursery:
        _, worker, _, wire, _ = await setup(nursery)
        wire.up()
        failure = start_slow_call(nursery, worker)
        await trio.testing.wait_all_tasks_blocked()
        worker.link_up(PeerLink(OWNER, "mem2", "static", ReplicationSession()))  # replaces the old link
        await trio.testing.wait_all_tasks_blocked()
        assert len(failure) == 1
        worker.link_down(wire.worker_end)  # the old link's end, reported late: changes nothing
        assert worker.connected(OWNER)
        nursery.cancel_scope.cancel()
