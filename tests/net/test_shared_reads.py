"""Identical reads in flight at once are read once (``SharedReads``): the second asker gets the first's
value or error; the first asker's cancellation makes the other read for itself (never a hang, never a
wrong answer); a waiter's cancellation leaves the read alone; nothing stays memoised once a read ended.
And the daemon's host: two links asking for the same rows of one value at once issue one store read."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.shared_reads import SharedReads
from latticed.protocol.core2_steps import Outgoing2
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


class Gated:
    """A read that starts, then waits for ``release`` before answering (or raising ``fail``)."""

    def __init__(self, value: str, fail: Exception | None = None) -> None:
        self.value, self.fail = value, fail
        self.calls = 0
        self.started = trio.Event()
        self.release = trio.Event()

    async def __call__(self) -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return self.value


async def test_a_second_asker_awaits_the_first_read_and_a_later_ask_reads_again() -> None:
    reads: SharedReads[str, str] = SharedReads()
    first, second = Gated("rows"), Gated("not read")
    got: dict[str, str] = {}

    async def ask(name: str, read: Gated) -> None:
        got[name] = await reads.read("q[1,1001)", read)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "a", first)
        await first.started.wait()
        nursery.start_soon(ask, "b", second)
        await trio.testing.wait_all_tasks_blocked()
        first.release.set()
    assert got == {"a": "rows", "b": "rows"} and second.calls == 0
    assert (reads.issued, reads.shared, reads.in_flight()) == (1, 1, 0)
    again = Gated("newer")
    again.release.set()
    assert await reads.read("q[1,1001)", again) == "newer" and again.calls == 1  # nothing cached
    other = Gated("other")
    other.release.set()
    assert await reads.read("q[1001,2001)", other) == "other" and reads.issued == 3


async def test_a_failed_read_raises_for_every_asker_and_is_forgotten() -> None:
    reads: SharedReads[str, str] = SharedReads()
    boom = LookupError("rows gone")
    first, second = Gated("x", fail=boom), Gated("not read")
    raised: list[BaseException] = []

    async def ask(read: Gated) -> None:
        try:
            await reads.read("k", read)
        except LookupError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, first)
        await first.started.wait()
        nursery.start_soon(ask, second)
        await trio.testing.wait_all_tasks_blocked()
        first.release.set()
    assert raised == [boom, boom] and second.calls == 0 and reads.in_flight() == 0
    fine = Gated("fine")
    fine.release.set()
    assert await reads.read("k", fine) == "fine"


async def test_the_first_askers_cancellation_makes_the_second_read_for_itself() -> None:
    reads: SharedReads[str, str] = SharedReads()
    first, second = Gated("lost"), Gated("its own")
    second.release.set()
    scope = trio.CancelScope()
    got: list[str] = []

    async def first_asker() -> None:
        with scope:
            got.append(await reads.read("k", first))

    async def waiter() -> None:
        got.append(await reads.read("k", second))

    with trio.fail_after(5):  # a hang fails the test
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_asker)
            await first.started.wait()
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert reads.in_flight() == 1 and not got
            scope.cancel()
    assert scope.cancelled_caught and got == ["its own"]
    assert first.calls == second.calls == 1 and (reads.issued, reads.shared, reads.in_flight()) == (2, 0, 0)


async def test_a_waiters_cancellation_leaves_the_read_to_its_asker() -> None:
    reads: SharedReads[str, str] = SharedReads()
    first, second = Gated("rows"), Gated("not read")
    scope = trio.CancelScope()
    got: list[str] = []

    async def first_asker() -> None:
        got.append(await reads.read("k", first))

    async def waiter() -> None:
        with scope:
            got.append(await reads.read("k", second))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_asker)
        await first.started.wait()
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        first.release.set()
    assert scope.cancelled_caught and got == ["rows"] and second.calls == 0 and reads.in_flight() == 0


async def test_two_links_asking_for_the_same_rows_at_once_share_one_store_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.core2.create("q")
        await e.core2.commit(q, [make_record(b"v%d" % i, timestamp=NOW + i) for i in range(1000)])
        host = EngineCore2Host(e)
        key = (ALICE.public_key, "q", 0)
        read = e.bridge.read
        issued = 0
        both_asked = trio.Event()

        async def counted(fn: Any) -> Any:
            nonlocal issued
            issued += 1
            await both_asked.wait()  # the reader thread still busy when the second link asks
            return await read(fn)

        monkeypatch.setattr(e.bridge, "read", counted)
        ask = functools.partial(host.delta2_for, key, None, 1000, 1 << 20)
        got: list[Outgoing2 | None] = []

        async def link() -> None:
            got.append(await ask())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(link)
            nursery.start_soon(link)
            await trio.testing.wait_all_tasks_blocked()
            both_asked.set()
        assert issued == 1 and (host.reads.issued, host.reads.shared) == (1, 1)
        assert got[0] is not None and got[0] is got[1] and len(got[0].delta.records) == 1000
        # A later ask (the first read ended) reads again; another range is another read.
        both_asked = trio.Event()
        both_asked.set()
        assert await ask() == got[0] and issued == 2
        other = await host.delta2_for(key, None, 500, 1 << 20)  # other bounds: another request
        assert other is not None and issued == 3 and host.reads.in_flight() == 0
