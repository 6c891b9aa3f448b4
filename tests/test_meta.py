"""Queue metadata is a map of text to text: other values are refused, never converted; keys can be listed
and deleted, in the library, over the local API and with latticectl."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner

import cli.ctl
from cli.boundary import ExitCode
from latticed.crdt.signing import Identity
from latticed.errors import MalformedError, NotOwnerError
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig

ALICE = Identity.from_seed(b"m" * 32)


@pytest.mark.parametrize("value", [5, 1.5, b"bytes", True, ["a"]])
def test_the_library_refuses_metadata_that_is_not_text(value: Any) -> None:
    q = LatticeQueue.create(ALICE, "q")
    q.set_meta("kept", "yes")
    version = q.state.version
    with pytest.raises(MalformedError, match="metadata values are strings"):
        q.set_meta("n", value)
    assert q.meta == {"kept": "yes"} and q.state.version == version  # nothing signed, nothing stored


def test_the_library_lists_and_deletes_metadata() -> None:
    q = LatticeQueue.create(ALICE, "q")
    q.set_meta("b", "2")
    q.set_meta("a", "1")
    assert q.meta == {"a": "1", "b": "2"}
    q.meta["c"] = "3"  # a copy: changes nothing
    assert q.del_meta("a") is True
    version = q.state.version
    assert q.del_meta("a") is False
    assert q.state.version == version  # deleting a key that is not set signs nothing
    assert q.meta == {"b": "2"} and q.get_meta("a") is None
    replica = LatticeQueue.empty_replica(ALICE.public_key, "q")
    replica.merge(q.delta(replica.summary()))
    assert replica.meta == {"b": "2"}  # a deletion replicates
    with pytest.raises(NotOwnerError):
        replica.del_meta("b")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    root = tmp_path_factory.mktemp("meta")
    d = start_in_process(DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"))
    yield d
    d.stop()


def test_the_api_lists_and_deletes_metadata(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        c.queue_create("api", {"team": "shop", "tier": "1"})
        assert c.meta_list("api") == {"team": "shop", "tier": "1"}
        assert c.meta_del("api", "tier") is True
        version = c.queue_info("api")["version"]
        assert c.meta_del("api", "tier") is False
        assert c.queue_info("api")["version"] == version
        assert c.meta_list("api") == {"team": "shop"}
        with pytest.raises(MalformedError, match="'value'"):
            c.meta_set("api", "n", 5)  # type: ignore[arg-type]
        assert c.meta_list("api") == {"team": "shop"}
        bob = LatticeQueue.create(Identity.from_seed(b"o" * 32), "theirs")
        bob.set_meta("k", "v")
        daemon.call(daemon.handle.engine.merge_delta, bob.delta())
        address = f"{bob.owner.hex()}/theirs"
        assert c.meta_list(address) == {"k": "v"}
        for key in ("k", "absent"):
            with pytest.raises(NotOwnerError):
                c.meta_del(address, key)


def test_latticectl_meta_list_and_del(daemon: InProcessDaemon) -> None:
    runner = CliRunner()

    def ctl(*args: str) -> Any:
        return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")

    with daemon.client() as c:
        c.queue_create("cli", {"b": "two words", "a": "1"})
    assert ctl("meta", "list", "cli").stdout == "a\t1\nb\ttwo words\n"
    assert ctl("meta", "list", "cli", "--json").stdout == '{"a": "1", "b": "two words"}\n'
    deleted = ctl("meta", "del", "cli", "a")
    assert (deleted.exit_code, deleted.stdout, deleted.stderr) == (0, "", "deleted metadata 'a' of cli\n")
    again = ctl("meta", "del", "cli", "a")
    assert (again.exit_code, again.stderr) == (0, "cli has no metadata 'a': nothing deleted\n")
    assert ctl("meta", "list", "cli").stdout == "b\ttwo words\n"
    assert ctl("meta", "del", "nope", "a").exit_code == ExitCode.NOT_FOUND
