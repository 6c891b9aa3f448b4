"""Queues on fork core 2 through a real daemon's local API: created with ``core: 2``, written and read as
any queue, frozen by a fork its daemon learns of (a copied store's history merged through the engine),
shown as frozen, refused writes, recovered by the owner, and followed by a tail that is told of both."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from support.core2_fork import NOW, copy_writes, merge
from support.inprocess import InProcessDaemon

from latticed.api.client.blocking_client import Client, Entry
from latticed.api.client.producer import Producer
from latticed.api.server.queue_listing import Listed, QueueListing
from latticed.crdt.head import KIND_GROUP
from latticed.crdt.queue2 import Delta, QueueState2
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.errors import (
    AlreadyExistsError,
    ForkedQueueError,
    MalformedError,
    NotOwnerError,
    OtherCoreError,
)
from latticed.privacy.meta import Sealing
from latticed.storage.core2_engine import Core2Engine
from latticed.storage.core2_view import Core2View
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer

BOB = Identity.from_seed(b"b" * 32)


def _values(entries: list[Entry]) -> list[bytes]:
    return [e.value for e in entries]


def test_a_core2_queue_is_written_and_read_as_any_queue(client: Client) -> None:
    assert client.queue_create("c2", {"team": "x"}, core=2).endswith("/c2")
    client.queue_create("c1", core=1)
    with pytest.raises(AlreadyExistsError):
        client.queue_create("c1", core=2)
    with pytest.raises(AlreadyExistsError):
        client.queue_create("c2")
    assert client.offer("c2", b"v0") == 0
    assert client.offer_batch("c2", [(f"v{i}".encode(), None, []) for i in range(1, 5)]) == [1, 2, 3, 4]
    assert _values(client.range("c2", 0, 10)) == [f"v{i}".encode() for i in range(5)]
    assert client.read("c2", 2).values == [b"v2", b"v3", b"v4"]
    assert client.peek("c2", 3) == b"v3"
    last = client.last("c2")
    assert last is not None and last.offset == 4
    assert _values(list(client.tail("c2", 0, follow=False))) == [f"v{i}".encode() for i in range(5)]
    client.meta_set("c2", "owner-team", "y")
    assert client.meta_get("c2", "owner-team") == "y"
    assert client.truncate("c2", 2) == {"dropped": 2, "start_offset": 2, "end_offset": 5}
    info = client.queue_info("c2")
    assert (info["core"], info["epoch"], info["start_offset"], info["end_offset"]) == (2, 0, 2, 5)
    assert info["forked"] is False and info["fork_point"] is None and info["owned"] is True
    assert {(q["name"], q["core"]) for q in client.queue_list()} == {("c2", 2), ("c1", 1)}
    assert client.queue_verify("c2")["records"] == 3
    status = client.status()
    assert status["queues"] == 2 and status["records"] == 3
    with pytest.raises(MalformedError):
        client.call("queue_create", name="bad", core=3)


def test_offers_into_a_core2_queue_do_not_ask_the_sealer(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A core-2 queue is never sealed: asking the sealer costs an error raised and caught per offer.
    asked: list[int] = []
    sealing = Sealer.sealing

    def counted(self: Sealer, q: int) -> Sealing | None:
        asked.append(q)
        return sealing(self, q)

    monkeypatch.setattr(Sealer, "sealing", counted)
    client.queue_create("c2", core=2)
    client.queue_create("c1", core=1)
    assert [client.offer("c2", f"v{i}".encode()) for i in range(3)] == [0, 1, 2]
    assert client.offer_batch("c2", [(b"v3", None, []), (b"v4", None, [])]) == [3, 4]
    assert asked == []
    assert _values(client.range("c2", 0, 10)) == [f"v{i}".encode() for i in range(5)]
    assert client.offer("c1", b"w") == 0 and asked  # a core-1 queue may be sealed: asked


def test_queue_list_builds_a_core2_entry_once_per_committed_value(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A replica catching up thousands of core-2 queues is listed every few hundred ms: an entry built
    # per queue per call would make the calls, and the catch-up sharing their loop, cost O(queues^2).
    built: list[int] = []
    info = Core2View.info

    def counted(self: Core2View, q: int, state: QueueState2) -> dict[str, Any]:
        built.append(q)
        return info(self, q, state)

    monkeypatch.setattr(Core2View, "info", counted)
    for i in range(5):
        client.queue_create(f"c{i}", core=2)
    assert len(client.queue_list()) == 5 and len(built) == 5
    assert len(client.queue_list()) == 5 and len(built) == 5  # nothing changed: nothing built
    client.offer("c3", b"v")
    assert {q["name"]: q["size"] for q in client.queue_list()}["c3"] == 1
    assert len(built) == 6  # only the queue that changed


def test_queue_list_reads_only_the_core2_queues_that_committed_since_the_last_listing(
    daemon: InProcessDaemon, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading every core-2 queue's value per call is O(queues) a call, O(queues^2) over a catch-up that
    # is listed every few hundred ms: the listing hears of core 2's commits and reads only those.
    read: list[int] = []
    add = QueueListing._add

    async def counted(self: QueueListing, found: list[int], looked: int, part: Listed[Any]) -> int:
        if part.followed:
            read.extend(cast(list[int], part.queues))
        return await add(self, found, looked, part)

    monkeypatch.setattr(QueueListing, "_add", counted)
    for i in range(5):
        client.queue_create(f"c{i}", core=2)
    assert len(client.queue_list()) == 5 and len(read) == 5  # the first listing scans
    assert len(client.queue_list()) == 5 and len(read) == 5  # nothing committed: nothing read
    client.offer("c3", b"v")
    client.queue_create("c5", core=2)
    listed = {q["name"]: q["size"] for q in client.queue_list()}
    assert listed == {"c0": 0, "c1": 0, "c2": 0, "c3": 1, "c4": 0, "c5": 0}
    assert len(read) == 7  # c3 and c5 only
    engine = daemon.handle.engine  # a core-2 commit of another kind is heard of, and not listed
    daemon.call(lambda: engine.create_queue("a-group", None, KIND_GROUP, core=2))
    assert {q["name"] for q in client.queue_list()} == {f"c{i}" for i in range(6)}


def test_a_producer_pipelines_offers_into_a_core2_queue(client: Client) -> None:
    """Pipelined offers (Commit2 jobs started before the previous ones are answered) commit in order."""
    client.queue_create("piped", core=2)
    with Producer(client, "piped", window=8) as producer:
        acks = [producer.offer(b"p%d" % i, headers={"n": b"%d" % i}) for i in range(50)]
        batch = producer.offer_batch([(b"b0", None, ()), (b"b1", b"k", ())])
    assert [ack.result() for ack in acks] == list(range(50)) and list(batch.offsets()) == [50, 51]
    entries = client.range("piped", 0, 100)
    assert [e.value for e in entries[:2]] == [b"p0", b"p1"] and entries[3].headers == (("n", b"3"),)
    assert entries[51].key == b"k"
    with pytest.raises(MalformedError):
        client.queue_create("sealed", readers=[], core=2)


def test_idempotent_offers_into_a_core2_queue_are_written_once(client: Client) -> None:
    """The Spark sink's path: a producer id and sequence, a retry answered with the first offsets."""
    client.queue_create("sink", core=2)
    rows = [(b"a", None, []), (b"b", b"k", [])]
    assert client.offer_batch("sink", rows, producer="task-1", seq=0) == [0, 1]
    assert client.offer_batch("sink", rows, producer="task-1", seq=0) == [0, 1]  # a retry: nothing twice
    assert client.offer("sink", b"c", producer="task-1", seq=1) == 2
    entries = client.range("sink", 0, 10)
    assert _values(entries) == [b"a", b"b", b"c"] and entries[1].key == b"k"
    assert [name for name, _ in entries[0].headers] == ["lattice.producer"]


def test_a_fork_freezes_the_queue_the_owner_recovers_and_a_tail_follows(
    daemon: InProcessDaemon, client: Client, tmp_path: Path
) -> None:
    client.queue_create("q", core=2)
    client.offer_batch("q", [(f"s{i}".encode(), None, []) for i in range(10)])
    with pytest.raises(MalformedError, match="not forked"):
        client.queue_recover("q")
    copied = copy_writes(tmp_path / "copy", daemon, "q", 3)
    client.offer_batch("q", [(f"o{i}".encode(), None, []) for i in range(5)])

    seen: list[Entry] = []
    events: list[dict[str, Any]] = []
    forked, recovered = threading.Event(), threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        events.append(event)
        (forked if event["event"] == "forked" else recovered).set()

    def follow() -> None:
        with daemon.client() as tailing:
            for entry in tailing.tail("q", 0, follow=True, on_event=on_event):
                seen.append(entry)
                if entry.value == b"new":
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    with daemon.client() as old_client:  # a client that does not take events: one clear error
        old = old_client.tail("q", 12, follow=True)
        merge(daemon, copied)
        with pytest.raises(ForkedQueueError, match="forked at offset 10"):
            next(old)
    assert forked.wait(10)
    assert events[0]["fork_point"] == 10 and events[0]["next_offset"] == 10

    info = client.queue_info("q")
    assert info["forked"] and info["fork_point"] == 10
    assert (info["start_offset"], info["end_offset"]) == (0, 10)
    assert info["frozen_since_ms"] > 0
    with pytest.raises(ForkedQueueError, match="recover it"):
        client.offer("q", b"refused")
    shown = client.queue_fork_show("q", limit=2)
    assert shown["evidence"]["records"] == 5 and [r[0] for r in shown["evidence"]["shown"]] == [10, 11]
    assert len(shown["branches"]) == 2
    assert [f["fork_point"] for f in client.status()["forked_queues"]] == [10]
    forks = [c for c in client.doctor() if c["check"] == "forks"]
    assert [c["ok"] for c in forks] == [False] and "forked at offset 10: frozen" in forks[0]["detail"]
    assert "latticectl queue recover q" in forks[0]["fix"]

    done = client.queue_recover("q", keep_mine=True)
    assert (done["epoch"], done["start_offset"], done["end_offset"]) == (1, 0, 15)
    assert recovered.wait(10)
    assert client.offer("q", b"new") == 15
    reader.join(10)
    assert not reader.is_alive()
    values = _values(seen)
    # Everything up to the fork, its own branch once, then the new epoch from the fork point.
    assert values[:15] == [f"s{i}".encode() for i in range(10)] + [f"o{i}".encode() for i in range(5)]
    assert [e.offset for e in seen[15:]] == list(range(10, 16))
    assert values[15:] == [f"o{i}".encode() for i in range(5)] + [b"new"]
    assert [e["event"] for e in events] == ["forked", "recovered"]
    assert not client.queue_info("q")["forked"]


def test_recovery_and_fork_show_refuse_what_they_cannot_do(
    daemon: InProcessDaemon, client: Client, tmp_path: Path
) -> None:
    (tmp_path / "bob").mkdir()

    async def bobs_queue() -> Delta:
        async with Engine.open(tmp_path / "bob", BOB) as engine:
            bob = Core2Engine(engine)
            q = await bob.create("theirs")
            await bob.commit(q, [make_record(b"x", timestamp=NOW)])
            return await bob.delta_for(q, None)

    merge(daemon, trio.run(bobs_queue))
    theirs = f"{BOB.public_key.hex()}/theirs"
    assert _values(client.range(theirs, 0, 5)) == [b"x"]
    assert client.queue_info(theirs)["owned"] is False
    with pytest.raises(NotOwnerError, match="only its owner's daemon"):
        client.queue_recover(theirs)
    with pytest.raises(NotOwnerError):
        client.offer(theirs, b"no")
    client.queue_create("one", core=1)  # a core-1 queue: only a forked one is recovered (onto core 2)
    with pytest.raises(MalformedError, match=r"not forked.*queue upgrade one"):
        client.queue_recover("one")
    with pytest.raises(OtherCoreError):
        client.queue_fork_show("one")
    assert client.queue_fork_show(theirs)["forked"] is False


def test_a_replica_that_learns_of_the_recovery_first_takes_its_tail_back_to_the_fork_point(
    daemon: InProcessDaemon, client: Client, tmp_path: Path
) -> None:
    """The replica held the owner's records past the fork point and never saw the copy's: the owner's
    new epoch supersedes them, and a tail that read them is sent back to the fork point."""
    owner_dir, copy_dir = tmp_path / "owner", tmp_path / "copy"
    owner_dir.mkdir()

    async def on(path: Path, work: Any) -> Any:
        async with Engine.open(path, BOB) as engine:
            return await work(Core2Engine(engine))

    async def start(bob: Core2Engine) -> None:
        q = await bob.create("r")
        await bob.commit(q, [make_record(b"s%d" % i, timestamp=NOW) for i in range(10)])

    async def write(bob: Core2Engine, tag: bytes, count: int) -> Delta:
        q = await bob.find(BOB.public_key, "r")
        assert q is not None
        await bob.commit(q, [make_record(tag + b"%d" % i, timestamp=NOW) for i in range(count)])
        return await bob.delta_for(q, None)

    trio.run(on, owner_dir, start)
    shutil.copytree(owner_dir, copy_dir)
    merge(daemon, trio.run(on, owner_dir, lambda bob: write(bob, b"o", 3)))
    copied = trio.run(on, copy_dir, lambda bob: write(bob, b"c", 2))

    async def fork_and_recover(bob: Core2Engine) -> Delta:
        await bob.merge(copied)
        q = await bob.find(BOB.public_key, "r")
        assert q is not None and (await bob.state(q)).forked
        assert await bob.recover(q) == 1
        return await write(bob, b"n", 1)

    recovered = trio.run(on, owner_dir, fork_and_recover)
    theirs = f"{BOB.public_key.hex()}/r"
    events: list[dict[str, Any]] = []
    with daemon.client() as tailing, daemon.client() as older:
        entries = tailing.tail(theirs, 0, follow=True, on_event=events.append)
        first = [next(entries) for _ in range(13)]
        old = older.tail(theirs, 12, follow=True)
        assert next(old).offset == 12
        merge(daemon, recovered)
        after = next(entries)
        with pytest.raises(ForkedQueueError, match="recovered by its owner"):
            next(old)
    assert [e.value for e in first[10:]] == [b"o0", b"o1", b"o2"]
    assert events == [
        {"id": 1, "ok": True, "event": "recovered", "queue": theirs, "epoch": 1, "next_offset": 10}
    ]
    assert (after.offset, after.value) == (10, b"n0")
    assert client.queue_info(theirs)["epoch"] == 1
