"""How long a peer stays without a link when its end of a link *we* dialled died while ours still looks
alive (half-open), and it redials every second (issue 29's "not covered", branch redial24).

In-process, over memory streams, on trio's mock clock (autojump): the relay dials the owner, both settle
what the link speaks, the owner's end dies alone (the relay hears nothing), and the owner dials again
each second until the relay keeps one of its redials. Printed: that wait in trio seconds (before the
``link-gone`` feature: until the relay's link was stale, 20 s), and the wall time per run. Uses only APIs
of every tree since 0.2.0's, so it runs on the tree it is given (``PYTHONPATH=TREE``).

    PYTHONPATH=$T python bench/bench_redial.py --runs 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.gossip_hosts import MemoryReplicaHost
from support.memory_links import cuttable_pair

from latticed.crdt.signing import Identity
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.gossip import Gossip
from latticed.net.leasing import LeaseLinks
from latticed.net.transport import secure_accept, secure_connect

OWNER, RELAY = Identity.from_seed(b"o" * 32), Identity.from_seed(b"r" * 32)
Pair = tuple[trio.StapledStream[Any, Any], trio.StapledStream[Any, Any]]


def gossip(identity: Identity) -> Gossip:
    return Gossip(MemoryReplicaHost(None), identity.public_key, extension=LeaseLinks(dial=lambda p: False))


def link(
    nursery: trio.Nursery,
    dialler: tuple[Gossip, Identity],
    acceptor: tuple[Gossip, Identity],
    address: str,
    pair: Pair | None = None,
) -> None:
    left, right = pair or trio.testing.memory_stream_pair()

    async def dial() -> None:
        stream = await secure_connect(left, seed=dialler[1].seed, network_key=DEFAULT_NETWORK_KEY)
        await dialler[0].run_peer(stream, "relay:7000", "static")

    async def accept() -> None:
        stream = await secure_accept(right, seed=acceptor[1].seed, network_key=DEFAULT_NETWORK_KEY)
        await acceptor[0].run_peer(stream, address, "incoming")

    nursery.start_soon(dial)
    nursery.start_soon(accept)


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(0.01)


async def without_link() -> float:
    """One run: trio seconds from the owner's end dying to the relay keeping one of its redials."""
    owner, relay = gossip(OWNER), gossip(RELAY)

    def settled() -> bool:
        ours, theirs = owner.links.get(RELAY.public_key), relay.links.get(OWNER.public_key)
        return ours is not None and theirs is not None and None not in (ours.agreement, theirs.agreement)

    async with trio.open_nursery() as nursery:
        relays_end, owners_end, cut = cuttable_pair()
        link(nursery, (relay, RELAY), (owner, OWNER), "10.0.0.9:7000", (relays_end, owners_end))
        await until(settled)
        old = relay.links[OWNER.public_key]
        cut(False)
        await until(lambda: RELAY.public_key not in owner.links)
        start = trio.current_time()

        def kept() -> bool:
            new = relay.links.get(OWNER.public_key)
            return old.ended and new is not None and new is not old and RELAY.public_key in owner.links

        for attempt in range(1, 100):
            link(nursery, (owner, OWNER), (relay, RELAY), f"10.0.0.1:{5000 + attempt}")
            with trio.move_on_after(1.0):
                await until(kept)
                break
        waited = trio.current_time() - start
        nursery.cancel_scope.cancel()
    return waited


def run(runs: int) -> tuple[list[float], list[float]]:
    """Each run's wait (trio seconds) and wall time (seconds)."""
    waits, walls = [], []
    for _ in range(runs):
        began = time.perf_counter()
        waits.append(trio.run(without_link, clock=trio.testing.MockClock(autojump_threshold=0)))
        walls.append(time.perf_counter() - began)
    return waits, walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    waits, walls = run(args.runs)
    print(
        f"runs {args.runs}: owner without a link (trio s) median {statistics.median(waits):.3f} "
        f"(min {min(waits):.3f}, max {max(waits):.3f}); wall s per run median {statistics.median(walls):.4f}"
    )


if __name__ == "__main__":
    main()
