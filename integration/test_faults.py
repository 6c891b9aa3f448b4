"""Faults an operator can see, with real daemon processes on loopback: each peer's state (connected,
dialling, refused with the reason, blocked), a wrong-key peer on both sides, clock skew from the
handshake, a fork detected between processes, peer management that survives restarts, and the doctor."""

from __future__ import annotations

import json
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from daemon_calls import client, ctl, runner
from daemons import LatticedProcess
from polling import wait_until
from typer.testing import Result

import cli.ctl
from cli.boundary import ExitCode
from latticed.crdt.signing import Identity
from latticed.errors import HandshakeError
from latticed.host.diskspace import disk_is_low, disk_usage
from latticed.host.netkey import DEFAULT_NETWORK_KEY, write_network_key
from latticed.protocol.handshake import Initiator

Factory = Callable[..., LatticedProcess]


def identity(daemon: LatticedProcess) -> str:
    with client(daemon) as c:
        return c.identity()


def listen_port(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        listen = c.status()["listen"]
    assert listen is not None
    return int(listen.rsplit(":", 1)[1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rows(daemon: LatticedProcess) -> list[dict[str, Any]]:
    with client(daemon) as c:
        return c.peers()


def row(
    daemon: LatticedProcess, *, address: str | None = None, key: str | None = None
) -> dict[str, Any] | None:
    for r in rows(daemon):
        if (address is None or r.get("address") == address) and (key is None or r.get("public_key") == key):
            return r
    return None


def has_row(daemon: LatticedProcess, **expected: Any) -> bool:
    """A peers row whose fields include ``expected`` (``address`` and ``public_key`` select it)."""
    return any(all(r.get(k) == v for k, v in expected.items()) for r in rows(daemon))


def text_line(result: Result, needle: str) -> str:
    [line] = [ln for ln in result.stdout.splitlines() if needle in ln]
    return line


def log_events(daemon: LatticedProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in daemon.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            if doc.get("event") == event:
                out.append(doc)
    return out


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "one.key", tmp_path / "two.key"
    write_network_key(one)
    write_network_key(two)
    return one, two


def start(factory: Factory, key: Path, *extra: str, port: int = 0) -> LatticedProcess:
    return factory(
        args=["--listen", f"127.0.0.1:{port}", "--no-mdns", "--network-key-file", str(key), *extra]
    )


# --- peer states ---------------------------------------------------------------------------------------


def test_each_peer_shows_its_real_state(latticed_process: Factory, keys: tuple[Path, Path]) -> None:
    one, two = keys
    stranger = start(latticed_process, one)  # another network key
    friend = start(latticed_process, two)
    closed = free_port()  # nobody listens there
    at = {
        name: f"127.0.0.1:{port}"
        for name, port in (
            ("stranger", listen_port(stranger)),
            ("friend", listen_port(friend)),
            ("closed", closed),
        )
    }
    me = start(latticed_process, two, *(x for a in at.values() for x in ("--peer", a)))
    friend_id = identity(friend)

    wait_until(
        lambda: has_row(me, address=at["friend"], status="connected", in_sync=True), "friend connected"
    )
    wait_until(lambda: has_row(me, address=at["stranger"], status="refused", failure="no_answer"), "refused")
    wait_until(
        lambda: has_row(me, address=at["closed"], status="dialling", failure="unreachable"), "dialling"
    )
    peers = ctl(me, "peers")
    assert peers.exit_code == 0, peers.output
    friend_line = text_line(peers, at["friend"])  # LAG, SENT/ACKED (deltas on the link), STATE
    assert re.search(r"  in sync  \d+/\d+ +connected$", friend_line), friend_line
    refused = text_line(peers, at["stranger"])
    assert "refused (no answer to the handshake: wrong network key?" in refused and "failure" in refused
    unreachable = text_line(peers, at["closed"])
    assert "dialling (cannot connect to" in unreachable and "Connection refused" in unreachable
    assert "next try in" in unreachable or "trying" in unreachable
    # The stranger, which accepted our dial and stayed silent, tells its own operator why.
    wait_until(
        lambda: has_row(stranger, status="refused", failure="incoming"), "the refusal on the other side"
    )
    [seen] = [r for r in rows(stranger) if r["failure"] == "incoming"]
    assert seen["address"] == "127.0.0.1" and "another network key" in seen["reason"]
    assert "refused (we refused its handshake" in ctl(stranger, "peers").stdout

    # A disconnected peer is never "in sync".
    friend.stop()
    wait_until(lambda: not has_row(me, address=at["friend"], status="connected"), "friend gone")
    gone = row(me, address=at["friend"])
    assert gone is not None and gone["in_sync"] is False and gone["public_key"] == friend_id
    line = text_line(ctl(me, "peers"), at["friend"])
    assert "in sync" not in line and re.search(r"  -  +-  ", line), line  # no lag, no link's counts


def _handshake_with_clock(port: int, offset_ms: int, seed: bytes) -> None:
    """Open a handshake whose first message carries our clock moved by ``offset_ms``."""

    async def run() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        now = time.time_ns() // 1_000_000
        handshake = Initiator(seed=seed, network_key=DEFAULT_NETWORK_KEY, now_ms=now + offset_ms)
        with trio.fail_after(10):
            await stream.send_all(handshake.initiate())
            while not handshake.done:
                data = await stream.receive_some(1 << 16)
                if not data:
                    raise HandshakeError("the daemon hung up")
                out = handshake.receive_data(data)
                if out:
                    await stream.send_all(out)
        await stream.aclose()

    trio.run(run)


def test_clock_skew_seen_in_the_handshake_is_logged_once_and_shown(latticed_process: Factory) -> None:
    daemon = latticed_process(args=["--listen", "127.0.0.1:0", "--no-mdns"])
    port = listen_port(daemon)
    seed = Identity.generate().seed
    _handshake_with_clock(port, 45_000, seed)  # accepted (within 2 minutes), but 45 s is worth a warning
    _handshake_with_clock(port, 46_000, seed)
    with pytest.raises(HandshakeError):
        _handshake_with_clock(port, -300_000, seed)  # refused as stale: the dialler hears nothing

    def skewed() -> list[dict[str, Any]]:
        with client(daemon) as c:
            return list(c.status()["clock_skew"])

    wait_until(lambda: len(skewed()) == 2, "both skewed peers in status")
    ahead, behind = sorted(skewed(), key=lambda r: -r["offset_ms"])
    assert 44_000 < ahead["offset_ms"] < 47_000 and ahead["peer"] is not None
    assert behind["offset_ms"] < -299_000 and behind["peer"] is None and behind["address"] == "127.0.0.1"
    assert len(log_events(daemon, "clock.skew")) == 2  # the second 45 s handshake added nothing
    assert "s ahead" in ctl(daemon, "status").stdout


# --- peer management -----------------------------------------------------------------------------------


def test_a_block_survives_a_restart_and_unblock_lets_the_peer_back(
    latticed_process: Factory, keys: tuple[Path, Path]
) -> None:
    _, key = keys
    port = free_port()
    home = start(latticed_process, key, port=port)
    laptop = start(latticed_process, key, "--peer", f"127.0.0.1:{port}")
    laptop_id = identity(laptop)
    wait_until(lambda: has_row(home, public_key=laptop_id, status="connected"), "laptop connected")

    blocked = ctl(home, "peers", "block", laptop_id)
    assert blocked.exit_code == 0 and blocked.stdout == "", blocked.output
    assert blocked.stderr.startswith(f"blocked {laptop_id}")
    wait_until(lambda: has_row(home, public_key=laptop_id, status="blocked", connected=False), "link closed")
    # The laptop redials and is refused after showing its identity: it is told so precisely.
    wait_until(
        lambda: has_row(laptop, address=f"127.0.0.1:{port}", status="refused", failure="refused_us"),
        "the laptop sees the refusal",
    )
    rules = json.loads((home.data_dir / "peer_rules.json").read_text())
    assert rules["blocked"] == [laptop_id]

    home.stop()
    refusals_before = len(log_events(home, "peer.handshake_failed"))
    home.start()
    wait_until(
        lambda: any(
            laptop_id in e["error"] for e in log_events(home, "peer.handshake_failed")[refusals_before:]
        ),
        "the restarted daemon refuses the blocked peer",
    )
    assert not has_row(home, public_key=laptop_id, status="connected")
    assert has_row(home, public_key=laptop_id, status="blocked")
    assert "blocked" in text_line(ctl(home, "peers"), laptop_id)

    unblocked = ctl(home, "--json", "peers", "unblock", laptop_id)
    assert unblocked.exit_code == 0 and json.loads(unblocked.stdout)["changed"] is True
    wait_until(lambda: has_row(home, public_key=laptop_id, status="connected"), "laptop back")
    assert json.loads((home.data_dir / "peer_rules.json").read_text())["blocked"] == []


def test_peers_add_persists_and_remove_forgets(latticed_process: Factory, keys: tuple[Path, Path]) -> None:
    _, key = keys
    office = start(latticed_process, key)
    address = f"127.0.0.1:{listen_port(office)}"
    office_id = identity(office)
    laptop = start(latticed_process, key)
    laptop_id = identity(laptop)

    added = ctl(laptop, "peers", "add", address)
    assert added.exit_code == 0 and added.stdout == "" and "added peer" in added.stderr, added.output
    wait_until(lambda: has_row(laptop, address=address, status="connected", public_key=office_id), "dialled")
    assert "added" in (row(laptop, address=address) or {})["sources"]
    again = ctl(laptop, "--json", "peers", "add", address)
    assert json.loads(again.stdout) == {"address": address, "new": False}
    assert ctl(laptop, "peers", "add", "no-port").exit_code == ExitCode.USAGE

    laptop.stop()
    laptop.start()
    wait_until(lambda: has_row(laptop, address=address, status="connected"), "redialled after a restart")

    removed = ctl(laptop, "--json", "peers", "remove", office_id)
    assert removed.exit_code == 0, removed.output
    assert json.loads(removed.stdout) == {"removed": [address], "public_key": office_id, "static": []}
    assert row(laptop, address=address) is None
    wait_until(lambda: not has_row(office, public_key=laptop_id, connected=True), "the link closed")
    assert ctl(laptop, "peers", "remove", office_id).exit_code == ExitCode.NOT_FOUND
    rules = json.loads((laptop.data_dir / "peer_rules.json").read_text())
    assert rules["added"] == []
    laptop.stop()
    book = json.loads((laptop.data_dir / "peers.json").read_text())
    assert all(p["public_key"] != office_id for p in book["peers"])
    laptop.start()
    assert row(laptop, address=address) is None  # forgotten: nothing left to redial


# --- a fork between processes ------------------------------------------------------------------------------


def test_a_fork_is_logged_once_and_shown(latticed_process: Factory) -> None:
    """A data directory's identity copied to a second machine that writes the same queue: the daemon that
    hears both histories flags the queue, logs it once, and shows it in status, queue list and info; the
    copy flags it from the proof and refuses its writes. Core 1's fork proof (a core-2 queue freezes
    instead: integration/test_core2_daemons.py)."""
    original = latticed_process(args=["--listen", "127.0.0.1:0", "--no-mdns"])
    witness = latticed_process(
        args=["--listen", "127.0.0.1:0", "--no-mdns", "--peer", f"127.0.0.1:{listen_port(original)}"]
    )
    with client(original) as c:
        queue = c.queue_create("ledger", core=1)
        c.offer("ledger", b"the first history")
    wait_until(lambda: _end(witness, queue) >= 1, "the witness holds the first history")
    original.stop()

    copy_dir = original.data_dir.with_name(original.data_dir.name + "-copy")
    copy_dir.mkdir(mode=0o700)
    shutil.copy2(original.data_dir / "identity.key", copy_dir / "identity.key")
    copy = latticed_process(data_dir=copy_dir, args=["--no-mdns"])  # offline while it writes
    with client(copy) as c:
        assert c.queue_create("ledger", core=1) == queue
        for value in (b"a second", b"history", b"signed by the same key"):
            c.offer("ledger", value)
        c.peers_add(f"127.0.0.1:{listen_port(witness)}")

    wait_until(lambda: _info(witness, queue)["forked"], "the witness flags the fork")
    proof = _info(witness, queue)["fork_proof"]
    assert isinstance(proof, str) and len(proof) == 64
    # The copy learns of the fork from the witness's proof; the queue stops there and its owner's daemon
    # refuses to write on (exit 6, one line naming the way out).
    wait_until(lambda: _info(copy, queue)["forked"], "the copy flags the fork too")
    refused = ctl(copy, "offer", "ledger", "more, after the fork")
    assert refused.exit_code == 6 and "latticectl queue recover ledger" in refused.stderr, refused.output
    [event] = [e for e in log_events(witness, "queue.forked") if e["queue"] == queue]
    assert event["level"] == "warning" and event["proof"] == proof
    with client(witness) as c:
        assert [f["queue"] for f in c.status()["forked_queues"]] == [queue]
    assert f"{queue} (proof {proof[:16]})" in ctl(witness, "status").stdout
    assert text_line(ctl(witness, "queue", "list"), queue).split()[-1] == "yes"


def _info(daemon: LatticedProcess, queue: str) -> dict[str, Any]:
    with client(daemon) as c:
        return c.queue_info(queue)


def _end(daemon: LatticedProcess, queue: str) -> int:
    try:
        return int(_info(daemon, queue)["end_offset"])
    except Exception:
        return 0


# --- doctor -------------------------------------------------------------------------------------------------


def test_doctor_passes_on_a_healthy_daemon(latticed_process: Factory, keys: tuple[Path, Path]) -> None:
    _, key = keys
    a = start(latticed_process, key)
    b = start(latticed_process, key, "--peer", f"127.0.0.1:{listen_port(a)}")
    usage = disk_usage(b.data_dir)
    if disk_is_low(usage.free, usage.total):
        pytest.skip("this machine's disk is low itself: the doctor would rightly say so")
    wait_until(lambda: has_row(b, status="connected"), "b connected to a")
    result = ctl(b, "doctor")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[-1] == "all checks passed"
    assert not any(line.startswith("✘") for line in lines)
    for check in ("socket", "data dir", "identity key", "network key", "disk", "listen", "peer"):
        assert any(line.startswith(f"✔ {check}:") for line in lines), (check, lines)
    report = json.loads(ctl(b, "doctor", "--json").stdout)
    assert report["ok"] is True and report["daemon_running"] is True


def test_doctor_names_each_problem_and_its_fix(latticed_process: Factory, tmp_path: Path) -> None:
    public = tmp_path / "public.key"
    write_network_key(public, DEFAULT_NETWORK_KEY)  # a key file that is no secret at all
    daemon = latticed_process(
        args=["--listen", "127.0.0.1:0", "--no-mdns", "--network-key-file", str(public)]
    )
    result = ctl(daemon, "doctor")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    i = lines.index(f"✘ network key: {public} holds the public default key: anyone can join")
    assert lines[i + 1].startswith("    fix: make a private key: `latticed network-key new")
    assert "✘ peer: no peers: this daemon replicates with nobody" in lines
    assert lines[-1] == "2 problems found"

    # Not running: it says so, then checks what it can from the config.
    daemon.stop()
    config = tmp_path / "latticed.toml"
    config.write_text(
        f'data_dir = "{daemon.data_dir}"\nsocket_path = "{daemon.socket}"\nnetwork_key_file = "{public}"\n'
        'listen = "127.0.0.1:0"\nmdns = false\n'
    )
    offline = runner.invoke(cli.ctl.app, ["doctor", "--config", str(config)], prog_name="latticectl")
    assert offline.exit_code == 1, offline.output
    lines = offline.stdout.splitlines()
    assert lines[0] == f"✘ socket: latticed is not running at {daemon.socket}"
    assert lines[1].startswith("    fix: start it: `systemctl start latticed`")
    assert f"- config: the daemon is not running: checking the config from {config}" in lines
    assert any(line.startswith("✔ identity key:") for line in lines)
    assert any(line.startswith("✘ network key:") for line in lines)
