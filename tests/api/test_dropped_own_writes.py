"""Our own queue dropped by ``queue repair --drop`` and not back yet, asked for by name: every write path
(a single offer, a batch, an idempotent offer, offers pipelined by a Producer, a producer's offer from
another daemon, metadata, truncate, retention) is refused with the owner fence's BehindPeersError naming
``--release`` (CLI exit 6), not as a queue that does not exist; reads still find no queue, saying it was
dropped and comes back. A queue that was never ours to drop still answers plain "no queue"."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.corrupt_daemon import make_corrupt
from support.inprocess import InProcessDaemon, daemon_at

from latticed.api.client.blocking_client import Client
from latticed.api.client.producer import Producer
from latticed.crdt.head import KIND_QUEUE
from latticed.errors import BehindPeersError, NotFoundError
from latticed.produce.owner import OfferServer
from latticed.storage.owner_view import OwnerView
from latticed.storage.sealer import Sealer

FENCE = r"cannot write to [0-9a-f]{64}/own yet: it was dropped by `queue repair --drop`.*own --release"


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessDaemon, Client]]:
    """A daemon whose own core-2 ``own`` (2 records) was found corrupt and dropped with ``--drop``, no
    peer connected to send it back."""
    root: Path = tmp_path_factory.mktemp("dropped")
    make_corrupt(root)
    with daemon_at(root) as d, d.client() as client:
        assert client.queue_repair("own", drop=True)["repaired"] is True
        yield d, client


WRITES: dict[str, Callable[[Client], Any]] = {
    "offer": lambda c: c.offer("own", b"fork?"),
    "offer_batch": lambda c: c.offer_batch("own", [(b"a", None, ()), (b"b", b"k", ())]),
    "idempotent offer_batch": lambda c: c.offer_batch("own", [(b"a", None, ())], producer="p1", seq=0),
    "meta_set": lambda c: c.meta_set("own", "team", "b"),
    "meta_del": lambda c: c.meta_del("own", "team"),
    "truncate": lambda c: c.truncate("own", 1),
    "retention_set": lambda c: c.retention_set("own", max_records=10),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_is_refused_by_the_fence(dropped: tuple[InProcessDaemon, Client], write: str) -> None:
    _, client = dropped
    with pytest.raises(BehindPeersError, match=FENCE):
        WRITES[write](client)
    with pytest.raises(NotFoundError):
        client.read("own", 0)  # nothing was written, nor the queue created


def test_offers_pipelined_by_a_producer_are_each_refused(dropped: tuple[InProcessDaemon, Client]) -> None:
    _, client = dropped
    producer = Producer(client, "own", window=4)
    acks = [producer.offer(b"p%d" % i) for i in range(3)]
    acks.append(producer.offer_batch([(b"b", None, ())]))
    with pytest.raises(BehindPeersError):
        producer.flush()
    for ack in acks:
        with pytest.raises(BehindPeersError, match=FENCE):
            ack.result()
    producer.close()
    with pytest.raises(NotFoundError):
        client.read("own", 0)


def test_a_producer_on_another_daemon_is_refused_by_the_fence(
    dropped: tuple[InProcessDaemon, Client],
) -> None:
    d, _ = dropped
    engine = d.handle.engine
    server = OfferServer(engine, Sealer(engine))

    async def own_queue() -> int:
        return server.own_queue("own")

    with pytest.raises(BehindPeersError, match=FENCE):
        d.call(own_queue)


def test_a_read_finds_no_queue_and_says_it_comes_back(dropped: tuple[InProcessDaemon, Client]) -> None:
    _, client = dropped
    for read in (lambda: client.read("own", 0), lambda: client.queue_info("own")):
        with pytest.raises(NotFoundError, match=r"no queue .*/own here: it was dropped by `queue repair"):
            read()
    with pytest.raises(NotFoundError, match="dropped by `queue repair --drop`"):
        next(iter(client.tail("own", follow=False)))


def test_a_queue_never_dropped_is_just_not_found(dropped: tuple[InProcessDaemon, Client]) -> None:
    _, client = dropped
    for write in (lambda: client.offer("nope", b"v"), lambda: client.offer_batch("nope", [(b"v", None, ())])):
        with pytest.raises(NotFoundError) as raised:
            write()
        assert str(raised.value).endswith("/nope"), raised.value  # no word of a repair
    assert client.offer("good", b"g1") == 1  # the daemon's other queues take writes as before


def test_the_owner_view_alone_decides_what_a_missing_name_answers(
    dropped: tuple[InProcessDaemon, Client],
) -> None:
    d, _ = dropped
    engine = d.handle.engine
    assert isinstance(engine, OwnerView)
    ours, stranger = engine.public_key, bytes(32)
    assert isinstance(engine.not_held(ours, "own", KIND_QUEUE, writing=True), BehindPeersError)
    assert str(engine.not_held(stranger, "own", KIND_QUEUE, writing=True)) == f"no queue {stranger.hex()}/own"
    assert "fetched back" in str(engine.not_held(ours, "own", KIND_QUEUE))
