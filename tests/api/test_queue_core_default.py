"""Which fork core a new queue gets: the daemon's ``default_queue_core`` (2 unless configured) when the
request names none (an older client never does), ``--core 1`` / ``core=1`` to keep core 1; sealed queues
stay on core 1; the config key's checks; and the peers that would miss core-2 queues."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner

import cli.ctl
from latticed.errors import MalformedError
from latticed.host.config import DaemonConfig, load_config
from latticed.host.core2_reach import core2_blind_peers


def _daemon(tmp_path: Path, **config: object) -> InProcessDaemon:
    return start_in_process(
        DaemonConfig(data_dir=tmp_path / "data", socket_path=tmp_path / "api.sock", **config)  # type: ignore[arg-type]
    )


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    d = _daemon(tmp_path)
    yield d
    d.stop()


def _core(daemon: InProcessDaemon, name: str) -> int:
    with daemon.client() as c:
        return int(c.queue_info(name)["core"])


def test_a_new_queue_is_on_core_2_unless_it_asks_for_core_1(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        assert c.call("hello")["default_queue_core"] == 2
        c.queue_create("plain")
        assert c.call("queue_create", name="older-client", meta={})["core"] == 2  # no "core" sent
        c.queue_create("kept", core=1)
    assert (_core(daemon, "plain"), _core(daemon, "older-client"), _core(daemon, "kept")) == (2, 2, 1)
    runner, sock = CliRunner(), ["--socket", str(daemon.socket)]
    assert runner.invoke(cli.ctl.app, [*sock, "queue", "create", "cli2"]).exit_code == 0
    done = runner.invoke(cli.ctl.app, [*sock, "queue", "create", "cli1", "--core", "1"])
    assert done.exit_code == 0, done.output
    assert (_core(daemon, "cli2"), _core(daemon, "cli1")) == (2, 1)


def test_a_daemon_configured_for_core_1_makes_core_1_queues_by_default(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, default_queue_core=1)
    try:
        with daemon.client() as c:
            assert c.call("hello")["default_queue_core"] == 1
            c.queue_create("plain")
            assert c.call("queue_create", name="older-client", meta={})["core"] == 1
            c.queue_create("asked", core=2)
        assert [_core(daemon, n) for n in ("plain", "older-client", "asked")] == [1, 1, 2]
    finally:
        daemon.stop()


def test_a_sealed_queue_stays_on_core_1_and_refuses_core_2(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        assert c.call("queue_create", name="sealed", meta={}, readers=[])["core"] == 1
        with pytest.raises(MalformedError, match=r"sealed queue is on fork core 1 only.*--core 1"):
            c.queue_create("sealed2", readers=[], core=2)
    assert _core(daemon, "sealed") == 1


def test_the_config_key_takes_1_or_2(tmp_path: Path) -> None:
    file = tmp_path / "latticed.toml"
    file.write_text("default_queue_core = 1\n")
    assert load_config(file, {}, env={"HOME": str(tmp_path)}).default_queue_core == 1
    assert load_config(None, {}, env={"HOME": str(tmp_path)}).default_queue_core == 2
    for bad in ("3", '"2"', "true"):
        file.write_text(f"default_queue_core = {bad}\n")
        with pytest.raises(MalformedError, match="default_queue_core"):
            load_config(file, {}, env={"HOME": str(tmp_path)})


def test_a_connected_peer_without_heads_v2_is_named_while_core_2_queues_are_held() -> None:
    old = {"status": "connected", "public_key": "ab" * 32, "address": "127.0.0.1:7000", "features": []}
    new = {**old, "public_key": "cd" * 32, "features": ["compact", "heads-v2"]}
    away = {**old, "public_key": "ef" * 32, "status": "dialling"}
    unsettled = {**old, "public_key": "01" * 32, "features": None}
    (blind,) = core2_blind_peers([old, new, away, unsettled], 3)
    assert blind["peer"] == "ab" * 32 and blind["release"] == "0.2.x"
    assert blind["message"] == (
        f"peer {'ab' * 8} at 127.0.0.1:7000 (0.2.x) receives none of 3 core-2 queues; "
        "upgrade it, or create queues with --core 1"
    )
    assert core2_blind_peers([old], 0) == []  # nothing of core 2 held: nothing missed
