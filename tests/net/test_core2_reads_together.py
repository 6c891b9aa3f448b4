"""A window of asks for core-2 deltas answered with one read (issue 28, many queues): a fresh replica of
many small queues asks a writer for a window of them at once, and a reader-thread hand-off and read
transaction per queue was the writer's serve cost that grew past the queue count. The answers are the
ones a read per queue gives, in the session's order; one whose rows a commit of ours took meanwhile is
read again alone, as before."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.alice_records import ALICE, key, rec

from latticed.errors import GapError
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.gossip import Gossip, PeerLink, _asks2
from latticed.net.replication_service import EngineHost
from latticed.protocol.core2_session import Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import Outgoing2
from latticed.storage.engine import Engine


async def test_a_window_of_asks_is_one_read_and_answers_as_a_read_per_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.open(tmp_path, ALICE) as e:
        names = [f"q{i:02d}" for i in range(20)]
        for n, name in enumerate(names):
            q = await e.core2.create(name)
            await e.core2.commit(q, [rec(name, i) for i in range(5 + n % 3)])
        host = EngineCore2Host(e)
        reads: list[object] = []
        read = e.bridge.read

        async def counted(fn: Any) -> Any:
            reads.append(fn)
            return await read(fn)

        monkeypatch.setattr(e.bridge, "read", counted)
        held = host.summaries2()
        asks = [(key(name), None, 4096) for name in names]  # from nothing: a fresh replica
        answers = await host.delta2_many(asks, 1 << 20)
        assert len(reads) == 1
        reads.clear()
        for (k, since, max_records), answer in zip(asks, answers, strict=True):
            alone = await host.delta2_for(k, since, max_records, 1 << 20)
            assert isinstance(answer, Outgoing2) and alone is not None
            assert list(answer.delta.records) == list(alone.delta.records)
            assert dataclasses.replace(answer.delta, records=()) == dataclasses.replace(
                alone.delta, records=()
            )
            assert (answer.steps, answer.implied) == (alone.steps, alone.implied)
        assert len(reads) == len(asks)
        assert [len(a.delta.records) for a in answers if isinstance(a, Outgoing2)] == [
            5 + n % 3 for n in range(20)
        ]
        unknown = await host.delta2_many(
            [(key("nope"), None, 10), (key(names[0]), held[key(names[0])].core, 10)], 1
        )
        assert unknown[0] is None


async def _three_queues(e: Engine) -> EngineCore2Host:
    """Queues a, b and c of three records each, and the host that reads them."""
    for name in ("a", "b", "c"):
        q = await e.core2.create(name)
        await e.core2.commit(q, [rec(name, i) for i in range(3)])
    return EngineCore2Host(e)


async def test_a_raced_answer_is_read_again_alone_and_the_others_go_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link driver (``Gossip._provide2``): a window's answers provided in the session's order; one that
    raced a commit of ours (``GapError`` in its place) is read again alone (``_read_again``), not a
    closed link."""
    async with Engine.open(tmp_path, ALICE) as e:
        host2 = await _three_queues(e)
        many = host2.delta2_many

        async def b_raced(asks: Any, max_bytes: int) -> list[Any]:
            answers = await many(asks, max_bytes)
            answers[1] = GapError("rows of b moved meanwhile")
            return answers

        monkeypatch.setattr(host2, "delta2_many", b_raced)
        gossip = Gossip(EngineHost(e), ALICE.public_key, host2=host2)
        provided: list[tuple[tuple[bytes, str, int], int]] = []
        core2 = SimpleNamespace(provide_delta=lambda k, out: provided.append((k, len(out.delta.records))))
        link = PeerLink(b"p" * 32, "10.0.0.2:7000", "incoming", SimpleNamespace(core2=core2))  # type: ignore[arg-type]
        await gossip._provide2(link, [NeedDelta2(key(n), None, 100) for n in ("a", "b", "c")])
        assert provided == [(key("a"), 3), (key("b"), 3), (key("c"), 3)]
        assert gossip.counters["delta_reads_raced"] == 1
        assert gossip.counters["deltas_out"] == 3


def _session_of(events: deque[Any], window: int, window_out: int) -> Any:
    core2 = SimpleNamespace(window=window, window_out=window_out)
    return SimpleNamespace(next_event=lambda: events.popleft() if events else None, core2=core2)


def test_the_driver_takes_the_asks_in_a_row_and_leaves_the_next_event_for_its_next_turn() -> None:
    asks = [NeedDelta2(key(f"q{i}"), None, 100) for i in range(40)]
    other = Delta2Received(key("x"), 1, None)  # type: ignore[arg-type]  # only its place matters
    events: deque[Any] = deque([*asks[1:3], other, asks[3]])
    link = PeerLink(b"p" * 32, "a", "incoming", _session_of(events, 8, 32))
    assert _asks2(link, asks[0]) == asks[:3]
    assert link.held is other and list(events) == [asks[3]]


@pytest.mark.parametrize(("window", "window_out", "most"), [(1, 0, 1), (3, 0, 3), (8, 0, 8), (8, 32, 32)])
def test_a_batch_gathers_up_to_the_links_window_and_never_more(
    window: int, window_out: int, most: int
) -> None:
    """The bound is what the link keeps in flight (``window_out`` once the wide window is agreed, else
    ``window``), not a constant: a narrow link's batch stays narrow, a wide one's is not cut short."""
    asks = [NeedDelta2(key(f"q{i}"), None, 100) for i in range(40)]
    events: deque[Any] = deque(asks[1:])
    link = PeerLink(b"p" * 32, "a", "incoming", _session_of(events, window, window_out))
    assert _asks2(link, asks[0]) == asks[:most]
    assert link.held is None and len(events) == 40 - most


class _Tracked(Outgoing2):
    """An answer a weak reference can follow (Outgoing2 has slots)."""


async def test_a_batchs_decoded_deltas_are_let_go_before_its_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once provided, a batch's answers are in the outbox as bytes: the send of a window of big deltas
    must not hold them decoded as well (the peak would be the window twice over)."""
    async with Engine.open(tmp_path, ALICE) as e:
        host2 = await _three_queues(e)
        many = host2.delta2_many
        alive: list[weakref.ref[Any]] = []

        async def one_at_a_time(asks: Any, max_bytes: int) -> list[Any]:
            first = (await many(asks, max_bytes))[0]  # a prefix, as a read over its byte budget
            answers = [_Tracked(first.delta, first.steps, first.implied)]
            alive.extend(weakref.ref(a) for a in answers)
            return answers

        monkeypatch.setattr(host2, "delta2_many", one_at_a_time)
        gossip = Gossip(EngineHost(e), ALICE.public_key, host2=host2)
        at_send: list[int] = []

        async def flush(stream: Any, link: Any) -> None:
            gc.collect()
            at_send.append(sum(ref() is not None for ref in alive))

        monkeypatch.setattr(gossip, "_flush", flush)
        provided: list[tuple[bytes, str, int]] = []
        core2 = SimpleNamespace(provide_delta=lambda k, out: provided.append(k))
        link = PeerLink(b"p" * 32, "10.0.0.2:7000", "incoming", SimpleNamespace(core2=core2))  # type: ignore[arg-type]
        await gossip._provide2(
            link, [NeedDelta2(key(n), None, 100) for n in ("a", "b", "c")], stream=object()
        )  # type: ignore[arg-type]
        assert provided == [key("a"), key("b"), key("c")]
        assert len(alive) >= 2 and at_send == [0, 0]
