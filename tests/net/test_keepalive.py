"""Idle cost: keep-alives on one shared tick, sent by the dialling side only, and a dead peer
still noticed within the documented time (docs/operations.md, "Dead peers"). Virtual time throughout
(trio's autojump clock): no test here sleeps for real."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
import trio.testing
from test_gossip import link, make

from latticed.crdt.signing import Identity
from latticed.crdt.wire import pack
from latticed.daemon import _watchdog
from latticed.host.netkey import DEFAULT_NETWORK_KEY
from latticed.net.gossip import PEER_TIMEOUT_S, PING_INTERVAL_S, Gossip
from latticed.net.transport import secure_accept, secure_connect
from latticed.process.threadname import name_os_thread
from latticed.process.ticks import next_tick, shared_period, sleep_until_tick
from latticed.protocol.replication import HELLO, PROTOCOL_VERSION, ReplicationSession
from latticed.services.retention_service import RetentionService
from latticed.storage.engine import Engine

Pings = list[tuple[float, ReplicationSession]]


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> Pings:
    """Every PING any session sends in the test: (trio time, the session)."""
    sent: Pings = []
    original = ReplicationSession.ping

    def ping(self: ReplicationSession, nonce: int) -> None:
        sent.append((trio.current_time(), self))
        original(self, nonce)

    monkeypatch.setattr(ReplicationSession, "ping", ping)
    return sent


def test_next_tick_is_the_next_multiple_of_the_period() -> None:
    assert next_tick(0.0, 10.0) == 10.0
    assert next_tick(10.0, 10.0) == 20.0  # a job that ran on a tick waits a whole period
    assert next_tick(12345.6, 10.0) == 12350.0
    # Periods that divide each other fall due together.
    assert next_tick(12355.0, 10.0) == next_tick(12345.6, 30.0) == 12360.0


async def test_jobs_on_the_shared_tick_wake_together(autojump_clock: trio.testing.MockClock) -> None:
    woke: dict[float, list[str]] = {}

    async def job(name: str, period: float) -> None:
        while True:
            await sleep_until_tick(period)
            woke.setdefault(trio.current_time(), []).append(name)

    await trio.sleep(3.7)  # the jobs start out of phase with the tick
    with trio.move_on_after(60.1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(job, "keep-alive", 10.0)
            nursery.start_soon(job, "retention", 10.0)
            nursery.start_soon(job, "disk", 30.0)
    assert sorted(woke) == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]  # each period kept, one instant each
    assert sorted(woke[30.0]) == sorted(woke[60.0]) == ["disk", "keep-alive", "retention"]


class _Notifier:
    def __init__(self) -> None:
        self.pings: list[float] = []

    def watchdog(self) -> bool:
        self.pings.append(trio.current_time())
        return True


async def test_the_watchdog_pings_in_time_on_the_shared_tick(autojump_clock: trio.testing.MockClock) -> None:
    """systemd's WatchdogSec=30 gives an interval of 15 s: the pings go on the 10 s tick, never further
    apart than 15 s (an interval shorter than a tick is kept as it is)."""
    assert shared_period(15.0) == 10.0
    assert shared_period(30.0) == 30.0
    assert shared_period(4.0) == 4.0
    notifier = _Notifier()
    await trio.sleep(7.3)
    with trio.move_on_after(100):
        await _watchdog(notifier, 15.0)  # type: ignore[arg-type]
    gaps = [b - a for a, b in zip(notifier.pings, notifier.pings[1:], strict=False)]
    assert notifier.pings[0] == 7.3  # at once
    assert all(at % 10.0 == 0 for at in notifier.pings[1:])
    assert max(gaps) <= 15.0
    assert len(notifier.pings) >= 100 / 15


def _session(gossip: Gossip, peer: Identity) -> ReplicationSession:
    return gossip.links[peer.public_key].session


async def test_an_idle_link_is_kept_alive_by_its_dialler_alone(
    autojump_clock: trio.testing.MockClock, pings: Pings
) -> None:
    """Both ends pinging would double the messages and each end's wake-ups; the accepting end only
    answers, and still hears the dialler often enough never to time it out."""
    a, b = make(b"1" * 32), make(b"2" * 32)
    idle_s = 300.0
    async with trio.open_nursery() as nursery:
        await link(nursery, a, b)  # a dials b
        await trio.testing.wait_all_tasks_blocked()
        dialler, acceptor = _session(a[2], b[0]), _session(b[2], a[0])
        start = trio.current_time()
        await trio.sleep(idle_s)
        # Still the same link at both ends: nobody timed out.
        assert _session(a[2], b[0]) is dialler
        assert _session(b[2], a[0]) is acceptor
        nursery.cancel_scope.cancel()
    sent = [session for at, session in pings if at > start]
    assert sent.count(acceptor) == 0
    assert idle_s / PING_INTERVAL_S - 1 <= sent.count(dialler) <= idle_s / PING_INTERVAL_S + 1


async def test_every_link_is_pinged_on_the_same_tick(
    autojump_clock: trio.testing.MockClock, pings: Pings
) -> None:
    """Links that came up at different moments are pinged together: one wake-up of the daemon per tick
    serves them all, instead of one per link."""
    hub = make(b"h" * 32)
    spokes = [make(bytes([48 + i]) * 32) for i in range(3)]
    async with trio.open_nursery() as nursery:
        for spoke, gap in zip(spokes, (0.0, 3.3, 2.9), strict=True):
            await trio.sleep(gap)
            await link(nursery, hub, spoke)
            await trio.testing.wait_all_tasks_blocked()
        # From the first tick on which no link carried its opening messages in the last half tick.
        start = next_tick(trio.current_time() + PING_INTERVAL_S / 2, PING_INTERVAL_S)
        await trio.sleep(60.0)
        sessions = [_session(hub[2], spoke[0]) for spoke in spokes]
        nursery.cancel_scope.cancel()
    times = sorted({at for at, session in pings if at >= start and session in sessions})
    assert len(times) >= 5, times
    assert all(at % PING_INTERVAL_S == 0 for at in times)
    for at in times:
        assert {id(s) for t, s in pings if t == at and s in sessions} == {id(s) for s in sessions}


@pytest.mark.parametrize("daemon_dials", [True, False], ids=["daemon-dialled", "peer-dialled"])
async def test_a_dead_peer_is_noticed_within_the_documented_time(
    autojump_clock: trio.testing.MockClock, daemon_dials: bool
) -> None:
    """A peer that says HELLO and then nothing, ever (its host crashed: no FIN, what we send is never
    read), is given up between PEER_TIMEOUT_S and one tick later, whichever side dialled."""
    identity, _, daemon = make(b"1" * 32)
    dead = Identity.from_seed(b"8" * 32)
    ours, theirs = trio.testing.memory_stream_pair()
    silent_since: list[float] = []

    async def peer() -> None:
        if daemon_dials:
            stream = await secure_accept(theirs, seed=dead.seed, network_key=DEFAULT_NETWORK_KEY)
        else:
            stream = await secure_connect(theirs, seed=dead.seed, network_key=DEFAULT_NETWORK_KEY)
        await stream.send(pack([HELLO, PROTOCOL_VERSION, None]))
        silent_since.append(trio.current_time())
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer)
        if daemon_dials:
            stream = await secure_connect(ours, seed=identity.seed, network_key=DEFAULT_NETWORK_KEY)
        else:
            stream = await secure_accept(ours, seed=identity.seed, network_key=DEFAULT_NETWORK_KEY)
        await daemon.run_peer(stream, "mem", "static" if daemon_dials else "incoming")  # until given up
        nursery.cancel_scope.cancel()
    assert not daemon.links
    waited = trio.current_time() - silent_since[0]
    assert PEER_TIMEOUT_S < waited <= PEER_TIMEOUT_S + PING_INTERVAL_S


def test_threads_get_names_the_os_shows() -> None:
    names: list[str] = []

    def run() -> None:
        name_os_thread("a-long-thread-name-cut")
        names.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert names == ["a-long-thread-n"]  # the kernel keeps 15 bytes


async def test_the_storage_thread_is_named(tmp_path: Path) -> None:
    def comms() -> set[str]:
        return {p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")}

    assert "ld-storage" not in comms()
    async with Engine.open(tmp_path, Identity.from_seed(b"s" * 32)):
        assert "ld-storage" in comms()


class _Rounds(RetentionService):
    """Retention's timer with its work replaced by noting when each round ran."""

    def __init__(self, interval_s: float) -> None:
        super().__init__(engine=None, interval_s=interval_s)  # type: ignore[arg-type]
        self.rounds: list[float] = []

    def check_all(self) -> None:
        self.rounds.append(trio.current_time())

    async def purge_kv(self) -> int:
        return 0

    async def enforce_core2(self) -> int:
        return 0


async def test_retention_checks_every_interval_on_the_shared_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    service = _Rounds(10.0)
    await trio.sleep(3.7)
    with trio.move_on_after(60):
        await service._timer()
    assert service.rounds == [3.7, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]  # at once, then on the tick
