"""The daemon's store as replication's host: a delta whose rows a commit of ours removed while it was read
raises ``GapError``, which the host leaves to its caller; the link driver's read again
(``Gossip._read_again``, the one mechanism for every host) answers from the newer value, or sends nothing
now when that commit is not published yet. Never a closed link (a GapError there closed the peer's)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import pytest

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import GapError
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.gossip import READ_TRIES, Gossip, PeerLink
from latticed.net.replication_service import EngineHost
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000
PEER = PeerLink(b"p" * 32, "10.0.0.2:7000", "incoming", None)  # type: ignore[arg-type]  # named in logs only


def rec(i: int) -> Record:
    return make_record(b"v%d" % i, timestamp=NOW + i)


async def test_a_truncation_committed_while_a_delta_is_read_is_read_again_from_the_truncated_value(
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
        delta_for = functools.partial(host.delta_for, key, None, 100, 1 << 20)
        with pytest.raises(GapError) as raised:
            await delta_for()  # the host leaves the race to its caller
        assert raced == [True]
        gossip = Gossip(host, ALICE.public_key)
        out = await gossip._read_again(PEER, key, delta_for, raised.value)
        assert out is not None and [r.value for r in out.records] == [b"v%d" % i for i in range(6, 11)]
        assert gossip.counters["delta_reads_raced"] == 1


async def test_rows_gone_before_their_commit_is_published_send_nothing_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The read saw the commit's rows gone before the storage thread published its value: after its tries
    nothing is sent now (that commit's change asks the link again), on either core."""
    caplog.set_level(logging.INFO, logger="latticed.net.gossip")
    async with Engine.open(tmp_path, ALICE) as e:
        one, two = await e.create_queue("one"), await e.create_queue("two", core=2)
        await e.append(one, [rec(i) for i in range(3)])
        await e.append(two, [rec(i) for i in range(3)])

        async def moved(fn: Any) -> Any:
            raise GapError("offset 0 of queue #1 is no longer stored (truncated meanwhile); retry")

        monkeypatch.setattr(e.bridge, "read", moved)
        host, host2 = EngineHost(e), EngineCore2Host(e)
        gossip = Gossip(host, ALICE.public_key, host2=host2)
        reads = [
            ((ALICE.public_key, "one", 0), functools.partial(host.delta_for, (ALICE.public_key, "one", 0))),
            ((ALICE.public_key, "two", 0), functools.partial(host2.delta2_for, (ALICE.public_key, "two", 0))),
        ]
        for key, read in reads:
            with pytest.raises(GapError) as raised:
                await read(None, 100, 1 << 20)
            again = functools.partial(read, None, 100, 1 << 20)
            assert await gossip._read_again(PEER, key, again, raised.value) is None
        assert gossip.counters["delta_reads_raced"] == 2 * READ_TRIES
        assert sum(r.getMessage() == "peer.delta_read_raced" for r in caplog.records) == 2
