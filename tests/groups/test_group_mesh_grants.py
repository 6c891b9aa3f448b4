"""A worker's daemon against a hostile group owner that speaks the real lease-forwarding protocol: its
grants are checked against the group's signed definition (replicated here), the verified local copy of a
record wins over a payload the owner sent, a sealed queue is never opened for a group that does not
consume it, and a malformed grant is a clear error (the lease given back), never handed to a worker."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.meshlinks import connect, start

from cli.output import to_json
from latticed.api.client.group_client import lease_from_wire
from latticed.crdt.head import KIND_GROUP
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import IntegrityError, NotReaderError
from latticed.facades.lattice_queue import LatticeQueue
from latticed.groups.remote import RemoteGroup, RemoteGroups
from latticed.groups.service import GroupService
from latticed.privacy import crypto
from latticed.privacy import meta as sealed_meta
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer
from latticed.storage.wiring import ChangeFanout

OWNER, WORKER = Identity.from_seed(b"o" * 32), Identity.from_seed(b"w" * 32)


@dataclass
class HostileOwner:
    """Answers every take with ``grants``; notes what was given back."""

    grants: list[Any] = field(default_factory=list)
    given_back: list[str] = field(default_factory=list)

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        if op == "give_back":
            self.given_back += body["leases"]
            return {"count": len(body["leases"])}
        return {"leases": self.grants}

    def peer_gone(self, peer: bytes) -> None:
        pass


def grant(queue: str, offset: int, **extra: Any) -> dict[str, Any]:
    return {
        "queue": queue,
        "offset": offset,
        "lease": f"t.{offset}",
        "attempt": 1,
        "consumer": f"{WORKER.public_key.hex()[:16]}/pid1.c1",
        "correlation_id": "c",
        "leased_at": 1.0,
        "expires_at": 99.0,
        **extra,
    }


def sealed_for_worker() -> LatticeQueue:
    """A sealed queue of a third identity, WORKER among its readers (a foreign group's source)."""
    queue = LatticeQueue.create(Identity.generate(), "secret")
    content_key = secrets.token_bytes(32)
    for key, value in sealed_meta.seal_new(
        queue.owner, [WORKER.public_key], content_key, secrets.token_bytes
    ).items():
        queue.set_meta(key, value)
    run = crypto.seal_run(
        content_key, queue.state.queue_id, 0, [Record(b"plaintext")], secrets.token_bytes(24)
    )
    queue.offer_many(run)
    queue.commit()
    return queue


@dataclass
class Worker:
    remote: RemoteGroups
    owner: HostileOwner
    sealed: str

    @property
    def jobs(self) -> str:
        return f"{OWNER.public_key.hex()}/jobs"

    async def take(self, name: str = "g") -> list[dict[str, Any]]:
        return await self.remote.take(RemoteGroup(OWNER.public_key, name), "pid1.c1", 10, None, None)


@asynccontextmanager
async def worker(tmp_path: Path, core: int = 1) -> AsyncIterator[Worker]:
    """WORKER's daemon holding replicas of OWNER's queue ``jobs`` (r0..r3, on fork core ``core``) and
    group ``g`` over it, and of a sealed queue it reads; OWNER's end of the link is :class:`HostileOwner`."""
    changes = ChangeFanout()
    (tmp_path / "o").mkdir()
    (tmp_path / "w").mkdir()
    async with (
        Engine.open(tmp_path / "o", OWNER, changes=changes) as theirs,
        Engine.open(tmp_path / "w", WORKER) as mine,
        trio.open_nursery() as nursery,
    ):
        groups: GroupService = await nursery.start(GroupService(theirs, changes, Sealer(theirs)).run)
        q = await theirs.create_queue("jobs", {}, core=core)
        await theirs.append(q, [Record(b"r%d" % i) for i in range(4)])
        await groups.create("g", ["jobs"])
        if core == 2:
            await mine.core2.merge(await theirs.core2.delta_for(q, None))
        for name, kind in (("jobs", 0), ("g", KIND_GROUP))[core - 1 :]:
            kw = {"kind": kind} if kind else {}
            await mine.merge_delta(await theirs.delta_for(OWNER.public_key, name, None, **kw))
        sealed = sealed_for_worker()
        await mine.merge_delta(sealed.delta())
        owner = HostileOwner()
        owner_links, worker_links = await start(nursery, owner), await start(nursery)
        connect(nursery, owner_links, OWNER.public_key, worker_links, WORKER.public_key)
        remote = RemoteGroups(mine, worker_links, Sealer(mine))
        await nursery.start(remote.run)
        yield Worker(remote, owner, f"{sealed.owner.hex()}/secret")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("core", [1, 2], ids=["core1", "core2"])
async def test_the_verified_local_copy_wins_over_a_payload_the_owner_forged(
    tmp_path: Path, core: int
) -> None:
    async with worker(tmp_path, core) as w:
        w.owner.grants = [grant(w.jobs, 1, record=[None, b"forged", 1, None])]
        [lease] = await w.take()
        assert (lease["value"], lease["payload_from"]) == (b"r1", "replica")


async def test_a_sealed_queue_outside_the_groups_sources_is_never_opened(tmp_path: Path) -> None:
    async with worker(tmp_path) as w:
        w.owner.grants = [grant(w.sealed, 0, sealed=True), grant(w.jobs, 2)]
        [lease] = await w.take()  # the group's own record still comes
        assert lease["offset"] == 2 and lease["value"] == b"r2"
        await trio.testing.wait_all_tasks_blocked()
        assert w.owner.given_back == ["t.0"]
        w.owner.grants = [grant(w.sealed, 0, sealed=True)]
        with pytest.raises(IntegrityError, match="not one of the group's sources"):
            await w.remote.take(RemoteGroup(OWNER.public_key, "g"), "pid1.c1", 1, None, None, op="dequeue")


async def test_without_the_groups_definition_here_no_sealed_queue_is_opened(tmp_path: Path) -> None:
    async with worker(tmp_path) as w:
        w.owner.grants = [grant(w.sealed, 0)]
        with pytest.raises(NotReaderError, match="has not replicated here"):
            await w.remote.take(RemoteGroup(OWNER.public_key, "h"), "pid1.c1", 1, None, None, op="dequeue")


@pytest.mark.parametrize(
    "bad",
    [
        {"record": [None, b"x", 1, [[1, 2, 3]]]},
        {"record": [None, b"x", 1, [["h", 5]]]},
        {"record": [None, b"x", 1, "headers"]},
        {"record": [None, "text", 1, None]},
        {"offset": -1},
        {"attempt": "1"},
    ],
)
async def test_a_malformed_grant_is_a_clear_error_and_given_back(tmp_path: Path, bad: dict[str, Any]) -> None:
    async with worker(tmp_path) as w:
        w.owner.grants = [{**grant(w.jobs, 9), **bad}]  # offset 9: not held here, the owner's payload
        with pytest.raises(IntegrityError, match=r"the owner of group .* sent"):
            await w.remote.take(RemoteGroup(OWNER.public_key, "g"), "pid1.c1", 1, None, None, op="dequeue")
        await trio.testing.wait_all_tasks_blocked()
        assert w.owner.given_back == ["t.9"]


def test_dequeue_json_says_where_a_payload_came_from() -> None:
    wire = {**grant("o/jobs", 1), "group": "o/g", "value": b"v", "timestamp": 1, "payload_from": "owner"}
    assert to_json(lease_from_wire(wire))["payload_from"] == "owner"
    assert lease_from_wire({**wire, "payload_from": None}).payload_from is None  # a local group's lease
