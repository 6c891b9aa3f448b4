"""The links a LAN of daemons that find each other by mDNS ends up with: bounded by the active view.

Sans-IO: one :class:`PeerBook` per daemon, driven as the replication service drives it (``due`` claims
dials, a dial's outcome reaches the dialled daemon's book as an incoming link, which ``over_view`` may
turn away), with the daemons starting one after another, their mDNS sightings, dials and accepts
delivered in a seeded random order, so dials in flight and accepts overlap as they do on a real LAN.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from latticed.protocol.addresses import HostPort
from latticed.protocol.peerbook import DEFAULT_ACTIVE_VIEW, PeerBook

T0 = 1_700_000_000.0


@dataclass
class Daemon:
    index: int
    key: bytes
    address: HostPort
    book: PeerBook
    #: Peer index -> the address this daemon's book knows that link under (ours, or its ephemeral one).
    links: dict[int, HostPort] = field(default_factory=dict)


@dataclass
class Lan:
    """Daemons on one LAN, every event (sighting, dial) delivered in a random order."""

    n: int
    seed: int
    browse_first: bool = False
    announce_first: bool = False
    daemons: list[Daemon] = field(default_factory=list)
    events: list[tuple[str, int, int]] = field(default_factory=list)
    now: float = T0
    turned_away: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        for i in range(self.n):
            key = bytes([i + 1]) * 32
            book = PeerBook(own_public_key=key, rng=self.rng.random)
            self.daemons.append(Daemon(i, key, (f"10.77.0.{i + 1}", 7464), book))

    def start(self, i: int) -> None:
        """Daemon ``i`` starts and registers: it and every daemon already up will see each other (later).
        With ``browse_first``, as the daemon does, it sees the others and dials them before they see its
        announcement."""
        if self.announce_first:
            for j in range(i):
                self.deliver("sight", j, i)
        if not self.browse_first:
            for j in range(i):
                self.events.append(("sight", i, j))
                if not self.announce_first:
                    self.events.append(("sight", j, i))
            return
        for j in range(i):
            self.deliver("sight", i, j)
        self.dial_round((i,))
        while self.events:
            self.step()
        for j in range(i):
            self.events.append(("sight", j, i))

    def dial_round(self, which: tuple[int, ...] | None = None) -> None:
        for d in self.daemons if which is None else (self.daemons[i] for i in which):
            for address in d.book.due(self.now):
                target = next(x.index for x in self.daemons if x.address == address)
                self.events.append(("dial", d.index, target))

    def step(self) -> None:
        """Deliver one event at random, then let the two daemons it touched dial what is due."""
        kind, i, j = self.events.pop(self.rng.randrange(len(self.events)))
        self.deliver(kind, i, j)
        self.dial_round((i, j))

    def deliver(self, kind: str, i: int, j: int) -> None:
        me, other = self.daemons[i], self.daemons[j]
        if kind == "sight":
            me.book.add(other.address, "mdns", now=self.now, public_key=other.key)
            for key in me.book.over_view_links():  # as the service does after each sighting
                self.close(i, next(d.index for d in self.daemons if d.key == key))
            return
        # A dial from me to other: the handshake reaches other first (an incoming link there) ...
        ephemeral = (me.address[0], 40000 + len(self.events) + self.rng.randrange(20000))
        other.book.connected(ephemeral, me.key, self.now, incoming=True)
        me.book.connected(other.address, other.key, self.now)
        room: list[bytes] | None = []
        if j not in me.links and other.book.over_view(me.key):
            room = other.book.make_room(me.key)  # as the service does: room for it, or turned away
        if j in me.links or room is None:
            # ... which closes it (one too many, or a link between the two is up already).
            self.turned_away += j not in me.links
            other.book.disconnected(ephemeral, self.now)
            me.book.disconnected(other.address, self.now)
            return
        for key in room:
            self.close(j, next(d.index for d in self.daemons if d.key == key))
        me.links[j] = other.address
        other.links[i] = ephemeral
        for key in me.book.over_view_links(spare=other.key):  # as the service does once its dial is up
            self.close(i, next(d.index for d in self.daemons if d.key == key))

    def close(self, i: int, j: int) -> None:
        """Daemon ``i`` closes its link to ``j``; both books hear of it."""
        me, other = self.daemons[i], self.daemons[j]
        me.book.disconnected(me.links.pop(j), self.now)
        other.book.disconnected(other.links.pop(i), self.now)
        self.dropped += 1

    def run(self, stagger: int = 3) -> None:
        """Start the daemons one after another (``stagger`` events apart), then let dials settle."""
        for i in range(self.n):
            self.start(i)
            self.dial_round()
            for _ in range(min(stagger, len(self.events))):
                self.step()
        end = self.now + 3600  # an hour: backoffs run out, passive peers get dialled
        while True:
            while self.events:
                self.step()
            due = [t for d in self.daemons if (t := d.book.next_due(self.now)) is not None]
            if not due or min(due) > end:
                return
            self.now = max(self.now, min(due))
            self.dial_round()

    def degrees(self) -> list[int]:
        return [len(d.links) for d in self.daemons]

    def connected(self) -> bool:
        seen, todo = {0}, [0]
        while todo:
            for j in self.daemons[todo.pop()].links:
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return len(seen) == self.n


@pytest.mark.parametrize("browse_first", [False, True])
@pytest.mark.parametrize("n", [8, 16, 40])
@pytest.mark.parametrize("seed", range(6))
def test_links_found_by_mdns_stay_within_the_active_view(n: int, seed: int, browse_first: bool) -> None:
    lan = Lan(n, seed, browse_first)
    lan.run()
    degrees = lan.degrees()
    assert max(degrees) <= DEFAULT_ACTIVE_VIEW + 1, degrees
    assert min(degrees) >= min(n - 1, DEFAULT_ACTIVE_VIEW) - 1, degrees
    assert lan.connected(), degrees


@pytest.mark.parametrize("first", ["browse", "announce"])
@pytest.mark.parametrize("seed", range(4))
def test_the_last_daemons_to_join_find_room(seed: int, first: str) -> None:
    lan = Lan(16, seed, browse_first=first == "browse", announce_first=first == "announce")
    lan.run()
    assert min(lan.degrees()[-3:]) >= DEFAULT_ACTIVE_VIEW - 2, lan.degrees()


def test_a_hub_its_operators_point_at_accepts_more_than_the_view() -> None:
    """Twenty daemons configured with the hub as their one ``--peer``, the hub with none and not seeing them
    by mDNS (they are elsewhere): max_links of them link to the hub, not just the active view."""
    lan = Lan(21, seed=1)
    hub = lan.daemons[0]
    for d in lan.daemons[1:]:
        d.book.add_static([hub.address], now=lan.now)
    lan.dial_round()
    while lan.events:
        lan.step()
    assert len(hub.links) == hub.book.max_links > DEFAULT_ACTIVE_VIEW + 1
