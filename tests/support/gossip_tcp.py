"""Two in-process :class:`Gossip` hosts linked over loopback TCP through the real secure handshake, with
every feature of this release agreed: what the relay tests need to run a real link without a daemon."""

from __future__ import annotations

import trio

from latticed.crdt.signing import Identity
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.gossip import Gossip
from latticed.net.transport import open_peer, secure_accept
from latticed.protocol.versions import ours

Host = tuple[Identity, Gossip]


async def link_gossips_tcp(nursery: trio.Nursery, a: Host, b: Host) -> None:
    """Dial ``b`` from ``a`` on 127.0.0.1 and return once each holds a link to the other."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def accept() -> None:
        raw = await listeners[0].accept()
        await listeners[0].aclose()
        stream = await secure_accept(raw, seed=b[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await b[1].run_peer(stream, "tcp", "incoming")

    async def dial() -> None:
        stream = await open_peer("127.0.0.1", port, seed=a[0].seed, network_key=DEFAULT_NETWORK_KEY)
        await a[1].run_peer(stream, "tcp", "static")

    nursery.start_soon(accept)
    nursery.start_soon(dial)
    with trio.fail_after(10):
        for one, other in ((a, b), (b, a)):
            while other[0].public_key not in one[1].links:
                changed = trio.Event()
                one[1].on_peer_change = changed.set
                await changed.wait()
            one[1].on_peer_change = None
    for _, gossip in (a, b):
        for peer in gossip.links.values():
            peer.session.agree_features(ours().features)
            peer.kick()
