"""What the integration tests ask a running daemon process (integration/daemons.py's handle) through its
socket: a client, a `latticectl` call, the address peers dial, a queue's info; and the copied identity
several tests start from."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from daemons import LatticedProcess
from typer.testing import CliRunner, Result

import cli.ctl
from latticed.api.client.blocking_client import Client

runner = CliRunner()
#: A daemon on loopback only: an ephemeral port, no mDNS.
LOCAL = ["--listen", "127.0.0.1:0", "--no-mdns"]


def client(daemon: LatticedProcess) -> Client:
    return Client(daemon.socket, timeout=10)


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


__all__ = ["LatticedProcess", "client", "ctl", "dial_address", "info", "runner"]


def copied_owner(factory: Callable[..., LatticedProcess], owner: LatticedProcess) -> LatticedProcess:
    """A second daemon on a copy of ``owner``'s data directory (its identity copied to another machine),
    both running, each having written its own records to ``events`` since: ``owner-0..4`` on the owner,
    ``copy-0..2`` on the copy. ``owner`` is stopped for the copy and restarted."""
    owner.stop()
    copy = factory(start=False, args=LOCAL)
    shutil.copytree(owner.data_dir, copy.data_dir)
    owner.start()
    copy.start()
    with client(owner) as c:
        c.offer_batch("events", [(b"owner-%d" % i, None, ()) for i in range(5)])
    with client(copy) as c:
        c.offer_batch("events", [(b"copy-%d" % i, None, ()) for i in range(3)])
    return copy
