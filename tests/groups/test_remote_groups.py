"""The owner's side of remote consumers (latticed/groups/remote.py) on a real engine and group service,
without a network: what a peer may do (its own leases only, the allow-list), settlements repeated after
a lost link answered as the first time, payloads sent only past what the caller holds, and the detaching
of a vanished peer's consumers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import LeaseError, MalformedError, NotAllowedError, NotFoundError
from latticed.groups.group_sources import find_source, held
from latticed.groups.lease_server import RemoteLeaseServer
from latticed.groups.remote import policy_meta
from latticed.groups.service import GroupService
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer
from latticed.storage.wiring import ChangeFanout

OWNER = Identity.from_seed(b"o" * 32)
PEER, OTHER = b"\x05" * 32, b"\x06" * 32


@asynccontextmanager
async def owner(tmp_path: Path, records: int = 4) -> AsyncIterator[tuple[GroupService, RemoteLeaseServer]]:
    changes = ChangeFanout()
    async with Engine.open(tmp_path, OWNER, changes=changes) as engine, trio.open_nursery() as nursery:
        groups: GroupService = await nursery.start(GroupService(engine, changes, Sealer(engine)).run)
        q = await engine.create_queue("jobs", {})
        await engine.append(q, [Record(b"r%d" % i) for i in range(records)])
        yield groups, RemoteLeaseServer(groups)
        nursery.cancel_scope.cancel()


def source() -> str:
    return f"{OWNER.public_key.hex()}/jobs"


async def take(server: RemoteLeaseServer, peer: bytes, n: int = 1, **body: Any) -> list[dict[str, Any]]:
    answer = await server.serve(peer, "take", {"group": "g", "consumer": "pid1.c1", "n": n, **body})
    leases: list[dict[str, Any]] = answer["leases"]
    return leases


async def test_payloads_go_only_past_what_the_caller_holds(tmp_path: Path) -> None:
    async with owner(tmp_path) as (groups, server):
        await groups.create("g", ["jobs"])
        first, second = await take(server, PEER, 2, have={source(): 1})
        assert "record" not in first  # offset 0: the caller holds it
        assert second["record"] == [None, b"r1", second["record"][2], None]  # offset 1: it does not
        assert first["consumer"] == PEER.hex()[:16] + "/pid1.c1"
        [third] = await take(server, PEER, 1)  # no "have": everything comes with its payload
        assert third["record"][1] == b"r2"


async def test_a_peer_settles_only_its_own_leases_and_a_retry_gets_the_first_answer(tmp_path: Path) -> None:
    async with owner(tmp_path) as (groups, server):
        rt = await groups.create("g", ["jobs"])
        [mine] = await take(server, PEER)
        [theirs] = await take(server, OTHER)
        refused = await server.serve(PEER, "ack", {"group": "g", "leases": [theirs["lease"]]})
        assert refused["results"][0]["error"]["code"] == "lease"
        with pytest.raises(LeaseError, match="not granted"):
            await server.serve(PEER, "nack", {"group": "g", "lease": theirs["lease"]})
        first = await server.serve(PEER, "ack", {"group": "g", "leases": [mine["lease"]]})
        assert first["results"][0]["ok"] and first["results"][0]["offset"] == mine["offset"]
        # the answer was lost with the link: sent again, flagged as a retry, it gets the same answer...
        again = await server.serve(PEER, "ack", {"group": "g", "leases": [mine["lease"]], "retry": True})
        assert again == first
        # ...while a plain second ack is stale, as locally
        stale = await server.serve(PEER, "ack", {"group": "g", "leases": [mine["lease"]]})
        assert stale["results"][0]["error"]["code"] == "lease"
        brief = await server.serve(
            OTHER, "ack", {"group": "g", "leases": [theirs["lease"], "x.1"], "brief": True}
        )
        assert [f[:2] for f in brief["failed"]] == [[1, "lease"]]
        assert rt.dispatcher.stats(groups.now()).done == 2


async def test_the_allow_list_and_unknown_groups_and_ops(tmp_path: Path) -> None:
    async with owner(tmp_path) as (groups, server):
        await groups.create(
            "g", ["jobs"], extra_meta={k: v for k, v in policy_meta([OTHER.hex()]).items() if v}
        )
        with pytest.raises(NotAllowedError, match="allow-list"):
            await take(server, PEER)
        assert await take(server, OTHER)
        with pytest.raises(NotFoundError):
            await server.serve(OTHER, "take", {"group": "nope", "consumer": "c", "n": 1})
        with pytest.raises(MalformedError, match="unknown lease op"):
            await server.serve(OTHER, "drop_table", {"group": "g"})
        with pytest.raises(MalformedError):
            await server.serve(OTHER, "take", {"group": "g", "consumer": "", "n": 1})


async def test_a_vanished_peers_consumers_keep_their_leases_until_they_expire(tmp_path: Path) -> None:
    async with owner(tmp_path) as (groups, server):
        rt = await groups.create("g", ["jobs"])
        [lease] = await take(server, PEER)
        assert rt.dispatcher.consumers() == [PEER.hex()[:16] + "/pid1.c1"]
        server.peer_gone(PEER)
        assert rt.dispatcher.holder(lease["lease"]) is not None  # still held: an ack over a new link counts
        assert rt.detached == {PEER.hex()[:16] + "/pid1.c1"}
        answer = await server.serve(PEER, "ack", {"group": "g", "leases": [lease["lease"]]})
        assert answer["results"][0]["ok"]
        assert rt.dispatcher.consumers() == []  # unregistered once its last lease ended


async def test_remote_consumers_go_on_when_the_source_moves_to_core_2(tmp_path: Path) -> None:
    async with owner(tmp_path) as (groups, server):
        rt = await groups.create("g", ["jobs"])
        [first] = await take(server, PEER, 1, have={source(): 1})
        engine = groups.engine
        q = engine.resolve("jobs")
        await engine.core2.upgrade_core1(q, engine.state(q))  # type: ignore[attr-defined]
        await engine.append(q, [Record(b"after")])
        assert find_source(engine, OWNER.public_key, "jobs") == q and held(engine, q) == (0, 5)
        while rt.cursors[source()] < 5:  # the feeder, woken by the core-2 commit, offers it
            await rt.changed.wait()
        leases = await take(server, PEER, 4, have={source(): 1})
        assert [lease["offset"] for lease in leases] == [1, 2, 3, 4]  # nothing twice, nothing lost
        assert leases[-1]["record"][1] == b"after"
        answer = await server.serve(PEER, "ack", {"group": "g", "leases": [first["lease"]]})
        assert answer["results"][0]["ok"]
