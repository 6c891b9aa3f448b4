"""Lease-forwarding link ends wired back to back in memory (:class:`~latticed.net.leasing.LeaseLinks` on
each side, the real sub-protocol between them): what one side queues on its link reaches the other, and
each end carries the other's identity, as the authenticated transport would."""

from __future__ import annotations

from typing import Any

import trio

from latticed.errors import NotFoundError
from latticed.net.gossip import PeerLink
from latticed.net.leasing import LeaseLinks, LeaseServer
from latticed.protocol.replication import ReplicationSession


class NoServer:
    """The side that only asks: refuses whatever it is asked."""

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        raise NotFoundError(f"this daemon answers no {op}")

    def peer_gone(self, peer: bytes) -> None:
        pass


async def _pump(src: PeerLink, dst_links: LeaseLinks, dst: PeerLink) -> None:
    while True:
        await src.wakeup.wait()
        src.wakeup = trio.Event()
        messages, src.extra_out = src.extra_out, []
        for message in messages:
            dst_links.receive(dst, message)


async def start(nursery: trio.Nursery, server: LeaseServer | None = None) -> LeaseLinks:
    """One daemon's lease forwarding, answering with ``server`` (None: it only asks)."""
    links = LeaseLinks(dial=lambda _: False)
    await nursery.start(links.run, server or NoServer())
    return links


def connect(nursery: trio.Nursery, a: LeaseLinks, a_id: bytes, b: LeaseLinks, b_id: bytes) -> None:
    """A link up between daemons ``a`` and ``b`` (each end names the other's identity)."""
    a_end = PeerLink(b_id, "mem", "incoming", ReplicationSession())
    b_end = PeerLink(a_id, "mem", "static", ReplicationSession())
    nursery.start_soon(_pump, b_end, a, a_end)
    nursery.start_soon(_pump, a_end, b, b_end)
    a.link_up(a_end)
    b.link_up(b_end)


__all__ = ["NoServer", "connect", "start"]
