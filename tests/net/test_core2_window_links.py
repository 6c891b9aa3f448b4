"""A hostile peer on a real link (secure stream in memory, the daemon's gossip shell and version
exchange): it is held to the core-2 delta window its own versions request stated, 32 deltas where it
named ``window2-32``, 8 where it did not, and cut off past that with a log line that says so."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing
from support.core2_sim import AsyncCore2Host, MemoryCore2Host
from support.gossip_hosts import MemoryReplicaHost

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.core2_host import PendingMerge2
from latticed.net.gossip import Gossip
from latticed.net.leasing import LeaseLinks
from latticed.net.transport import secure_accept, secure_connect
from latticed.process.logs import record_fields
from latticed.protocol.core2_wire import Delta2, Digest2, Steps, encode2, link_summary
from latticed.protocol.lease_forwarding import LeasingSession, Request, is_leasing_message
from latticed.protocol.replication import PROTOCOL_VERSION
from latticed.protocol.replication_messages import Digest, Hello, encode_message
from latticed.protocol.versions import HEADS_V2, VERSIONS_OP, WIDE_WINDOW2, WINDOW2, LinkVersions
from latticed.version import RELEASE

DAEMON = Identity.from_seed(b"d" * 32)
HOSTILE = Identity.from_seed(b"h" * 32)


class _NeverDurable:
    """A merge whose commit never lands: nothing is acknowledged, so every delta stays unacknowledged."""

    def when_settled(self, callback: object) -> bool:
        return True

    def settled(self) -> None:
        return None

    async def result(self) -> tuple[None, bool]:
        await trio.sleep_forever()
        raise AssertionError


class _StuckHost2(AsyncCore2Host):
    def submit_merge2(self, delta: queue2.Delta, steps: Steps | None, peer: bytes) -> PendingMerge2:
        return _NeverDurable()  # type: ignore[return-value]


def _deltas(count: int) -> list[bytes]:
    out = []
    for seq in range(1, count + 1):
        state = queue2.commit(
            queue2.empty_state(HOSTILE.public_key, f"q{seq:03d}"), HOSTILE, now_ms=1, records=[Record(b"x")]
        )
        out.append(encode2(Delta2(seq, link_summary(state), queue2.delta(state, None))))
    return out


@pytest.mark.parametrize(
    ("features", "admitted"),
    [(frozenset({HEADS_V2, "compact", WINDOW2}), WIDE_WINDOW2), (frozenset({HEADS_V2, "compact"}), 8)],
)
async def test_a_peer_past_the_window_its_request_stated_is_cut_off_with_a_clear_log(
    features: frozenset[str], admitted: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="latticed")
    gossip = Gossip(
        MemoryReplicaHost(),
        DAEMON.public_key,
        host2=_StuckHost2(MemoryCore2Host()),
        extension=LeaseLinks(dial=lambda peer: False),
    )
    statement: dict[str, Any] = LinkVersions(RELEASE, (PROTOCOL_VERSION,), features).to_body()
    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            stream = await secure_accept(right, seed=DAEMON.seed, network_key=DEFAULT_NETWORK_KEY)
            await gossip.run_peer(stream, "mem", "incoming")

        nursery.start_soon(serve)
        stream = await secure_connect(left, seed=HOSTILE.seed, network_key=DEFAULT_NETWORK_KEY)
        requests = LeasingSession()
        requests.request(VERSIONS_OP, statement, now=0.0, timeout=30.0)
        hello = encode_message(Hello(PROTOCOL_VERSION, None, b"\x07" * 16))
        await stream.send_many([hello, encode_message(Digest(())), *requests.messages_to_send()])
        answered = False
        while not answered:  # the daemon's versions request, answered as a peer of ``features`` would
            message = await stream.receive()
            assert message is not None
            if is_leasing_message(message):
                requests.receive(message)
                while (event := requests.next_event()) is not None:
                    if isinstance(event, Request) and event.op == VERSIONS_OP:
                        requests.answer(event.rid, statement)
                        answered = True
        await stream.send_many(requests.messages_to_send())
        await trio.testing.wait_all_tasks_blocked()
        [link] = gossip.links.values()
        assert link.agreement is not None and link.agreement.features == features

        await stream.send_many([encode2(Digest2(())), *_deltas(admitted + 1)])
        with trio.fail_after(10):
            while await stream.receive() is not None:
                pass  # the daemon's messages, until it closes the link
        nursery.cancel_scope.cancel()
    [error] = [r for r in caplog.records if r.getMessage() == "peer.protocol_error"]
    fields = record_fields(error)
    assert fields["peer"] == HOSTILE.public_key.hex()
    assert f"peer exceeded the delta window: more than {admitted} core-2 deltas unacknowledged" in str(
        fields["reason"]
    )
    assert gossip.counters["protocol_errors"] == 1 and not gossip.links
