"""Gathering what the replication service knows of one queue's peers, for ``latticectl queue why``: a
narrow read of the gossip links (what each connected peer last said it holds, what is in flight), the
summaries remembered of peers since their link ended, the peer book (when a peer was last seen) and the
block list. Nothing here changes any of them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection

import trio

from latticed.net.gossip import Gossip
from latticed.protocol.peerbook import PeerBook
from latticed.protocol.replication import QueueKey
from latticed.protocol.why_verdict import PeerFacts


def peer_facts(gossip: Gossip, book: PeerBook, blocked: Collection[bytes], key: QueueKey) -> list[PeerFacts]:
    """Every peer that holds (or last said it held) ``key``, and its owner in any case."""
    wall, now = time.time(), trio.current_time()
    owner = key[0]
    last_seen = {s.public_key: s.last_seen for s in book.by_identity() if s.public_key is not None}
    out: dict[bytes, PeerFacts] = {}
    for public_key, link in gossip.links.items():
        theirs = link.session.peer_summary(key)
        core2 = link.session.core2
        theirs2 = core2.peer_summary(key) if theirs is None and core2 is not None else None
        if theirs is None and theirs2 is None and public_key != owner:
            continue
        in_flight, asked = link.session.key_traffic(key)
        out[public_key] = PeerFacts(
            peer=public_key.hex(),
            connected=True,
            blocked=public_key in blocked,
            since=wall - (now - link.connected_at),
            held_start=None if theirs is None else theirs.held_start,
            held_end=theirs.held_end if theirs is not None else theirs2.core.held_end if theirs2 else None,
            forked=bool(theirs and theirs.forked),
            in_flight=in_flight,
            asked=asked,
            is_owner=public_key == owner,
        )
    for public_key, (ended, memory) in gossip.memories.items():
        theirs = memory.held.get(key)
        if public_key in out or (theirs is None and public_key != owner):
            continue
        out[public_key] = PeerFacts(
            peer=public_key.hex(),
            connected=False,
            blocked=public_key in blocked,
            since=wall - (now - ended),
            held_start=None if theirs is None else theirs.held_start,
            held_end=None if theirs is None else theirs.held_end,
            forked=bool(theirs and theirs.forked),
            is_owner=public_key == owner,
        )
    if owner not in out and owner != gossip.local_public_key:
        out[owner] = PeerFacts(
            peer=owner.hex(),
            connected=False,
            blocked=owner in blocked,
            since=last_seen.get(owner.hex()),
            is_owner=True,
        )
    rows = []
    for public_key, found in out.items():
        error = gossip.queue_errors.last(public_key, key)
        rows.append(found if error is None else dataclasses.replace(found, last_error=error[1]))
    return sorted(rows, key=lambda p: (not p.is_owner, not p.connected, p.peer))


__all__ = ["peer_facts"]
