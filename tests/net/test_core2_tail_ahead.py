"""A live tail on a core-2 replica streams a relayed live push verified on the event loop while its commit
is still under way (net/core2_ahead.py, core2_view.ahead_columns), as core 1's do: every other read waits
for the commit, and a push that did not verify there is shown only once committed. The storage thread
is held inside a batch (``engine.bridge.hold()``), so "not committed yet" is certain."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process

from latticed.crdt import queue2
from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity
from latticed.errors import IntegrityError
from latticed.host.config import DaemonConfig
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.storage.bridge import StorageHold
from latticed.storage.engine import Engine

ALICE = Identity.from_seed(b"a" * 32)
PEER = b"p" * 32


def rec(i: int) -> Record:
    return make_record(b"v-%d" % i, timestamp=1000 + i)


class Owner:
    """Alice's queue in memory, and the deltas she pushes, one commit at a time."""

    def __init__(self) -> None:
        self.state = queue2.commit(
            queue2.empty_state(ALICE.public_key, "q"), ALICE, now_ms=1, records=[rec(0)]
        )

    def push(self, i: int) -> queue2.Delta:
        before = queue2.summary(self.state)
        self.state = queue2.commit(self.state, ALICE, now_ms=i + 1, records=[rec(i)])
        return queue2.delta(self.state, before)


@contextmanager
def replica(tmp_path: Path, owner: Owner) -> Iterator[tuple[InProcessDaemon, Engine, EngineCore2Host]]:
    """A daemon in this process holding Alice's first record as a core-2 replica."""
    daemon = start_in_process(DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock"))
    try:
        engine: Engine = daemon.handle.engine
        host = EngineCore2Host(engine)

        async def first() -> None:
            assert (await host.submit_merge2(queue2.delta(owner.state, None), None, PEER).result())[1]

        daemon.call(first)
        yield daemon, engine, host
    finally:
        daemon.stop()


def test_a_tail_on_a_core2_replica_streams_a_relayed_push_ahead_of_its_commit(tmp_path: Path) -> None:
    owner = Owner()
    with replica(tmp_path, owner) as (daemon, engine, host):
        address = f"{ALICE.public_key.hex()}/q"
        with daemon.client() as c:
            tail = c.tail(address, from_offset=1)

            async def submit_held() -> StorageHold:
                hold = engine.bridge.hold()
                pending = [host.submit_merge2(owner.push(i), None, PEER) for i in (1, 2)]
                daemon.box["pending"] = pending
                assert all(getattr(p, "ahead", None) is not None for p in pending)
                assert all(p._job.may_linger for p in pending)  # type: ignore[attr-defined]
                return hold

            hold = daemon.call(submit_held)
            got: list[tuple[int, bytes]] = []
            try:
                for entry in tail:
                    got.append((entry.offset, entry.value))
                    if entry.offset == 2:
                        break
                assert c.queue_info(address)["end_offset"] == 1  # still not committed
                assert c.read(address, 0).offsets == [0]  # other reads wait for it
            finally:
                hold.release()
                tail.close()

            async def committed() -> None:
                for p in daemon.box.pop("pending"):
                    assert (await p.result())[1]

            daemon.call(committed)
            assert got == [(1, b"v-1"), (2, b"v-2")]
            assert c.queue_info(address)["end_offset"] == 3


def test_only_a_push_verified_ahead_is_shown_and_only_past_the_committed_end(tmp_path: Path) -> None:
    owner = Owner()
    with replica(tmp_path, owner) as (daemon, engine, host):

        async def check() -> None:
            q = engine.core2.lookup(ALICE.public_key, "q")
            assert q is not None
            good = owner.push(1)
            forged = dataclasses.replace(good, records=(Record(value=b"forged"),))
            with engine.bridge.hold():
                bad = host.submit_merge2(forged, None, PEER)  # not verified ahead: the storage thread's
                assert getattr(bad, "ahead", None) is None
                assert engine.core2.ahead_columns(q, 1, 10, 100, 1 << 20).offsets == []
            with pytest.raises(IntegrityError):
                await bad.result()
            with engine.bridge.hold():
                pending = host.submit_merge2(good, None, PEER)
                shown = engine.core2.ahead_columns(q, 1, 10, 100, 1 << 20)
                assert shown.offsets == [1] and shown.values == [b"v-1"]
                assert engine.core2.ahead_columns(q, 0, 10, 100, 1 << 20).offsets == []  # committed: read
                assert engine.core2.ahead_columns(q, 1, 10, 0, 1 << 20).offsets == []
            assert (await pending.result())[1]
            assert engine.core2.ahead_columns(q, 1, 10, 100, 1 << 20).offsets == []  # committed now

        daemon.call(check)
