"""``offer_batch``'s ``packed`` layout (local API 2: the records as columns) through a real daemon: stored
as the same records sent as a list are, on either fork core; an idempotent retry in either form is a
retry; a malformed batch is refused with a reason, stores nothing, and the daemon carries on; a request
naming API 1 cannot use the layout, and the list form of API 1 is answered as ever."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from support.inprocess import InProcessDaemon, daemon_at

from latticed.api.client.blocking_client import Client
from latticed.api.client.packed_offer import packed_fields
from latticed.api.client.producer import Producer
from latticed.errors import MalformedError, OwnerUnreachableError, ProtocolError

ROWS = [
    (b"v%d" % i, b"k%d" % i if i % 2 else None, [("n", b"%d" % i)] if i % 3 == 0 else ()) for i in range(9)
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    with daemon_at(tmp_path_factory.mktemp("packed-offers")) as d:
        yield d


def _stored(client: Client, queue: str, start: int = 0) -> list[tuple[Any, ...]]:
    got = client.read(queue, start)
    return list(zip(got.values, got.keys, got.headers, strict=True))


def test_the_daemon_says_it_speaks_api_2(client: Client) -> None:
    assert client.api_versions() == (1, 2)
    assert client.versions()["local_api"] == [1, 2]


@pytest.mark.parametrize("core", [1, 2])
def test_packed_records_are_stored_as_the_same_list_is(client: Client, core: int) -> None:
    client.queue_create(f"both-{core}", core=core)
    plain = [(v, k, ()) for v, k, _ in ROWS]
    for rows in (ROWS, plain):
        first = client.offer_batch(f"both-{core}", rows)[0]  # the list form: API 1, as an old client sends
        reply = client.call("offer_batch", queue=f"both-{core}", **packed_fields(rows))
        assert (reply["first"], reply["count"]) == (first + len(rows), len(rows))
        stored = _stored(client, f"both-{core}", first)
        assert stored[: len(rows)] == stored[len(rows) :] == [(v, k, tuple(h)) for v, k, h in rows]


@pytest.mark.parametrize("core", [1, 2])
def test_a_retry_in_either_form_is_a_retry(client: Client, core: int) -> None:
    queue = f"retry-{core}"
    client.queue_create(queue, core=core)
    listed = [[v, k, [list(h) for h in hs]] for v, k, hs in ROWS]
    produced = {"producer": "p", "shared": True}
    first = client.call("offer_batch", queue=queue, seq=0, **produced, **packed_fields(ROWS))
    again = client.call("offer_batch", queue=queue, seq=0, **produced, records=listed)
    assert (again["first"], again["count"], again["duplicate"]) == (first["first"], 9, True)
    client.call("offer_batch", queue=queue, seq=1, **produced, records=listed)
    again = client.call("offer_batch", queue=queue, seq=1, **produced, **packed_fields(ROWS))
    assert (again["first"], again["duplicate"]) == (9, True)
    other = [(b"other", None, ())] * 9
    with pytest.raises(MalformedError, match="a retry must send the same records"):
        client.call("offer_batch", queue=queue, seq=1, **produced, **packed_fields(other))
    assert client.queue_info(queue)["end_offset"] == 18


def test_timestamps_and_headers_go_with_a_producer(client: Client) -> None:
    client.queue_create("stamped")
    rows = [(b"a", None, (), 5), (b"b", b"k", [("x", b"y")], None)]
    client.call("offer_batch", queue="stamped", producer="p", seq=0, **packed_fields(rows))
    got = client.read("stamped", 0)
    assert got.values == [b"a", b"b"] and got.keys == [None, b"k"] and got.timestamps[0] == 5
    assert got.headers[1][0] == ("x", b"y")
    with pytest.raises(MalformedError, match="timestamps are taken from an idempotent offer only"):
        client.call("offer_batch", queue="stamped", **packed_fields(rows))


def _bad(n: int = 3) -> list[dict[str, Any]]:
    good = packed_fields([(b"v%d" % i, None, ()) for i in range(n)])
    return [
        {**good, "values": good["values"][:-1]},
        {**good, "value_lengths": struct.pack("<3i", 2, 2, -1)},
        {**good, "value_lengths": good["value_lengths"][:-1]},
        {**good, "count": 4},
        {**good, "count": "3"},
        {**good, "keys": b"k", "key_lengths": struct.pack("<3i", 1, 1, -1)},
        {**good, "key_lengths": struct.pack("<3i", -2, -1, -1)},
        {**good, "timestamps": b"\0" * 8},
        {**good, "headers": {7: [["h", b"v"]]}},
        {**good, "headers": {0: [["h", "text"]]}},
        {**good, "layout": "rows"},
        {**good, "records": [[b"v", None, []]]},
    ]


@pytest.mark.parametrize("index", range(len(_bad())))
@pytest.mark.parametrize("producer", [None, "p"])
def test_a_malformed_packed_batch_stores_nothing_and_the_daemon_carries_on(
    client: Client, index: int, producer: str | None
) -> None:
    queue = f"bad-{index}-{producer}"
    client.queue_create(queue)
    fields = _bad()[index]
    extra = {} if producer is None else {"producer": producer, "seq": 0}
    with pytest.raises(MalformedError):
        client.call("offer_batch", queue=queue, **extra, **fields)
    assert client.queue_info(queue)["end_offset"] == 0
    client.call("offer_batch", queue=queue, **extra, **packed_fields([(b"fine", None, ())]))
    assert client.queue_info(queue)["end_offset"] == 1


def test_api_1_cannot_send_columns_and_its_list_form_still_works(client: Client) -> None:
    client.queue_create("old")
    with pytest.raises(ProtocolError, match="local API 2"):
        client.call("offer_batch", queue="old", **{**packed_fields([(b"x", None, ())]), "v": 1})
    reply = client.call("offer_batch", queue="old", records=[[b"a", None, []], [b"b", b"k", None]])
    assert (reply["first"], reply["count"]) == (0, 2)
    assert _stored(client, "old") == [(b"a", None, ()), (b"b", b"k", ())]


def test_columns_into_another_daemons_queue_are_checked_before_they_travel(client: Client) -> None:
    queue = "ab" * 32 + "/elsewhere"
    with pytest.raises(OwnerUnreachableError):
        client.call("offer_batch", queue=queue, wait=0.2, **packed_fields([(b"x", None, ())]))
    with pytest.raises(MalformedError, match="set by the queue's owner"):
        client.call(
            "offer_batch",
            queue=queue,
            wait=0.2,
            **packed_fields([(b"x", None, [("lattice.producer", b"me")])]),
        )


@pytest.mark.parametrize("speaks", [(1, 2), (1,)], ids=["api2", "api1"])
def test_the_client_sends_columns_to_a_daemon_that_takes_them(
    daemon: InProcessDaemon, speaks: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[dict[str, Any]] = []
    real_call = Client.call

    def spy(self: Client, op: str, **args: Any) -> dict[str, Any]:
        if op == "offer_batch":
            sent.append(args)
        return real_call(self, op, **args)

    monkeypatch.setattr(Client, "call", spy)
    monkeypatch.setattr(Client, "api_versions", lambda self: speaks)
    queue = f"client-{len(speaks)}"
    with daemon.client() as client:
        client.queue_create(queue)
        assert client.offer_batch(queue, ROWS) == list(range(9))
        again = client.produce(queue, [(*r, 7) for r in ROWS], producer="p", seq=0)
        assert (again.first, again.count) == (9, 9)
        with Producer(client, queue, window=2) as producer:
            producer.offer_batch(ROWS)
        with pytest.raises(MalformedError, match="bytes"):  # not bytes: the list, the daemon's reason
            client.offer_batch(queue, [("text", None, ())])  # type: ignore[list-item]
        stored = _stored(client, queue)
    assert [(v, k) for v, k, _ in stored] == [(v, k) for v, k, _ in ROWS] * 3
    assert [("layout" in args) for args in sent] == [2 in speaks, 2 in speaks, False]
