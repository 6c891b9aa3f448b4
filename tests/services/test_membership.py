"""Network membership: the public key refused beyond loopback, and invite/join on in-process daemons
(a new key is stored and replication restarts under it; a key shared with peers is not dropped silently)."""

from __future__ import annotations

import logging
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.api_polling import wait_for
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner

import cli.ctl
from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client
from latticed.daemon import run_daemon
from latticed.errors import AlreadyExistsError, MalformedError
from latticed.host.config import DaemonConfig, load_config
from latticed.host.invite import decode_invite
from latticed.host.netkey import (
    DEFAULT_NETWORK_KEY,
    check_listen_key,
    is_loopback_host,
    new_network_key,
    read_network_key,
    replace_network_key,
    write_network_key,
)
from latticed.process.logs import EVENT_ATTR, record_fields
from latticed.protocol.peerbook import PeerBook

PRIVATE = bytes(range(32))


# --- the public default key beyond loopback -------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.6.7", "::1", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)
    check_listen_key((host, 7464), DEFAULT_NETWORK_KEY, insecure_ok=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "fe80::1", "myhost", "localhost.example"])
def test_beyond_loopback_the_public_key_is_refused(host: str) -> None:
    assert not is_loopback_host(host)
    with pytest.raises(MalformedError) as raised:
        check_listen_key((host, 7464), DEFAULT_NETWORK_KEY, insecure_ok=False)
    message = str(raised.value)
    assert "\n" not in message
    assert "latticed network-key new PATH" in message and "latticed init" in message
    assert "--insecure-public-network-key" in message
    check_listen_key((host, 7464), DEFAULT_NETWORK_KEY, insecure_ok=True)  # the explicit opt-in
    check_listen_key((host, 7464), PRIVATE, insecure_ok=False)  # a private key
    check_listen_key(None, DEFAULT_NETWORK_KEY, insecure_ok=False)  # not listening at all


def test_the_opt_in_is_a_config_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("insecure_public_network_key = true\n")
    assert load_config(path, {}, env={}).insecure_public_network_key is True
    path.write_text('insecure_public_network_key = "yes"\n')
    with pytest.raises(MalformedError, match="insecure_public_network_key"):
        load_config(path, {}, env={})


async def test_daemon_refuses_before_creating_anything(tmp_path: Path) -> None:
    config = DaemonConfig(
        data_dir=tmp_path / "data", socket_path=tmp_path / "run" / "s.sock", listen=("0.0.0.0", 0)
    )
    with pytest.raises(MalformedError, match="public default network key"):
        await run_daemon(config, handle_signals=False, tune_gc=False)
    assert list(tmp_path.iterdir()) == []


async def test_a_key_file_holding_the_public_key_is_refused_too(tmp_path: Path) -> None:
    key_file = tmp_path / "network.key"
    write_network_key(key_file, DEFAULT_NETWORK_KEY)
    config = DaemonConfig(
        data_dir=tmp_path / "data",
        socket_path=tmp_path / "s.sock",
        listen=("::", 0),
        network_key_file=key_file,
    )
    with pytest.raises(MalformedError, match="public default network key"):
        await run_daemon(config, handle_signals=False, tune_gc=False)
    assert not (tmp_path / "data").exists()


def test_replace_network_key(tmp_path: Path) -> None:
    path = tmp_path / "network.key"
    replace_network_key(path, PRIVATE)  # creates
    assert read_network_key(path) == PRIVATE
    other = new_network_key()
    replace_network_key(path, other)  # replaces
    assert read_network_key(path) == other
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["network.key"]


def test_a_peer_from_an_invite_is_persisted_and_dialled_at_once() -> None:
    book = PeerBook(own_public_key=b"\x09" * 32, rng=lambda: 0.0)
    now = 1_700_000_000.0
    book.remember(("192.0.2.1", 7464), b"\x01" * 32, now=now)
    assert book.due(now) == [("192.0.2.1", 7464)]
    restored = PeerBook.from_json(book.to_json(), now=now + 60)
    assert [s.public_key for s in restored.snapshot()] == [(b"\x01" * 32).hex()]
    for i in range(20):  # an unreachable inviter is not forgotten after a few failures
        book.failed(("192.0.2.1", 7464), now + i)
        book.due(now + 10_000 + i)
    assert ("192.0.2.1", 7464) in book


# --- invite and join on in-process daemons --------------------------------------------------------


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., InProcessDaemon]]:
    started: list[InProcessDaemon] = []

    def start(
        name: str,
        *,
        key: bytes | None = None,
        listen: bool = True,
        key_file: bool = True,
        allowed: tuple[str, ...] = (),
        mdns: bool = False,
    ) -> InProcessDaemon:
        root = tmp_path / name
        root.mkdir()
        path = root / "network.key"
        if key is not None:
            write_network_key(path, key)
        config = DaemonConfig(
            data_dir=root / "data",
            socket_path=root / "api.sock",
            listen=("127.0.0.1", 0) if listen else None,
            mdns=mdns,
            mdns_interfaces=("127.0.0.1",),
            network_key_file=path if key_file else None,
            allowed_peers=allowed,
        )
        daemon = start_in_process(config, name)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def holds(client: Client, queue: str, end: int) -> bool:
    try:
        return int(client.queue_info(queue)["end_offset"]) >= end
    except Exception:
        return False


def test_join_switches_the_key_and_replicates_without_a_restart(
    daemons: Callable[..., InProcessDaemon],
) -> None:
    a = daemons("a", key=new_network_key())
    b = daemons("b", key=new_network_key())  # a fresh key of its own, shared with nobody yet
    with a.client() as ca, b.client() as cb:
        queue = ca.queue_create("q")
        ca.offer("q", b"from a")
        b_listen = cb.status()["listen"]
        token = ca.invite()
        invite = decode_invite(token)
        assert invite.identity.hex() == ca.identity()
        assert invite.addresses == (("127.0.0.1", int(ca.status()["listen"].rsplit(":", 1)[1])),)
        joined = cb.join(token)
        assert joined["key_changed"] and joined["peer"] == ca.identity()
        assert read_network_key(b.config.network_key_file) == invite.network_key  # type: ignore[arg-type]
        wait_for(lambda: holds(cb, queue, 1), "a's queue on b")
        assert cb.status()["listen"] == b_listen  # restarted on the port it had
        mine = cb.queue_create("back")
        cb.offer("back", b"from b")
        wait_for(lambda: holds(ca, mine, 1), "b's queue on a")
        again = cb.join(token)  # the same network: nothing to switch
        assert not again["key_changed"]


class _Events(logging.Handler):
    """The daemons' log events in order, with a condition to wait on (they log from their own threads)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, dict[str, object]]] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.seen.append((getattr(record, EVENT_ATTR, ""), record_fields(record)))
            self.changed.notify_all()

    def index(self, event: str, **fields: object) -> int | None:
        for i, (name, got) in enumerate(list(self.seen)):
            if name == event and all(got.get(k) == v for k, v in fields.items()):
                return i
        return None

    def wait_for(self, event: str, **fields: object) -> int:
        with self.changed:
            assert self.changed.wait_for(lambda: self.index(event, **fields) is not None, 30), event
        found = self.index(event, **fields)
        assert found is not None
        return found


@pytest.fixture
def events() -> Iterator[_Events]:
    handler = _Events()
    logger = logging.getLogger("latticed")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_join_waits_for_no_mdns_announcement_nor_goodbye(
    daemons: Callable[..., InProcessDaemon], events: _Events
) -> None:
    """Replication restarts under the invite's key at once: announcing on mDNS under it (~1.5 s of
    probing) and the old announcement's goodbyes (~0.25 s) go on after the reply."""
    a = daemons("a", key=new_network_key())
    b = daemons("b", key=new_network_key(), mdns=True)
    with a.client() as ca, b.client() as cb:
        first = events.wait_for("mdns.registered")  # b has been up a while: announced
        old_name = events.seen[first][1]["name"]
        token = ca.invite()
        assert cb.join(token)["key_changed"]
        joined = events.wait_for("network.joined")
        new_network = events.seen[joined][1]["network"]
        registered = events.wait_for("mdns.registered", network=new_network)
        stopped = events.wait_for("mdns.stopped", goodbye=True)
        assert joined < registered and joined < stopped, events.seen[first:]
        assert events.seen[registered][1]["name"] != old_name  # a new random name on the new network


def test_join_refuses_to_drop_a_key_shared_with_peers_unless_forced(
    daemons: Callable[..., InProcessDaemon],
) -> None:
    shared = new_network_key()
    a = daemons("a", key=shared)
    b = daemons("b", key=shared)
    c = daemons("c", key=new_network_key())
    with a.client() as ca, b.client() as cb, c.client() as cc:
        cb.join(ca.invite())  # same key: only remembers a as a peer
        wait_for(lambda: any(p["connected"] for p in cb.peers()), "b connected to a")
        with pytest.raises(AlreadyExistsError, match="--force") as raised:
            cb.join(cc.invite())
        assert ca.identity()[:16] in str(raised.value)
        assert read_network_key(b.config.network_key_file) == shared  # type: ignore[arg-type]
        cb.join(cc.invite(), force=True)
        assert read_network_key(b.config.network_key_file) != shared  # type: ignore[arg-type]
        queue = cc.queue_create("c-q")
        cc.offer("c-q", b"x")
        wait_for(lambda: holds(cb, queue, 1), "c's queue on b")


def test_invite_and_join_refusals(daemons: Callable[..., InProcessDaemon]) -> None:
    public = daemons("public", key_file=False)  # loopback with the public default key
    quiet = daemons("quiet", key=new_network_key(), listen=False)
    keyless = daemons("keyless", key_file=False, listen=False)
    picky = daemons("picky", key=new_network_key(), listen=False, allowed=("ab" * 32,))
    with public.client() as cp, quiet.client() as cq, keyless.client() as ck, picky.client() as cy:
        with pytest.raises(MalformedError, match="public default network key"):
            cp.invite()
        with pytest.raises(MalformedError, match="does not accept peers"):
            cq.invite()
        token = cq.invite(["192.0.2.1:7464"])  # an address given by hand
        assert decode_invite(token).addresses == (("192.0.2.1", 7464),)
        with pytest.raises(MalformedError, match="own"):
            cq.join(token)
        with pytest.raises(MalformedError, match="allowed_peers"):
            cy.join(token)
        with pytest.raises(MalformedError, match="damaged"):
            ck.join(token[:-2] + ("a" if token[-2] != "a" else "b") + token[-1])


def test_a_daemon_without_a_key_file_keeps_the_joined_key_in_its_data_dir(
    daemons: Callable[..., InProcessDaemon], tmp_path: Path
) -> None:
    a = daemons("a", key=new_network_key())
    config = DaemonConfig(
        data_dir=tmp_path / "b" / "data",
        socket_path=tmp_path / "b" / "api.sock",
        listen=("127.0.0.1", 0),  # the public default key, as on loopback it may
        mdns=False,
    )
    kept = config.data_dir / "network.key"
    b = start_in_process(config, "b")
    try:
        with a.client() as ca, b.client() as cb:
            token = ca.invite()
            joined = cb.join(token)
            assert joined["key_changed"] and joined["key_file"] == str(kept)
            assert read_network_key(kept) == decode_invite(token).network_key
            assert stat.S_IMODE(kept.stat().st_mode) == 0o600
            queue = ca.queue_create("q")
            ca.offer("q", b"before")
            wait_for(lambda: holds(cb, queue, 1), "a's queue on b")
    finally:
        b.stop()
    b = start_in_process(config, "b-again")  # the next start reads the kept key: b is still in a's network
    try:
        with a.client() as ca, b.client() as cb:
            ca.offer("q", b"after")
            wait_for(lambda: holds(cb, queue, 2), "a's next record on the restarted b", timeout=60)
    finally:
        b.stop()


# --- latticectl invite / join without a daemon ------------------------------------------------------


def test_a_damaged_token_fails_before_the_daemon_is_asked(tmp_path: Path) -> None:
    runner = CliRunner()
    absent = str(tmp_path / "nobody.sock")
    for args, stdin in ((["join", "latticed1:abcdefgh"], None), (["join", "-"], "latticed9:aaaa\n")):
        result = runner.invoke(cli.ctl.app, ["--socket", absent, *args], input=stdin, prog_name="latticectl")
        assert result.exit_code == ExitCode.USAGE, result.output  # not 3: the daemon was never contacted
        [line] = result.stderr.splitlines()
        assert line.startswith("latticectl: error: ") and "latticed1:abcdefgh" not in line
    result = runner.invoke(cli.ctl.app, ["--socket", absent, "invite", "--address", "nonsense"])
    assert result.exit_code == ExitCode.USAGE, result.output
