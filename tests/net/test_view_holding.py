"""The daemon holds its links to the active view's bound level-triggered: whatever edge (a sighting, a dial
ending) was missed, the dialer's next pass drops exactly the excess, and never again while drops it chose
are still closing (they count until they have, so choosing again would drop more than the excess)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import trio

from latticed.net.replication_service import _drop_links, _hold_view, _link_scope
from latticed.protocol.peerbook import PeerBook

T0 = 1_700_000_000.0


def service_with_links(n: int, active_view: int = 2) -> tuple[SimpleNamespace, dict[bytes, tuple[str, int]]]:
    book = PeerBook(
        active_view=active_view, max_links=10, rng=random.Random(1).random, own_public_key=b"\1" * 32
    )
    addresses = {}
    for i in range(n):
        address, key = (f"192.0.2.{100 + i}", 7000), bytes([100 + i]) * 32
        book.add(address, "mdns", now=T0, public_key=key)
        book.connected(address, key, T0)
        addresses[key] = address
    scopes = {bytes([100 + i]) * 32: [trio.CancelScope()] for i in range(n)}
    return SimpleNamespace(book=book, link_scopes=scopes), addresses


def test_the_excess_is_dropped_once_and_not_again_while_it_closes() -> None:
    trio.run(_the_excess_is_dropped_once)


async def _the_excess_is_dropped_once() -> None:
    service, addresses = service_with_links(6)  # bound: the view (2) plus one
    assert _hold_view(service)
    cancelled = [key for key, [scope] in service.link_scopes.items() if scope.cancel_called]
    assert len(cancelled) == 3
    assert _hold_view(service)  # still over (they have not closed) ...
    assert sum(s.cancel_called for [s] in service.link_scopes.values()) == 3  # ... and nothing more dropped
    for key in cancelled:  # the links end: the book hears of it and the scopes go
        service.book.disconnected(addresses[key], T0 + 1)
        del service.link_scopes[key]
    assert not _hold_view(service)
    assert not any(s.cancel_called for [s] in service.link_scopes.values())


def test_within_the_bound_nothing_is_dropped() -> None:
    trio.run(_within_the_bound)


async def _within_the_bound() -> None:
    service, _ = service_with_links(3)
    assert not _hold_view(service)
    assert not any(s.cancel_called for [s] in service.link_scopes.values())


def test_a_second_link_closed_at_once_leaves_the_first_droppable() -> None:
    trio.run(_a_second_link_closed_at_once)


async def _a_second_link_closed_at_once() -> None:
    """Both sides dialled: gossip keeps one link of the identity and closes the other at once. The link
    that stays must still be the view's to drop (it used to lose its scope to the closed one's)."""
    service, _ = service_with_links(0)
    peer = b"\x07" * 32
    with _link_scope(service, peer):  # the link that stays
        with _link_scope(service, peer):  # the duplicate, closed at once
            pass
        _drop_links(service, [peer], "test")
        with trio.fail_after(5):  # (a hang here: the drop did not reach it)
            await trio.sleep_forever()  # cancelled by the drop
    assert peer not in service.link_scopes
