"""Offers into a queue another daemon owns (latticed/produce/): the owner's real engine and offer server,
producers' daemons linked to it through the real lease-forwarding sub-protocol in memory (meshlinks).
Who may offer (the signed allow-list, sealed queues' readers), the producer header the owner sets, a
retry after a lost answer written once (also after the owner restarts), an unreachable owner, and an
owner whose release does not take remote offers, on either fork core (sealed queues are core 1's).
Timeouts are short real ones (the store commits on its
own thread, which a mock clock would jump past)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from support import meshlinks

from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack, unpack
from latticed.errors import (
    IncompatiblePeerError,
    MalformedError,
    NotAllowedError,
    OwnerUnreachableError,
)
from latticed.net.leasing import LeaseLinks
from latticed.produce.forward import RemoteOffers
from latticed.produce.owner import OfferServer, WithOffers, produced_run
from latticed.produce.policy import PRODUCER_HEADER, producers_meta
from latticed.protocol.versions import UNSTATED, Agreement
from latticed.storage.batch import Batch
from latticed.storage.engine import Engine
from latticed.storage.jobs import WriterView
from latticed.storage.sealer import Sealer

OWNER = Identity.from_seed(b"a" * 32)
B, C = Identity.from_seed(b"b" * 32), Identity.from_seed(b"c" * 32)


class Owner:
    def __init__(self, engine: Engine, offers: OfferServer, links: LeaseLinks) -> None:
        self.engine, self.offers, self.links = engine, offers, links
        self.sealer = offers.sealer

    async def records(self, name: str = "feed") -> list[tuple[bytes, list[Any] | None]]:
        q = self.engine.resolve(name)
        start, end = await self.engine.bounds(q)
        columns = await self.engine.read(q, start, end, 10_000, 1 << 24)
        columns = self.sealer.open_columns(q, columns)
        return list(zip(columns.values, columns.headers, strict=True))


class Flaky:
    """The owner's server, but the answer to the first ``produce`` is lost: it commits, then never
    answers (as when the link drops after the owner wrote)."""

    def __init__(self, inner: WithOffers) -> None:
        self.inner = inner
        self.lost = 0

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await self.inner.serve(peer, op, body)
        if op == "produce" and not self.lost:
            self.lost += 1
            await trio.sleep_forever()
        return answer

    def peer_gone(self, peer: bytes) -> None:
        self.inner.peer_gone(peer)


@pytest.fixture(params=[1, 2], ids=["core1", "core2"])
def core(request: pytest.FixtureRequest) -> int:
    """The fork core of the owner's queue (both take remote offers alike)."""
    return int(request.param)


@asynccontextmanager
async def owner(
    tmp_path: Path, *, flaky: bool = False, sealed: bool = False, both: bool = False, core: int = 1
) -> AsyncIterator[Owner]:
    async with Engine.open(tmp_path, OWNER) as engine, trio.open_nursery() as nursery:
        offers = OfferServer(engine, Sealer(engine))
        meta = producers_meta([B.public_hex, C.public_hex] if sealed or both else [B.public_hex])
        if sealed:
            await offers.sealer.create_queue("feed", meta, [B.public_key])  # C is not a reader
        else:
            await engine.create_queue("feed", meta, core=core)
        server: Any = WithOffers(meshlinks.NoServer(), offers)
        links = await meshlinks.start(nursery, Flaky(server) if flaky else server)
        yield Owner(engine, offers, links)
        nursery.cancel_scope.cancel()


async def producer(nursery: trio.Nursery, a: Owner, me: Identity, *, link: bool = True) -> RemoteOffers:
    links = await meshlinks.start(nursery)
    if link:
        meshlinks.connect(nursery, a.links, OWNER.public_key, links, me.public_key)
    return RemoteOffers(links, a.offers, answer_within=0.5)


async def test_an_allowed_producer_offers_and_one_not_allowed_is_refused(tmp_path: Path, core: int) -> None:
    async with owner(tmp_path, core=core) as a, trio.open_nursery() as nursery:
        b, c = await producer(nursery, a, B), await producer(nursery, a, C)
        answer = await b.offer(
            OWNER.public_key, "feed", [[b"x", None, None], [b"y", b"k", [["h", b"1"]]]], producer="p", seq=0
        )
        assert answer == {"first": 0, "count": 2, "duplicate": False}
        with pytest.raises(NotAllowedError, match="does not take offers from " + C.public_hex):
            await c.offer(OWNER.public_key, "feed", [[b"z", None, None]], producer="p", seq=0)
        stamp = [PRODUCER_HEADER, B.public_hex.encode()]
        assert await a.records() == [(b"x", [stamp]), (b"y", [["h", b"1"], stamp])]
        nursery.cancel_scope.cancel()


async def test_a_producer_cannot_forge_the_producer_header(tmp_path: Path, core: int) -> None:
    async with owner(tmp_path, core=core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, B)
        forged = [[b"x", None, [[PRODUCER_HEADER, C.public_hex.encode()]]]]
        with pytest.raises(MalformedError, match="set by the queue's owner"):
            await b.offer(OWNER.public_key, "feed", forged, producer="p", seq=0)
        assert await a.records() == []
        nursery.cancel_scope.cancel()


async def test_a_retry_after_a_lost_answer_is_written_once(tmp_path: Path, core: int) -> None:
    async with owner(tmp_path, flaky=True, core=core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, B)
        records = [[b"r%d" % i, None, None] for i in range(3)]
        # The first answer never comes: B sends the same producer id and sequence again
        answer = await b.offer(OWNER.public_key, "feed", records, producer="p", seq=7, wait=10.0)
        assert answer == {"first": 0, "count": 3, "duplicate": True}
        assert b.counters["retries"] == 1
        assert [v for v, _ in await a.records()] == [b"r0", b"r1", b"r2"]
        # a new sequence writes; an old one within the window is still answered as it was
        assert (await b.offer(OWNER.public_key, "feed", records[:1], producer="p", seq=8))["first"] == 3
        assert (await b.offer(OWNER.public_key, "feed", records, producer="p", seq=7))["first"] == 0
        # the same sequence with other records is refused, nothing written
        with pytest.raises(MalformedError, match="same records"):
            await b.offer(OWNER.public_key, "feed", records[:2], producer="p", seq=7)
        # ... and so is one of as many records that are not these (a re-run split otherwise): never
        # answered as written, which would drop its records silently
        other = [[b"other %d" % i, None, None] for i in range(3)]
        with pytest.raises(MalformedError, match="same records"):
            await b.offer(OWNER.public_key, "feed", other, producer="p", seq=7)
        assert len(await a.records()) == 4
        # a timestamp computed anew by the retry is no other record: the first attempt's stands
        stamped = [[b"s", None, None, 1_000]]
        assert (await b.offer(OWNER.public_key, "feed", stamped, producer="p", seq=9))["duplicate"] is False
        restamped = [[b"s", None, None, 2_000]]
        assert (await b.offer(OWNER.public_key, "feed", restamped, producer="p", seq=9))["duplicate"] is True
        assert len(await a.records()) == 5
        nursery.cancel_scope.cancel()


async def test_sequences_remembered_without_a_digest_still_answer_retries(tmp_path: Path, core: int) -> None:
    """Rows written before digests were kept (``[seq, first, count]``) are read as they were."""
    async with owner(tmp_path, core=core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, B)
        records = [[b"r%d" % i, None, None] for i in range(2)]
        assert (await b.offer(OWNER.public_key, "feed", records, producer="p", seq=1))["duplicate"] is False

        def drop_digests(batch: Batch, writer: WriterView) -> int:
            conn = writer.store.connection
            (name, raw), *_ = conn.execute("SELECT name, value FROM settings WHERE name LIKE 'producer/%'")
            entries = unpack(bytes(raw))
            conn.execute(
                "UPDATE settings SET value = ? WHERE name = ?", (pack([e[:3] for e in entries]), name)
            )
            conn.commit()
            return len(entries[0])

        assert await a.engine.call_in_writer(drop_digests) == 4  # [seq, first, count, digest] until now
        again = await b.offer(OWNER.public_key, "feed", records, producer="p", seq=1)
        assert again == {"first": 0, "count": 2, "duplicate": True}
        assert len(await a.records()) == 2
        nursery.cancel_scope.cancel()


async def test_offers_naming_no_producer_go_under_the_daemons_own_and_leave_one_row(
    tmp_path: Path, core: int
) -> None:
    """The owner remembers sequences per producer: one producer id per offer would leave a row per offer."""
    async with owner(tmp_path, core=core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, B)
        pairs = [b.next_own() for _ in range(5)]
        assert len({p for p, _ in pairs}) == 1 and [s for _, s in pairs] == [0, 1, 2, 3, 4]
        for i, (producer_id, seq) in enumerate(pairs):
            await b.offer(OWNER.public_key, "feed", [[b"r%d" % i, None, None]], producer=producer_id, seq=seq)
        assert len(await a.records()) == 5

        def rows(reader: Any) -> int:
            sql = "SELECT count(*) FROM settings WHERE name LIKE 'producer/%'"
            return int(reader.conn.execute(sql).fetchone()[0])

        assert await a.engine.inspect(rows) == 1
        nursery.cancel_scope.cancel()


async def test_a_shared_producer_id_is_written_once_whichever_daemon_sends_it(
    tmp_path: Path, core: int
) -> None:
    async with owner(tmp_path, both=True, core=core) as a, trio.open_nursery() as nursery:
        b, c = await producer(nursery, a, B), await producer(nursery, a, C)
        records = [[b"task", None, None, 1_700_000_000_000]]
        first = await b.offer(OWNER.public_key, "feed", records, producer="t", seq=3, shared=True)
        # the same task retried through another daemon: the owner had it
        again = await c.offer(OWNER.public_key, "feed", records, producer="t", seq=3, shared=True)
        assert (first["duplicate"], again) == (False, {"first": 0, "count": 1, "duplicate": True})
        # not shared, the same id is C's own: written
        assert (await c.offer(OWNER.public_key, "feed", records, producer="t", seq=3))["first"] == 1
        q = a.engine.resolve("feed")
        with pytest.raises(MalformedError, match="'shared' is true or false"):  # a peer's body, as sent
            a.offers.start(C.public_key, q, "t", 4, records, shared="yes")
        stored = await a.engine.read(q, 0, 2, 10, 1 << 20)
        assert stored.timestamps == [1_700_000_000_000] * 2  # the producer's timestamps are kept
        stamps = [[PRODUCER_HEADER, B.public_hex.encode()]], [[PRODUCER_HEADER, C.public_hex.encode()]]
        assert [h for _, h in await a.records()] == list(stamps)
        nursery.cancel_scope.cancel()


async def test_the_owner_remembers_sequences_across_a_restart(tmp_path: Path, core: int) -> None:
    records = [[b"once", None, None]]
    async with owner(tmp_path, core=core) as a:
        q = a.offers.own_queue("feed")
        job = a.offers.start(B.public_key, q, "p", 1, records)
        assert await a.engine.outcome(job) == (0, 1, False)
    async with Engine.open(tmp_path, OWNER) as engine:
        offers = OfferServer(engine, Sealer(engine))
        q = offers.own_queue("feed")
        assert await engine.outcome(offers.start(B.public_key, q, "p", 1, records)) == (0, 1, True)
        # a producer of the same name on another daemon (here: the owner's own) has sequences of its own
        assert await engine.outcome(offers.start(OWNER.public_key, q, "p", 1, records)) == (1, 1, False)
        assert await engine.bounds(q) == (0, 2)


async def test_a_sealed_queue_takes_offers_from_its_readers_only(tmp_path: Path) -> None:
    async with owner(tmp_path, sealed=True) as a, trio.open_nursery() as nursery:
        b, c = await producer(nursery, a, B), await producer(nursery, a, C)
        await b.offer(OWNER.public_key, "feed", [[b"secret", None, None]], producer="p", seq=0)
        with pytest.raises(NotAllowedError, match="not one of its readers"):
            await c.offer(OWNER.public_key, "feed", [[b"z", None, None]], producer="p", seq=0)
        assert await a.records() == [(b"secret", [[PRODUCER_HEADER, B.public_hex.encode()]])]
        q = a.engine.find(OWNER.public_key, "feed")
        assert q is not None
        stored = await a.engine.read(q, 0, 1, 1, 1 << 20)
        assert b"secret" not in stored.values[0] and not stored.headers[0]  # an envelope, header inside
        nursery.cancel_scope.cancel()


async def test_an_unreachable_owner_fails_after_the_wait(tmp_path: Path, core: int) -> None:
    async with owner(tmp_path, core=core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, B, link=False)
        started = trio.current_time()
        with pytest.raises(OwnerUnreachableError):
            await b.offer(OWNER.public_key, "feed", [[b"x", None, None]], producer="p", seq=0, wait=0.5)
        assert 0.5 <= trio.current_time() - started < 2.0
        assert await a.records() == []
        nursery.cancel_scope.cancel()


async def test_an_owner_without_the_feature_gets_no_offer(tmp_path: Path, core: int) -> None:
    async with owner(tmp_path, core=core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, B)
        await b.links.wait_link(OWNER.public_key, 1.0)
        while b.links.features(OWNER.public_key) is None:  # the versions exchange settles
            await trio.sleep(0)
        # as a link to 0.2.0 settles: protocol 1, no features
        b.links._endpoints[OWNER.public_key].link.agreement = Agreement(1, frozenset(), UNSTATED)
        with pytest.raises(IncompatiblePeerError, match="does not take remote offers"):
            await b.offer(OWNER.public_key, "feed", [[b"x", None, None]], producer="p", seq=0)
        nursery.cancel_scope.cancel()


async def test_an_owner_that_refuses_the_op_as_unknown_is_named_too_old(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        old = await meshlinks.start(nursery, Old())
        links = await meshlinks.start(nursery)
        meshlinks.connect(nursery, old, OWNER.public_key, links, B.public_key)
        b = RemoteOffers(links, Any)  # type: ignore[arg-type]
        with pytest.raises(IncompatiblePeerError, match="does not take remote offers"):
            await b.offer(OWNER.public_key, "feed", [[b"x", None, None]], producer="p", seq=0)
        nursery.cancel_scope.cancel()


class Old:
    """A 0.2.0 owner: every op it does not know is refused so (latticed/groups/lease_server.py)."""

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        raise MalformedError(f"unknown lease op {op[:64]!r}")

    def peer_gone(self, peer: bytes) -> None:
        pass


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "records",
        [(b"v", None, [])],  # a tuple, not msgpack's list
        [[b"v", None]],
        [[b"v", None, [], None, None]],
        [["text", None, []]],
        [[b"v", "key", []]],
        [[b"v", None, [], -1]],
        [[b"v", None, [], True]],
        [[b"v", None, [], 1.5]],
        [[b"v", None, 0]],
        [[b"v", None, "headers"]],
        [[b"v", None, [["h", "text"]]]],
        [[b"v", None, [["lattice.producer", b"forged"]]]],
        [[b"ok", None, []], [b"v", None, [["lattice.producer", b"forged"]]]],
    ],
)
def test_offered_records_are_checked_before_anything_is_written(bad: Any) -> None:
    with pytest.raises(MalformedError):
        produced_run(bad, "ab" * 32, 5)


def test_offered_records_are_stamped_with_the_producer_and_keep_their_headers() -> None:
    run = produced_run(
        [[b"a", None, []], [b"b", b"k", [["h", b"v"]], 7], [b"c", None, None, None]], "ab" * 32, 5
    )
    stamp = ("lattice.producer", b"ab" * 32)
    assert [(r.value, r.key, r.timestamp, r.headers) for r in run] == [
        (b"a", None, 5, (stamp,)),
        (b"b", b"k", 7, (("h", b"v"), stamp)),
        (b"c", None, 5, (stamp,)),
    ]


async def test_an_edited_allow_list_judges_the_next_offer(tmp_path: Path, core: int) -> None:
    async with owner(tmp_path, core=core) as a, trio.open_nursery() as nursery:
        b = await producer(nursery, a, B)
        await b.offer(OWNER.public_key, "feed", [[b"in", None, None]], producer="p", seq=0)
        await a.engine.set_meta(a.engine.resolve("feed"), producers_meta([C.public_hex]))
        with pytest.raises(NotAllowedError, match="does not take offers from " + B.public_hex):
            await b.offer(OWNER.public_key, "feed", [[b"out", None, None]], producer="p", seq=1)
        assert [v for v, _ in await a.records()] == [b"in"]
        nursery.cancel_scope.cancel()
