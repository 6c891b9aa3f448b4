"""Replication out of the box, with real processes on loopback: daemons set up by ``latticed init --user``
(XDG directories in a temp dir) and started with nothing but ``--config``; the public key refused beyond
loopback; ``latticectl invite`` / ``join`` switching a running daemon to another network.

``init --listen 127.0.0.1:0 --mdns-interface 127.0.0.1`` keeps everything on loopback (a LAN would use the
defaults, 0.0.0.0:7464 and every interface); mDNS works on loopback (see test_discovery_loopback.py), so the
first test finds its peer by mDNS like two machines on a LAN. The invite test turns mDNS off, so only the
address in the token can bring the daemons together.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from daemon_calls import CALL_TIMEOUT_S
from daemons import START_TIMEOUT_S, socket_accepts
from polling import wait_until

from latticed.api.client.blocking_client import Client
from latticed.host.netkey import DEFAULT_NETWORK_KEY, read_network_key

BIN = Path(sys.executable).parent
LATTICED = [sys.executable, "-m", "latticed"]
LOOPBACK = ["--listen", "127.0.0.1:0", "--mdns-interface", "127.0.0.1"]


@dataclass
class Home:
    """One machine's user account: its own XDG directories, ``latticed init --user``, ``latticed run``."""

    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.root / "cfg"),
            "XDG_STATE_HOME": str(self.root / "state"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
        }

    @property
    def config(self) -> Path:
        return self.root / "cfg" / "latticed" / "latticed.toml"

    @property
    def data_dir(self) -> Path:
        return self.root / "state" / "latticed"

    @property
    def socket(self) -> Path:
        return self.root / "run" / "latticed" / "latticed.sock"

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    def init(self, *args: str) -> str:
        done = subprocess.run(
            [*LATTICED, "init", "--user", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self) -> None:
        """``latticed run --config FILE``: no other flag."""
        log = (self.root / "daemon.log").open("ab")
        proc = subprocess.Popen(
            [*LATTICED, "run", "--config", str(self.config)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        wait_until(
            lambda: socket_accepts(self.socket) or proc.poll() is not None, "the socket", START_TIMEOUT_S
        )
        assert proc.poll() is None, (self.root / "daemon.log").read_text()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def client(self) -> Client:
        return Client(self.socket, timeout=CALL_TIMEOUT_S)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of this home's daemon log, for a failure report."""
        log = self.root / "daemon.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return f"--- {self.root.name}'s daemon.log (last {lines} lines) ---\n" + "\n".join(
            text.splitlines()[-lines:]
        )

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "latticectl"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def homes() -> Iterator[Callable[[str], Home]]:
    base = Path(tempfile.mkdtemp(prefix="ld-init-"))  # short: socket paths must fit in 107 bytes
    made: list[Home] = []

    def make(name: str) -> Home:
        home = Home(base / name)
        (home.root / "run").mkdir(parents=True, mode=0o700)
        made.append(home)
        return home

    yield make
    for home in made:
        for proc in home.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    shutil.rmtree(base, ignore_errors=True)


def holds(home: Home, queue: str, end: int) -> bool:
    with home.client() as c:
        try:
            return int(c.queue_info(queue)["end_offset"]) >= end
        except Exception:
            return False


def test_two_daemons_from_init_configs_replicate_with_no_flags(homes: Callable[[str], Home]) -> None:
    a, b = homes("a"), homes("b")
    out = a.init(*LOOPBACK)
    assert "network key" in out and "next:" in out
    key = read_network_key(a.data_dir / "network.key")
    assert key != DEFAULT_NETWORK_KEY
    # The other machine gets the key file (the manual alternative to invite/join); init keeps it.
    b.data_dir.mkdir(parents=True, mode=0o700)
    shutil.copy2(a.data_dir / "network.key", b.data_dir / "network.key")
    assert "(kept" in b.init(*LOOPBACK)
    a.start()
    b.start()
    with a.client() as ca:
        queue = ca.queue_create("out-of-the-box")
        ca.offer_batch("out-of-the-box", [(b"r%d" % i, None, ()) for i in range(20)])
    with b.client() as cb:
        mine = cb.queue_create("back")
        cb.offer("back", b"from b")
    wait_until(lambda: holds(b, queue, 20), "a's records on b (found by mDNS)")
    wait_until(lambda: holds(a, mine, 1), "b's record on a")

    def found_by_mdns() -> bool:  # replication may finish before b resolves a's announcement (a dialled b)
        with b.client() as cb:
            return any("mdns" in p["sources"] for p in cb.peers())

    wait_until(found_by_mdns, "b finding a by mDNS")


def test_public_key_beyond_loopback_is_refused_unless_opted_in(tmp_path: Path) -> None:
    data, sock = tmp_path / "data", tmp_path / "run" / "d.sock"
    argv = [*LATTICED, "run", "--data-dir", str(data), "--socket", str(sock), "--no-mdns"]
    refused = subprocess.run(
        [*argv, "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert line.startswith(
        "latticed: error: refusing to listen on 0.0.0.0:0 with the public default network key"
    )
    assert "`latticed network-key new PATH`" in line and "`latticed init`" in line
    assert refused.stdout == ""
    assert not data.exists() and not sock.parent.exists()  # nothing created

    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--listen", "0.0.0.0:0", "--insecure-public-network-key"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: socket_accepts(sock) or proc.poll() is not None, "the opted-in daemon", START_TIMEOUT_S
        )
        assert proc.poll() is None
        with Client(sock, timeout=CALL_TIMEOUT_S) as c:
            assert c.status()["listen"].startswith("0.0.0.0:")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "insecure_network_key" in log.read_text()  # and it says so in its log


def test_invite_and_join_switch_a_running_daemon_to_the_network(homes: Callable[[str], Home]) -> None:
    a, b = homes("a"), homes("b")
    a.init("--listen", "127.0.0.1:0", "--no-mdns")
    b.init("--listen", "127.0.0.1:0", "--no-mdns")
    assert read_network_key(a.data_dir / "network.key") != read_network_key(b.data_dir / "network.key")
    a.start()
    b.start()
    with a.client() as ca:
        queue = ca.queue_create("invited")
        ca.offer("invited", b"before the join")

    invite = a.ctl("invite")
    assert invite.returncode == 0, invite.stderr
    token = invite.stdout.strip()
    assert token.startswith("latticed1:") and "\n" not in token
    assert "secret" in invite.stderr

    b_pid = b.proc.pid
    joined = b.ctl("join", token)
    assert joined.returncode == 0, joined.stderr
    assert "joined network" in joined.stdout

    def logs() -> str:
        return f"{a.log_tail()}\n{b.log_tail()}"

    wait_until(lambda: holds(b, queue, 1), "a's queue on b after the join", diagnose=logs)
    assert b.proc.poll() is None and b.proc.pid == b_pid  # no restart
    assert read_network_key(b.data_dir / "network.key") == read_network_key(a.data_dir / "network.key")

    # Both survive a restart: the key is in b's key file, a in its peer book (mDNS is off).
    assert b.stop() == 0
    b.start()
    with a.client() as ca:
        ca.offer("invited", b"after b's restart")
    wait_until(lambda: holds(b, queue, 2), "a's new record on the restarted b", diagnose=logs)
    with b.client() as cb:
        [peer] = [p for p in cb.peers() if p["connected"]]
        assert "remembered" in peer["sources"]
