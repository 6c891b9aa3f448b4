"""Review of the batched core-2 delta reads (issue 28, review27). A commit of ours between a batch's
lookup of the values and its one read transaction (``EngineCore2Host.delta2_many``) gives each answer
as ``delta2_for`` would at some instant (before or after the commit), or the race's ``GapError`` /
``NotFoundError`` in its place for the link driver to read again alone; never rows of another value.
A batch holds at most about two deltas' bytes (a window of big queues was all read, then all encoded,
before the first send); another error in it ends the link as a read alone did; the event held for the
driver's next turn is not taken by another task meanwhile."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.alice_records import ALICE, NOW, key, rec

from latticed.crdt.records import make_record
from latticed.errors import GapError, MalformedError, NotFoundError
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.gossip import Gossip, PeerLink
from latticed.net.replication_service import EngineHost
from latticed.protocol.core2_session import NeedDelta2
from latticed.protocol.core2_steps import Outgoing2, outgoing
from latticed.storage.engine import Engine


def same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return (list(a.delta.records), a.delta.from_offset, a.steps, a.implied) == (
        list(b.delta.records),
        b.delta.from_offset,
        b.steps,
        b.implied,
    )


@pytest.mark.parametrize("race", ["append", "truncate", "drop", "recreate"])
async def test_a_commit_between_the_lookup_and_the_batch_read_answers_as_at_some_instant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, race: str
) -> None:
    async with Engine.open(tmp_path, ALICE) as e:
        qs = {}
        for name in ("a", "b", "c"):  # c last: its id is the one a queue created after its drop takes
            qs[name] = await e.core2.create(name)
            await e.core2.commit(qs[name], [rec(name, i) for i in range(6)])
        host = EngineCore2Host(e)
        asks = [(key(n), None, 100) for n in "abc"]
        before = [await host.delta2_for(k, s, m, 1 << 20) for k, s, m in asks]
        read = e.bridge.read
        raced: list[str] = []

        async def commit_first(fn: Any) -> Any:
            monkeypatch.setattr(e.bridge, "read", read)
            q = qs["c"]
            if race == "append":
                await e.core2.commit(q, [rec("c", 6)])
            elif race == "truncate":
                await e.core2.truncate(q, 4)
            else:
                await e.core2.drop(q)
                if race == "recreate":
                    again = await e.core2.create("c")
                    await e.core2.commit(again, [rec("C", i) for i in range(8)])
            raced.append(race)
            return await read(fn)

        monkeypatch.setattr(e.bridge, "read", commit_first)
        answers = await host.delta2_many(asks, 1 << 20)
        assert raced == [race]  # the commit came between the lookup and the read
        after = [await host.delta2_for(k, s, m, 1 << 20) for k, s, m in asks]
        assert same(answers[0], before[0]) and same(answers[1], before[1])
        c = answers[2]
        if isinstance(c, Exception):
            assert isinstance(c, GapError | NotFoundError), c
        else:
            assert same(c, before[2]) or same(c, after[2]), (c, before[2], after[2])


def payload(out: Any) -> int:
    return sum(len(r.value) + len(r.key or b"") for r in out.delta.records)


async def big_queues(e: Engine, names: str) -> None:
    for name in names:
        q = await e.core2.create(name)
        await e.core2.commit(q, [make_record(name.encode() * 1000, timestamp=NOW + i) for i in range(10)])


async def test_a_batch_of_big_deltas_reads_a_prefix_within_its_byte_budget(tmp_path: Path) -> None:
    """Eight asks (the session's window) of queues each near ``max_bytes`` were all read into memory by
    one batch (8 x 8 MiB at the default frame size) where one at a time held one: now the batch stops
    once its deltas reach ``max_bytes``, the rest asked again, each answer still a read alone's."""
    async with Engine.open(tmp_path, ALICE) as e:
        await big_queues(e, "abcd")  # 10 kB each
        host = EngineCore2Host(e)
        asks = [(key(n), None, 100) for n in "abcd"]
        answers = await host.delta2_many(asks, 15_000)
        assert 1 <= len(answers) < len(asks)
        assert sum(payload(a) for a in answers) <= 2 * 15_000
        rest = await host.delta2_many(asks[len(answers) :], 15_000)
        for (k, since, m), answer in zip(asks, [*answers, *rest], strict=False):
            assert same(answer, await host.delta2_for(k, since, m, 15_000))
        small = await host.delta2_many(asks, 1 << 20)
        assert len(small) == len(asks)  # under the budget: one read, as before


async def test_the_driver_sends_a_batchs_answers_before_it_reads_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.open(tmp_path, ALICE) as e:
        await big_queues(e, "abcd")
        host2 = EngineCore2Host(e)
        gossip = Gossip(EngineHost(e), ALICE.public_key, host2=host2, max_message_bytes=30_000)
        sent: list[Any] = []

        async def flush(stream: object, link: object) -> None:
            sent.append("flush")

        monkeypatch.setattr(gossip, "_flush", flush)
        core2 = SimpleNamespace(provide_delta=lambda k, out: sent.append((k[1], payload(out))))
        link = PeerLink(b"p" * 32, "10.0.0.2:7000", "incoming", SimpleNamespace(core2=core2))  # type: ignore[arg-type]
        await gossip._provide2(link, [NeedDelta2(key(n), None, 100) for n in "abcd"], object())  # type: ignore[arg-type]
        assert [s[0] for s in sent if s != "flush"] == list("abcd")  # each once, in the session's order
        held = 0
        for s in sent:
            held = 0 if s == "flush" else held + s[1]
            assert held <= 2 * 15_000, sent  # what waits for a send between two flushes
        assert gossip.counters["deltas_out"] == 4


async def test_another_error_in_a_batch_ends_the_link_and_leaves_the_reader_sound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delta that fails to build (a corrupt row, a malformed value: not one of our commits' races)
    raises out of the batch, so the driver ends that link as a read alone did; it is not an answer, not
    read again, and the reader serves the next batch."""
    async with Engine.open(tmp_path, ALICE) as e:
        for name in "abc":
            q = await e.core2.create(name)
            await e.core2.commit(q, [rec(name, i) for i in range(3)])
        host2 = EngineCore2Host(e)

        def broken(state: Any, *args: Any) -> Any:
            if state.name == "b":
                raise MalformedError("a row of b does not decode")
            return outgoing(state, *args)

        monkeypatch.setattr("latticed.net.core2_engine_host.outgoing", broken)
        asks = [(key(n), None, 100) for n in "abc"]
        with pytest.raises(MalformedError):
            await host2.delta2_many(asks, 1 << 20)
        gossip = Gossip(EngineHost(e), ALICE.public_key, host2=host2)
        provided: list[str] = []
        core2 = SimpleNamespace(provide_delta=lambda k, out: provided.append(k[1]))
        link = PeerLink(b"p" * 32, "10.0.0.2:7000", "incoming", SimpleNamespace(core2=core2))  # type: ignore[arg-type]
        with pytest.raises(MalformedError):
            await gossip._provide2(link, [NeedDelta2(k, s, m) for k, s, m in asks])
        assert provided == [] and gossip.counters["delta_reads_raced"] == 0
        monkeypatch.setattr("latticed.net.core2_engine_host.outgoing", outgoing)
        again = await host2.delta2_many(asks, 1 << 20)
        assert all(isinstance(a, Outgoing2) and len(a.delta.records) == 3 for a in again)


def test_an_event_held_for_the_running_driver_is_not_taken_by_a_direct_write() -> None:
    """While the driver awaits a batch's read it runs (``sleeping_until`` -inf): a task's direct write
    (``_drive_now``) leaves the held event and the session's next ones to it, so none is overwritten,
    lost or answered out of order."""
    events: list[object] = ["next"]
    session: Any = SimpleNamespace(
        has_work=lambda: True,
        next_event=lambda: events.pop(0) if events else None,
        next_deadline=lambda: None,
    )
    link = PeerLink(b"p" * 32, "a", "incoming", session)
    link.stream = SimpleNamespace(can_send_now=lambda: True)  # type: ignore[assignment]
    link.opened = True
    held = object()
    link.held = held  # type: ignore[assignment]
    assert link.sleeping_until == -math.inf
    Gossip(None, b"o" * 32)._drive_now(link)  # type: ignore[arg-type]
    assert link.held is held and events == ["next"] and link.wakeup.is_set()
