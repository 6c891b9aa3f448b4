"""A forwarded bulk offer's records as columns (feature ``produce-columns``): the owner's real engine and
offer server, producers' daemons linked to it by the real lease-forwarding sub-protocol in memory
(meshlinks). Where the link agreed on the feature the columns go as they came and are stored as the list
would be (producer header, offsets); where not, the list goes; a retry in either form is a retry; a
hostile peer's malformed columns are refused as its protocol error, nothing written, the link kept."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from support import meshlinks

from latticed.api.client.packed_offer import packed_fields
from latticed.crdt.records import MAX_KEY_BYTES, MAX_VALUE_BYTES
from latticed.crdt.signing import Identity
from latticed.errors import RemoteProtocolError
from latticed.net.leasing import LeaseLinks
from latticed.produce.forward import PRODUCE_COLUMNS_FEATURE, PRODUCE_FEATURE, RemoteOffers
from latticed.produce.offered_columns import LINK_FIELDS, OfferedColumns, offered_columns
from latticed.produce.owner import MAX_RECORDS, PRODUCE_OP, OfferServer, WithOffers
from latticed.produce.policy import PRODUCER_HEADER, producers_meta
from latticed.protocol.versions import UNSTATED, Agreement
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer

OWNER, B = Identity.from_seed(b"a" * 32), Identity.from_seed(b"b" * 32)
STAMP = [PRODUCER_HEADER, B.public_hex.encode()]


class Seen:
    """The owner's server, keeping the body of each ``produce`` it is asked; ``lose`` answers are lost
    after the commit (as when the link drops after the owner wrote)."""

    def __init__(self, inner: WithOffers, lose: int = 0) -> None:
        self.inner, self.lose = inner, lose
        self.bodies: list[dict[str, Any]] = []

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        if op == PRODUCE_OP:
            self.bodies.append(body)
        answer = await self.inner.serve(peer, op, body)
        if op == PRODUCE_OP and self.lose:
            self.lose -= 1
            await trio.sleep_forever()
        return answer

    def peer_gone(self, peer: bytes) -> None:
        self.inner.peer_gone(peer)


class Owner:
    def __init__(self, engine: Engine, seen: Seen, links: LeaseLinks) -> None:
        self.engine, self.seen, self.links = engine, seen, links

    async def records(self) -> list[tuple[bytes, bytes | None, list[Any] | None]]:
        q = self.engine.resolve("feed")
        start, end = await self.engine.bounds(q)
        got = await self.engine.read(q, start, end, 10_000, 1 << 24)
        return list(zip(got.values, got.keys, got.headers, strict=True))


@pytest.fixture(params=[1, 2], ids=["core1", "core2"])
def core(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@asynccontextmanager
async def owner(tmp_path: Path, core: int, *, lose: int = 0) -> AsyncIterator[Owner]:
    async with Engine.open(tmp_path, OWNER) as engine, trio.open_nursery() as nursery:
        offers = OfferServer(engine, Sealer(engine))
        await engine.create_queue("feed", producers_meta([B.public_hex]), core=core)
        seen = Seen(WithOffers(meshlinks.NoServer(), offers), lose)
        yield Owner(engine, seen, await meshlinks.start(nursery, seen))
        nursery.cancel_scope.cancel()


async def producer(nursery: trio.Nursery, a: Owner, features: frozenset[str] | None = None) -> RemoteOffers:
    """B's remote offers on a settled link to A (``features``: what the link agreed, as against an older
    owner; None: what the two builds agree)."""
    links = await meshlinks.start(nursery)
    meshlinks.connect(nursery, a.links, OWNER.public_key, links, B.public_key)
    while links.features(OWNER.public_key) is None:  # the versions exchange settles
        await trio.sleep(0)
    if features is not None:
        links._endpoints[OWNER.public_key].link.agreement = Agreement(1, features, UNSTATED)
    return RemoteOffers(links, Any, answer_within=0.5)  # type: ignore[arg-type]


def columns(rows: list[tuple[Any, ...]]) -> tuple[OfferedColumns, dict[str, Any]]:
    """``rows`` as a client's packed ``offer_batch`` carries them, cut as the forwarding daemon cuts them."""
    fields = packed_fields(rows)
    return offered_columns(fields, MAX_RECORDS), {f: fields[f] for f in LINK_FIELDS}


ROWS = [(b"v%d" % i, b"k%d" % i if i % 2 else None, ()) for i in range(5)]


async def test_columns_go_as_they_came_where_the_link_agreed(tmp_path: Path, core: int) -> None:
    async with owner(tmp_path, core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a)
        assert PRODUCE_COLUMNS_FEATURE in (b.links.features(OWNER.public_key) or ())
        records, fields = columns(ROWS)
        answer = await b.offer(OWNER.public_key, "feed", records, columns=fields, producer="p", seq=0)
        assert answer == {"first": 0, "count": 5, "duplicate": False}
        (body,) = a.seen.bodies
        assert "records" not in body and body["layout"] == "packed"
        assert {f: body.get(f) for f in LINK_FIELDS} == fields
        assert await a.records() == [(v, k, [STAMP]) for v, k, _ in ROWS]
        nursery.cancel_scope.cancel()


async def test_timestamps_go_in_the_columns_and_are_stored_as_sent(tmp_path: Path) -> None:
    async with owner(tmp_path, 2) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a)
        records, fields = columns([(b"t0", None, (), 1_000), (b"t1", b"k", (), None)])
        answer = await b.offer(OWNER.public_key, "feed", records, columns=fields, producer="p", seq=0)
        assert answer == {"first": 0, "count": 2, "duplicate": False}
        (body,) = a.seen.bodies
        assert body["layout"] == "packed" and body["timestamps"] == fields["timestamps"]
        q = a.engine.resolve("feed")
        got = await a.engine.read(q, 0, 2, 10, 1 << 20)
        assert got.values == [b"t0", b"t1"] and got.timestamps[0] == 1_000 and got.timestamps[1] > 1_000
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("features", [frozenset({PRODUCE_FEATURE}), None], ids=["older-owner", "headers"])
async def test_the_list_goes_where_the_link_did_not_agree_or_a_record_has_headers(
    tmp_path: Path, core: int, features: frozenset[str] | None
) -> None:
    rows = ROWS if features is not None else [*ROWS, (b"h", None, [("n", b"1")])]
    async with owner(tmp_path, core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, features)
        records, fields = columns(rows)
        answer = await b.offer(OWNER.public_key, "feed", records, columns=fields, producer="p", seq=0)
        assert answer == {"first": 0, "count": len(rows), "duplicate": False}
        (body,) = a.seen.bodies
        assert "layout" not in body and body["records"] == [[v, k, list(map(list, h))] for v, k, h in rows]
        headers = [[*map(list, h), STAMP] for _, _, h in rows]
        assert await a.records() == [(v, k, h) for (v, k, _), h in zip(rows, headers, strict=True)]
        nursery.cancel_scope.cancel()


async def test_a_retry_over_the_columns_is_written_once_whichever_form_came_first(
    tmp_path: Path, core: int
) -> None:
    async with owner(tmp_path, core, lose=1) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a)
        records, fields = columns(ROWS)
        # the first answer is lost after the commit: B sends the same producer and sequence again
        answer = await b.offer(
            OWNER.public_key, "feed", records, columns=fields, producer="p", seq=3, wait=10
        )
        assert answer == {"first": 0, "count": 5, "duplicate": True} and b.counters["retries"] == 1
        assert [body["layout"] for body in a.seen.bodies] == ["packed", "packed"]
        # the list form of the same records under the same sequence is the same offer
        as_list = [[v, k, []] for v, k, _ in ROWS]
        again = await b.offer(OWNER.public_key, "feed", as_list, producer="p", seq=3)
        assert again == {"first": 0, "count": 5, "duplicate": True}
        # ... and the other way round
        assert (await b.offer(OWNER.public_key, "feed", as_list, producer="p", seq=4))["first"] == 5
        again = await b.offer(OWNER.public_key, "feed", records, columns=fields, producer="p", seq=4)
        assert again == {"first": 5, "count": 5, "duplicate": True}
        assert len(await a.records()) == 10
        nursery.cancel_scope.cancel()


def _hostile() -> list[dict[str, Any]]:
    """Column requests a forwarding daemon never sends (it cut and checked them first)."""
    good = {"layout": "packed", **columns(ROWS)[1]}
    n = len(ROWS)
    return [
        {**good, "values": good["values"][:-1]},
        {**good, "values": good["values"] + b"x"},
        {**good, "value_lengths": good["value_lengths"][:-4]},
        {**good, "value_lengths": struct.pack(f"<{n}i", *[2] * (n - 1), -1)},
        {**good, "key_lengths": struct.pack(f"<{n}i", *[-2] * n)},
        {**good, "keys": good["keys"][:-1]},
        {**good, "count": n + 1},
        {**good, "count": 0},
        {**good, "count": MAX_RECORDS + 1},
        {
            **good,
            "values": b"x",
            "value_lengths": struct.pack("<i", 1),
            "count": 1,
            "keys": b"k" * (MAX_KEY_BYTES + 1),
            "key_lengths": struct.pack("<i", MAX_KEY_BYTES + 1),
        },
        {**good, "value_lengths": struct.pack(f"<{n}i", MAX_VALUE_BYTES + 1, *[0] * (n - 1))},
        {**good, "timestamps": b"\0" * 8},
        {**good, "timestamps": struct.pack(f"<{n}q", *[-5] * n)},
        {**good, "headers": {"0": [["h", b"v"]]}},
        {**good, "values": "text"},
        {**good, "layout": "rows"},
        {**good, "records": [[b"v", None, []]]},
    ]


@pytest.mark.parametrize("index", range(len(_hostile())))
async def test_malformed_columns_are_the_peers_protocol_error_and_nothing_is_written(
    tmp_path: Path, index: int
) -> None:
    async with owner(tmp_path, 1) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a)
        body = {"queue": "feed", "producer": "p", "seq": 0, **_hostile()[index]}
        with pytest.raises(RemoteProtocolError, match="produce: "):
            await b.links.call(OWNER.public_key, PRODUCE_OP, body, timeout=5, connect_within=0)
        assert await a.records() == []
        # the link and the owner carry on: the well-formed offer under the same sequence is written
        records, fields = columns(ROWS)
        answer = await b.offer(OWNER.public_key, "feed", records, columns=fields, producer="p", seq=0)
        assert answer == {"first": 0, "count": 5, "duplicate": False}
        nursery.cancel_scope.cancel()
