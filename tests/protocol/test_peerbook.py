"""The dialing policy: backoff timing and jitter, peer book states, mDNS vs liveness, persistence.

Pure: every call takes an explicit ``now`` and the random source is injected.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from latticed.errors import MalformedError, NotFoundError
from latticed.net.discovery import DiscoveredPeer
from latticed.protocol.peerbook import Backoff, PeerBook, PeerStatus

A = ("192.0.2.10", 7000)
B = ("192.0.2.11", 7000)
C = ("198.51.100.7", 7001)
PK_A, PK_B, PK_C, OWN = (bytes([i]) * 32 for i in (1, 2, 3, 9))
T0 = 1_700_000_000.0


def no_jitter() -> float:
    return 0.0


def book(**kwargs: object) -> PeerBook:
    kwargs.setdefault("rng", no_jitter)
    kwargs.setdefault("own_public_key", OWN)
    return PeerBook(**kwargs)  # type: ignore[arg-type]


# --- Backoff --------------------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = Backoff(initial=1.0, factor=2.0, cap=60.0)
    assert [policy.ceiling(n) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert policy.ceiling(10**9) == 60.0  # no overflow after a very long outage
    assert Backoff(initial=3.0, factor=1.0, cap=10.0).ceiling(50) == 3.0


def test_jitter_bounds() -> None:
    policy = Backoff(initial=1.0, factor=2.0, cap=300.0, jitter=0.5)
    assert policy.delay(4, lambda: 0.0) == 8.0  # the ceiling itself
    assert policy.delay(4, lambda: 0.5) == 6.0
    almost_one = math.nextafter(1.0, 0.0)
    assert 4.0 <= policy.delay(4, lambda: almost_one) < 4.0 + 1e-9
    assert Backoff(jitter=0.0).delay(3, lambda: 0.9) == 4.0


@given(failures=st.integers(0, 200), u=st.floats(0.0, 1.0, exclude_max=True), jitter=st.floats(0.0, 1.0))
def test_jittered_delay_stays_within_bounds(failures: int, u: float, jitter: float) -> None:
    policy = Backoff(initial=0.5, factor=3.0, cap=120.0, jitter=jitter)
    ceiling = policy.ceiling(failures)
    delay = policy.delay(failures, lambda: u)
    assert ceiling * (1 - jitter) - 1e-9 <= delay <= ceiling <= 120.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0},
        {"initial": 10.0, "cap": 5.0},
        {"cap": math.inf},
        {"factor": 0.5},
        {"jitter": 1.5},
        {"jitter": -0.1},
    ],
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(MalformedError):
        Backoff(**kwargs)


def test_random_source_out_of_range_is_an_error() -> None:
    with pytest.raises(MalformedError):
        Backoff().delay(1, lambda: 1.0)


# --- dialing and backoff in the book -----------------------------------------------------------------


def test_new_address_is_due_at_once_and_claimed_by_due() -> None:
    b = book()
    assert b.add(A, "static", now=T0) is True
    assert b.add(A, "static", now=T0) is False
    assert b.next_due(T0) == T0
    assert b.due(T0) == [A]
    assert b.due(T0) == []  # dialing: not handed out twice
    assert b.next_due(T0) is None
    assert b.status(A).state == "dialing"


def test_failures_back_off_exponentially_with_explicit_now() -> None:
    b = book(backoff=Backoff(initial=1.0, factor=2.0, cap=8.0))
    b.add(A, "static", now=T0)
    now = T0
    expected_delays = [1.0, 2.0, 4.0, 8.0, 8.0]
    for delay in expected_delays:
        assert b.due(now) == [A]
        b.failed(A, now)
        assert b.next_due(now) == now + delay
        assert b.due(now + delay - 0.001) == []
        now += delay
    assert b.status(A).failures == len(expected_delays)
    assert b.due(now) == [A]


def test_jitter_comes_from_the_injected_source() -> None:
    b = book(rng=lambda: 0.5, backoff=Backoff(initial=4.0, jitter=0.5))
    b.add(A, "static", now=T0)
    b.due(T0)
    b.failed(A, T0)
    assert b.next_due(T0) == T0 + 3.0


def test_success_resets_the_backoff() -> None:
    b = book(backoff=Backoff(initial=1.0, cap=300.0), stable_after=30.0)
    b.add(A, "static", now=T0)
    for i in range(5):
        b.due(T0 + i * 100)
        b.failed(A, T0 + i * 100)
    assert b.status(A).failures == 5
    now = T0 + 1000
    assert b.due(now) == [A]
    b.connected(A, PK_A, now)
    status = b.status(A)
    assert (status.state, status.connected, status.failures, status.public_key) == (
        "connected",
        True,
        0,
        PK_A.hex(),
    )
    assert b.due(now + 10_000) == []  # connected: never dialled
    b.disconnected(A, now + 3600)  # a long, stable connection ended
    assert b.status(A).failures == 1
    assert b.next_due(now + 3600) == now + 3600 + 1.0
    assert b.status(A).last_seen == now + 3600


def test_a_peer_that_accepts_and_drops_keeps_backing_off() -> None:
    b = book(backoff=Backoff(initial=1.0, cap=300.0), stable_after=30.0)
    b.add(A, "static", now=T0)
    now = T0
    for _ in range(3):
        b.due(now)
        b.failed(A, now)
        now += 100
    b.due(now)
    b.connected(A, PK_A, now)
    b.disconnected(A, now + 1)  # dropped after a second
    assert b.status(A).failures == 4
    assert b.next_due(now + 1) == now + 1 + 8.0


def test_unknown_addresses_are_errors_except_incoming() -> None:
    b = book()
    with pytest.raises(NotFoundError):
        b.failed(A, T0)
    with pytest.raises(NotFoundError):
        b.connected(A, PK_A, T0)
    with pytest.raises(NotFoundError):
        b.disconnected(A, T0)
    with pytest.raises(MalformedError):
        b.add(("[::1]", 7000), "static", now=T0)
    with pytest.raises(MalformedError):
        b.add((A[0], 0), "static", now=T0)
    with pytest.raises(MalformedError):
        b.add(A, "carrier-pigeon", now=T0)  # type: ignore[arg-type]


def test_a_dial_that_ends_before_connecting_counts_as_a_failure() -> None:
    b = book()
    b.add(A, "static", now=T0)
    b.due(T0)
    b.disconnected(A, T0)
    assert (b.status(A).state, b.status(A).failures) == ("idle", 1)
    b.disconnected(A, T0 + 1)  # not connected: nothing to do
    assert b.status(A).failures == 1


def test_incoming_connections_are_shown_but_never_dialled() -> None:
    b = book()
    ephemeral = ("192.0.2.50", 51234)
    b.connected(ephemeral, PK_B, T0, incoming=True)
    assert b.status(ephemeral).sources == ("incoming",)
    assert b.connected_identities() == {PK_B}
    b.disconnected(ephemeral, T0 + 5)
    assert ephemeral not in b
    assert b.due(T0 + 10_000) == []


def test_incoming_connection_suppresses_dialing_that_identity() -> None:
    b = book()
    b.add(B, "mdns", now=T0, public_key=PK_B)
    b.connected(("192.0.2.11", 40000), PK_B, T0, incoming=True)
    assert b.due(T0) == []
    b.disconnected(("192.0.2.11", 40000), T0 + 1)
    assert b.due(T0 + 1) == [B]


def test_one_dial_per_identity_and_none_while_connected_elsewhere() -> None:
    b = book()
    multi_homed = [("192.0.2.20", 7000), ("198.51.100.20", 7000)]
    for address in multi_homed:
        b.add(address, "mdns", now=T0, public_key=PK_C)
    first = b.due(T0)
    assert len(first) == 1
    assert b.due(T0) == []  # the other address waits for the outcome
    b.failed(first[0], T0)
    (second,) = b.due(T0)
    assert second != first[0]
    b.connected(second, PK_C, T0)
    assert b.due(T0 + 10_000) == []


def test_due_respects_limit_and_order() -> None:
    b = book()
    b.add(C, "static", now=T0 + 2)
    b.add(A, "static", now=T0)
    b.add(B, "static", now=T0 + 1)
    assert b.due(T0 + 5, limit=2) == [A, B]
    assert b.due(T0 + 5) == [C]


def test_own_address_is_marked_self_and_never_dialled_again() -> None:
    b = book()
    b.add(A, "static", now=T0)
    b.due(T0)
    b.connected(A, OWN, T0)
    assert b.status(A).state == "self"
    assert b.due(T0 + 10**6) == [] and b.next_due(T0) is None
    assert json.loads(b.to_json())["peers"] == []


def test_clock_going_backwards_cannot_stall_dialing() -> None:
    b = book(backoff=Backoff(initial=100.0, cap=100.0))
    b.add(A, "static", now=T0)
    b.due(T0)
    b.failed(A, T0)  # next attempt at T0 + 100
    earlier = T0 - 86_400  # the wall clock was set back a day
    assert b.next_due(earlier) == earlier + 100.0
    assert b.due(earlier + 100.0) == [A]


# --- mDNS sightings are not liveness ----------------------------------------------------------------------


def mdns(b: PeerBook, peer: DiscoveredPeer, now: float) -> bool:
    return b.add(peer.address, peer.via, now=now, public_key=peer.public_key)


def test_mdns_sighting_does_not_make_a_peer_connected() -> None:
    b = book()
    peer = DiscoveredPeer(public_key=PK_A, host=A[0], port=A[1])
    assert mdns(b, peer, T0)
    assert b.connected_identities() == set()
    assert b.status(A).state == "idle" and b.status(A).public_key == PK_A.hex()


def test_connected_mdns_peer_stays_connected_until_the_connection_says_otherwise() -> None:
    b = book()
    peer = DiscoveredPeer(public_key=PK_A, host=A[0], port=A[1])
    mdns(b, peer, T0)
    b.due(T0)
    b.connected(A, PK_A, T0)
    for i in range(5):
        mdns(b, peer, T0 + i)
        mdns(b, DiscoveredPeer(public_key=PK_B, host=A[0], port=A[1]), T0 + i)  # a claim cannot override it
    assert b.status(A).connected and b.status(A).public_key == PK_A.hex()
    b.disconnected(A, T0 + 60)  # pings timed out: mDNS still lists it, which does not matter
    assert not b.status(A).connected
    assert A in b  # and it is not dropped either: retried with backoff


def test_fresh_sighting_of_a_backing_off_peer_makes_it_due_now() -> None:
    b = book(backoff=Backoff(initial=60.0, cap=300.0))
    b.add(A, "mdns", now=T0, public_key=PK_A)
    for i in range(3):
        b.due(T0 + i * 1000)
        b.failed(A, T0 + i * 1000)
    now = T0 + 2000 + 1
    assert b.due(now) == []
    b.add(A, "mdns", now=now, public_key=PK_A)  # it announced again, e.g. after a restart
    assert b.due(now) == [A]
    assert b.status(A).failures == 3  # not reset: only a connection does that


def test_a_failing_mdns_peer_is_retried_then_forgotten_but_static_peers_never() -> None:
    b = book(backoff=Backoff(initial=1.0, cap=1.0), forget_failures=5)
    b.add(A, "mdns", now=T0, public_key=PK_A)
    b.add(B, "static", now=T0)
    now = T0
    for i in range(5):
        assert A in b, f"dropped after {i} failures"
        assert set(b.due(now)) == {A, B}
        b.failed(A, now)
        b.failed(B, now)
        now += 1
    assert A not in b and B in b


def test_a_peer_that_once_connected_is_kept_until_forget_after() -> None:
    b = book(backoff=Backoff(initial=1.0, cap=1.0), forget_failures=2, forget_after=100.0)
    b.add(A, "mdns", now=T0, public_key=PK_A)
    b.due(T0)
    b.connected(A, PK_A, T0)
    b.disconnected(A, T0 + 50)
    now = T0 + 51
    for _ in range(10):
        b.due(now)
        b.failed(A, now)
        now += 1
    assert A in b  # last seen < 100 s ago
    now = T0 + 200
    b.due(now)
    b.failed(A, now)
    assert A not in b


# --- snapshot and persistence -------------------------------------------------------------------------


def test_snapshot_rows() -> None:
    b = book()
    b.add(B, "mdns", now=T0, public_key=PK_B)
    b.add(B, "static", now=T0)
    b.add(A, "static", now=T0)
    b.due(T0)
    b.connected(A, PK_A, T0 + 1)
    rows = b.snapshot()
    assert [(r.host, r.port) for r in rows] == [A, B]
    assert rows[0] == PeerStatus(
        public_key=PK_A.hex(),
        host=A[0],
        port=A[1],
        sources=("static",),
        state="connected",
        connected=True,
        failures=0,
        last_seen=T0 + 1,
        next_attempt=None,
    )
    assert rows[1].sources == ("mdns", "static") and rows[1].state == "dialing"
    json.dumps([dataclasses.asdict(r) for r in rows])  # ready for the local API


def test_persistence_round_trip() -> None:
    b = book()
    for address, key, source in ((A, PK_A, "static"), (B, PK_B, "mdns"), (C, PK_C, "mdns")):
        b.add(address, source, now=T0, public_key=key if source == "mdns" else None)  # type: ignore[arg-type]
    b.due(T0)
    b.connected(A, PK_A, T0 + 10)
    b.connected(B, PK_B, T0 + 20)
    b.disconnected(B, T0 + 30)
    b.failed(C, T0)  # never connected: not worth remembering
    text = b.to_json()
    assert json.loads(text) == {
        "version": 1,
        "peers": [
            {"host": B[0], "port": B[1], "public_key": PK_B.hex(), "last_seen": T0 + 30},
            {"host": A[0], "port": A[1], "public_key": PK_A.hex(), "last_seen": T0 + 10},
        ],
    }
    later = T0 + 3600
    loaded = PeerBook.from_json(text, now=later, rng=no_jitter)
    assert loaded.to_json() == text
    assert [(r.host, r.port, r.public_key, r.sources, r.state, r.failures) for r in loaded.snapshot()] == [
        (A[0], A[1], PK_A.hex(), ("remembered",), "idle", 0),
        (B[0], B[1], PK_B.hex(), ("remembered",), "idle", 0),
    ]
    assert sorted(loaded.due(later)) == [A, B]  # everyone is tried once right away
    loaded.add(A, "static", now=later)  # the config names it too
    assert loaded.status(A).sources == ("remembered", "static")


def test_persistence_limits_and_drops() -> None:
    b = book(max_remembered=2)
    for i in range(4):
        address = (f"192.0.2.{i + 1}", 7000)
        b.add(address, "static", now=T0)
        b.due(T0)
        b.connected(address, bytes([i + 10]) * 32, T0 + i)
    peers = json.loads(b.to_json())["peers"]
    assert [p["host"] for p in peers] == ["192.0.2.4", "192.0.2.3"]  # most recently seen
    text = b.to_json()
    assert len(PeerBook.from_json(text, now=T0 + 3, forget_after=0.5)) == 1  # the older one expired
    assert len(PeerBook.from_json(text, now=T0 + 3, own_public_key=bytes([13]) * 32)) == 1  # ourselves


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"version": 2, "peers": []}',
        '{"version": 1}',
        '{"version": 1, "peers": [1]}',
        '{"version": 1, "peers": [{"host": "h", "port": 1, "public_key": "zz", "last_seen": 0}]}',
        '{"version": 1, "peers": [{"host": "h", "port": 1, "public_key": "00", "last_seen": 0}]}',
        '{"version": 1, "peers": [{"host": "", "port": 1, "public_key": "%s", "last_seen": 0}]}'
        % ("00" * 32),
        '{"version": 1, "peers": [{"host": "h", "port": 70000, "public_key": "%s", "last_seen": 0}]}'
        % ("00" * 32),
        '{"version": 1, "peers": [{"host": "h", "port": 1, "public_key": "%s", "last_seen": "x"}]}'
        % ("00" * 32),
        '{"version": 1, "peers": [{"host": "h", "port": 1, "public_key": "%s"}]}' % ("00" * 32),
        b"\xff\xfe",
    ],
)
def test_corrupt_peer_book_is_malformed(text: str | bytes) -> None:
    with pytest.raises(MalformedError):
        PeerBook.from_json(text, now=T0)


# --- the active view ------------------------------------------------------------------------------


def mdns_peers(b: PeerBook, n: int, now: float = T0) -> list[tuple[tuple[str, int], bytes]]:
    peers = [((f"192.0.2.{100 + i}", 7000), bytes([100 + i]) * 32) for i in range(n)]
    for address, key in peers:
        b.add(address, "mdns", now=now, public_key=key)
    return peers


def test_discovery_fills_the_active_view_and_no_more() -> None:
    b = book(active_view=4)
    peers = mdns_peers(b, 15)
    first = b.due(T0)
    assert len(first) == 4
    assert b.due(T0 + 1000) == []  # eleven known, none dialled: the view is full
    keys = dict(peers)
    for address in first:
        b.connected(address, keys[address], T0)
    assert b.due(T0 + 1000) == []
    assert b.next_due(T0 + 1000) is None  # nothing to wake up for until a link drops


def test_a_dropped_link_makes_room_for_one_passive_peer() -> None:
    b = book(active_view=4)
    keys = dict(mdns_peers(b, 15))
    active = b.due(T0)
    for address in active:
        b.connected(address, keys[address], T0)
    b.disconnected(active[0], T0 + 100)
    (replacement,) = b.due(T0 + 100)
    assert replacement not in active
    assert b.due(T0 + 100) == []


def test_static_peers_count_within_the_view_and_are_always_dialled() -> None:
    b = book(active_view=2)
    statics = [("198.51.100.1", 7000), ("198.51.100.2", 7000), ("198.51.100.3", 7000)]
    b.add_static(statics, now=T0)
    mdns_peers(b, 5)
    assert b.due(T0) == statics  # all three, though the view holds two; no mDNS peer now
    for i, address in enumerate(statics):
        b.connected(address, bytes([50 + i]) * 32, T0)
    assert b.due(T0 + 1000) == []
    b.disconnected(statics[0], T0 + 1000)
    assert b.due(T0 + 1000 + 60) == [statics[0]]  # redialled after its backoff, view full or not


def test_incoming_links_count_within_the_view() -> None:
    b = book(active_view=3)
    mdns_peers(b, 6)
    for i in range(2):
        b.connected((f"203.0.113.{i}", 40000 + i), bytes([200 + i]) * 32, T0, incoming=True)
    assert len(b.due(T0)) == 1


def test_passive_peers_are_chosen_at_random_not_by_address() -> None:

    picks = set()
    for seed in range(8):
        b = book(active_view=1, rng=random.Random(seed).random)
        mdns_peers(b, 10)
        picks.update(b.due(T0))
    assert len(picks) > 2  # daemons that see the same LAN do not all dial the same peer


def test_a_peer_dialling_us_beyond_max_links_is_turned_away_unless_configured() -> None:
    b = book(active_view=2, max_links=3)
    static = ("198.51.100.9", 7000)
    b.add_static([static], now=T0)
    for i in range(3):
        key = bytes([200 + i]) * 32
        b.connected((f"203.0.113.{i}", 40000 + i), key, T0, incoming=True)
        assert not b.over_view(key)
    extra = bytes([210]) * 32
    b.connected(("203.0.113.9", 40009), extra, T0, incoming=True)
    assert b.over_view(extra)
    b.due(T0)
    b.connected(static, PK_C, T0)
    assert not b.over_view(PK_C)  # the operator's peer is kept, over the bound or not


def test_accepts_while_our_dials_are_out_count_them() -> None:
    b = book(active_view=2, max_links=4)
    keys = dict(mdns_peers(b, 6))
    assert len(b.due(T0)) == 2  # both out, neither answered yet
    incoming = [a for a in keys if b.status(a).state == "idle"]
    first, second = incoming[0], incoming[1]
    b.connected(("203.0.113.1", 40001), keys[first], T0, incoming=True)
    assert not b.over_view(keys[first])  # 2 dials + 1 = the view plus one
    b.connected(("203.0.113.2", 40002), keys[second], T0, incoming=True)
    assert b.over_view(keys[second])  # one too many, though only two links are up
    b.disconnected(("203.0.113.2", 40002), T0)  # the service closes it
    stranger = bytes([250]) * 32  # not seen by mDNS: held to max_links only
    b.connected(("203.0.113.3", 40003), stranger, T0, incoming=True)
    assert not b.over_view(stranger)


def test_a_peer_let_in_before_its_announcement_makes_room_once_seen() -> None:
    b = book(active_view=2, max_links=6, rng=random.Random(3).random)
    keys = dict(mdns_peers(b, 2))
    for address in b.due(T0):
        b.connected(address, keys[address], T0)
    early = [bytes([240 + i]) * 32 for i in range(3)]
    for i, key in enumerate(early):  # they dialled us before we saw them announced
        b.connected(("203.0.113.9", 41000 + i), key, T0 + i, incoming=True)
        assert not b.over_view(key)
    for i, key in enumerate(early):
        b.add(("192.0.2.200", 7000 + i), "mdns", now=T0 + 5, public_key=key)
    drop = b.over_view_links()
    assert len(drop) == 2 and len(set(drop)) == 2  # 5 links, the view plus one is 3: any two, at random
    assert set(drop) <= set(early) | set(keys.values())
    b.add_static([("192.0.2.200", 7002)], now=T0 + 6)
    assert early[2] not in b.over_view_links()  # the operator's peer is kept
    drops = set()
    for seed in range(10):
        c = book(active_view=1, max_links=6, rng=random.Random(seed).random)
        for i, key in enumerate(early):
            c.connected(("203.0.113.9", 41000 + i), key, T0 + i, incoming=True)
            c.add(("192.0.2.200", 7000 + i), "mdns", now=T0, public_key=key)
        drops.update(c.over_view_links())
    assert drops == set(early)  # not always the newest: a joining daemon is not shut out


def test_a_peer_a_caller_hurries_is_dialled_though_the_view_is_full() -> None:
    b = book(active_view=1)
    keys = dict(mdns_peers(b, 3))
    (active,) = b.due(T0)
    b.connected(active, keys[active], T0)
    owner = next(a for a in keys if a != active)
    b.failed(owner, T0)  # backing off, and passive anyway
    assert b.due(T0) == []
    assert b.hurry(keys[owner], T0)
    assert b.due(T0) == [owner]


def test_an_empty_active_view_is_refused() -> None:
    with pytest.raises(MalformedError):
        book(active_view=0)
