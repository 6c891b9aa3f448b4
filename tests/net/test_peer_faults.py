"""The pure state behind visible faults, without sockets: why a dial failed and what state a peer is shown
in, the rules file, clock-skew and low-disk transitions (logged once each way), the handshake facts they
are built on, and the doctor's verdicts."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing
from typer.testing import CliRunner

import cli.latticed_command
import cli.peers
from latticed.errors import HandshakeError, LatticedError, MalformedError
from latticed.host.checklist import (
    Check,
    check_network_key,
    check_peer_rows,
    check_secret_file,
)
from latticed.host.config import DaemonConfig
from latticed.host.diskspace import LOW_DISK_BYTES, DiskUsage, disk_is_low
from latticed.host.mdns_interfaces import mdns_addresses, mdns_interfaces
from latticed.host.netkey import DEFAULT_NETWORK_KEY, write_network_key
from latticed.net.peer_faults import PeerFaults, load_rules, save_rules
from latticed.net.transport import SecureStream, secure_accept, secure_connect
from latticed.protocol.handshake import Initiator, Responder, public_key_from_seed
from latticed.protocol.peerbook import Backoff, PeerBook
from latticed.protocol.peerstate import (
    NO_ANSWER_REASON,
    REFUSED_US_REASON,
    ClockSkew,
    DialFailure,
    IncomingRefusals,
    PeerRules,
    classify_dial_failure,
    peer_status,
)
from latticed.services.health import Health
from latticed.storage.engine import Engine

K = bytes(range(32))
OTHER_K = bytes(range(1, 33))
SEED_A, SEED_B = b"\x11" * 32, b"\x22" * 32
PK_A, PK_B = public_key_from_seed(SEED_A), public_key_from_seed(SEED_B)
ADDR = ("192.0.2.7", 7464)


# --- why a dial failed --------------------------------------------------------------------------------


def test_a_dial_that_never_connected_is_unreachable() -> None:
    failure = classify_dial_failure(reached=False, message="cannot connect: Connection refused", at=5.0)
    assert (failure.kind, failure.refused, failure.reason) == (
        "unreachable",
        False,
        "cannot connect: Connection refused",
    )


@pytest.mark.parametrize(
    ("kw", "kind", "reason"),
    [
        # The responder never answered our opening: what a peer with another network key does.
        ({"handshake_error": True, "waiting_for": "msg2"}, "no_answer", NO_ANSWER_REASON),
        # ... or it timed out / the connection broke before any answer.
        ({"handshake_error": False}, "no_answer", NO_ANSWER_REASON),
        # It answered msg1, then hung up on our identity: its allow-list or block list.
        ({"handshake_error": True, "waiting_for": "msg4"}, "refused_us", REFUSED_US_REASON),
        (
            {"handshake_error": True, "we_refused": PK_B},
            "not_allowed",
            f"{PK_B.hex()} is not in our allowed_peers",
        ),
        (
            {"handshake_error": True, "we_refused": PK_B, "blocked": frozenset({PK_B})},
            "blocked",
            f"{PK_B.hex()} is on our block list",
        ),
        ({"handshake_error": True}, "handshake", "the handshake failed: boom"),
    ],
)
def test_a_handshake_failure_is_refused_with_its_reason(kw: dict[str, Any], kind: str, reason: str) -> None:
    failure = classify_dial_failure(reached=True, message="boom", at=1.0, **kw)
    assert (failure.kind, failure.reason, failure.refused) == (kind, reason, True)


# --- the state a peer is shown in ----------------------------------------------------------------------


def _status(
    book_state: str, failure: DialFailure | None = None, *, blocked: bool = False
) -> tuple[str, str | None]:
    return peer_status(
        book_state=book_state,
        public_key=PK_B,
        blocked=frozenset({PK_B}) if blocked else frozenset(),
        failure=failure,
    )


def test_peer_states() -> None:
    unreachable = DialFailure("unreachable", "cannot connect", 1.0)
    wrong_key = DialFailure("no_answer", NO_ANSWER_REASON, 1.0)
    assert _status("connected") == ("connected", None)
    assert _status("idle") == ("dialling", None)
    assert _status("dialing") == ("dialling", None)
    assert _status("idle", unreachable) == ("dialling", "cannot connect")
    assert _status("idle", wrong_key) == ("refused", NO_ANSWER_REASON)
    assert _status("dialing", wrong_key) == ("refused", NO_ANSWER_REASON)  # being retried, still refused
    assert _status("self")[0] == "self"
    # A block wins over whatever the entry says (a link up when it was blocked is being closed).
    assert _status("connected", blocked=True)[0] == "blocked"
    assert _status("idle", wrong_key, blocked=True)[0] == "blocked"
    # An address whose identity we only learnt by refusing it at the handshake.
    assert peer_status(
        book_state="idle",
        public_key=None,
        blocked=frozenset(),
        failure=DialFailure("blocked", "on our block list", 1.0),
    ) == ("blocked", "on our block list")


def test_state_text_says_when_and_why() -> None:
    row: dict[str, Any] = {"status": "dialling", "reason": "cannot connect", "state": "idle", "failures": 3}
    assert cli.peers.state_text({**row, "next_try_s": 12.4}) == (
        "dialling (cannot connect; next try in 12 s, 3 failures so far)"
    )
    assert cli.peers.state_text({**row, "state": "dialing"}) == (
        "dialling (cannot connect; trying again now, 3 failures so far)"
    )
    refused = {
        "status": "refused",
        "reason": NO_ANSWER_REASON,
        "state": "idle",
        "failures": 1,
        "next_try_s": 2.0,
    }
    assert cli.peers.state_text(refused) == f"refused ({NO_ANSWER_REASON}; next try in 2 s, 1 failure so far)"
    assert cli.peers.state_text({"status": "connected", "reason": None}) == "connected"
    # A link's place in the eager trees: shown once some queue on it is announced rather than pushed.
    tree = {"queues_eager_in": 1, "queues_pruned_in": 2, "queues_lazy_out": 3}
    assert cli.peers.state_text({"status": "connected", "reason": None, **tree}) == (
        "connected (1 of 3 queues pushed to us, 3 announced to it)"
    )
    all_eager = {"queues_eager_in": 4, "queues_pruned_in": 0, "queues_lazy_out": 0}
    assert cli.peers.state_text({"status": "connected", "reason": None, **all_eager}) == "connected"
    assert cli.peers.state_text({"status": "blocked", "reason": "on our block list"}) == "blocked"
    # An older daemon's row, with the book's state only.
    assert cli.peers.state_text({"connected": False, "state": "idle"}) == "idle"


# --- the operator's rules ------------------------------------------------------------------------------


def test_rules_round_trip_and_compose_with_the_allow_list(tmp_path: Path) -> None:
    rules = PeerRules().with_added(ADDR).with_added(("::1", 7000)).with_blocked(PK_B)
    assert rules.with_added(ADDR) is rules and rules.with_blocked(PK_B) is rules
    assert PeerRules.from_json(rules.to_json()) == rules
    save_rules(tmp_path, rules)
    assert load_rules(tmp_path) == rules
    assert os.stat(tmp_path / "peer_rules.json").st_mode & 0o077 == 0
    # A peer must be allowed (if there is a list) and not blocked.
    assert rules.admits(PK_A, None) and not rules.admits(PK_B, None)
    assert rules.admits(PK_A, frozenset({PK_A})) and not rules.admits(PK_A, frozenset({PK_B}))
    assert not rules.admits(PK_B, frozenset({PK_B}))
    unblocked = rules.without_blocked(PK_B).without_added([ADDR])
    assert unblocked.admits(PK_B, None) and unblocked.added == (("::1", 7000),)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"version": 2, "added": [], "blocked": []}',
        '{"version": 1, "added": [], "blocked": ["abc"]}',
        '{"version": 1, "added": ["nohost"], "blocked": []}',
        '{"version": 1, "added": [], "blocked": [], "extra": 1}',
    ],
)
def test_a_damaged_rules_file_stops_the_start_instead_of_forgetting_blocks(tmp_path: Path, text: str) -> None:
    (tmp_path / "peer_rules.json").write_text(text)
    with pytest.raises(MalformedError, match=r"peer_rules\.json"):
        load_rules(tmp_path)
    with pytest.raises(MalformedError):
        PeerFaults.load(tmp_path, None)


def test_the_book_never_dials_a_blocked_identity_and_keeps_added_addresses() -> None:
    book = PeerBook(backoff=Backoff(initial=1.0, cap=4.0), rng=lambda: 0.0, forget_failures=2)
    book.add(ADDR, "remembered", now=0.0, public_key=PK_B)
    book.add(("192.0.2.8", 1), "added", now=0.0)
    book.add(("192.0.2.9", 1), "mdns", now=0.0)
    book.blocked = frozenset({PK_B})
    assert set(book.due(0.0)) == {("192.0.2.8", 1), ("192.0.2.9", 1)}
    assert book.addresses_of(PK_B) == [ADDR]
    for t in (1.0, 10.0, 20.0):
        for address in (("192.0.2.8", 1), ("192.0.2.9", 1)):
            if address in book:
                book.failed(address, t)
                book.due(t + 100)
    # Failing for ever forgets what mDNS found, never what the operator added.
    assert ("192.0.2.8", 1) in book and ("192.0.2.9", 1) not in book
    book.blocked = frozenset()
    assert ADDR in book.due(1000.0)


# --- refused handshakes, clock skew, disk ---------------------------------------------------------------


def test_incoming_refusals_are_counted_bounded_and_cleared() -> None:
    refusals = IncomingRefusals(shown_for=60.0, capacity=2)
    refusals.refused("10.0.0.1", "wrong key", 0.0)
    refusals.refused("10.0.0.1", "wrong key", 1.0)
    assert [(r.host, r.count) for r in refusals.recent(1.0)] == [("10.0.0.1", 2)]
    refusals.refused("10.0.0.2", "x", 2.0)
    refusals.refused("10.0.0.3", "x", 3.0)
    assert [r.host for r in refusals.recent(3.0)] == ["10.0.0.2", "10.0.0.3"]  # the oldest went
    refusals.accepted("10.0.0.2")
    assert [r.host for r in refusals.recent(3.0)] == ["10.0.0.3"]
    assert refusals.recent(100.0) == []  # shown for a while only


def test_clock_skew_reports_each_transition_once_with_hysteresis() -> None:
    skew = ClockSkew(warn_ms=10_000, recover_ms=5_000, forget_after=100.0)
    assert skew.observe("p", 2_000, 0.0) is None
    assert skew.observe("p", 12_000, 1.0) == "skewed"
    assert skew.observe("p", 30_000, 2.0) is None  # still off: nothing new to say
    assert skew.observe("p", 7_000, 3.0) is None  # between the thresholds: still skewed
    assert [r.offset_ms for r in skew.skewed(3.0)] == [7_000]
    assert skew.observe("p", -4_000, 4.0) == "recovered"
    assert skew.skewed(4.0) == []
    assert skew.observe("p", -11_000, 5.0) == "skewed"  # behind counts as well as ahead
    assert skew.skewed(200.0) == []  # not renewed: that peer has not connected since
    assert skew.observe("p", -11_000, 300.0) == "skewed"  # a forgotten reading starts over


def test_disk_thresholds() -> None:
    tb = 1 << 40
    assert not disk_is_low(tb // 2, tb)
    assert disk_is_low(tb // 25, tb)  # 4 %
    assert disk_is_low(LOW_DISK_BYTES - 1, 10 * LOW_DISK_BYTES)  # under 1 GiB, 10 % of a small disk
    assert not disk_is_low(LOW_DISK_BYTES * 2, 10 * LOW_DISK_BYTES)
    # Once low, it takes 10 % more than the threshold to be back.
    assert disk_is_low(LOW_DISK_BYTES + 1, 100 * LOW_DISK_BYTES, was_low=True)
    assert not disk_is_low(LOW_DISK_BYTES * 6, 100 * LOW_DISK_BYTES, was_low=True)


def test_low_disk_is_logged_once_each_way(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    samples = iter(
        [
            10 * LOW_DISK_BYTES,
            LOW_DISK_BYTES // 2,
            LOW_DISK_BYTES // 3,
            5 * LOW_DISK_BYTES,
            10 * LOW_DISK_BYTES,
        ]
    )
    total = 100 * LOW_DISK_BYTES
    health = Health(
        cast(Engine, None), tmp_path, usage=lambda path: DiskUsage(str(path), next(samples), total)
    )
    caplog.set_level(logging.INFO, logger="latticed.services.health")
    lows = []
    for _ in range(5):
        health.check_disk()
        lows.append(health.disk_low)
    assert lows == [False, True, True, True, False]
    events = [r.getMessage() for r in caplog.records if r.name == "latticed.services.health"]
    assert events == ["disk.low", "disk.ok"]
    assert health.disk_status() == {
        "path": str(tmp_path),
        "free_bytes": 10 * LOW_DISK_BYTES,
        "total_bytes": total,
        "low": False,
    }


def test_clock_skew_from_handshakes_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    faults = PeerFaults(tmp_path)
    caplog.set_level(logging.INFO, logger="latticed.net.peer_faults")
    for offset in (40_000, 41_000, 39_000):
        faults.incoming_succeeded("10.0.0.1", PK_B, offset, "10.0.0.1:5000")
    stale = HandshakeError("msg1 is not fresh", clock_offset_ms=-300_000)
    faults.incoming_failed("10.0.0.2", stale, None)
    faults.incoming_failed("10.0.0.2", stale, None)
    faults.incoming_succeeded("10.0.0.1", PK_B, 100, "10.0.0.1:5001")
    events = [r.getMessage() for r in caplog.records if r.name == "latticed.net.peer_faults"]
    assert events == ["clock.skew", "clock.skew", "clock.skew_recovered"]
    [reading] = faults.clock_skew()
    assert (reading.peer, reading.offset_ms, reading.public_key) == ("10.0.0.2", -300_000, None)
    assert [r.count for r in faults.incoming.recent(reading.at)] == [2]


# --- the handshake facts these are built on --------------------------------------------------------------


def test_the_responder_learns_the_initiators_clock_only_from_an_authentic_opening() -> None:
    initiator = Initiator(seed=SEED_A, network_key=K, now_ms=1_000_000 + 45_000)
    responder = Responder(seed=SEED_B, network_key=K, now_ms=1_000_000)
    msg2 = responder.receive_data(initiator.initiate())
    assert responder.peer_clock_offset_ms == 45_000
    msg4 = responder.receive_data(initiator.receive_data(msg2))
    initiator.receive_data(msg4)
    assert responder.result.peer_clock_offset_ms == 45_000
    assert initiator.result.peer_clock_offset_ms is None
    # Under another key the opening's time is anyone's number: not taken.
    stranger = Responder(seed=SEED_B, network_key=OTHER_K, now_ms=1_000_000)
    with pytest.raises(HandshakeError):
        stranger.receive_data(Initiator(seed=SEED_A, network_key=K, now_ms=5).initiate())
    assert stranger.peer_clock_offset_ms is None
    # Too far off: refused, with the offset for the operator.
    late = Responder(seed=SEED_B, network_key=K, now_ms=1_000_000)
    with pytest.raises(HandshakeError, match="not fresh") as refused:
        late.receive_data(Initiator(seed=SEED_A, network_key=K, now_ms=1_000_000 - 200_000).initiate())
    assert refused.value.clock_offset_ms == -200_000


async def _dial_outcome(client_kw: dict[str, Any], server_kw: dict[str, Any]) -> LatticedError | SecureStream:
    left, right = trio.testing.memory_stream_pair()
    outcome: dict[str, LatticedError | SecureStream] = {}

    async def client() -> None:
        try:
            outcome["client"] = await secure_connect(left, **client_kw)
        except LatticedError as error:
            outcome["client"] = error

    async def server() -> None:
        try:
            await secure_accept(right, **server_kw)
        except LatticedError:
            await right.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        nursery.start_soon(server)
    return outcome["client"]


async def test_a_dialler_hears_which_message_the_peer_hung_up_before() -> None:
    wrong_key = await _dial_outcome(
        {"seed": SEED_A, "network_key": OTHER_K}, {"seed": SEED_B, "network_key": K}
    )
    assert isinstance(wrong_key, HandshakeError) and wrong_key.waiting_for == "msg2"
    refused = await _dial_outcome(
        {"seed": SEED_A, "network_key": K},
        {"seed": SEED_B, "network_key": K, "allowed": lambda key: key != PK_A},
    )
    assert isinstance(refused, HandshakeError) and refused.waiting_for == "msg4"


# --- the doctor's verdicts -------------------------------------------------------------------------------


def test_key_files_must_be_private_and_the_key_not_the_public_one(tmp_path: Path) -> None:
    key = tmp_path / "network.key"
    key.write_text(DEFAULT_NETWORK_KEY.hex() + "\n")
    key.chmod(0o644)
    [mode] = check_network_key(key, data_dir=tmp_path)
    assert mode.ok is False and mode.fix == f"chmod 600 {key}"
    key.chmod(0o600)
    checks = check_network_key(key, data_dir=tmp_path)
    assert [c.ok for c in checks] == [True, False]
    assert "public default key" in checks[1].detail and "latticed network-key new" in str(checks[1].fix)
    empty = tmp_path / "empty"
    empty.mkdir()
    [none] = check_network_key(None, data_dir=empty)
    assert none.ok is False and str(empty / "network.key") in str(none.fix)
    key.write_text(os.urandom(32).hex() + "\n")
    assert [c.ok for c in check_network_key(key, data_dir=tmp_path)] == [True, True]
    # With no key file configured, the key `join` kept in the data directory is the daemon's key.
    kept = tmp_path / "kept"
    kept.mkdir()
    write_network_key(kept / "network.key")
    assert [c.ok for c in check_network_key(None, data_dir=kept)] == [True, True]
    assert check_secret_file("identity key", tmp_path / "missing", required=False).ok is None
    assert check_secret_file("identity key", tmp_path / "missing", required=True).ok is False


def test_peer_rows_become_checks_with_a_fix_for_each_kind_of_failure() -> None:
    rows = [
        {"public_key": PK_A.hex(), "address": "10.0.0.1:7464", "status": "connected"},
        {
            "public_key": None,
            "address": "10.0.0.2:7464",
            "status": "refused",
            "failure": "no_answer",
            "reason": "x",
        },
        {"public_key": None, "address": "10.0.0.3:7464", "status": "dialling", "failure": "unreachable"},
        {"public_key": PK_B.hex(), "address": None, "status": "blocked"},
        {"public_key": None, "address": "10.0.0.4", "status": "refused", "failure": "incoming"},
    ]
    checks = check_peer_rows(rows)
    assert [c.ok for c in checks] == [True, False, False, None, False]
    assert "network key" in str(checks[1].fix) and "10.0.0.3:7464" in str(checks[2].fix)
    assert "invite" in str(checks[4].fix)
    [nobody] = check_peer_rows([])
    assert nobody.ok is False and "peers add" in str(nobody.fix)


def test_the_doctor_lists_the_interfaces_discovery_uses() -> None:
    """The doctor keeps its own copy of the interface rules (latticectl must not import trio): same
    answers."""
    for interfaces in ((), ("127.0.0.1",), ("lo",)):
        assert [address for address, _ in mdns_interfaces(interfaces)] == mdns_addresses(interfaces)
    for bad in (("no-such-interface0",), ("::1",)):
        with pytest.raises(MalformedError):
            mdns_addresses(bad)
        with pytest.raises(MalformedError):
            mdns_interfaces(bad)


def test_check_is_plain_data() -> None:
    check = Check("disk", False, "low", "free space")
    assert Check.from_wire(check.to_wire()) == check
    assert dataclasses.asdict(check) == check.to_wire()


def test_allow_peer_is_a_flag_as_well_as_a_config_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[DaemonConfig] = []

    async def fake_run_daemon(config: DaemonConfig, **_: object) -> None:
        started.append(config)

    monkeypatch.setattr(cli.latticed_command, "run_daemon", fake_run_daemon)
    monkeypatch.setattr(cli.latticed_command, "configure_logging", lambda *args: None)
    base = ["run", "--data-dir", str(tmp_path / "d"), "--socket", str(tmp_path / "s")]
    allow = ["--allow-peer", PK_A.hex().upper(), "--allow-peer", PK_B.hex()]
    result = CliRunner().invoke(cli.latticed_command.app, [*base, *allow])
    assert result.exit_code == 0, result.output
    assert started[0].allowed_peers == (PK_A.hex(), PK_B.hex())
    bad = CliRunner().invoke(cli.latticed_command.app, [*base, "--allow-peer", "nope"])
    assert bad.exit_code == 2 and "allowed_peers" in bad.output
