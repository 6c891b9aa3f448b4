"""The daemon's store as replication's host: a delta whose rows a truncation removed while it was read is
built again from the truncated value, or not sent until that commit is published; never raised (a
GapError there closed the peer's link)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import GapError
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.replication_service import EngineHost
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(i: int) -> Record:
    return make_record(b"v%d" % i, timestamp=NOW + i)


async def test_a_truncation_committed_while_a_delta_is_read_answers_from_the_truncated_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.open(tmp_path, ALICE) as e:
        q = await e.create_queue("q")
        await e.append(q, [rec(i) for i in range(10)])
        await e.append(q, [rec(10)])  # the last commit's records answer a peer one behind from memory
        host = EngineHost(e)
        key = (ALICE.public_key, "q", 0)
        read = e.bridge.read
        raced: list[bool] = []

        async def after_a_truncation(fn: Any) -> Any:
            if not raced:  # the truncation commits between the value's load and the read
                raced.append(True)
                await e.truncate(q, 6)
            return await read(fn)

        monkeypatch.setattr(e.bridge, "read", after_a_truncation)
        out = await host.delta_for(key, None, 100, 1 << 20)
        assert raced == [True]
        assert out is not None and [r.value for r in out.records] == [b"v%d" % i for i in range(6, 11)]


async def test_rows_gone_before_their_commit_is_published_send_nothing_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read saw the commit's rows gone before the storage thread published its value: nothing is sent
    now (that commit's change asks the link again), on either core."""
    async with Engine.open(tmp_path, ALICE) as e:
        one, two = await e.create_queue("one"), await e.create_queue("two", core=2)
        await e.append(one, [rec(i) for i in range(3)])
        await e.append(two, [rec(i) for i in range(3)])

        async def moved(fn: Any) -> Any:
            raise GapError("offset 0 of queue #1 is no longer stored (truncated meanwhile); retry")

        monkeypatch.setattr(e.bridge, "read", moved)
        assert await EngineHost(e).delta_for((ALICE.public_key, "one", 0), None, 100, 1 << 20) is None
        assert await EngineCore2Host(e).delta2_for((ALICE.public_key, "two", 0), None, 100, 1 << 20) is None
