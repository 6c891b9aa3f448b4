"""A real daemon (``run_daemon``) on its own trio thread inside the test process, for API tests that
need no subprocess: start it, talk to it with the blocking client, run coroutines on its loop, stop it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from latticed.api.client.blocking_client import Client
from latticed.api.server.api_ports import MembershipView
from latticed.api.server.context import Context
from latticed.api.server.op_table import build_op_table
from latticed.daemon import RunningDaemon, run_daemon
from latticed.host.config import DaemonConfig
from latticed.storage.engine import Engine
from latticed.storage.sealer import Sealer


@dataclass
class InProcessDaemon:
    config: DaemonConfig
    handle: RunningDaemon
    token: trio.lowlevel.TrioToken
    thread: threading.Thread
    box: dict[str, Any] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.config.socket_path

    def client(self, timeout: float | None = 10.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run an async function on the daemon's trio thread."""
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def stop(self) -> None:
        """Shut down cleanly; the daemon must not have failed and must remove its socket."""
        trio.from_thread.run_sync(self.handle.stop, trio_token=self.token)
        self.thread.join(30)
        assert "error" not in self.box, self.box.get("error")
        assert not self.config.socket_path.exists()


def start_in_process(config: DaemonConfig, name: str = "daemon-under-test") -> InProcessDaemon:
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            box["handle"] = await nursery.start(run_daemon, config)
            started.set()

    def thread() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            box["error"] = exc
        finally:
            started.set()

    runner = threading.Thread(target=thread, name=name, daemon=True)
    runner.start()
    assert started.wait(30)
    if "error" in box:
        raise box["error"]
    return InProcessDaemon(config, box["handle"], box["token"], runner, box)


@contextmanager
def daemon_at(root: Path) -> Iterator[InProcessDaemon]:
    """A daemon on the embedded defaults, data and socket under ``root``, stopped (and checked) after."""
    d = start_in_process(DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"))
    try:
        yield d
    finally:
        d.stop()


def engine_context(engine: Engine, path: Path, membership: MembershipView | None = None) -> Context:
    """The local API's context over an open ``engine`` (every op, its own sealer; no socket is opened):
    handlers called directly, without a daemon around them."""
    return Context(
        engine,
        path,
        path / "sock",
        1 << 20,
        sealer=Sealer(engine),
        ops=build_op_table(),
        membership=membership,
    )
