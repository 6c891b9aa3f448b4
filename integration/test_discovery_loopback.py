"""LAN discovery end to end: real python-zeroconf instances on 127.0.0.1 inside one trio run.

mDNS on loopback works here although ``lo`` is not flagged MULTICAST (see /work/shared/notes/facts.md);
every instance binds to 127.0.0.1 explicitly, so nothing goes out on a real interface. Each test uses a
fresh random network key: other runs on this machine may advertise ``_latticed._tcp`` on loopback too, and
must be neither reported nor confused with ours. No sleeps: waits are on channels and events, bounded by
``trio.fail_after``.
"""

from __future__ import annotations

import functools
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from latticed.errors import IntegrityError, MalformedError
from latticed.net import discovery
from latticed.net.discovery import DiscoveredPeer, OtherNetworks, run_discovery
from latticed.process.clock import wall_ms
from latticed.process.logs import EVENT_ATTR, record_fields
from latticed.protocol.announce import open_announcement

LOOPBACK = ["127.0.0.1"]
DISCOVERY_TIMEOUT = 15.0


def trio_test(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(fn, *args, **kwargs))

    return wrapper


def free_port() -> int:
    """A port number nobody else uses right now (only advertised, never bound by these tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Node:
    name: str
    network_key: bytes
    public_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    port: int = field(default_factory=free_port)
    reannounce_interval: float = discovery.DEFAULT_REANNOUNCE_INTERVAL
    clock_offset_ms: int = 0
    found: list[DiscoveredPeer] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    stopped: trio.Event = field(default_factory=trio.Event)
    others: OtherNetworks = field(default_factory=OtherNetworks)

    async def run(self, nursery: trio.Nursery) -> None:
        """Start discovery (returns once registered) and collect what it reports into ``found``."""
        send, receive = trio.open_memory_channel[DiscoveredPeer](16)

        async def discover(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with self.cancel:
                    await run_discovery(
                        network_key=self.network_key,
                        identity_public_key=self.public_key,
                        port=self.port,
                        interfaces=LOOPBACK,
                        found=send,
                        task_status=task_status,
                        reannounce_interval=self.reannounce_interval,
                        clock=lambda: wall_ms() + self.clock_offset_ms,
                        others=self.others,
                    )
            finally:
                self.stopped.set()

        async def collect() -> None:
            async for peer in receive:
                self.found.append(peer)
                self.changed.set()
                self.changed = trio.Event()

        nursery.start_soon(collect)
        await nursery.start(discover)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self.changed.wait()

    def keys_found(self) -> set[bytes]:
        return {p.public_key for p in self.found}

    async def wait_for_keys(self, keys: set[bytes]) -> None:
        await self.wait_for(lambda: self.keys_found() >= keys)


async def start_all(nursery: trio.Nursery, nodes: list[Node]) -> None:
    """Register all nodes concurrently: each registration spends ~1-2 s probing."""
    async with trio.open_nursery() as starters:
        for node in nodes:
            starters.start_soon(node.run, nursery)


class Events(logging.Handler):
    """Collects discovery's structured log events and wakes trio waiters (it runs in the trio thread)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, dict[str, object]]] = []
        self.levels: list[int] = []
        self.changed = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((getattr(record, EVENT_ATTR, ""), record_fields(record)))
        self.levels.append(record.levelno)
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, event: str, **fields: object) -> dict[str, object]:
        while True:
            for name, got in self.records:
                if name == event and all(got.get(k) == v for k, v in fields.items()):
                    return got
            await self.changed.wait()

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate`` holds, checking it whenever discovery logs something."""
        while not predicate():
            await self.changed.wait()


@contextmanager
def discovery_events() -> Iterator[Events]:
    logger = logging.getLogger(discovery.__name__)
    handler = Events()
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@trio_test
async def test_two_daemons_find_each_other_and_goodbye_is_seen() -> None:
    key = secrets.token_bytes(32)
    a, b = Node("a", key), Node("b", key)
    with discovery_events() as events, trio.fail_after(3 * DISCOVERY_TIMEOUT):
        async with trio.open_nursery() as nursery:
            t0 = time.monotonic()
            with trio.fail_after(DISCOVERY_TIMEOUT):
                await start_all(nursery, [a, b])
                registered = time.monotonic()
                await a.wait_for_keys({b.public_key})
                await b.wait_for_keys({a.public_key})
            print(
                f"\ndiscovery on loopback: {registered - t0:.2f} s to register both, "
                f"{time.monotonic() - t0:.2f} s until both found each other"
            )
            assert a.found == [DiscoveredPeer(public_key=b.public_key, host="127.0.0.1", port=b.port)]
            assert b.found == [DiscoveredPeer(public_key=a.public_key, host="127.0.0.1", port=a.port)]
            assert a.found[0].address == ("127.0.0.1", b.port) and a.found[0].via == "mdns"

            # Clean shutdown of b: its goodbye reaches a, which forgets the sighting.
            b_name = (await events.wait_for("mdns.found", peer=b.public_key.hex()))["name"]
            t1 = time.monotonic()
            b.cancel.cancel()
            with trio.fail_after(DISCOVERY_TIMEOUT):
                await b.stopped.wait()
                await events.wait_for("mdns.removed", name=b_name)
            print(f"goodbye seen {time.monotonic() - t1:.2f} s after cancelling b")
            assert any(e == "mdns.stopped" and f["goodbye"] is True for e, f in events.records)

            # b restarts (same identity and port, new instance name): reported again.
            b2 = Node("b2", key, public_key=b.public_key, port=b.port)
            with trio.fail_after(DISCOVERY_TIMEOUT):
                await b2.run(nursery)
                await a.wait_for(lambda: len(a.found) == 2)
            assert a.found[1] == DiscoveredPeer(public_key=b.public_key, host="127.0.0.1", port=b2.port)
            nursery.cancel_scope.cancel()
    warnings = [(e, f) for e, f in events.records if e in ("mdns.close_timeout", "mdns.event_dropped")]
    assert warnings == []
    assert sum(e == "mdns.stopped" for e, _ in events.records) == 3


@trio_test
async def test_three_daemons_find_each_other_and_reannouncements_are_not_reported_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = secrets.token_bytes(32)
    nodes = [Node("a", key, reannounce_interval=0.5), Node("b", key), Node("c", key)]
    a = nodes[0]

    # Which of a's announcements (by timestamp) each node has opened: re-announcements must reach the others
    # with fresh timestamps, and be deduplicated there.
    opened: dict[bytes, set[int]] = {n.public_key: set() for n in nodes}
    changed = trio.Event()
    real_open = open_announcement

    def spy(token: str | bytes, **kwargs: Any) -> Any:
        nonlocal changed
        result = real_open(token, **kwargs)
        if result is not None and result.public_key == a.public_key:
            opened[kwargs["own_public_key"]].add(result.timestamp_ms)
            changed.set()
            changed = trio.Event()
        return result

    monkeypatch.setattr(discovery, "open_announcement", spy)
    async with trio.open_nursery() as nursery:
        t0 = time.monotonic()
        with trio.fail_after(DISCOVERY_TIMEOUT):
            await start_all(nursery, nodes)
            for node in nodes:
                await node.wait_for_keys({n.public_key for n in nodes if n is not node})
            print(f"\nthree daemons found each other in {time.monotonic() - t0:.2f} s")
            while min(len(opened[n.public_key]) for n in nodes[1:]) < 3:
                await changed.wait()
        for node in nodes:
            assert sorted((p.public_key, p.port) for p in node.found) == sorted(
                (n.public_key, n.port) for n in nodes if n is not node
            )
        nursery.cancel_scope.cancel()


@trio_test
async def test_other_network_and_skewed_clock_are_neither_reported_nor_see_us(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key, other_key = secrets.token_bytes(32), secrets.token_bytes(32)
    a, b = Node("a", key), Node("b", key)
    outsider = Node("x", other_key)
    skewed = Node("s", key, clock_offset_ms=-11 * 60 * 1000)  # a member whose clock is 11 minutes slow
    nodes = {n.public_key: n for n in (a, b, outsider, skewed)}

    # Record which announcements each node rejected, and whose they were (the test holds both keys), so we
    # wait exactly until every announcement has reached every node and been judged.
    rejected: set[tuple[bytes, bytes]] = set()  # (rejecting node, announcer)
    changed = trio.Event()
    real_open = open_announcement

    def announcer_of(token: str | bytes) -> bytes | None:
        for k in (key, other_key):
            try:
                opened = real_open(token, network_key=k, now_ms=0, max_age_ms=2**64, max_future_ms=2**64)
            except IntegrityError:
                continue
            return opened.public_key if opened is not None else None
        return None

    def spy(token: str | bytes, **kwargs: Any) -> Any:
        nonlocal changed
        try:
            return real_open(token, **kwargs)
        except IntegrityError:
            announcer = announcer_of(token)
            if announcer in nodes:
                rejected.add((kwargs["own_public_key"], announcer))
                changed.set()
                changed = trio.Event()
            raise

    monkeypatch.setattr(discovery, "open_announcement", spy)
    expected = {
        (x.public_key, y.public_key)
        for x, y in [
            *[(outsider, a), (outsider, b), (outsider, skewed), (a, outsider), (b, outsider)],  # other key
            *[(a, skewed), (b, skewed), (skewed, a), (skewed, b)],  # stale one way, from the future the other
        ]
    }
    with discovery_events() as events:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(DISCOVERY_TIMEOUT):
                await start_all(nursery, list(nodes.values()))
                await a.wait_for_keys({b.public_key})
                await b.wait_for_keys({a.public_key})
                while not expected <= rejected:
                    await changed.wait()
            assert a.keys_found() == {b.public_key}
            assert b.keys_found() == {a.public_key}
            assert outsider.found == [] and skewed.found == []

            # Announcements under another key are counted by instance name (other runs on this machine
            # may add theirs, so membership is checked, not totals); stale ones from a member are not.
            name = {
                n.public_key: (await events.wait_for("mdns.registered", port=n.port))["name"]
                for n in nodes.values()
            }
            for member in (a, b):
                assert name[outsider.public_key] in member.others
                assert name[skewed.public_key] not in member.others
                assert name[a.public_key] not in member.others and name[b.public_key] not in member.others
            assert {name[a.public_key], name[b.public_key], name[skewed.public_key]} <= {
                n for n in name.values() if n in outsider.others
            }
            heard = [
                (fields["name"], level)
                for (event, fields), level in zip(events.records, events.levels, strict=True)
                if event == "mdns.other_network"
            ]
            # Each node says its first sighting at INFO (which one is first depends on the LAN).
            assert [level for _, level in heard].count(logging.INFO) >= 2

            # The outsider stops (goodbye): it is no longer counted.
            outsider.cancel.cancel()
            with trio.fail_after(DISCOVERY_TIMEOUT):
                await events.until(
                    lambda: (
                        name[outsider.public_key] not in a.others
                        and name[outsider.public_key] not in b.others
                    )
                )
            nursery.cancel_scope.cancel()


def test_mdns_addresses() -> None:
    assert discovery.mdns_addresses(["127.0.0.1"]) == ["127.0.0.1"]
    assert discovery.mdns_addresses(["lo"]) == ["127.0.0.1"]
    assert discovery.mdns_addresses(["127.0.0.1", "lo"]) == ["127.0.0.1"]  # deduplicated
    default = discovery.mdns_addresses([])
    assert default == ["127.0.0.1"] or "127.0.0.1" not in default  # loopback only as the last resort
    with pytest.raises(MalformedError, match="IPv6"):
        discovery.mdns_addresses(["::1"])
    with pytest.raises(MalformedError, match="no interface"):
        discovery.mdns_addresses(["no-such-if0"])


@pytest.mark.parametrize(
    "overrides",
    [
        {"network_key": b"short"},
        {"identity_public_key": b"\x01" * 31},
        {"port": 0},
        {"interfaces": ["no-such-if0"]},
        {"addresses": ["not-an-address"]},
        {"addresses": []},
    ],
)
@trio_test
async def test_run_discovery_rejects_bad_arguments_before_touching_the_network(
    overrides: dict[str, object],
) -> None:
    send, _ = trio.open_memory_channel[DiscoveredPeer](1)
    args: dict[str, Any] = {
        "network_key": b"\x00" * 32,
        "identity_public_key": b"\x01" * 32,
        "port": 7000,
        "interfaces": LOOPBACK,
        "found": send,
    }
    args.update(overrides)
    with pytest.raises(MalformedError):
        await run_discovery(**args)


@trio_test
async def test_zeroconf_threads_are_named() -> None:
    """``top -H`` and bench/bench_idle.py tell zeroconf's threads from the daemon's by their names."""
    node = Node("a", secrets.token_bytes(32))
    with trio.fail_after(DISCOVERY_TIMEOUT):
        async with trio.open_nursery() as nursery:
            await start_all(nursery, [node])
            comms = [p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")]
            nursery.cancel_scope.cancel()
    assert comms.count("ld-zeroconf") >= 2  # its event loop and the browser's thread


@trio_test
async def test_start_does_not_wait_for_the_announcement_and_a_cancel_does_not_either() -> None:
    """``nursery.start`` returns once mDNS browses; probing for our name (~1.5 s) goes on behind it, and
    a cancel during it (a ``join`` right after start-up) ends discovery at once, with nothing to say
    goodbye to."""
    node = Node("a", secrets.token_bytes(32))
    with discovery_events() as events, trio.fail_after(DISCOVERY_TIMEOUT):
        async with trio.open_nursery() as nursery:
            await node.run(nursery)
            assert "mdns.registered" not in [e for e, _ in events.records]
            node.cancel.cancel()
            await node.stopped.wait()
            nursery.cancel_scope.cancel()
    assert "mdns.registered" not in [e for e, _ in events.records]
    assert [f["goodbye"] for e, f in events.records if e == "mdns.stopped"] == [False]
