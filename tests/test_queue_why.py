"""``latticectl queue why``: the verdict names the right reason in each case (the pure verdict for every
branch, then in-process daemons: up to date, owner offline, the only holder offline, blocked peer, capped
replica, forked), and the facts it shows."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.api_polling import wait_for
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.signing import Identity
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig
from latticed.protocol.replication import PeerMemory
from latticed.protocol.why_verdict import PeerFacts, QueueFacts, verdict

runner = CliRunner()
BOB = Identity.from_seed(b"w" * 32)
OWNER = "ab" * 32
OTHER = "cd" * 32


def facts(**changes: object) -> QueueFacts:
    base = QueueFacts(
        address=f"{OWNER}/q",
        owned=False,
        start=0,
        held_start=0,
        held_end=10,
        known_end=10,
        forked=False,
        fork_at=None,
        fork_proof=None,
        capped=False,
        peers=(
            PeerFacts(
                OWNER, connected=True, blocked=False, since=0.0, held_start=0, held_end=10, is_owner=True
            ),
        ),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def text(f: QueueFacts) -> str:
    return verdict(f, lambda wall: "14:02")


def test_each_verdict_of_the_pure_rules() -> None:
    owner_off = PeerFacts(OWNER, connected=False, blocked=False, since=1.0, held_end=10, is_owner=True)
    assert text(facts()) == "up to date"
    assert text(facts(peers=(owner_off,))).startswith("owner offline since 14:02")
    holder = PeerFacts(OTHER, connected=False, blocked=False, since=1.0, held_start=0, held_end=1214)
    assert text(facts(peers=(owner_off, holder))) == (
        f"behind by 1,204 records: the only peer that holds them, {OTHER[:16]}, has been offline since 14:02"
    )
    assert text(facts(peers=(owner_off, dataclasses.replace(holder, connected=True)))).startswith(
        "behind by 1,204 records: catching up from"
    )
    assert text(facts(peers=(owner_off, dataclasses.replace(holder, blocked=True)))).startswith(
        "blocked peer"
    )
    assert text(facts(peers=(dataclasses.replace(owner_off, blocked=True),))).startswith("blocked peer")
    assert text(facts(known_end=50, peers=(owner_off,))).startswith("owner offline: behind by 40 records")
    assert text(facts(capped=True, held_start=5)).startswith("capped here by replica_max_bytes: holds 5..9")
    assert text(facts(forked=True, fork_at=7, fork_proof="ee" * 32)).startswith(
        f"frozen: forked at offset 7 (proof {'ee' * 8})"
    )
    # A peer that dropped the records we lack (its own cap) does not hold what comes next for us.
    capped_peer = dataclasses.replace(holder, connected=True, held_start=500)
    assert text(facts(peers=(owner_off, capped_peer))).startswith("owner offline: behind by 1,204")


# ------------------------------------------------------------------ in-process daemons


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., InProcessDaemon]]:
    started: list[InProcessDaemon] = []

    def start(name: str, *peers: InProcessDaemon, **config: object) -> InProcessDaemon:
        root = tmp_path / name
        root.mkdir()
        addresses = tuple(("127.0.0.1", int(p.client().status()["listen"].rsplit(":", 1)[1])) for p in peers)
        daemon = start_in_process(
            DaemonConfig(
                data_dir=root / "data",
                socket_path=root / "api.sock",
                listen=("127.0.0.1", 0),
                peers=addresses,
                mdns=False,
                **config,  # type: ignore[arg-type]
            ),
            name,
        )
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def why(daemon: InProcessDaemon, queue: str) -> dict[str, object]:
    result = ctl(daemon, "queue", "why", queue, "--json")
    assert result.exit_code == 0, result.output
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def test_up_to_date_then_blocked_peer(daemons: Callable[..., InProcessDaemon]) -> None:
    a = daemons("a")
    b = daemons("b", a)
    with a.client() as ca:
        queue = ca.queue_create("orders")
        ca.offer_batch("orders", [(b"r%d" % i, None, []) for i in range(5)])
        owner = ca.identity()
    wait_for(
        lambda: b.client().queue_list() and why(b, queue)["behind"] == 0 and why(b, queue)["holds"] == [0, 5],
        "catch-up",
    )
    answer = why(b, queue)
    assert answer["verdict"] == "up to date"
    [row] = answer["peers"]  # type: ignore[misc]
    assert row["peer"] == owner and row["connected"] and row["held_end"] == 5
    assert why(a, "orders")["verdict"] == "up to date"  # the owner's own
    human = ctl(b, "queue", "why", queue)
    assert human.exit_code == 0 and human.stdout.splitlines()[0] == "up to date" and "PEER" in human.stdout
    assert ctl(b, "peers", "block", owner).exit_code == 0
    assert str(why(b, queue)["verdict"]).startswith("blocked peer: the owner")


def test_owner_offline_and_the_only_holder_offline(daemons: Callable[..., InProcessDaemon]) -> None:
    b = daemons("b")
    feed = LatticeQueue.create(BOB, f"feed{secrets.token_hex(2)}")
    for i in range(20):
        feed.offer(b"f%d" % i)
        if i % 4 == 3:
            feed.commit()  # a head every 4 records: a delta can stop at one
    first = feed.delta(max_records=8)
    b.call(b.handle.engine.merge_delta, first)
    address = f"{BOB.public_key.hex()}/{feed.name}"
    assert str(why(b, address)["verdict"]).startswith("owner offline: behind by 12 records")
    # A peer that held all of it was connected and went away: what its link left behind says so.
    gone = Identity.from_seed(b"g" * 32).public_key
    held = {(BOB.public_key, feed.name, KIND_QUEUE): core.Summary(version=1, start=0, held_end=20)}
    gossip = b.handle.membership.service.gossip  # type: ignore[union-attr]

    async def remember() -> None:
        gossip._remember(gone, PeerMemory(b"i" * 16, {}, held))  # what a link leaves when it ends

    b.call(remember)
    answer = why(b, address)
    assert str(answer["verdict"]).startswith(
        f"behind by 12 records: the only peer that holds them, {gone.hex()[:16]}, has been offline since "
    )
    b.call(
        b.handle.engine.merge_delta,
        feed.delta(b.handle.engine.state(b.handle.engine.resolve(address)).summary()),
    )
    assert str(why(b, address)["verdict"]).startswith("owner offline: holds all")  # never seen here


def test_capped_replica(daemons: Callable[..., InProcessDaemon]) -> None:
    b = daemons("b", replica_max_bytes=1_000_000)
    feed = LatticeQueue.create(BOB, f"capped{secrets.token_hex(2)}")
    for i in range(50):
        feed.offer(b"c%d" % i)
    feed.commit()
    b.call(b.handle.engine.merge_delta, feed.delta())
    engine = b.handle.engine
    q = engine.resolve(f"{BOB.public_key.hex()}/{feed.name}")
    b.call(engine.drop_local, q, 30)
    answer = why(b, f"{BOB.public_key.hex()}/{feed.name}")
    assert str(answer["verdict"]).startswith(
        "capped here by replica_max_bytes: holds 30..49, the owner keeps from 0"
    )


def test_forked(daemons: Callable[..., InProcessDaemon]) -> None:
    d = daemons("d")
    name = f"q{secrets.token_hex(3)}"
    with d.client() as c:
        c.queue_create(name, core=1)  # the second history is v1 deltas: core 1's fork
        c.offer(name, b"this daemon's record")
    other = LatticeQueue.create(d.handle.identity, name)
    other.offer(b"a")
    other.commit()
    first = other.delta()
    other.offer(b"b")
    other.commit()
    d.call(d.handle.engine.merge_delta, dataclasses.replace(first, head=other.delta().head))
    state = d.handle.engine.state(d.handle.engine.resolve(name))
    assert state.forked and state.fork is not None
    answer = why(d, name)
    assert str(answer["verdict"]).startswith("frozen: forked at") and state.fork.digest().hex()[:16] in str(
        answer["verdict"]
    )


def test_lag_metrics_have_no_queue_label() -> None:
    from latticed.services.lag_metrics import lag_histogram  # noqa: PLC0415

    family = lag_histogram([0, 3, 1204, 0, 2_000_000])
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("latticed_queue_lag_records_bucket", "10")] == 1
    assert samples[("latticed_queue_lag_records_bucket", "10000")] == 2
    assert samples[("latticed_queue_lag_records_bucket", "+Inf")] == 3
    assert samples[("latticed_queue_lag_records_sum", None)] == 2_001_207
    assert {key for s in family.samples for key in s.labels} == {"le"}
