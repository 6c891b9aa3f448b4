"""What the integration tests ask a running daemon process (integration/daemons.py's handle) through its
socket: a client, a `latticectl` call, the address peers dial, a queue's info, a write right after a
start (:func:`write_after_start`); and the copied identity several tests start from."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any, TypeVar

from daemons import LatticedProcess
from polling import wait_until
from typer.testing import CliRunner, Result

import cli.ctl
from latticed.api.client.blocking_client import Client
from latticed.errors import VersionGapError
from latticed.protocol.start_gate import WRITE_HOLD_S

runner = CliRunner()
_T = TypeVar("_T")
#: A daemon on loopback only: an ephemeral port, no mDNS.
LOCAL = ["--listen", "127.0.0.1:0", "--no-mdns"]
#: A call's timeout: the longest the start gate holds a write, plus the 10 s any answer may take on a
#: loaded CI box, so a write just after a start is never failed while the daemon would still answer it.
CALL_TIMEOUT_S = WRITE_HOLD_S + 10.0


def client(daemon: LatticedProcess) -> Client:
    """A client whose timeout outlasts the start gate's hold on a write (:data:`CALL_TIMEOUT_S`)."""
    return Client(daemon.socket, timeout=CALL_TIMEOUT_S)


def ctl(daemon: LatticedProcess, *args: str) -> Result:
    """`latticectl --socket DAEMON ARGS...` in this process (typer's runner: output and exit code)."""
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def dial_address(daemon: LatticedProcess) -> str:
    """Where a peer on this machine dials the daemon (it listens on 127.0.0.1, port chosen at start)."""
    with client(daemon) as c:
        listen = c.status()["listen"]
    assert listen is not None
    return f"127.0.0.1:{listen.rsplit(':', 1)[1]}"


def info(daemon: LatticedProcess, queue: str) -> dict[str, Any]:
    """The queue's info, or {} while the daemon does not hold it yet (for polling)."""
    with client(daemon) as c:
        try:
            return c.queue_info(queue)
        except Exception:
            return {}


def gate_open(daemon: LatticedProcess) -> bool:
    """Whether the daemon's start gate is open: it signs again once the peers it dialled first said what
    they hold or turned out unreachable (``identity_runs``' ``catching_up`` is None; it never closes again
    in a run). A release without the gate (0.2.0: no ``identity_runs``) is always open."""
    with client(daemon) as c:
        try:
            facts = c.identity_runs()
        except VersionGapError:
            return True
    return facts is None or facts.get("catching_up") is None


def write_after_start(daemon: LatticedProcess, write: Callable[[Client], _T], what: str) -> _T:
    """``write`` (one call: no retry) on a daemon just started with peers, once its start gate is open.

    The daemon refuses to sign until it heard what its peers hold (latticed/protocol/start_gate.py). A write
    meanwhile waits in the daemon (up to ``WRITE_HOLD_S``, which the client's timeout outlasts), but a test
    of what comes *after* the catch-up must not depend on that wait: it waits for the gate itself, by the
    status the daemon exposes, and a ``BehindPeersError`` after that is a failure of the test, not a moment
    to retry."""
    wait_gate_open(daemon, what)
    with client(daemon) as c:
        return write(c)


def wait_gate_open(daemon: LatticedProcess, what: str) -> None:
    """Wait (bounded, with the daemon's facts on failure) until the just-started daemon's start gate is
    open, before ``what`` writes to it."""
    wait_until(
        lambda: gate_open(daemon),
        f"{what}: the daemon's start gate open (it heard what its peers hold)",
        diagnose=lambda: _gate_facts(daemon),
    )


def _gate_facts(daemon: LatticedProcess) -> str:
    """For a wait's failure: why the gate is still closed, the daemon's peers, and its log's tail."""
    try:
        with client(daemon) as c:
            facts = c.identity_runs()
            peers = [{k: row.get(k) for k in ("address", "status", "reason")} for row in c.peers()]
    except Exception as exc:
        return f"the daemon's facts unreadable ({type(exc).__name__}: {exc})\n{daemon.log_text()}"
    return f"identity_runs: {facts}\npeers: {peers}\n--- log (tail)\n{daemon.log_text()}"


def copied_owner(factory: Callable[..., LatticedProcess], owner: LatticedProcess) -> LatticedProcess:
    """A second daemon on a copy of ``owner``'s data directory (its identity copied to another machine),
    both running, each having written its own records to ``events`` since: ``owner-0..4`` on the owner,
    ``copy-0..2`` on the copy. ``owner`` is stopped for the copy and restarted; each writes once its start
    gate is open."""
    owner.stop()
    copy = factory(start=False, args=LOCAL)
    shutil.copytree(owner.data_dir, copy.data_dir)
    owner.start()
    copy.start()
    owner_batch = [(b"owner-%d" % i, None, ()) for i in range(5)]
    copy_batch = [(b"copy-%d" % i, None, ()) for i in range(3)]
    write_after_start(owner, lambda c: c.offer_batch("events", owner_batch), "the owner's 5 records")
    write_after_start(copy, lambda c: c.offer_batch("events", copy_batch), "the copy's 3 records")
    return copy


__all__ = [
    "CALL_TIMEOUT_S",
    "LatticedProcess",
    "client",
    "copied_owner",
    "ctl",
    "dial_address",
    "gate_open",
    "info",
    "runner",
    "wait_gate_open",
    "write_after_start",
]
